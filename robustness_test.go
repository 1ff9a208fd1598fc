package bulkhead_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
)

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

// TestDrainIdleWithEndedContext: a closed bulkhead with nothing in flight,
// queued or left to deliver is drained, even for a context that has already
// ended (Drain used to race the context against the event actor's answer
// and report such a bulkhead not drained nearly every time).
func TestDrainIdleWithEndedContext(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 200; i++ {
		b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 1))
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 { // half of them used before they close
			p := mustAcquire(t, b, req("a", 0))
			_ = p.Release(nil)
			testutil.WaitFor(t, "events delivered", func() bool { return b.Stats().Events.Backlog == 0 })
		}
		b.Close()
		res, err := b.Drain(ended)
		if !res.Drained || err != nil {
			t.Fatalf("run %d: Drain = %+v, %v; want drained", i, res, err)
		}
	}
}
