package bulkhead_test

// Regression tests from an adversarial review of Config.Queue (fair
// queuing, waiting for capacity): each TestReviewQueue* test failed on the
// reviewed code and guards the fix of the defect its comment describes.

import (
	"context"
	"errors"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// reviewCfg is a bulkhead with n slots, a budget, a roomy queue without a
// timeout, the classes given and the queue policy q.
func reviewCfg(n int, budget int64, cls map[string]bulkhead.ClassLimits, def string, q bulkhead.QueuePolicy) bulkhead.Config {
	cfg := bulkhead.Interactive("gpt-4o", n)
	cfg.MaxQueue = 1000
	cfg.Clock = clock.NewMock()
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: budget}
	cfg.Classes = &bulkhead.Classes{Default: def, Limits: cls}
	cfg.Queue = q
	return cfg
}

// firstDone returns the index of the one waiter in ws that has its answer,
// -1 for none; two is a failure.
func firstDone(t *testing.T, ws []*queued) int {
	t.Helper()
	got := -1
	for i, w := range ws {
		if w != nil && isDone(w.f) {
			if got >= 0 {
				t.Fatalf("two waiters answered at once")
			}
			got = i
		}
	}
	return got
}

// TestReviewQueueFairBudgetWaiterStarved: with Fair and WaitForCapacity, a
// class whose first waiter needs more of the global budget than is free is
// skipped ("other classes go ahead") every time a slot frees, so another
// class's burst of smaller calls is admitted indefinitely while it waits.
// QueuePolicy.Fair and README promise that "one class's burst cannot
// starve another's waiters" and that two backlogged classes of equal
// weight are admitted within twice the largest reservation of each other
// (SPEC X3). Here b is admitted 20 x 30 = 600 tokens while a's one 50-token
// call, which would fit an idle bulkhead many times over, is admitted
// nothing.
func TestReviewQueueFairBudgetWaiterStarved(t *testing.T) {
	cfg := reviewCfg(10, 100, map[string]bulkhead.ClassLimits{"a": {}, "b": {}}, "a",
		bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true})
	b := newBulkhead(t, cfg)
	var holders []*bulkhead.Permit
	for range 3 {
		holders = append(holders, mustAcquire(t, b, req("b", 0), override(30, 0), bulkhead.WithClass("b")))
	}
	wa := enqueue(t, b, "a", 50) // 90 + 50 > 100: waits for tokens
	var wb []*queued
	for range 20 {
		wb = append(wb, enqueue(t, b, "b", 30)) // 90 + 30 > 100: waits too
	}
	bServed := int64(0)
	for len(wb) > 0 && !isDone(wa.f) {
		if err := holders[0].Release(nil); err != nil {
			t.Fatal(err)
		}
		holders = holders[1:]
		if isDone(wa.f) {
			break
		}
		i := firstDone(t, wb)
		if i < 0 {
			if len(holders) == 0 {
				t.Fatalf("nothing admitted after the last release")
			}
			continue // the slot waits for a's tokens
		}
		holders = append(holders, admitted(t, wb[i]))
		bServed += wb[i].reserved
		wb = append(wb[:i], wb[i+1:]...)
	}
	starved := !isDone(wa.f)
	// Settle everything so the bulkhead drains.
	for _, p := range holders {
		_ = p.Release(nil)
	}
	_ = admitted(t, wa).Release(nil)
	for _, w := range wb {
		_ = admitted(t, w).Release(nil)
	}
	if starved || bServed > 2*50 {
		t.Fatalf("class a's 50-token waiter starved: class b was admitted %d tokens from the queue while a waited with 0 (bound 2 x 50)", bServed)
	}
}

// TestReviewQueueFairBlockedClassLendsCredit: a class blocked for capacity
// (here at its concurrency ceiling) stays backlogged with an old, low
// counter; a class that starts to wait is lifted only to that low counter,
// so a class that was idle while another was served starts far below it
// and takes every slot. README: "A class that starts to wait begins level
// with the classes already waiting, so an idle class saves up no credit";
// the two servable classes a and b both wait, yet b is admitted all 10 of
// its calls (1000 tokens) before a's first.
func TestReviewQueueFairBlockedClassLendsCredit(t *testing.T) {
	one := 1
	cfg := reviewCfg(2, 1<<40, map[string]bulkhead.ClassLimits{"a": {}, "b": {}, "x": {MaxConcurrent: &one}}, "a",
		bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true})
	b := newBulkhead(t, cfg)
	x1 := mustAcquire(t, b, req("x", 0), override(1, 0), bulkhead.WithClass("x"))
	x2 := enqueue(t, b, "x", 1) // at x's ceiling: waits, backlogged with x's counter (1)
	for range 50 {              // a is served 5000 tokens while b is idle
		p := mustAcquire(t, b, req("a", 0), override(100, 0), bulkhead.WithClass("a"))
		if err := p.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
	holder := mustAcquire(t, b, req("a", 0), override(100, 0), bulkhead.WithClass("a")) // the last slot
	var waiting []*queued
	for range 10 {
		waiting = append(waiting, enqueue(t, b, "b", 100), enqueue(t, b, "a", 100))
	}
	got := serveAll(t, holder, waiting)
	if err := x1.Release(nil); err != nil {
		t.Fatal(err)
	}
	if err := admitted(t, x2).Release(nil); err != nil {
		t.Fatal(err)
	}
	served := map[string]int64{}
	for _, w := range got {
		served[w.class] += w.reserved
		if gap := served["a"] - served["b"]; gap > 200 || gap < -200 {
			var s []string
			for _, w := range got {
				s = append(s, w.class)
			}
			t.Fatalf("served %v: a %d, b %d while both waited; b saved up credit while idle", s, served["a"], served["b"])
		}
	}
}

