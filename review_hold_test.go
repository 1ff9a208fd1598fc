package bulkhead_test

// Regression tests from an adversarial review of cool-downs held in the
// queue (HoldCooldown): each guards a defect the review found, now fixed,
// or probes a case that held.

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func cool429(t *testing.T, b *bulkhead.Bulkhead, model string, d time.Duration) {
	t.Helper()
	if err := b.Feedback(bulkhead.Feedback{Model: model, Outcome: bulkhead.OutcomeRateLimited, RetryAfter: d}); err != nil {
		t.Fatal(err)
	}
}

func pendingIs(b *bulkhead.Bulkhead, n int) func() bool {
	return func() bool { return b.Stats().Gate.Pending == n }
}

// fullQueueCooling returns a bulkhead with its one slot taken, its one
// queue place taken by a call of another model, and gpt-4o cooling down
// for 5s: a gpt-4o call finds no room to be held.
func fullQueueCooling(t *testing.T) *bulkhead.Bulkhead {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.MaxConcurrent, cfg.MaxQueue, cfg.QueueTimeout = 1, 1, 30*time.Second
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("hi", 1))
	other := req("other", 1)
	other.Model = "gpt-4.1"
	waiter := acquireAsync(context.Background(), b, other)
	t.Cleanup(func() {
		_ = p.Release(nil)
		if r := <-waiter; r.err == nil {
			_ = r.tok.Release(nil)
		}
	})
	testutil.WaitFor(t, "the other model's call to queue", pendingIs(b, 1))
	cool429(t, b, "gpt-4o", 5*time.Second)
	return b
}

// A call that finds no queue room to be held in is rejected Cooldown with
// the time left, as with ShedCooldown (it was rejected QueueLimit, with no
// cool-down detail).
func TestReviewHoldFullQueueRejectsCooldown(t *testing.T) {
	b := fullQueueCooling(t)
	_, err := b.Acquire(context.Background(), req("hi", 1))
	rej := wantReason(t, err, bulkhead.Cooldown)
	if d, ok := rej.RetryAfter(); !ok || d != 5*time.Second {
		t.Fatalf("RetryAfter = %v, %v", d, ok)
	}
}

// In observe mode the same call is not bypassed into the cool-down:
// Cooldown is not a shadow reason (QueueLimit, which stood in for it, was).
func TestReviewHoldObserveFullQueueBypassesCooldown(t *testing.T) {
	b := fullQueueCooling(t)

	ran := false
	_, err := bulkhead.Run(context.Background(), b, req("hi", 1), func(context.Context, *bulkhead.RunContext) (int, error) {
		ran = true
		return 0, nil
	}, bulkhead.WithMode(bulkhead.Observe))
	if ran {
		t.Errorf("observe mode ran the call during its model's cool-down (err %v)", err)
	}
}

// A waiter is held only within what is left of its queue timeout: with 2s
// left, facing a 5s cool-down, it is turned away Cooldown at its grant (it
// was held against its whole timeout, and then timed out).
func TestReviewHoldWaiterUsesWholeQueueTimeout(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.MaxConcurrent, cfg.MaxQueue, cfg.QueueTimeout = 1, 4, 10*time.Second
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("hi", 1))
	w := acquireAsync(context.Background(), b, req("w", 1))
	testutil.WaitFor(t, "the call to queue", pendingIs(b, 1))
	clk.Add(8 * time.Second)
	cool429(t, b, "gpt-4o", 5*time.Second) // ends at 13s, after w's queue timeout at 10s
	_ = p.Release(nil)
	_ = b.Stats() // behind the release
	clk.Add(2 * time.Second)
	r := <-w
	if r.err == nil {
		_ = r.tok.Release(nil)
	}
	wantReason(t, r.err, bulkhead.Cooldown)
}

// A held call holds back the calls of its class behind it, and a newer call
// of that class arriving while a slot is free waits behind them too (first
// in, first out within a class), rather than being admitted ahead of an
// older waiter.
func TestReviewHoldLaterCallOvertakesHeldBackWaiter(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.MaxConcurrent, cfg.MaxQueue, cfg.QueueTimeout = 1, 4, 30*time.Second
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("hi", 1))
	cool429(t, b, "gpt-4o", 10*time.Second)
	held := acquireAsync(context.Background(), b, req("held", 1))
	testutil.WaitFor(t, "the call to hold", pendingIs(b, 1))
	b1req := req("b1", 1)
	b1req.Model = "gpt-4.1"
	b1 := acquireAsync(context.Background(), b, b1req)
	testutil.WaitFor(t, "b1 to queue", pendingIs(b, 2))
	_ = p.Release(nil)
	_ = b.Stats()

	b2req := req("b2", 1)
	b2req.Model = "gpt-4.1"
	b2 := acquireAsync(context.Background(), b, b2req)
	testutil.WaitFor(t, "b2 to queue behind b1", pendingIs(b, 3))
	clk.Add(10 * time.Second)
	for _, ch := range []<-chan result{held, b1, b2} {
		if r := <-ch; r.err == nil {
			_ = r.tok.Release(nil)
		} else {
			t.Errorf("after the cool-down: %v", r.err)
		}
	}
}

