package demo

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// printHeader describes gateway mode's burst, account and gateway.
func printHeader(w io.Writer, c *Config, reqs []simprovider.Request) {
	var cost int64
	inputs := make([]int64, len(reqs))
	for i, r := range reqs {
		cost += r.Cost()
		inputs[i] = r.InputTokens
	}
	slices.Sort(inputs)
	fmt.Fprintf(w, "bulkhead demo: a burst of %s arriving over %v, at a simulated provider\n\n",
		count(int64(c.Calls), c.Model+" call"), c.Ramp)
	fmt.Fprintf(w, "  workload  prompts %s tokens (median), max_tokens %s; %s tokens per call on average (input + max_tokens)\n",
		commas(inputs[len(inputs)/2]), joinInts(c.Workload.MaxTokens, "/"), commas(cost/int64(len(reqs))))
	fmt.Fprintf(w, "  provider  %s concurrent requests, %s tokens/min (input + max_tokens, sliding window); 429 above either\n",
		limit(int64(c.ProviderConcurrency)), limit(c.ProviderTPM))
	budget := "no token budget"
	if c.TokenBudget > 0 {
		budget = "TokenBudget " + commas(c.TokenBudget)
	}
	fmt.Fprintf(w, "  bulkhead  MaxConcurrent %d, MaxQueue %d, QueueTimeout %v, %s\n",
		c.MaxConcurrent, c.MaxQueue, c.QueueTimeout, budget)
	fmt.Fprintf(w, "  clients   retry a 429 up to %s, backoff 0.5s, 1s, 2s ... with jitter (SDK defaults)\n", count(int64(c.Retries), "time"))
	fmt.Fprintf(w, "  gateway   the guarded pass goes over HTTP: clients -> gateway -> the provider served on loopback\n")
	fmt.Fprintf(w, "  time      over real HTTP, on the wall clock (not simulated time), at scale %g: simulated durations run %gx faster; latencies below are wall-clock\n\n",
		c.TimeScale, roundSig(1/c.TimeScale))
}

// row is one line of the comparison: a label and the two columns.
type row struct{ label, bare, guard string }

func printComparison(w io.Writer, rep *Report) {
	b, g := &rep.Bare, &rep.Guard
	c := &rep.Config
	n := func(v int) string { return commas(int64(v)) }
	rows := []row{
		{"calls sent", n(b.Calls), n(g.Calls)},
		{"completed OK", n(b.OK), n(g.OK)},
		{"failed: provider 429 after retries", n(b.Failed429), n(g.Failed429)},
		{"shed by the bulkhead", "-", n(g.Shed)},
	}
	for _, r := range shedReasons(g.ShedByReason) {
		rows = append(rows, row{"  " + r.String(), "-", commas(g.ShedByReason[r])})
	}
	if b.Failed+g.Failed > 0 {
		rows = append(rows, row{"failed otherwise", n(b.Failed), n(g.Failed)})
	}
	bp, gp := &b.Provider, &g.Provider
	rows = append(rows,
		row{"provider requests (with retries)", commas(bp.Requests), commas(gp.Requests)},
		row{"provider 429s", commas(bp.RateLimited), commas(gp.RateLimited)},
		row{"  over the concurrency limit", commas(bp.RateLimitedConcurrency), commas(gp.RateLimitedConcurrency)},
		row{"  over tokens per minute", commas(bp.RateLimitedTokens), commas(gp.RateLimitedTokens)},
		row{"latency of OK calls p50 / p99", lat(b.OKLatency), lat(g.OKLatency)},
		row{"latency of failed calls p50 / p99", lat(b.FailLatency), lat(g.FailLatency)},
	)
	if g.Failed429+g.Failed > 0 {
		rows = append(rows, row{"  of bulkhead rejections", "-", lat(g.ShedLatency)})
	}
	rows = append(rows,
		row{"peak calls in flight at provider", ofLimit(int64(bp.PeakInFlight), int64(c.ProviderConcurrency)), ofLimit(int64(gp.PeakInFlight), int64(c.ProviderConcurrency))},
		row{"peak tokens in flight at provider", commas(bp.PeakInFlightTokens), commas(gp.PeakInFlightTokens)},
		row{"peak tokens in the TPM window", ofLimit(bp.PeakWindowTokens, c.ProviderTPM), ofLimit(gp.PeakWindowTokens, c.ProviderTPM)},
		row{"wall time", fmtDur(b.Wall), fmtDur(g.Wall)},
	)
	lw, bw, gw := 0, len("bare"), len(g.Name)
	for _, r := range rows {
		lw, bw, gw = max(lw, len(r.label)), max(bw, len(r.bare)), max(gw, len(r.guard))
	}
	fmt.Fprintf(w, "  %-*s   %*s   %*s\n", lw, "", bw, "bare", gw, g.Name)
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s   %*s   %*s\n", lw, r.label, bw, r.bare, gw, r.guard)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, verdict(rep))
}

