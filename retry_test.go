package bulkhead_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// retryConfig is a bulkhead of 8 slots on a mock clock with a retry budget
// of half the first attempts, at least one, over 10 seconds.
func retryConfig(clk clock.Clock) bulkhead.Config {
	return bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 8, Clock: clk,
		RetryBudgets: &bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 0.5, MinRetries: 1}}}
}

// TestRetryOverBudgetIsRejectedRetryBudget: once the retries admitted over
// the window reach the budget, a retry is rejected RetryBudget at once,
// with slots free, matching its sentinel, with a one-line message that
// carries the numbers, no retry-after and the budget's detail; events
// carry each call's attempt number; Stats shows the budget's use; the
// window frees the budget as it slides.
func TestRetryOverBudgetIsRejectedRetryBudget(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, retryConfig(clk))
	var mu sync.Mutex
	var admits []int
	var rejects []bulkhead.RejectEvent
	b.Subscribe(bulkhead.Hooks{
		Admit:  func(ev bulkhead.AdmitEvent) { mu.Lock(); admits = append(admits, ev.Attempt); mu.Unlock() },
		Reject: func(ev bulkhead.RejectEvent) { mu.Lock(); rejects = append(rejects, ev); mu.Unlock() },
	})
	var permits []*bulkhead.Permit
	for range 2 {
		permits = append(permits, mustAcquire(t, b, req("first", 10)))
	}
	permits = append(permits, mustAcquire(t, b, req("retry", 10), bulkhead.WithAttempt(1)))
	_, err := b.Acquire(context.Background(), req("retry", 10), bulkhead.WithAttempt(2), bulkhead.WithTag("call-7"))
	rej := testutil.WantReason(t, err, bulkhead.RetryBudget)
	want := &bulkhead.RetryBudgetDetail{RetryBudgetStats: bulkhead.RetryBudgetStats{Ratio: 0.5, MinRetries: 1, Window: bulkhead.DefaultRetryWindow,
		FirstAttempts: 2, Retries: 1, Allowed: 1}}
	if !reflect.DeepEqual(rej.Detail.RetryBudget, want) || rej.Detail.InFlight != 3 || rej.Detail.MaxConcurrent != 8 {
		t.Fatalf("detail %+v, retry budget %+v", rej.Detail, rej.Detail.RetryBudget)
	}
	msg := rej.Error()
	for _, part := range []string{"retry_budget", "1 retries admitted over the last 10s, of 1 allowed", "0.5 of 2 first attempts, at least 1", `tag "call-7"`} {
		if !strings.Contains(msg, part) || strings.Contains(msg, "\n") {
			t.Errorf("message %q lacks %q", msg, part)
		}
	}
	if _, ok := rej.RetryAfter(); ok || rej.NeverFits() {
		t.Errorf("RetryAfter ok %v, NeverFits %v: a budget promises no time", ok, rej.NeverFits())
	}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "err", rej)
	if !strings.Contains(logged.String(), "retry_budget.allowed=1") {
		t.Errorf("log line %q lacks the budget", logged.String())
	}
	st := b.Stats()
	if st.Calls.RejectedByReason[bulkhead.RetryBudget] != 1 || st.Retries.Admitted != 1 || st.Gate.Rejected != 0 {
		t.Fatalf("stats: rejected %v, retries %+v, gate %+v", st.Calls.RejectedByReason, st.Retries, st.Gate)
	}
	if got := *st.Retries.Budget; got != (bulkhead.RetryBudgetStats{Ratio: 0.5, MinRetries: 1, Window: 10 * time.Second,
		FirstAttempts: 2, Retries: 1, Allowed: 1, Available: 0}) {
		t.Fatalf("budget stats %+v", got)
	}
	// Two more first attempts make room for one more retry.
	permits = append(permits, mustAcquire(t, b, req("first", 10)), mustAcquire(t, b, req("first", 10)))
	permits = append(permits, mustAcquire(t, b, req("retry", 10), bulkhead.WithAttempt(1)))
	for _, p := range permits {
		if err := p.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
	// The window slides past them all: the floor lets one through.
	clk.Add(bulkhead.DefaultRetryWindow)
	p := mustAcquire(t, b, req("retry", 10), bulkhead.WithAttempt(1))
	_ = p.Release(nil)
	if _, err := b.Acquire(context.Background(), req("retry", 10), bulkhead.WithAttempt(1)); !errors.Is(err, bulkhead.ErrRetryBudget) {
		t.Fatalf("error %v, want the floor spent", err)
	}
	testutil.WaitFor(t, "the events", func() bool { mu.Lock(); defer mu.Unlock(); return len(admits) == 7 && len(rejects) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(admits, []int{0, 0, 1, 0, 0, 1, 1}) || rejects[0].Attempt != 2 || rejects[0].Tag != "call-7" ||
		rejects[0].Reason != bulkhead.RetryBudget || !reflect.DeepEqual(rejects[0].Detail.RetryBudget, want) {
		t.Fatalf("admit attempts %v, reject %+v", admits, rejects[0])
	}
}

// TestWouldAdmitTellsARetryOverBudget: the advisory answer names the
// budget for a retry, and admits a first attempt.
func TestWouldAdmitTellsARetryOverBudget(t *testing.T) {
	cfg := retryConfig(clock.NewMock())
	cfg.RetryBudgets.Bulkhead.MinRetries = 0
	b := newBulkhead(t, cfg)
	d, err := b.WouldAdmit(req("retry", 10), bulkhead.WithAttempt(1), bulkhead.WithDetail())
	if err != nil || d.Admit || d.Reason != bulkhead.RetryBudget || d.Detail == nil || d.Detail.RetryBudget == nil {
		t.Fatalf("WouldAdmit = %+v, %v", d, err)
	}
	if d, err := b.WouldAdmit(req("first", 10)); err != nil || !d.Admit {
		t.Fatalf("first attempt: %+v, %v", d, err)
	}
}

// TestWithAttemptRejectsANegativeNumber: a negative attempt number is
// invalid input, for every method, and takes nothing.
func TestWithAttemptRejectsANegativeNumber(t *testing.T) {
	b := newBulkhead(t, retryConfig(clock.NewMock()))
	check := func(method string, err error) {
		t.Helper()
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != "WithAttempt" || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("%s: error %v, want a *ConfigError for WithAttempt", method, err)
		}
	}
	_, err := b.Acquire(context.Background(), req("x", 1), bulkhead.WithAttempt(-1))
	check("Acquire", err)
	_, err = bulkhead.Run(context.Background(), b, req("x", 1), func(context.Context, *bulkhead.RunContext) (int, error) { return 0, nil },
		bulkhead.WithAttempt(-2))
	check("Run", err)
	_, err = b.WouldAdmit(req("x", 1), bulkhead.WithAttempt(-3))
	check("WouldAdmit", err)
	_, err = b.AcquireAsync(context.Background(), req("x", 1), bulkhead.WithAttempt(-4)).Result()
	check("AcquireAsync", err)
	if st := b.Stats(); st.Calls.Rejected != 0 || st.Gate.InFlight != 0 {
		t.Fatalf("stats %+v", st.Calls)
	}
}

// TestRetryBudgetsAreValidated: a bad budget is a *ConfigError naming its
// field.
func TestRetryBudgetsAreValidated(t *testing.T) {
	classes := &bulkhead.Classes{Default: "web", Limits: map[string]bulkhead.ClassLimits{"web": {}, "batch": {}}}
	tests := []struct {
		name    string
		budgets bulkhead.RetryBudgets
		classes *bulkhead.Classes
		field   string
	}{
		{"nothing set", bulkhead.RetryBudgets{}, nil, "Config.RetryBudgets"},
		{"ratio above 1", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 1.5}}, nil, "Config.RetryBudgets.Bulkhead.Ratio"},
		{"negative ratio", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: -0.1}}, nil, "Config.RetryBudgets.Bulkhead.Ratio"},
		{"NaN ratio", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: math.NaN(), MinRetries: 3}}, nil, "Config.RetryBudgets.Bulkhead.Ratio"},
		{"infinite ratio", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: math.Inf(1)}}, nil, "Config.RetryBudgets.Bulkhead.Ratio"},
		{"negative infinite ratio", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: math.Inf(-1)}}, nil, "Config.RetryBudgets.Bulkhead.Ratio"},
		{"ratio below a millionth", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 4e-7}}, nil, "Config.RetryBudgets.Bulkhead.Ratio"},
		{"negative floor", bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 0.1, MinRetries: -1}}, nil, "Config.RetryBudgets.Bulkhead.MinRetries"},
		{"short window", bulkhead.RetryBudgets{Window: time.Millisecond, Bulkhead: bulkhead.RetryLimit{Ratio: 0.1}}, nil, "Config.RetryBudgets.Window"},
		{"long window", bulkhead.RetryBudgets{Window: 2 * time.Hour, Bulkhead: bulkhead.RetryLimit{Ratio: 0.1}}, nil, "Config.RetryBudgets.Window"},
		{"negative window", bulkhead.RetryBudgets{Window: -time.Second, Bulkhead: bulkhead.RetryLimit{Ratio: 0.1}}, nil, "Config.RetryBudgets.Window"},
		{"per class without classes", bulkhead.RetryBudgets{PerClass: map[string]bulkhead.RetryLimit{"web": {Ratio: 0.1}}}, nil, "Config.RetryBudgets.PerClass"},
		{"unknown class", bulkhead.RetryBudgets{PerClass: map[string]bulkhead.RetryLimit{"gold": {Ratio: 0.1}}}, classes, `Config.RetryBudgets.PerClass["gold"]`},
		{"the empty class name", bulkhead.RetryBudgets{PerClass: map[string]bulkhead.RetryLimit{"": {Ratio: 0.1}}}, classes, `Config.RetryBudgets.PerClass[""]`},
		{"NaN class ratio", bulkhead.RetryBudgets{PerClass: map[string]bulkhead.RetryLimit{"batch": {Ratio: math.NaN()}}}, classes, `Config.RetryBudgets.PerClass["batch"].Ratio`},
		{"bad class ratio", bulkhead.RetryBudgets{PerClass: map[string]bulkhead.RetryLimit{"web": {Ratio: 2}}}, classes, `Config.RetryBudgets.PerClass["web"].Ratio`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			budgets := tt.budgets
			_, err := bulkhead.New(bulkhead.Config{Model: "m", MaxConcurrent: 1, Classes: tt.classes, RetryBudgets: &budgets})
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("error %v, want a *ConfigError for %s", err, tt.field)
			}
		})
	}
	b := newBulkhead(t, bulkhead.Config{Model: "m", MaxConcurrent: 1, Classes: classes,
		RetryBudgets: &bulkhead.RetryBudgets{Window: time.Minute, PerClass: map[string]bulkhead.RetryLimit{"web": {Ratio: 0.2, MinRetries: 2}}}})
	st := b.Stats()
	if st.Retries.Budget != nil || st.Classes.Classes["batch"].Retries.Budget != nil {
		t.Fatal("budgets where none was set")
	}
	if w := st.Classes.Classes["web"].Retries.Budget; w == nil || w.Window != time.Minute || w.Allowed != 2 || w.Available != 2 {
		t.Fatalf("web's budget %+v", w)
	}
}

// TestRetriesWaitBehindFirstAttempts: with the default aging, a first
// attempt that queues after a retry is admitted before it.
func TestRetriesWaitBehindFirstAttempts(t *testing.T) {
	b := newBulkhead(t, bulkhead.Config{Model: "m", MaxConcurrent: 1, MaxQueue: 4})
	held := mustAcquire(t, b, req("held", 1))
	retry := acquireAsync(context.Background(), b, req("retry", 1), bulkhead.WithAttempt(1))
	testutil.WaitFor(t, "the retry to queue", func() bool { return b.Stats().Gate.Pending == 1 })
	first := acquireAsync(context.Background(), b, req("first", 1))
	testutil.WaitFor(t, "the first attempt to queue", func() bool { return b.Stats().Gate.Pending == 2 })
	_ = held.Release(nil)
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	testutil.WaitFor(t, "one waiter left", func() bool { return b.Stats().Gate.Pending == 1 })
	_ = r.tok.Release(nil)
	rr := <-retry
	if rr.err != nil {
		t.Fatal(rr.err)
	}
	_ = rr.tok.Release(nil)
}
