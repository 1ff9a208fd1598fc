package bulkhead_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
)

// TestStreamingLedger replays the reference's probed streaming ledger:
// reserve 100 + 200, report, a stale report, an overrun, a progressive
// hold, release.
func TestStreamingLedger(t *testing.T) {
	b := budgetBulkhead(t, 4, 10_000, 0)
	var usages []bulkhead.UsageEvent
	var releases []bulkhead.ReleaseEvent
	b.Subscribe(bulkhead.Hooks{
		Usage:   func(e bulkhead.UsageEvent) { usages = append(usages, e) },
		Release: func(e bulkhead.ReleaseEvent) { releases = append(releases, e) },
	})
	tok := mustAcquire(t, b, req("a", 0), override(100, 200))

	steps := []struct {
		u        bulkhead.Usage
		p        *bulkhead.Progressive
		seq      int64
		held     int64
		consumed int64
	}{
		{bulkhead.Usage{Input: 60}, nil, 1, 260, 60},
		{bulkhead.Usage{Input: 50}, nil, 1, 260, 60}, // stale: clamped, no change
		{bulkhead.Usage{Input: 60, Output: 250}, nil, 2, 310, 310},
		{bulkhead.Usage{Input: 60, Output: 250}, &bulkhead.Progressive{SafetyMargin: 10}, 3, 60, 310},
	}
	for i, s := range steps {
		rep, err := tok.ReportUsage(s.u, s.p)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if rep.Sequence != s.seq || rep.Held != s.held || rep.Consumed != s.consumed || rep.Reserved != 300 {
			t.Fatalf("step %d: report = %+v", i, rep)
		}
		if rep.OutputCap == nil || *rep.OutputCap != 200 || rep.OutputRemaining == nil {
			t.Fatalf("step %d: output cap = %v", i, rep.OutputCap)
		}
	}
	if st := b.Stats().TokenBudget; st.InFlightTokens != 60 || st.TotalOverrun != 50 {
		t.Fatalf("mid-stream ledger = %+v", st)
	}
	if err := tok.Release(nil); err != nil {
		t.Fatal(err)
	}
	after, err := tok.ReportUsage(bulkhead.Usage{Input: 70, Output: 250}, nil)
	if err != nil || after.Held != 0 || after.Sequence != 3 || after.Consumed != 320 {
		t.Fatalf("report after release = %+v, %v", after, err)
	}
	closeAndDrain(t, b)

	st := b.Stats().TokenBudget
	want := bulkhead.BudgetStats{Budget: 10_000, Available: 10_000, TotalReserved: 300, TotalConsumed: 310, TotalRefunded: 290, TotalOverrun: 50}
	if *st != want {
		t.Fatalf("ledger = %+v, want %+v", *st, want)
	}
	if len(usages) != 3 || usages[0].Delta != -40 || usages[1].Delta != 50 || usages[2].Delta != -250 || usages[2].Progressive == nil {
		t.Fatalf("usage events = %+v", usages)
	}
	if len(releases) != 1 || releases[0].Held != 60 || releases[0].Refunded != 0 || releases[0].UsageSequence != 3 {
		t.Fatalf("release event = %+v", releases)
	}
	// The ledger identity: reserved + overrun - early refunds == holds at
	// release + in flight. Early refunds here are 40 + 250.
	if st.TotalReserved+st.TotalOverrun-290 != releases[0].Held+st.InFlightTokens {
		t.Fatalf("ledger identity broken: %+v", st)
	}
}

func TestReportUsageValidation(t *testing.T) {
	b := budgetBulkhead(t, 4, 10_000, 0)
	tok := mustAcquire(t, b, req("a", 0), override(10, 20))
	if _, err := tok.ReportUsage(bulkhead.Usage{Output: -1}, nil); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative usage: %v", err)
	}
	if _, err := tok.ReportUsage(bulkhead.Usage{}, &bulkhead.Progressive{RemainingOutput: 21}); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("remaining over the reservation: %v", err)
	}
	if _, err := tok.ReportUsage(bulkhead.Usage{}, &bulkhead.Progressive{SafetyMargin: -1}); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative margin: %v", err)
	}
	// The last report is the final usage when release names none.
	if _, err := tok.ReportUsage(bulkhead.Usage{Input: 10, Output: 5}, nil); err != nil {
		t.Fatal(err)
	}
	_ = tok.Release(nil)
	if st := b.Stats().TokenBudget; st.TotalConsumed != 15 || st.TotalRefunded != 15 || st.InFlightTokens != 0 {
		t.Fatalf("ledger = %+v", st)
	}
}

