#!/usr/bin/env bash
# bench-tables.sh runs the project's benchmarks in interleaved rounds and
# turns their output into markdown tables: each benchmark beside the
# baselines it is measured against (a mutex, a semaphore, a PING, a plain
# line scan...), all measured in the same rounds, so that a machine that
# slows down slows both.
#
#   bash scripts/bench-tables.sh                          # the tables, on standard output
#   bash scripts/bench-tables.sh -w docs/performance.md   # replace the tables in the guide
#   ROUNDS=5 BENCHTIME=1s bash scripts/bench-tables.sh    # the defaults
#
# A round runs every benchmark family once (go test -run '^$' -bench, one
# family after the other); the rounds repeat, so each family's runs are
# spread over the whole run. A family is a top-level benchmark and its
# baselines: its sub-benchmarks, and the benchmarks named like it with a
# suffix (BenchmarkMeter and BenchmarkMeterBaseline, BenchmarkParseRequest400KB
# and BenchmarkParseRequest400KB_EncodingJSON). Each cell is the median over
# the rounds, with the lowest and the highest in parentheses. The raw output
# is kept (its path is printed on standard error) for benchstat.
#
# The Redis benchmarks start a redis-server of their own (scripts/test.sh
# installs it); without one they are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
benchtime=${BENCHTIME:-1s}
write=""
case "${1:-}" in
  -w) write=${2:?"-w needs a file"} ;;
  "") ;;
  *) echo "usage: bash scripts/bench-tables.sh [-w FILE]" >&2; exit 2 ;;
esac

# The packages with benchmarks to tabulate, and which of their benchmarks.
packages=(
  "./benchmarks/|."
  ".|^BenchmarkDedupKey$"
  "./metrics/|^BenchmarkAcquireRelease$"
  "./fleet/|^BenchmarkReserve"
)

work=$(mktemp -d)
raw="$work/raw.txt"
: >"$raw"
echo "bench-tables: raw output in $raw" >&2

load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime | sed 's/.*load average[s]*: //'; }
load_start=$(load)
date_start=$(date -u '+%Y-%m-%d %H:%M UTC')

# Build each package's test binary once, and list its families.
families=() # "pkgindex;family regex;family name"
for i in "${!packages[@]}"; do
  pkg=${packages[$i]%%|*}
  filter=${packages[$i]#*|}
  go test -c -o "$work/bench$i.test" "$pkg"
  names=$(cd "$pkg" && "$work/bench$i.test" -test.list '^Benchmark' | grep -E "$filter" || true)
  # A family is a name that does not extend another listed name.
  while read -r fam; do
    [ -z "$fam" ] && continue
    members=$(printf '%s\n' $names | awk -v f="$fam" 'index($0, f) == 1 && (length($0) == length(f) || substr($0, length(f) + 1) ~ /^(_|Baseline)/)' | paste -sd'|')
    families+=("$i;^($members)\$;$fam")
  done < <(printf '%s\n' $names | awk '{ n[NR] = $0 } END { for (i = 1; i <= NR; i++) { own = 1; for (j = 1; j <= NR; j++) if (i != j && index(n[i], n[j]) == 1 && substr(n[i], length(n[j]) + 1) ~ /^(_|Baseline)/) own = 0; if (own) print n[i] } }')
done

# The tables' order: these families first, the others after them.
first="BenchmarkAcquireRelease BenchmarkRun BenchmarkWouldAdmit BenchmarkEstimate BenchmarkRunObserve
BenchmarkRunDedup BenchmarkDedupKey BenchmarkQueued BenchmarkMassCancel BenchmarkAdaptive BenchmarkRateCheck
BenchmarkPacerLocal BenchmarkPacerRedis BenchmarkReserve BenchmarkReserveParallel32 BenchmarkParseRequest400KB
BenchmarkMeter BenchmarkGateway BenchmarkGatewayStreamMemory"
ordered=()
for name in $first; do
  for f in "${families[@]}"; do
    [ "${f##*;}" = "$name" ] && ordered+=("$f")
  done
done
for f in "${families[@]}"; do
  case " $(echo $first) " in *" ${f##*;} "*) ;; *) ordered+=("$f") ;; esac