// A later headroom report that frees the window lets a held call go with
// the next call of its model, which queues behind it, rather than the
// newer call being admitted ahead of it while it waits out the old time.
func TestReviewHoldHeadroomReportDoesNotEndHold(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.QueueTimeout = time.Minute
	b := newBulkhead(t, cfg)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensReset: 30 * time.Second, Requests: -1})
	held := acquireAsync(context.Background(), b, req("held", 9))
	testutil.WaitFor(t, "the call to hold", holding(b))
	report(t, b, bulkhead.Headroom{Tokens: 10_000, TokensReset: 30 * time.Second, Requests: -1})

	tok, err := b.Acquire(context.Background(), req("new", 9))
	if err != nil {
		t.Fatalf("new call: %v", err)
	}
	_ = tok.Release(nil)
	if st := b.Stats(); st.Gate.Pending != 0 {
		t.Errorf("a later call of the same model was admitted while the earlier held one still waits (pending %d)", st.Gate.Pending)
	}
	clk.Add(30 * time.Second)
	if r := <-held; r.err == nil {
		_ = r.tok.Release(nil)
	}
}

// A held Observe-mode call whose cool-down is extended past what is left
// of its queue timeout is turned away Cooldown, not held until it times out
// (Timeout is a shadow reason: it would then run against the provider while
// its model is still cooling down).
func TestReviewHoldObserveExtendedCooldownBypasses(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.QueueTimeout = 10 * time.Second
	b := newBulkhead(t, cfg)
	cool429(t, b, "gpt-4o", 2*time.Second)
	var ranAt time.Time
	done := make(chan error, 1)
	go func() {
		_, err := bulkhead.Run(context.Background(), b, req("hi", 1), func(context.Context, *bulkhead.RunContext) (int, error) {
			ranAt = clk.Now()
			return 0, nil
		}, bulkhead.WithMode(bulkhead.Observe))
		done <- err
	}()
	testutil.WaitFor(t, "the call to hold", holding(b))
	clk.Add(time.Second)
	cool429(t, b, "gpt-4o", 9500*time.Millisecond) // now until 10.5s
	clk.Add(time.Second)
	_ = b.Stats()
	clk.Add(8 * time.Second) // 10s: the queue timeout
	err := <-done
	if !ranAt.IsZero() {
		t.Errorf("observe call ran at %v into a cool-down that ends at 10.5s (err %v)", ranAt.Sub(time.Unix(0, 0)), err)
	}
}

// Probe (passes): a held call survives MaxConcurrent 0 and is admitted once
// the limit is raised after its cool-down ended.
func TestReviewHoldMaxConcurrentZeroThenRaised(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.Adaptive = nil
	cfg.QueueTimeout = time.Minute
	b := newBulkhead(t, cfg)
	cool429(t, b, "gpt-4o", 5*time.Second)
	held := acquireAsync(context.Background(), b, req("hi", 1))
	testutil.WaitFor(t, "the call to hold", holding(b))
	l := b.Limits()
	l.Revision++
	l.MaxConcurrent = 0
	if _, err := b.ApplyLimits(l); err != nil {
		t.Fatal(err)
	}
	clk.Add(5 * time.Second)
	_ = b.Stats()
	l.Revision++
	l.MaxConcurrent = 8
	if _, err := b.ApplyLimits(l); err != nil {
		t.Fatal(err)
	}
	r := <-held
	if r.err != nil {
		t.Fatalf("held call after MaxConcurrent 0 then 8: %v; want it admitted", r.err)
	}
	_ = r.tok.Release(nil)
}

// Probe: a dedup leader held for a cool-down; its followers share its
// answer once the cool-down ends, and Held counts the leader once.
func TestReviewHoldDedupLeaderHeld(t *testing.T) {
	clk := clock.NewMock()
	cfg := dedupConfig(4)
	cfg.Clock = clk
	cfg.QueueTimeout = time.Minute
	b := newBulkhead(t, cfg)
	cool429(t, b, "gpt-4o", 5*time.Second)
	g := newGate()
	close(g.release)
	ctx := context.Background()
	leader := runAsync(ctx, b, req("hello", 10), g.fn("answer", nil))
	testutil.WaitFor(t, "the leader to hold", holding(b))
	var followers []<-chan runOut
	for range 3 {
		followers = append(followers, runAsync(ctx, b, req("hello", 10), g.fn("wrong", nil)))
	}
	waitHits(t, b, 3)
	if st := b.Stats(); st.Gate.Pending != 1 || st.Cooldown.Held != 1 {
		t.Errorf("while held: pending %d, held %d", st.Gate.Pending, st.Cooldown.Held)
	}
	clk.Add(5 * time.Second)
	for _, ch := range append(followers, leader) {
		if o := <-ch; o.v != "answer" || o.err != nil {
			t.Errorf("got %q, %v", o.v, o.err)
		}
	}
	if g.count() != 1 {
		t.Errorf("fn ran %d times", g.count())
	}
}
