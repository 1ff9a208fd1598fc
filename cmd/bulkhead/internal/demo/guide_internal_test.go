package demo

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

var updateGuide = flag.Bool("update-guide", false, "rewrite the demo's output blocks in the guides and the seeds table of docs/demo.md")

// root is the module's root, from this package's folder.
const root = "../../../.."

// guideSeeds is how many seeds the seeds table of docs/demo.md runs.
const guideSeeds = 8

// outputBlock is a demo output a guide quotes: a text block after a
// comment that gives the demo's arguments.
var outputBlock = regexp.MustCompile("(?s)<!-- output of: bulkhead demo([^>]*?) -->\n```text\n(.*?)```")

// TestGuideQuotesTheDemo checks every output and figure the guides quote
// from the demo: each output block (in README.md and docs/) is what the
// demo prints with the arguments its comment gives; the seeds table of
// docs/demo.md is what seeds 1 to guideSeeds give; every figure its prose
// quotes is one of guidePhrases, each computed from the runs it quotes;
// and the defaults its table of flags gives are the flags'. With
// -update-guide it rewrites the output blocks and the seeds table.
func TestGuideQuotesTheDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole table at every seed the guide quotes")
	}
	ctx := context.Background()
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		quoted := outputBlock.FindAllStringSubmatchIndex(text, -1)
		if n := strings.Count(text, "```text\nbulkhead demo"); n != len(quoted) {
			t.Errorf("%s: %d demo outputs, %d of them after a comment <!-- output of: bulkhead demo ARGS --> that says how to print them", file, n, len(quoted))
		}
		for i := len(quoted) - 1; i >= 0; i-- { // from the end, so that a rewrite keeps the earlier indices
			m := quoted[i]
			args := text[m[2]:m[3]]
			var out bytes.Buffer
			cfg := DefaultConfig()
			fs := flag.NewFlagSet("demo", flag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(strings.Fields(args)); err != nil {
				t.Fatalf("%s: bulkhead demo%s: %v", file, args, err)
			}
			if _, err := Run(ctx, cfg, &out); err != nil {
				t.Fatalf("%s: bulkhead demo%s: %v", file, args, err)
			}
			if shown := text[m[4]:m[5]]; shown != out.String() {
				if *updateGuide {
					text = text[:m[4]] + out.String() + text[m[5]:]
					continue
				}
				t.Errorf("%s shows another output of bulkhead demo%s than the demo prints (go test -run TestGuideQuotesTheDemo -update-guide rewrites it); it prints:\n%s", file, args, out.String())
			}
		}
		if *updateGuide {
			if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	path := filepath.Join(root, "docs", "demo.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	guide := string(data)
	// Every seed's table, run side by side (each run is a simulation of
	// its own, on one goroutine).
	tables := make([]*Table, guideSeeds)
	errs := make([]error, guideSeeds)
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i := range tables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cfg := DefaultConfig()
			cfg.Seed = uint64(i + 1)
			tables[i], errs[i] = RunTable(ctx, cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	// The seeds table: the lines after its comment, up to a blank line.
	const mark = "<!-- seeds table: TestGuideQuotesTheDemo -->\n"
	start := strings.Index(guide, mark)
	if start < 0 {
		t.Fatalf("%s has no %q", path, mark)
	}
	start += len(mark)
	end := start + strings.Index(guide[start:], "\n\n") + 1
	if want := seedsTable(tables); guide[start:end] != want {
		if *updateGuide {
			guide = guide[:start] + want + guide[end:]
			if err := os.WriteFile(path, []byte(guide), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Errorf("%s: the seeds table is not what the demo prints at seeds 1 to %d (go test -run TestGuideQuotesTheDemo -update-guide rewrites it); it is:\n%s", path, guideSeeds, want)
		}
	}

	// The prose: every phrase with its figures, and no figure besides.
	prose := proseOf(guide)
	for _, p := range guidePhrases(t, tables) {
		if !strings.Contains(prose, p) {
			t.Errorf("%s does not say %q: the demo's figures have changed, or the guide's words", path, p)
		}
		prose = strings.ReplaceAll(prose, p, "")
	}
	prose = regexp.MustCompile(`\b429|\b1%`).ReplaceAllString(prose, "") // a status, and the target
	for _, m := range regexp.MustCompile(`.{0,30}\b\d.{0,30}`).FindAllString(prose, -1) {
		t.Errorf("%s quotes a figure that no test checks: %q (compute it in guidePhrases)", path, m)
	}

	// The flags' defaults.
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cfg := DefaultConfig()
	cfg.RegisterFlags(fs)
	rows := regexp.MustCompile("(?m)^\\| (`-[^|]*) \\| ([^|]*) \\|").FindAllStringSubmatch(guide, -1)
	if len(rows) < 5 {
		t.Fatalf("%s: %d rows of flags", path, len(rows))
	}
	for _, row := range rows {
		names, defaults := strings.Split(row[1], ", "), strings.Split(row[2], ", ")
		if len(names) != len(defaults) {
			t.Errorf("%s: flags %s have defaults %s", path, row[1], row[2])
			continue
		}
		for i, name := range names {
			f := fs.Lookup(strings.Trim(name, "`-"))
			want := map[string]string{"all": "", "none": "0"}[defaults[i]]
			if want == "" && defaults[i] != "all" {
				want = defaults[i]
			}
			if f == nil || f.DefValue != want {
				t.Errorf("%s: flag %s: the guide says default %s, the flag %v", path, name, defaults[i], f)
			}
		}
	}
}

// proseOf is a guide's prose: its text without code blocks, tables and
// comments, on one line.
func proseOf(guide string) string {
	guide = regexp.MustCompile("(?s)```.*?```|<!--.*?-->").ReplaceAllString(guide, "")
	guide = regexp.MustCompile(`(?m)^\|.*$`).ReplaceAllString(guide, "")
	return strings.Join(strings.Fields(guide), " ")
}

// rowOf returns the row of t for the scenario key.
func rowOf(t *Table, key string) Row {
	for _, r := range t.Rows {
		if r.Key == key {
			return r
		}
	}
	panic("no row " + key)
}

// guidePhrases returns what docs/demo.md says with figures, each computed
// from the demo: its settings, the runs at the default seed (tables[0]),
// at every seed, and the adaptive + fair column without provider headroom
// (learning from 429s alone) on the capacity row.
func guidePhrases(t *testing.T, tables []*Table) []string {
	cfg := DefaultConfig()
	w, p := cfg.Workload, cfg.Provider
	var halves *scenario
	for _, sc := range scenarios(&cfg) {
		if sc.key == "capacity-halves" {
			halves = sc
		}
	}
	reqs, err := w.Generate(cfg.Seed, halves.tenants[0].calls)
	if err != nil {
		t.Fatal(err)
	}
	var cost int64
	for _, r := range reqs {
		cost += r.Cost()
	}
	load := float64(cost) / float64(len(reqs)) * float64(time.Minute) / float64(halves.tenants[0].every) / float64(cfg.ProviderTPM)

	alone := adaptiveFair()
	feedback := alone.feedback
	alone.feedback = func(pm *bulkhead.Permit, o providerOutcome, ra time.Duration, _ *bulkhead.Headroom) {
		feedback(pm, o, ra, nil)
	}
	noHeadroom, err := simulate(context.Background(), &cfg, halves, alone)
	if err != nil {
		t.Fatal(err)
	}

	t1 := tables[0]
	const bare, static, adaptive = 0, 1, 2
	at := func(key string, col int) TenantResult { return rowOf(t1, key).Results[col].Total }
	b50, b1000, cap, two := "burst-50", "burst-1000", "capacity-halves", "two-tenants"
	slowest := 0.0
	for _, key := range []string{b50, "burst-100", "burst-400", b1000} {
		slowest = max(slowest, float64(at(key, static).Latency.P50)/float64(at(key, bare).Latency.P50))
	}
	bursting := func(col int) float64 { return float64(rowOf(t1, two).Results[col].Tenants[1].Completed) }
	var allHold int
	var missed []string
	for i, tb := range tables {
		ok := true
		for _, c := range tb.Checks() {
			ok = ok && c.Holds
		}
		if ok {
			allHold++
		} else {
			missed = append(missed, fmt.Sprint(i+1))
		}
	}
	but := strings.Join(missed, ", ")
	if i := strings.LastIndex(but, ", "); i >= 0 {
		but = but[:i] + " and " + but[i+2:]
	}

	// What the runs show beside the figures the guide quotes.
	for _, key := range []string{b50, "burst-100"} {
		if a := at(key, adaptive); a.Completed != a.Calls {
			t.Errorf("%s: adaptive + fair completed %d of %d calls; the guide says every call", key, a.Completed, a.Calls)
		}
	}
	for _, key := range []string{b50, "burst-100", "burst-400", b1000} {
		if a := at(key, adaptive); a.Provider429 != 0 || key != b50 && a.Completed < 3*at(key, bare).Completed && key != "burst-100" {
			t.Errorf("%s: adaptive + fair met %d 429s and completed %d calls, bare %d; the guide says none, and several times bare's count in the larger bursts", key, a.Provider429, a.Completed, at(key, bare).Completed)
		}
	}
	if at(cap, bare).Provider429 < 100 || at(cap, static).Provider429 < 100 {
		t.Errorf("capacity row: bare met %d 429s, the static bulkhead %d; the guide says hundreds", at(cap, bare).Provider429, at(cap, static).Provider429)
	}

	return []string{
		fmt.Sprintf("prompts of ~%s tokens, `max_tokens` %d to %d", commas(w.InputMedian), w.MaxTokens[0], w.MaxTokens[len(w.MaxTokens)-1]),
		fmt.Sprintf("time to first token plus ~%s per output token", fmtDur(p.PerOutputToken)),
		fmt.Sprintf("%d concurrent requests and %s tokens per minute", cfg.ProviderConcurrency, commas(cfg.ProviderTPM)),
		fmt.Sprintf("exponential backoff with full jitter from %s, up to %d attempts", seconds(backoffBase), cfg.Attempts),
		fmt.Sprintf("the flags' `MaxConcurrent %d`, `MaxQueue %d`, `QueueTimeout %v`, `TokenBudget %s`", cfg.MaxConcurrent, cfg.MaxQueue, cfg.QueueTimeout, commas(cfg.TokenBudget)),
		fmt.Sprintf("spend %g%% of its tokens per minute at the workload's average cost and ~%s per call", provisionalShare*100, fmtDur(provisionalLatency)),
		fmt.Sprintf("bare completes %s calls of a burst of 1,000", commas(int64(at(b1000, bare).Completed))),
		fmt.Sprintf("at up to %.1f times bare's median latency", slowest),
		fmt.Sprintf("at a burst of 50 its median call took %s against bare's %s", fmtDur(at(b50, adaptive).Latency.P50), fmtDur(at(b50, bare).Latency.P50)),
		fmt.Sprintf("at a burst of 1,000 a p99 of %s", fmtDur(at(b1000, adaptive).Latency.P99)),
		fmt.Sprintf("under a load of ~%.0f%% of the full account", load*100),
		fmt.Sprintf("%d 429s against bare's %s (with 429s alone it met %d)", at(cap, adaptive).Provider429, commas(int64(at(cap, bare).Provider429)), noHeadroom.Total.Provider429),
		fmt.Sprintf("more completed calls than bare (%d against %d)", at(cap, adaptive).Completed, at(cap, bare).Completed),
		fmt.Sprintf("the clients' %d attempts", cfg.Attempts),
		fmt.Sprintf("fewer calls than with 429s alone (%d), at a lower p99 (%s against %s)", noHeadroom.Total.Completed, fmtDur(at(cap, adaptive).Latency.P99), fmtDur(noHeadroom.Total.Latency.P99)),
		fmt.Sprintf("the bursting tenant still completes %.1f times bare's count", bursting(adaptive)/bursting(bare)),
		fmt.Sprintf("Over seeds 1 to %d every target holds at %d of them (all but %s)", guideSeeds, allHold, but),
		fmt.Sprintf("one burst (%d calls over %s)", gatewayCalls, cfg.Ramp),
		fmt.Sprintf("(`-time-scale`, default %g, runs it %g times faster)", cfg.TimeScale, 1/cfg.TimeScale),
		fmt.Sprintf("(`-retries`, default %d)", cfg.Retries),
		retryPhrase(t1),
	}
}

// retryPhrase is what docs/demo.md says of the retries line (see
// Table.retrySentence).
func retryPhrase(t *Table) string {
	without, with := t.Retries[0], t.Retries[1]
	return fmt.Sprintf("the bulkhead refused %d retries at once, and the provider saw %d attempts instead of %d (%d 429s instead of %d), "+
		"at the price of %d completed calls instead of %d",
		with.Bulkheads[0].Calls.RejectedByReason[bulkhead.RetryBudget], with.Provider.Requests, without.Provider.Requests,
		with.Total.Provider429, without.Total.Provider429, with.Total.Completed, without.Total.Completed)
}

// seedsTable is the table of docs/demo.md that shows, for each seed, the
// figures of the rows that decide whether the adaptive + fair column's
// targets hold, in bold where one does not.
func seedsTable(tables []*Table) string {
	var b strings.Builder
	b.WriteString("| seed | targets that hold | capacity halves at 1m: provider 429s (bare) | calls done (bare) | two tenants: the quiet tenant's p99 (alone) | burst of 1,000: calls done (bare) |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for i, tb := range tables {
		checks := tb.Checks()
		failed := map[string]bool{} // by row and target: "capacity halves at 1m/0"
		held := 0
		n := map[string]int{}
		for _, c := range checks {
			if c.Holds {
				held++
			} else {
				failed[fmt.Sprintf("%s/%d", c.Row, n[c.Row])] = true
			}
			n[c.Row]++
		}
		cell := func(key string, target int, figure, beside string) string {
			if failed[fmt.Sprintf("%s/%d", rowOf(tb, key).Scenario, target)] {
				figure = "**" + figure + "**"
			}
			return figure + " (" + beside + ")"
		}
		holds := fmt.Sprintf("%d of %d", held, len(checks))
		if held == len(checks) {
			holds = fmt.Sprintf("all %d", held)
		}
		last := len(tb.Strategies) - 1
		halves, two, burst := rowOf(tb, "capacity-halves"), rowOf(tb, "two-tenants"), rowOf(tb, "burst-1000")
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", i+1, holds,
			cell("capacity-halves", 1, commas(int64(halves.Results[last].Total.Provider429)), commas(int64(halves.Results[0].Total.Provider429))),
			cell("capacity-halves", 0, commas(int64(halves.Results[last].Total.Completed)), commas(int64(halves.Results[0].Total.Completed))),
			cell("two-tenants", 2, fmtDur(two.Results[last].Tenants[quiet].Latency.P99), fmtDur(two.Unloaded[last].Tenants[quiet].Latency.P99)),
			cell("burst-1000", 0, commas(int64(burst.Results[last].Total.Completed)), commas(int64(burst.Results[0].Total.Completed))))
	}
	return b.String()
}