func TestReportUsageWithoutBudget(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	tok := mustAcquire(t, b, req("a", 0))
	rep, err := tok.ReportUsage(bulkhead.Usage{Input: 5}, nil)
	if err != nil || rep.Sequence != 1 || rep.Held != 0 || rep.OutputCap != nil {
		t.Fatalf("report = %+v, %v", rep, err)
	}
	_ = tok.Release(nil)
}

// TestUsageBreakdownValidation: the breakdown fields are non-negative and
// parts of their totals, checked without overflow, by Release, ReportUsage
// and SetUsage alike; an invalid usage records nothing.
func TestUsageBreakdownValidation(t *testing.T) {
	tests := []struct {
		name    string
		u       bulkhead.Usage
		field   string // "" when valid
		problem string // the exact problem, "" to skip the check
	}{
		{"no breakdown", bulkhead.Usage{Input: 10, Output: 5}, "", ""},
		{"parts equal the totals", bulkhead.Usage{Input: 1000, Output: 50, CachedInput: 600, CacheCreation: 400, Reasoning: 50}, "", ""},
		{"parts below the totals", bulkhead.Usage{Input: 1000, Output: 50, CachedInput: 1, CacheCreation: 2, Reasoning: 3}, "", ""},
		{"all cached at int64 max", bulkhead.Usage{Input: top, CachedInput: top}, "", ""},
		{"parts summing to int64 max", bulkhead.Usage{Input: top, CachedInput: top - 1, CacheCreation: 1}, "", ""},
		{"negative cached input", bulkhead.Usage{Input: 10, CachedInput: -1}, "Usage.CachedInput", "must be >= 0, got -1"},
		{"negative cache creation", bulkhead.Usage{Input: 10, CacheCreation: -2}, "Usage.CacheCreation", "must be >= 0, got -2"},
		{"negative reasoning", bulkhead.Usage{Output: 10, Reasoning: -3}, "Usage.Reasoning", "must be >= 0, got -3"},
		{"cached + creation above input", bulkhead.Usage{Input: 1000, CachedInput: 700, CacheCreation: 400}, "Usage.CachedInput",
			"CachedInput + CacheCreation must not exceed Input (700 + 400 > 1000)"},
		{"cached alone above input", bulkhead.Usage{Input: 10, CachedInput: 11}, "Usage.CachedInput", ""},
		{"creation alone above input", bulkhead.Usage{Input: 10, CacheCreation: 11}, "Usage.CachedInput", ""},
		{"parts wrapping to a negative sum", bulkhead.Usage{Input: top, CachedInput: top, CacheCreation: top}, "Usage.CachedInput", ""},
		{"parts wrapping to int64 min", bulkhead.Usage{Input: top, CachedInput: top, CacheCreation: 1}, "Usage.CachedInput", ""},
		{"parts one past int64 max", bulkhead.Usage{Input: top - 1, CachedInput: top - 1, CacheCreation: 1}, "Usage.CachedInput", ""},
		{"reasoning above output", bulkhead.Usage{Output: 5, Reasoning: 6}, "Usage.Reasoning", "Reasoning must not exceed Output (6 > 5)"},
		{"reasoning without output", bulkhead.Usage{Input: 5, Reasoning: 1}, "Usage.Reasoning", ""},
		{"totals checked first", bulkhead.Usage{Input: -1, CachedInput: 5}, "Usage.Input", ""},
		{"sum checked first", bulkhead.Usage{Input: top, Output: 1, Reasoning: 2}, "Usage", ""},
	}
	check := func(t *testing.T, what string, err error, field, problem string) {
		t.Helper()
		if field == "" {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			return
		}
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != field || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("%s: error = %v, want a *ConfigError for %s", what, err, field)
		} else if problem != "" && ce.Problem != problem {
			t.Errorf("%s: problem = %q, want %q", what, ce.Problem, problem)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 2)) // no budget: any total fits

			p := mustAcquire(t, b, req("a", 0))
			rep, err := p.ReportUsage(tt.u, nil)
			check(t, "ReportUsage", err, tt.field, tt.problem)
			if tt.field != "" && rep.Sequence != 0 {
				t.Errorf("an invalid report was recorded: %+v", rep)
			}
			check(t, "Release", p.Release(&tt.u), tt.field, tt.problem)

			_, err = bulkhead.Run(context.Background(), b, req("a", 0), func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
				check(t, "SetUsage", rc.SetUsage(tt.u), tt.field, tt.problem)
				return 0, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if st := b.Stats(); st.Gate.InFlight != 0 || st.Calls.Released != 2 {
				t.Fatalf("an invalid usage kept an admission: %+v", st.Gate)
			}
		})
	}
}

