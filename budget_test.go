package bulkhead_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
)

func budgetBulkhead(t *testing.T, maxConcurrent int, budget, reserve int64) *bulkhead.Bulkhead {
	cfg := bulkhead.Interactive("gpt-4o", maxConcurrent)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: budget, HighPriorityReserve: reserve}
	return newBulkhead(t, cfg)
}

func override(in, out int64) bulkhead.Option {
	return bulkhead.WithReservation(bulkhead.Reservation{Input: in, MaxOutput: out})
}

func TestEstimateChecks(t *testing.T) {
	b := budgetBulkhead(t, 1, 1000, 0)
	tests := []struct {
		name string
		req  *bulkhead.Request
		want bulkhead.Reservation
	}{
		{"37 chars, max 100", req(strings.Repeat("x", 37), 100), bulkhead.Reservation{Input: 10, MaxOutput: 100, Reserved: 110}},
		{"abcd, no max", req("abcd", 0), bulkhead.Reservation{Input: 2, MaxOutput: 2048, Reserved: 2050}},
	}
	for _, tt := range tests {
		got, err := b.Estimate(tt.req)
		if err != nil || got == nil || *got != tt.want {
			t.Errorf("%s: Estimate = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
	// Without a budget Estimate is nil, but the request is still validated.
	nb := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	if got, err := nb.Estimate(req("abcd", 0)); got != nil || err != nil {
		t.Fatalf("Estimate without a budget = %+v, %v", got, err)
	}
	if _, err := nb.Estimate(req("abcd", -1)); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative MaxTokens without a budget: %v", err)
	}
}

func TestBudgetExactFitAndPriorityReserve(t *testing.T) {
	b := budgetBulkhead(t, 10, 100, 20)
	normal := mustAcquire(t, b, req("a", 0), override(30, 50)) // 80: exact fit for normal
	_, err := b.Acquire(context.Background(), req("a", 0), override(1, 0))
	rej := wantReason(t, err, bulkhead.BudgetLimit)
	d := rej.Detail.TokenBudget
	if d == nil || d.Budget != 100 || d.EffectiveBudget != 80 || d.InFlightTokens != 80 || d.Available != 0 || d.Reserved != 1 {
		t.Fatalf("budget detail = %+v", d)
	}
	high := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithPriority(bulkhead.High))
	_, err = b.Acquire(context.Background(), req("a", 0), override(1, 0), bulkhead.WithPriority(bulkhead.High))
	wantReason(t, err, bulkhead.BudgetLimit)
	st := b.Stats()
	if st.TokenBudget.InFlightTokens != 100 || st.TokenBudget.TotalReserved != 100 || st.Calls.RejectedByReason[bulkhead.BudgetLimit] != 2 {
		t.Fatalf("stats = %+v %+v", st.TokenBudget, st.Calls)
	}
	// Budget rejections are fail fast even with queue room, and count at
	// the admission layer only.
	if st.Gate.Rejected != 0 {
		t.Fatalf("budget rejections counted at the gate: %+v", st.Gate)
	}
	_ = normal.Release(nil)
	_ = high.Release(nil)
	if st := b.Stats(); st.TokenBudget.InFlightTokens != 0 {
		t.Fatalf("tokens left after release: %+v", st.TokenBudget)
	}
}

func TestZeroBudget(t *testing.T) {
	b := budgetBulkhead(t, 10, 0, 0)
	tok := mustAcquire(t, b, req("a", 0), override(0, 0))
	_ = tok.Release(nil)
	_, err := b.Acquire(context.Background(), req("a", 0), override(1, 0))
	wantReason(t, err, bulkhead.BudgetLimit)
	_, err = b.Acquire(context.Background(), req("a", 0))
	wantReason(t, err, bulkhead.BudgetLimit)
}

func TestReservationOverride(t *testing.T) {
	b := budgetBulkhead(t, 10, 10000, 0)
	est, err := b.Estimate(req("hello there", 64))
	if err != nil {
		t.Fatal(err)
	}
	tok := mustAcquire(t, b, req("something else entirely", 0), bulkhead.WithReservation(*est))
	if got := tok.Reservation(); got == nil || *got != *est {
		t.Fatalf("reservation = %+v, want the override %+v", got, est)
	}
	_ = tok.Release(nil)
	bad := bulkhead.WithReservation(bulkhead.Reservation{Input: 1, MaxOutput: 1, Reserved: 3})
	if _, err := b.Acquire(context.Background(), req("a", 0), bad); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("inconsistent override: %v", err)
	}
	neg := bulkhead.WithReservation(bulkhead.Reservation{Input: -1})
	if _, err := b.Acquire(context.Background(), req("a", 0), neg); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative override: %v", err)
	}
	if st := b.Stats(); st.Calls.Admitted != 1 || st.TokenBudget.TotalReserved != est.Reserved {
		t.Fatalf("invalid overrides changed counters: %+v", st)
	}
}

