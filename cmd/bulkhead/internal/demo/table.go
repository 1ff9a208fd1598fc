package demo

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/llmbulkhead/bulkhead"
)

// Table is the demo's table: one row per scenario, one column per
// strategy.
type Table struct {
	// Config is the configuration the table ran with.
	Config Config
	// Strategies names the columns: bare, static bulkhead, adaptive + fair.
	Strategies []string
	// Configs describes each column's bulkheads, one line for one tenant
	// and, when they differ, a second for several.
	Configs []string
	// Rows are the scenarios, in order.
	Rows []Row
	// Retries is the retries sentence's two runs (see retryStrategies),
	// without and with a retry budget, of the row storyRow; nil when the
	// table does not run that row.
	Retries  []SimResult
	storyRow string
}

// Row is one scenario's runs.
type Row struct {
	// Scenario is the scenario's label; Key its -scenario name.
	Scenario, Key string
	// Results is each strategy's run, in column order.
	Results []SimResult
	// Unloaded, for a scenario with a quiet tenant, is each strategy's run
	// of the quiet tenant alone; nil otherwise.
	Unloaded []SimResult
}

// RunTable runs every scenario cfg asks for under every strategy, each on
// a simulation of its own, and returns the table. It returns early with
// ctx's error when ctx ends.
func RunTable(ctx context.Context, cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	scs, err := pickScenarios(&cfg)
	if err != nil {
		return nil, err
	}
	sts := strategies()
	t := &Table{Config: cfg}
	for _, st := range sts {
		t.Strategies = append(t.Strategies, st.name)
		about := describe(st.bulkheads(&cfg, scs[0]))
		for _, sc := range scs {
			if len(sc.tenants) > 1 {
				if d := describe(st.bulkheads(&cfg, sc)); d != about {
					about += fmt.Sprintf("\nwith %d tenants: %s", len(sc.tenants), d)
				}
				break
			}
		}
		t.Configs = append(t.Configs, about)
	}
	for _, sc := range scs {
		row := Row{Scenario: sc.name, Key: sc.key}
		for _, st := range sts {
			res, err := simulate(ctx, &cfg, sc, st)
			if err != nil {
				return nil, err
			}
			row.Results = append(row.Results, res)
			if sc.unloaded != nil {
				un, err := simulate(ctx, &cfg, sc.unloaded, st)
				if err != nil {
					return nil, err
				}
				row.Unloaded = append(row.Unloaded, un)
			}
		}
		t.Rows = append(t.Rows, row)
		if sc.key == retryStory && cfg.Calls == 0 {
			t.storyRow = sc.name
			for _, st := range retryStrategies() {
				res, err := simulate(ctx, &cfg, sc, st)
				if err != nil {
					return nil, err
				}
				t.Retries = append(t.Retries, res)
			}
		}
	}
	return t, nil
}

// retrySentence says, in one sentence, what a retry budget did to the
// retries run (t.Retries).
func (t *Table) retrySentence() string {
	without, with := t.Retries[0], t.Retries[1]
	b := storyBudget.Bulkhead
	refused := with.Bulkheads[0].Calls.RejectedByReason[bulkhead.RetryBudget]
	return fmt.Sprintf("Retries: with clients that retry as the official SDKs do (twice, backing off 0.5s then 1s with jitter, "+
		"and never after x-should-retry: false), the static bulkhead in the row %q sent the provider %s (%s answered 429) "+
		"and completed %s; with a retry budget of %g of the first attempts (at least %d per %v), it refused %s %s at once, "+
		"sent the provider %s (%s answered 429) and completed %s.\n",
		t.storyRow, count(without.Provider.Requests, "attempt"), commas(int64(without.Total.Provider429)), count(int64(without.Total.Completed), "call"),
		b.Ratio, b.MinRetries, bulkhead.DefaultRetryWindow, commas(refused), map[bool]string{true: "retry", false: "retries"}[refused == 1],
		commas(with.Provider.Requests), commas(int64(with.Total.Provider429)), commas(int64(with.Total.Completed)))
}