// TestReviewQueueFairCounterPrecision: the virtual token counters are
// float64 sums, so once they are large an admission's charge
// (reservation / weight) rounds away and the counter stops moving: the
// class with the lower handle then wins every tie and is served
// exclusively. Classes a and b have equal weights (1,000,000, within the
// documented range) and both keep calls waiting, yet a is admitted all 10
// of its calls before b's first, past the "within twice the largest
// reservation" bound. The counters reach this size after a weight-1 class
// has been admitted about 1e13 tokens (here in one call, to keep the test
// short; in a long-lived gateway, cumulatively).
func TestReviewQueueFairCounterPrecision(t *testing.T) {
	cfg := reviewCfg(1, 1<<44, map[string]bulkhead.ClassLimits{"a": {}, "b": {}, "c": {}}, "c",
		bulkhead.QueuePolicy{Fair: true, Weights: map[string]int{"a": 1_000_000, "b": 1_000_000}})
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("c", 0), override(10_000_000_000_000, 0), bulkhead.WithClass("c"))
	if err := p.Release(nil); err != nil {
		t.Fatal(err)
	}
	holder := mustAcquire(t, b, req("c", 0), override(1, 0), bulkhead.WithClass("c"))
	var waiting []*queued
	for range 10 {
		waiting = append(waiting, enqueue(t, b, "a", 100), enqueue(t, b, "b", 100))
	}
	got := serveAll(t, holder, waiting)
	served := map[string]int64{}
	for _, w := range got {
		served[w.class] += w.reserved
		if gap := served["a"] - served["b"]; gap > 200 || gap < -200 {
			var s []string
			for _, w := range got {
				s = append(s, w.class)
			}
			t.Fatalf("served %v: a %d, b %d while both waited with equal weights", s, served["a"], served["b"])
		}
	}
}

// TestReviewQueueUnfittableWaiterKeptWhileSlotsBusy: README (waiting for
// capacity): "a waiter that new limits make unfittable is rejected then".
// With every slot in use the pump serves no one, so a waiter that
// SetBudget made unable ever to fit stays queued (Stats shows it pending,
// WouldAdmit already says never fits) until some slot frees.
func TestReviewQueueUnfittableWaiterKeptWhileSlotsBusy(t *testing.T) {
	cfg := waitConfig(clock.NewMock())
	cfg.MaxConcurrent = 1
	b := newBulkhead(t, cfg)
	holder := mustAcquire(t, b, req("a", 0), override(80, 0))
	defer holder.Release(nil)
	w := enqueue(t, b, "y", 50) // waits for tokens (and for the slot)
	if _, err := b.SetBudget(40); err != nil {
		t.Fatal(err)
	}
	d, err := b.WouldAdmit(req("a", 0), override(50, 0), bulkhead.WithDetail())
	if err != nil || d.Admit {
		t.Fatalf("WouldAdmit = %+v, %v", d, err)
	}
	if !isDone(w.f) {
		t.Fatalf("a waiter of 50 tokens under a budget of 40 is still queued (pending %d; WouldAdmit for the same call: %v, NeverFits %v)",
			b.Stats().Gate.Pending, d.Reason, d.Detail != nil && d.Detail.NeverFits)
	}
	_, err = w.f.Result()
	if rej := wantReason(t, err, bulkhead.BudgetLimit); !rej.NeverFits() {
		t.Fatalf("%v: want NeverFits", err)
	}
}

// TestReviewQueueUnfittableWaiterKeptBehindItsClass: the same README
// promise with slots free: the pump looks only at the first waiter of each
// class, so a waiter behind it that new limits made unable ever to fit
// stays queued (until its queue timeout) instead of being rejected then.
func TestReviewQueueUnfittableWaiterKeptBehindItsClass(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	holder := mustAcquire(t, b, req("a", 0), override(60, 0))
	w1 := enqueue(t, b, "y", 50) // 60 + 50 > 100: waits; fits under 55 once holder ends
	w2 := enqueue(t, b, "y", 52) // waits behind w1
	if _, err := b.SetBudget(51); err != nil {
		t.Fatal(err)
	}
	stillQueued(t, w1)
	w2Done := isDone(w2.f)
	_ = holder.Release(nil)
	_ = admitted(t, w1).Release(nil)
	_, err := w2.f.Result()
	if rej := wantReason(t, err, bulkhead.BudgetLimit); !rej.NeverFits() {
		t.Fatalf("%v: want NeverFits", err)
	}
	if !w2Done {
		t.Fatalf("a waiter of 52 tokens under a budget of 51, with 3 of 4 slots free, stayed queued after SetBudget")
	}
}