func TestSettlementLedger(t *testing.T) {
	b := budgetBulkhead(t, 10, 10000, 0)
	a := mustAcquire(t, b, req("a", 0), override(100, 200))
	c := mustAcquire(t, b, req("a", 0), override(50, 50))
	d := mustAcquire(t, b, req("a", 0), override(10, 10))
	if err := a.Release(&bulkhead.Usage{Input: 90, Output: 60}); err != nil { // refund 150
		t.Fatal(err)
	}
	if err := c.Release(&bulkhead.Usage{Input: 70, Output: 80}); err != nil { // over: no refund
		t.Fatal(err)
	}
	if err := d.Release(&bulkhead.Usage{Input: -1}); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("invalid usage: %v", err)
	}
	st := b.Stats().TokenBudget
	want := bulkhead.BudgetStats{Budget: 10000, Available: 10000, TotalReserved: 420, TotalConsumed: 300, TotalRefunded: 150}
	if *st != want {
		t.Fatalf("ledger = %+v, want %+v", *st, want)
	}
	// The invalid usage still released everything.
	if s := b.Stats(); s.Gate.InFlight != 0 || s.Calls.InFlight != 0 {
		t.Fatalf("invalid usage leaked: %+v", s)
	}
}

func TestSetBudget(t *testing.T) {
	b := budgetBulkhead(t, 10, 100, 0)
	tok := mustAcquire(t, b, req("a", 0), override(60, 0))
	res, err := b.SetBudget(50)
	if err != nil || !res.Applied || res.Current.Revision != 1 || res.Current.TokenBudget.Budget != 50 || res.Previous.TokenBudget.Budget != 100 {
		t.Fatalf("SetBudget = %+v, %v", res, err)
	}
	// Shrunk below what is held: nothing is revoked, new work waits for it.
	_, err = b.Acquire(context.Background(), req("a", 0), override(0, 0))
	wantReason(t, err, bulkhead.BudgetLimit)
	_ = tok.Release(nil)
	mustAcquire(t, b, req("a", 0), override(50, 0)).Release(nil)
	if _, err := b.SetBudget(-1); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative budget: %v", err)
	}
	// The budget must stay present in a full snapshot.
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 5, MaxConcurrent: 1}); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("snapshot without the budget: %v", err)
	}
}

func TestQueuedCallIsPostchecked(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100}
	b := newBulkhead(t, cfg)
	first := mustAcquire(t, b, req("a", 0), override(10, 0))
	w := acquireAsync(context.Background(), b, req("w", 0), override(50, 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	// While it waits, the budget shrinks under its reservation.
	if _, err := b.SetBudget(40); err != nil {
		t.Fatal(err)
	}
	_ = first.Release(nil)
	wantReason(t, (<-w).err, bulkhead.BudgetLimit)
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.Gate.Admitted != 2 || st.Gate.Released != 2 || st.TokenBudget.InFlightTokens != 0 {
		t.Fatalf("postcheck leaked: %+v %+v", st.Gate, st.TokenBudget)
	}
}

func TestWouldAdmit(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 1)
	cfg.MaxQueue = 1
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100}
	b := newBulkhead(t, cfg)
	d, err := b.WouldAdmit(req("a", 0), override(10, 10), bulkhead.WithDetail())
	if err != nil || !d.Admit || d.Detail == nil || d.Detail.TokenBudget.Reserved != 20 {
		t.Fatalf("WouldAdmit = %+v, %v", d, err)
	}
	if d, _ := b.WouldAdmit(req("a", 0), override(10, 10)); d.Detail != nil {
		t.Fatal("detail without WithDetail")
	}
	if d, _ := b.WouldAdmit(req("a", 0), override(100, 1)); d.Admit || d.Reason != bulkhead.BudgetLimit {
		t.Fatalf("over budget: %+v", d)
	}
	if d, _ := b.WouldAdmit(req("a", 0), override(100, 1), bulkhead.WithDetail()); d.Detail == nil || !d.Detail.NeverFits {
		t.Fatalf("a reservation above the whole budget never fits: %+v", d.Detail)
	}
	tok := mustAcquire(t, b, req("a", 0), override(10, 10))
	if d, _ := b.WouldAdmit(req("a", 0), override(10, 10)); !d.Admit {
		t.Fatalf("would queue, so would admit: %+v", d)
	}
	w := acquireAsync(context.Background(), b, req("w", 0), override(10, 10), bulkhead.WithQueueTimeout(0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	if d, _ := b.WouldAdmit(req("a", 0), override(10, 10)); d.Admit || d.Reason != bulkhead.QueueLimit {
		t.Fatalf("queue full: %+v", d)
	}
	if _, err := b.WouldAdmit(req("a", 0), bulkhead.WithQueueTimeout(1)); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("WithQueueTimeout on WouldAdmit: %v", err)
	}
	st := b.Stats()
	if st.Calls.Admitted != 1 || st.Calls.Rejected != 0 || st.TokenBudget.TotalReserved != 20 {
		t.Fatalf("WouldAdmit changed counters: %+v", st)
	}
	_ = tok.Release(nil)
	r := <-w
	_ = r.tok.Release(nil)
}