// verdict is the plain-words conclusion.
func verdict(rep *Report) string {
	b, g := &rep.Bare, &rep.Guard
	var s strings.Builder
	fmt.Fprintf(&s, "Bare: the burst became a storm of %s (%.1f per call sent); %s still failed after retrying, each after %s (p50).\n",
		count(b.Provider.RateLimited, "provider 429"), float64(b.Provider.RateLimited)/float64(b.Calls), count(int64(b.Failed429), "call"), fmtDur(b.FailLatency.P50))
	var reasons []string
	for _, r := range shedReasons(g.ShedByReason) {
		reasons = append(reasons, fmt.Sprintf("%s %s", r, commas(g.ShedByReason[r])))
	}
	fmt.Fprintf(&s, "Through the gateway (over HTTP): %s shed before reaching the provider, in %s (p50), with typed reasons (%s);\n",
		count(int64(g.Shed), "excess call"), fmtDur(g.ShedLatency.P50), strings.Join(reasons, ", "))
	fmt.Fprintf(&s, "the provider answered %s and completed %s (bare: %s).\n",
		count(g.Provider.RateLimited, "429"), count(int64(g.OK), "call"), commas(int64(b.OK)))
	return s.String()
}

// shedReasons returns the reasons with a non-zero count, most frequent
// first.
func shedReasons(m map[bulkhead.Reason]int64) []bulkhead.Reason {
	var rs []bulkhead.Reason
	for r, v := range m {
		if v > 0 {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b bulkhead.Reason) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return int(a) - int(b)
	})
	return rs
}

func lat(l Latencies) string {
	if l.N == 0 {
		return "-"
	}
	return fmtDur(l.P50) + " / " + fmtDur(l.P99)
}

func ofLimit(v, lim int64) string {
	if lim <= 0 {
		return commas(v)
	}
	return commas(v) + " / " + commas(lim)
}

func limit(v int64) string {
	if v <= 0 {
		return "unlimited"
	}
	return commas(v)
}

// seconds formats d in seconds: 0.5s, 2s.
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// fmtDur formats d with three significant digits: 4.2µs, 310ms, 2.35s.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "ns"
	case d < time.Millisecond:
		return strconv.FormatFloat(roundSig(float64(d)/1e3), 'f', -1, 64) + "µs"
	case d < time.Second:
		return strconv.FormatFloat(roundSig(float64(d)/1e6), 'f', -1, 64) + "ms"
	default:
		return strconv.FormatFloat(roundSig(float64(d)/1e9), 'f', -1, 64) + "s"
	}
}

// roundSig rounds v to three significant digits.
func roundSig(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	return f
}

// count is v with thousands separators and noun, plural unless v is 1:
// "1 call", "5,707 provider 429s".
func count(v int64, n string) string {
	return commas(v) + " " + noun(v, n)
}

// noun is n, plural (with an s) unless v is 1.
func noun(v int64, n string) string {
	if v != 1 {
		return n + "s"
	}
	return n
}

// commas formats v with thousands separators.
func commas(v int64) string {
	s := strconv.FormatInt(v, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	return b.String()
}

func joinInts(vs []int64, sep string) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, sep)
}
