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
	}
	return t, nil
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
				s += fmt.Sprintf(" (%d slots protected each)", l.ProtectedConcurrent)
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
	fmt.Fprintf(w, "  clients   try a call up to %d times; a provider 429 and a bulkhead rejection are retried alike:\n", c.Attempts)
	fmt.Fprintf(w, "            after Retry-After when given, else after a backoff from 0.5s with full jitter\n")
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
	fmt.Fprint(w, tableVerdict(t))
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
			What: fmt.Sprintf("%s completed %s calls, bare %s", name, commas(int64(a.Completed)), commas(int64(bare.Completed)))})
		// Under 1% of bare's: none at all when bare had none.
		ok := a.Provider429*100 < bare.Provider429 || a.Provider429 == 0
		out = append(out, Check{Row: row.Scenario, Holds: ok,
			What: fmt.Sprintf("%s provider 429s against bare's %s (the target is under 1%%)", commas(int64(a.Provider429)), commas(int64(bare.Provider429)))})
		if row.Unloaded != nil {
			p99, alone := row.Results[last].Tenants[quiet].Latency.P99, row.Unloaded[last].Tenants[quiet].Latency.P99
			out = append(out, Check{Row: row.Scenario, Holds: p99 <= 2*alone,
				What: fmt.Sprintf("the quiet tenant's p99 is %s, against %s alone (the target is at most twice)", fmtDur(p99), fmtDur(alone))})
		}
	}
	return out
}

// tableVerdict says, in plain words and row by row, whether the targets hold.
func tableVerdict(t *Table) string {
	var s strings.Builder
	checks := t.Checks()
	failed := 0
	for _, c := range checks {
		if !c.Holds {
			failed++
		}
	}
	name := t.Strategies[len(t.Strategies)-1]
	if failed == 0 {
		fmt.Fprintf(&s, "Verdict: every target holds for %s, in every row:\n", name)
	} else {
		fmt.Fprintf(&s, "Verdict: %d of %d targets do not hold for %s:\n", failed, len(checks), name)
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
