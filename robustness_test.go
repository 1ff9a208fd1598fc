package bulkhead_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
)

// panickyCtx is a context whose Err panics once armed: user code the engine
// calls while it decides.
type panickyCtx struct {
	context.Context
	armed bool
}

func (c *panickyCtx) Err() error {
	if c.armed {
		panic("a broken context")
	}
	return c.Context.Err()
}

// TestPanicInEngineAnswersAndGoesOn: a panic while the engine decides (here
// from a context's Err) answers the caller with ErrInternal, for the
// blocking and the asynchronous acquire alike, and the engine keeps going.
func TestPanicInEngineAnswersAndGoesOn(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 2))
	held := mustAcquire(t, b, req("a", 0))
	ctx := &panickyCtx{Context: context.Background(), armed: true}
	if _, err := b.Acquire(ctx, req("a", 0)); !errors.Is(err, bulkhead.ErrInternal) {
		t.Fatalf("Acquire with a panicking context = %v", err)
	}
	f := b.AcquireAsync(ctx, req("a", 0))
	select {
	case <-f.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the async acquire was never answered: the engine is wedged")
	}
	if _, err := f.Result(); !errors.Is(err, bulkhead.ErrInternal) {
		t.Fatalf("AcquireAsync with a panicking context = %v", err)
	}
	if st := b.Stats(); st.Gate.InFlight != 1 || st.Calls.Admitted != 1 {
		t.Fatalf("state after the panics: %+v", st)
	}
	_ = held.Release(nil)
	mustAcquire(t, b, req("a", 0)).Release(nil)
}

// TestDrainSeesIdlenessReachedThroughApplyLimits: when applying limits
// rejects the last waiter (its postcheck fails), a waiting Drain returns.
func TestDrainSeesIdlenessReachedThroughApplyLimits(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.MaxQueue = 1
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000}
	b := newBulkhead(t, cfg)
	held := mustAcquire(t, b, req("a", 0), override(1, 1))
	w := acquireAsync(context.Background(), b, req("w", 0), override(10, 10))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	// Kill switch, then release: the waiter stays queued.
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 1, MaxConcurrent: 0, MaxQueue: 1, TokenBudget: &bulkhead.BudgetLimits{Budget: 1000}}); err != nil {
		t.Fatal(err)
	}
	_ = held.Release(nil)
	drained := make(chan bulkhead.DrainResult, 1)
	go func() {
		res, _ := b.Drain(context.Background())
		drained <- res
	}()
	// Reopen with a budget the waiter no longer fits: it is rejected, and
	// the bulkhead is idle.
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 2, MaxConcurrent: 1, MaxQueue: 1, TokenBudget: &bulkhead.BudgetLimits{Budget: 1}}); err != nil {
		t.Fatal(err)
	}
	wantReason(t, (<-w).err, bulkhead.BudgetLimit)
	select {
	case res := <-drained:
		if !res.Drained {
			t.Fatalf("Drain = %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain missed the idleness reached through ApplyLimits")
	}
}