// describe summarises a strategy's bulkheads for the table's header.
func describe(cfgs []bulkhead.Config, route []int) string {
	if len(cfgs) == 0 {
		return "no bulkhead: every call goes straight to the provider"
	}
	bc := &cfgs[0]
	s := ""
	if len(cfgs) > 1 && len(cfgs) == len(route) {
		s = "a bulkhead per tenant, each "
	}
	s += fmt.Sprintf("MaxConcurrent %d, MaxQueue %d, QueueTimeout %v", bc.MaxConcurrent, bc.MaxQueue, bc.QueueTimeout)
	if bc.TokenBudget != nil {
		s += ", TokenBudget " + commas(bc.TokenBudget.Budget)
	} else {
		s += ", no token budget"
	}
	if a := bc.Adaptive; a != nil {
		s += fmt.Sprintf(", adaptive (%v, cool-down %v)", a.Rule, a.Cooldown)
	}
	if bc.Classes != nil {
		s += ", a class per tenant"
		for _, l := range bc.Classes.Limits {
			if l.ProtectedConcurrent > 0 {
				s += fmt.Sprintf(" (%s protected each)", count(int64(l.ProtectedConcurrent), "slot"))
			}
			break
		}
		if bc.Queue.Fair {
			s += ", fair queue"
		}
		if bc.Queue.WaitForCapacity {
			s += ", waits for capacity"
		}
	}
	return s
}