// TestUsageBreakdownCarried: the breakdown reaches UsageEvent.Usage and
// ReleaseEvent.Usage as reported (each field clamped never to fall), and
// every hold, refund and total is what it would be without it.
func TestUsageBreakdownCarried(t *testing.T) {
	type report struct {
		u bulkhead.Usage
		p *bulkhead.Progressive
	}
	reports := []report{
		{bulkhead.Usage{Input: 60, CachedInput: 40, CacheCreation: 20}, nil},
		{bulkhead.Usage{Input: 60, Output: 250, CachedInput: 30, Reasoning: 200}, nil}, // cached clamped to 40, creation to 20
		{bulkhead.Usage{Input: 70, Output: 260, CachedInput: 50, CacheCreation: 20, Reasoning: 210}, &bulkhead.Progressive{SafetyMargin: 10}},
	}
	final := bulkhead.Usage{Input: 80, Output: 270, CachedInput: 50, CacheCreation: 25, Reasoning: 220}
	clamped := []bulkhead.Usage{
		{Input: 60, CachedInput: 40, CacheCreation: 20},
		{Input: 60, Output: 250, CachedInput: 40, CacheCreation: 20, Reasoning: 200},
		{Input: 70, Output: 260, CachedInput: 50, CacheCreation: 20, Reasoning: 210},
	}
	totals := func(u bulkhead.Usage) bulkhead.Usage { return bulkhead.Usage{Input: u.Input, Output: u.Output} }

	type outcome struct {
		reports  []bulkhead.UsageReport
		usages   []bulkhead.UsageEvent
		releases []bulkhead.ReleaseEvent
		ledger   bulkhead.BudgetStats
	}
	// play reports and releases one permit that reports, one that releases
	// with final usage after the reports, and one Run that sets it.
	play := func(strip bool) outcome {
		t.Helper()
		b := budgetBulkhead(t, 4, 10_000, 0)
		var o outcome
		b.Subscribe(bulkhead.Hooks{
			Usage:   func(e bulkhead.UsageEvent) { o.usages = append(o.usages, e) },
			Release: func(e bulkhead.ReleaseEvent) { o.releases = append(o.releases, e) },
		})
		use := func(u bulkhead.Usage) bulkhead.Usage {
			if strip {
				return totals(u)
			}
			return u
		}
		for _, withFinal := range []bool{false, true} {
			p := mustAcquire(t, b, req("a", 0), override(100, 200))
			for _, r := range reports {
				rep, err := p.ReportUsage(use(r.u), r.p)
				if err != nil {
					t.Fatal(err)
				}
				rep.AdmissionID = bulkhead.ID{} // differs between the runs
				o.reports = append(o.reports, rep)
			}
			var u *bulkhead.Usage
			if withFinal {
				f := use(final)
				u = &f
			}
			if err := p.Release(u); err != nil {
				t.Fatal(err)
			}
		}
		_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
			return 0, rc.SetUsage(use(final))
		}, override(100, 200))
		if err != nil {
			t.Fatal(err)
		}
		closeAndDrain(t, b)
		o.ledger = *b.Stats().TokenBudget
		return o
	}
	with, without := play(false), play(true)

	if !reflect.DeepEqual(with.reports, without.reports) {
		t.Fatalf("the breakdown changed the reports:\n with    %+v\n without %+v", with.reports, without.reports)
	}
	if with.ledger != without.ledger {
		t.Fatalf("the breakdown changed the ledger: %+v, without %+v", with.ledger, without.ledger)
	}
	if len(with.usages) != 2*len(reports) || len(without.usages) != len(with.usages) {
		t.Fatalf("usage events: %d with the breakdown, %d without", len(with.usages), len(without.usages))
	}
	for i, e := range with.usages {
		if e.Usage != clamped[i%len(clamped)] {
			t.Fatalf("usage event %d: usage %+v, want %+v", i, e.Usage, clamped[i%len(clamped)])
		}
		w := without.usages[i]
		if w.Usage != totals(e.Usage) {
			t.Fatalf("usage event %d without the breakdown: %+v", i, w.Usage)
		}
		e.Usage, e.Admission, w.Admission = w.Usage, bulkhead.Admission{}, bulkhead.Admission{}
		if !reflect.DeepEqual(e, w) {
			t.Fatalf("usage event %d: the breakdown changed it:\n with    %+v\n without %+v", i, e, w)
		}
	}
	wantFinal := []bulkhead.Usage{clamped[len(clamped)-1], final, final}
	if len(with.releases) != 3 || len(without.releases) != 3 {
		t.Fatalf("release events: %+v, without %+v", with.releases, without.releases)
	}
	for i, e := range with.releases {
		if e.Usage == nil || *e.Usage != wantFinal[i] {
			t.Fatalf("release event %d: usage %+v, want %+v", i, e.Usage, wantFinal[i])
		}
		w := without.releases[i]
		if w.Usage == nil || *w.Usage != totals(*e.Usage) {
			t.Fatalf("release event %d without the breakdown: %+v", i, w.Usage)
		}
		e.Usage, e.Admission, w.Admission = w.Usage, bulkhead.Admission{}, bulkhead.Admission{}
		if !reflect.DeepEqual(e, w) {
			t.Fatalf("release event %d: the breakdown changed it:\n with    %+v\n without %+v", i, e, w)
		}
	}
}