done
families=("${ordered[@]}")

for r in $(seq 1 "$rounds"); do
  for f in "${families[@]}"; do
    i=${f%%;*}
    rest=${f#*;}
    re=${rest%;*}
    pkg=${packages[$i]%%|*}
    echo "bench-tables: round $r/$rounds: ${rest#*;} ($pkg)" >&2
    (cd "$pkg" && "$work/bench$i.test" -test.run '^$' -test.bench "$re" -test.benchtime "$benchtime" -test.count 1 2>&1) |
      awk -v pkg="$pkg" '/^Benchmark/ { print pkg "\t" $0 } /^--- (SKIP|FAIL)/ { print pkg "\t" $0 }' >>"$raw" || true
  done
done
load_end=$(load)

# Each family's caption: the first sentence of its doc comment.
captions="$work/captions.txt"
: >"$captions"
for p in "${packages[@]}"; do
  pkg=${p%%|*}
  awk -v pkg="$pkg" '
    /^\/\// { c = c (c == "" ? "" : " ") substr($0, 4); next }
    /^func Benchmark/ { name = $2; sub(/\(.*/, "", name); s = c; if (match(s, /\. /)) s = substr(s, 1, RSTART); print pkg "\t" name "\t" s }
    { c = "" }' "$pkg"/*_test.go >>"$captions"
done

tables="$work/tables.md"
{
  cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || echo unknown)
  redis=$(redis-server --version 2>/dev/null | awk '{ print $3 }' | sed 's/v=//' || true)
  echo "Measured $date_start by \`scripts/bench-tables.sh\` ($rounds rounds, \`-benchtime $benchtime\`):"
  echo "$(nproc) cores ($cpu), $(go version | awk '{ print $3, $4 }'), GOMAXPROCS $(nproc)${redis:+, redis-server $redis};"
  echo "load average $load_start at the start and $load_end at the end (the machine is shared)."
  echo "Each cell is the median of the rounds, with the lowest and highest in parentheses."
  awk -F'\t' -v capfile="$captions" '
    BEGIN {
      while ((getline line < capfile) > 0) { split(line, cp, "\t"); caption[cp[1] SUBSEP cp[2]] = cp[3] }
    }
    function fmt(v, unit,   a) {
      a = v < 0 ? -v : v
      if (unit ~ /^ns\//) {
        if (a >= 1e9) return sprintf("%.3g s", v / 1e9)
        if (a >= 1e6) return sprintf("%.3g ms", v / 1e6)
        if (a >= 1e3) return sprintf("%.3g µs", v / 1e3)
        return sprintf("%.3g ns", v)
      }
      if (a >= 1e9) return sprintf("%.3g G", v / 1e9)
      if (a >= 1e6) return sprintf("%.3g M", v / 1e6)
      if (a >= 1e4) return sprintf("%.3g k", v / 1e3)
      if (a >= 100 || a == int(a)) return sprintf("%.0f", v)
      return sprintf("%.3g", v)
    }
    # extends reports whether benchmark name is base or one of its baselines.
    function extends(name, base) {
      return index(name, base) == 1 && (length(name) == length(base) || substr(name, length(base) + 1) ~ /^(_|Baseline)/)
    }
    {
      pkg = $1
      line = substr($0, length($1) + 2)
    }
    line ~ /^--- / { next }
    line ~ /^Benchmark/ {
      n = split(line, w, /[ \t]+/)
      name = w[1]; sub(/-[0-9]+$/, "", name)
      top = name; sub(/\/.*/, "", top)
      tops[pkg SUBSEP top] = 1
      if (!((pkg SUBSEP name) in seen)) { seen[pkg SUBSEP name] = 1; order[++norder] = pkg SUBSEP name }
      for (i = 3; i < n; i += 2) {
        unit = w[i + 1]
        if (unit == "B/op") continue
        k = pkg SUBSEP name SUBSEP unit
        cnt[k]++; val[k, cnt[k]] = w[i] + 0
        if (cnt[k] == 1) units[pkg SUBSEP name] = units[pkg SUBSEP name] SUBSEP unit
      }
    }
    END {
      # Families, in the order their first member appeared: a top-level
      # benchmark that extends another (Meter, MeterBaseline) joins it.
      for (i = 1; i <= norder; i++) {
        split(order[i], p, SUBSEP)
        top = p[2]; sub(/\/.*/, "", top)
        fam = top
        for (t in tops) {
          split(t, q, SUBSEP)
          if (q[1] == p[1] && extends(top, q[2]) && length(q[2]) < length(fam)) fam = q[2]
        }
        key = p[1] SUBSEP fam
        if (!(key in famseen)) { famseen[key] = 1; famorder[++nfam] = key }
        members[key] = members[key] SUBSEP p[2]
        nu = split(units[order[i]], us, SUBSEP)
        for (j = 2; j <= nu; j++) if (!((key SUBSEP us[j]) in famunit)) { famunit[key SUBSEP us[j]] = 1; famunits[key] = famunits[key] SUBSEP us[j] }
      }
      for (f = 1; f <= nfam; f++) {
        split(famorder[f], p, SUBSEP)
        pkg = p[1]; fam = p[2]
        print ""
        title = fam; sub(/^Benchmark/, "", title)
        print "#### " title " (`" pkg "`)"
        print ""
        if ((pkg SUBSEP fam) in caption && caption[pkg SUBSEP fam] != "") { print caption[pkg SUBSEP fam]; print "" }
        nu = split(famunits[famorder[f]], us, SUBSEP)
        hdr = "| benchmark |"; sep = "|---|"
        for (j = 2; j <= nu; j++) { hdr = hdr " " us[j] " |"; sep = sep "---|" }
        print hdr; print sep
        nm = split(members[famorder[f]], ms, SUBSEP)
        for (m = 2; m <= nm; m++) {
          label = ms[m]; sub(/^Benchmark/, "", label)
          row = "| `" label "` |"
          for (j = 2; j <= nu; j++) {
            k = pkg SUBSEP ms[m] SUBSEP us[j]
            c = cnt[k]
            if (c == 0) { row = row " |"; continue }
            for (a = 1; a <= c; a++) v[a] = val[k, a]
            for (a = 2; a <= c; a++) { x = v[a]; b = a - 1; while (b >= 1 && v[b] > x) { v[b + 1] = v[b]; b-- } v[b + 1] = x }
            med = c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
            cell = fmt(med, us[j])
            if (c > 1 && fmt(v[1], us[j]) != fmt(v[c], us[j])) cell = cell " (" fmt(v[1], us[j]) "–" fmt(v[c], us[j]) ")"
            row = row " " cell " |"
          }
          print row
        }
      }
    }' "$raw"
} >"$tables"

if [ -z "$write" ]; then
  cat "$tables"
  exit 0
fi
begin='<!-- bench-tables:begin -->'
end='<!-- bench-tables:end -->'
if ! grep -qF "$begin" "$write" || ! grep -qF "$end" "$write"; then
  echo "bench-tables: $write has no $begin ... $end markers" >&2
  exit 1
fi
awk -v b="$begin" -v e="$end" -v t="$tables" '
  $0 == b { print; while ((getline line < t) > 0) print line; print ""; skip = 1; next }
  $0 == e { skip = 0 }
  !skip' "$write" >"$work/out.md"
cp "$work/out.md" "$write"
echo "bench-tables: wrote the tables into $write" >&2