// printTable writes the table, its legend and its verdict.
func printTable(w io.Writer, t *Table) {
	c := &t.Config
	fmt.Fprintf(w, "bulkhead demo: LLM calls against a simulated provider account, on simulated time (seed %d)\n\n", c.Seed)
	fmt.Fprintf(w, "  provider  %s concurrent requests, %s tokens/min (input + max_tokens, sliding window); 429 above either\n",
		limit(int64(c.ProviderConcurrency)), limit(c.ProviderTPM))
	fmt.Fprintf(w, "  workload  prompts ~%s tokens (median), max_tokens %s\n", commas(c.Workload.InputMedian), joinInts(c.Workload.MaxTokens, "/"))
	fmt.Fprintf(w, "  clients   try a call up to %s; a provider 429 and a bulkhead rejection are retried alike:\n", count(int64(c.Attempts), "time"))
	fmt.Fprintf(w, "            after Retry-After when given, else after a backoff from %s with full jitter\n", seconds(backoffBase))
	for i, name := range t.Strategies {
		for _, line := range strings.Split(t.Configs[i], "\n") {
			fmt.Fprintf(w, "  %-16s%s\n", name, line)
			name = ""
		}
	}
	fmt.Fprintln(w)

	// Each strategy's cells: completed, provider 429s, p50 / p99 of the
	// successes, tokens per minute used / peak of the TPM window.
	head := []string{"done", "429s", "p50 / p99", "TPM used/peak"}
	lines := [][]string{}
	for _, row := range t.Rows {
		line := []string{row.Scenario, commas(int64(row.Results[0].Total.Calls))}
		for _, r := range row.Results {
			line = append(line, cells(r.Total, kilo(r.TPM)+" / "+kilo(r.PeakWindow))...)
		}
		lines = append(lines, line)
		if row.Unloaded == nil {
			continue
		}
		q := []string{"  quiet tenant", commas(int64(row.Results[0].Tenants[quiet].Calls))}
		for i, r := range row.Results {
			q = append(q, cells(r.Tenants[quiet], "p99 alone "+fmtDur(row.Unloaded[i].Tenants[quiet].Latency.P99))...)
		}
		lines = append(lines, q)
	}
	widths := make([]int, 2+len(head)*len(t.Strategies))
	widths[0], widths[1] = len("scenario"), len("calls")
	for j := range len(widths) - 2 {
		widths[2+j] = len(head[j%len(head)])
	}
	for _, l := range lines {
		for j, cell := range l {
			widths[j] = max(widths[j], len([]rune(cell)))
		}
	}
	group := func(k int) int { // width of strategy k's cells
		n := 0
		for j := range head {
			n += widths[2+k*len(head)+j] + 2
		}
		return n - 2
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  %-*s  %*s", widths[0], "", widths[1], "")
	for k, name := range t.Strategies {
		fmt.Fprintf(&b, "  | %-*s", group(k), name)
	}
	b.WriteString("\n")
	writeLine := func(l []string) {
		fmt.Fprintf(&b, "  %-*s  %*s", widths[0], l[0], widths[1], l[1])
		for j, cell := range l[2:] {
			sep := "  "
			if j%len(head) == 0 {
				sep = "  | "
			}
			fmt.Fprintf(&b, "%s%*s", sep, widths[2+j]+len(cell)-len([]rune(cell)), cell)
		}
		b.WriteString("\n")
	}
	hl := []string{"scenario", "calls"}
	for range t.Strategies {
		hl = append(hl, head...)
	}
	writeLine(hl)
	for _, l := range lines {
		writeLine(l)
	}
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	fmt.Fprintf(w, "\n  done: calls completed; 429s: every provider 429, retries included; p50 / p99: latency of the\n")
	fmt.Fprintf(w, "  completed calls, first attempt to answer; TPM used: input + output tokens of the completed calls\n")
	fmt.Fprintf(w, "  per minute of the run (a run shorter than a minute counts as one); peak: the most the provider's\n")
	fmt.Fprintf(w, "  TPM window held (input + max_tokens, as it counts them), against the account's %s.\n\n", kilo(c.ProviderTPM))
	fmt.Fprint(w, t.Verdict())
	if t.Retries != nil {
		fmt.Fprint(w, "\n"+t.retrySentence())
	}
}

// cells formats a tenant's result as one strategy's cells; last is the
// fourth.
func cells(r TenantResult, last string) []string {
	return []string{commas(int64(r.Completed)), commas(int64(r.Provider429)), lat(r.Latency), last}
}

// kilo formats a token count in thousands: 61k, 1.2k, 0.
func kilo(v int64) string {
	if v < 1000 {
		return commas(v)
	}
	return fmt.Sprintf("%gk", roundSig(float64(v)/1000))
}

// Check is one target of the verdict, for one row.
type Check struct {
	// Row is the scenario's label.
	Row string
	// What is the target in plain words, with the numbers it was judged on.
	What string
	// Holds reports whether the numbers meet the target.
	Holds bool
}

// Checks judges the last column (adaptive + fair) against bare, row by
// row: at least as many calls completed, provider 429s under 1% of bare's,
// and the quiet tenant's p99 within twice its p99 alone.
func (t *Table) Checks() []Check {
	var out []Check
	last := len(t.Strategies) - 1
	name := t.Strategies[last]
	for _, row := range t.Rows {
		bare, a := row.Results[0].Total, row.Results[last].Total
		out = append(out, Check{Row: row.Scenario, Holds: a.Completed >= bare.Completed,
			What: fmt.Sprintf("%s completed %s, bare %s", name, count(int64(a.Completed), "call"), commas(int64(bare.Completed)))})
		// Under 1% of bare's: none at all when bare had none.
		ok := a.Provider429*100 < bare.Provider429 || a.Provider429 == 0
		out = append(out, Check{Row: row.Scenario, Holds: ok,
			What: fmt.Sprintf("%s against bare's %s (the target is under 1%%)", count(int64(a.Provider429), "provider 429"), commas(int64(bare.Provider429)))})
		if row.Unloaded != nil {
			p99, alone := row.Results[last].Tenants[quiet].Latency.P99, row.Unloaded[last].Tenants[quiet].Latency.P99
			out = append(out, Check{Row: row.Scenario, Holds: p99 <= 2*alone,
				What: fmt.Sprintf("the quiet tenant's p99 is %s, against %s alone (the target is at most twice)", fmtDur(p99), fmtDur(alone))})
		}
	}
	return out
}

// Verdict says, in plain words, what each column bought against bare in
// each row, and what it cost (the provider 429s it avoided, the calls it
// finished, the latency its calls paid), then whether the last column's
// targets hold (see Checks).
func (t *Table) Verdict() string {
	var s strings.Builder
	s.WriteString("Verdict: what each column bought against bare, and what it cost:\n")
	for _, row := range t.Rows {
		fmt.Fprintf(&s, "  %s\n", row.Scenario)
		bare := row.Results[0].Total
		for i, r := range row.Results[1:] {
			fmt.Fprintf(&s, "    %s: %s\n", t.Strategies[i+1], tradeoff(r.Total, bare))
		}
	}
	s.WriteString("  A median counts the finished calls only: a call that did not finish failed after its last attempt, and is in none.\n")

	checks := t.Checks()
	failed := 0
	for _, c := range checks {
		if !c.Holds {
			failed++
		}
	}
	name := t.Strategies[len(t.Strategies)-1]
	switch {
	case failed == 0:
		fmt.Fprintf(&s, "Targets for %s, against bare: every one holds, in every row:\n", name)
	case failed == 1:
		fmt.Fprintf(&s, "Targets for %s, against bare: 1 of %d does not hold:\n", name, len(checks))
	default:
		fmt.Fprintf(&s, "Targets for %s, against bare: %d of %d do not hold:\n", name, failed, len(checks))
	}
	for _, c := range checks {
		mark := "holds:        "
		if !c.Holds {
			mark = "DOES NOT HOLD:"
		}
		fmt.Fprintf(&s, "  %s %s: %s\n", mark, c.Row, c.What)
	}
	return s.String()
}

// tradeoff says what r bought against bare, and what it cost: the
// provider 429s it avoided, the calls it finished, and the median latency
// of its finished calls.
func tradeoff(r, bare TenantResult) string {
	var avoided string
	switch a, b := int64(r.Provider429), int64(bare.Provider429); {
	case b == 0 && a == 0:
		avoided = "met no provider 429, nor did bare"
	case b == 0:
		avoided = "met " + count(a, "provider 429") + ", where bare met none"
	case a == 0:
		avoided = "avoided all " + commas(b) + " of bare's " + noun(b, "provider 429")
	case a < b:
		avoided = fmt.Sprintf("avoided %s of bare's %s (it met %s)", commas(b-a), count(b, "provider 429"), commas(a))
	default:
		avoided = fmt.Sprintf("avoided none of bare's %s (it met %s)", count(b, "provider 429"), commas(a))
	}
	var finished string
	switch c, d := int64(r.Completed), int64(bare.Completed); {
	case c == d:
		finished = fmt.Sprintf("finished as many calls as bare (%s)", commas(c))
	case c > d:
		finished = fmt.Sprintf("finished %s more %s than bare (%s against %s)", commas(c-d), noun(c-d, "call"), commas(c), commas(d))
	default:
		finished = fmt.Sprintf("finished %s fewer %s than bare (%s against %s)", commas(d-c), noun(d-c, "call"), commas(c), commas(d))
	}
	s := avoided + "; " + finished
	switch p, q := r.Latency.P50, bare.Latency.P50; {
	case r.Latency.N == 0:
	case bare.Latency.N == 0:
		s += fmt.Sprintf("; its median finished call took %s (bare finished none)", fmtDur(p))
	case p*10 > q*11:
		s += fmt.Sprintf("; its median finished call took %s, %.1f times bare's %s", fmtDur(p), float64(p)/float64(q), fmtDur(q))
	case p*10 < q*9:
		s += fmt.Sprintf("; its median finished call took %s, less than bare's %s", fmtDur(p), fmtDur(q))
	default:
		s += fmt.Sprintf("; its median finished call took %s, about as long as bare's %s", fmtDur(p), fmtDur(q))
	}
	return s + "."
}