// TestUsageBreakdownOnlyChange: a report that changes only the breakdown
// changes the usage, so it takes a sequence number and emits a usage event,
// with the hold unchanged.
func TestUsageBreakdownOnlyChange(t *testing.T) {
	b := budgetBulkhead(t, 4, 10_000, 0)
	var usages []bulkhead.UsageEvent
	b.Subscribe(bulkhead.Hooks{Usage: func(e bulkhead.UsageEvent) { usages = append(usages, e) }})
	p := mustAcquire(t, b, req("a", 0), override(100, 200))
	first, err := p.ReportUsage(bulkhead.Usage{Input: 60, Output: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := bulkhead.Usage{Input: 60, Output: 10, CachedInput: 60, Reasoning: 4}
	rep, err := p.ReportUsage(u, nil)
	if err != nil || rep.Sequence != 2 || rep.Held != first.Held || rep.Consumed != first.Consumed {
		t.Fatalf("report = %+v, %v; first %+v", rep, err, first)
	}
	if again, err := p.ReportUsage(bulkhead.Usage{Input: 60, Output: 10, CachedInput: 50}, nil); err != nil || again.Sequence != 2 {
		t.Fatalf("a lower breakdown is stale: %+v, %v", again, err)
	}
	_ = p.Release(nil)
	closeAndDrain(t, b)
	if len(usages) != 2 || usages[1].Delta != 0 || usages[1].Usage != u {
		t.Fatalf("usage events = %+v", usages)
	}
}

func TestUsageTotalAndFormat(t *testing.T) {
	u := bulkhead.Usage{Input: 100, Output: 30, CachedInput: 60, CacheCreation: 40, Reasoning: 20}
	if u.Total() != 130 {
		t.Fatalf("Total = %d, want Input + Output", u.Total())
	}
	e := bulkhead.UsageEvent{Usage: u}
	if s, want := e.String(), "Usage:{Input:100 Output:30 CachedInput:60 CacheCreation:40 Reasoning:20}"; !strings.Contains(s, want) {
		t.Fatalf("String = %s, want it to contain %s", s, want)
	}
}
