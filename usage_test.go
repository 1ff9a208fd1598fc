package bulkhead_test

import (
	"context"
	"errors"
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