// TestReviewQueueNoteHighWaitsBehindNormal (a doubtful point, passes): in
// the plain queue a High call that fits the High priority reserve waits
// behind a Normal call of its class that waits for the Normal budget (F15's
// own check, "a high 20 is admitted", no longer holds with
// WaitForCapacity). Documented ("a call waits behind the calls of its class
// that are already waiting, even if it would fit now"), but it defeats the
// reserve; with Fair, High goes first within the class.
func TestReviewQueueNoteHighWaitsBehindNormal(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.MaxQueue = 8
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100, HighPriorityReserve: 20}
	cfg.Queue.WaitForCapacity = true
	b := newBulkhead(t, cfg)
	normal := mustAcquire(t, b, req("a", 0), override(80, 0))
	n1 := b.AcquireAsync(context.Background(), req("a", 0), override(1, 0))
	h := b.AcquireAsync(context.Background(), req("a", 0), override(20, 0), bulkhead.WithPriority(bulkhead.High))
	if isDone(h) || isDone(n1) {
		t.Fatalf("want both waiting")
	}
	_ = normal.Release(nil)
	for _, f := range []*bulkhead.AcquireFuture{n1, h} {
		p, err := f.Result()
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Release(nil)
	}
}

// The TestReviewQueueProbe* tests pass: attacks that found nothing (Close
// across every lane, the kill switch with waiters, Observe mode with a
// waiter for capacity, a rolled-back provisional admission pumping).

func TestReviewQueueProbeCloseAllLanes(t *testing.T) {
	one := 1
	cfg := reviewCfg(1, 100, map[string]bulkhead.ClassLimits{"a": {}, "b": {}, "x": {MaxConcurrent: &one}}, "a",
		bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true})
	b := newBulkhead(t, cfg)
	h := mustAcquire(t, b, req("x", 0), override(60, 0), bulkhead.WithClass("x"))
	var ws []*queued
	for _, c := range []string{"a", "b", "x"} {
		ws = append(ws, enqueue(t, b, c, 50), enqueue(t, b, c, 10, bulkhead.WithPriority(bulkhead.High)), enqueue(t, b, c, 10))
	}
	st := b.Stats()
	if st.Gate.Pending != 9 || st.Classes.Classes["x"].Pending != 3 {
		t.Fatalf("%+v", st.Gate)
	}
	b.Close()
	for _, w := range ws {
		_, err := w.f.Result()
		if !errors.Is(err, bulkhead.ErrShutdown) {
			t.Fatalf("%v", err)
		}
	}
	st = b.Stats()
	for n, c := range st.Classes.Classes {
		if c.Pending != 0 {
			t.Fatalf("%s pending %d", n, c.Pending)
		}
	}
	h.Release(nil)
}

func TestReviewQueueProbeKillSwitch(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	h := mustAcquire(t, b, req("a", 0), override(80, 0))
	w1 := enqueue(t, b, "y", 50)
	l := b.Limits()
	l.Revision++
	l.MaxConcurrent = 0
	if _, err := b.ApplyLimits(l); err != nil {
		t.Fatal(err)
	}
	h.Release(nil)
	stillQueued(t, w1)
	_, err := b.Acquire(context.Background(), req("a", 0), override(1, 0))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	l.Revision++
	l.MaxConcurrent = 4
	if _, err := b.ApplyLimits(l); err != nil {
		t.Fatal(err)
	}
	admitted(t, w1).Release(nil)
}

func TestReviewQueueProbeObserveWait(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, waitConfig(clk))
	h := mustAcquire(t, b, req("a", 0), override(80, 0))
	done := make(chan *bulkhead.RunContext, 1)
	go bulkhead.Run(context.Background(), b, req("a", 0), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		done <- rc
		return 0, nil
	}, override(50, 0), bulkhead.WithMode(bulkhead.Observe))
	for b.Stats().Gate.Pending == 0 {
	}
	h.Release(nil)
	rc := <-done
	if rc.Bypass() != nil {
		t.Fatalf("bypassed %+v", rc.Bypass())
	}
}

func TestReviewQueueProbeRollbackPumps(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		cfg := waitConfig(clk)
		cfg.RateLimits = &bulkhead.RateLimits{Store: store, PerClass: map[string]bulkhead.Rate{"x": {RequestsPerMinute: 1, RequestBurst: bulkhead.NoBurst}}}
		b := newBulkhead(t, cfg)
		p := mustAcquire(t, b, req("a", 0), override(1, 0), bulkhead.WithClass("x"))
		p.Release(nil)
		h := mustAcquire(t, b, req("a", 0), override(80, 0))
		w1 := enqueue(t, b, "x", 60)
		for b.Stats().Gate.Pending < 1 {
		}
		w2 := enqueue(t, b, "y", 60)
		for b.Stats().Gate.Pending < 2 {
		}
		h.Release(nil)
		_, err := w1.f.Result()
		wantReason(t, err, bulkhead.RateLimit)
		admitted(t, w2).Release(nil)
	})
}
