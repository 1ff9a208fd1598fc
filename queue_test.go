package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// twoTenants is a bulkhead with one slot, a roomy budget and queue, and two
// classes, a and b.
func twoTenants(q bulkhead.QueuePolicy) bulkhead.Config {
	cfg := bulkhead.Interactive("gpt-4o", 1)
	cfg.MaxQueue = 10_000
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1 << 40}
	cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}, "b": {}}}
	cfg.Queue = q
	return cfg
}

// queued is a call waiting in the queue, by AcquireAsync.
type queued struct {
	class    string
	reserved int64
	f        *bulkhead.AcquireFuture
}

// enqueue queues a call of class reserving n tokens; AcquireAsync decides
// before it returns, so calls queue in the order they are made.
func enqueue(t *testing.T, b *bulkhead.Bulkhead, class string, n int64, opts ...bulkhead.Option) *queued {
	t.Helper()
	opts = append([]bulkhead.Option{bulkhead.WithClass(class), override(n, 0)}, opts...)
	f := b.AcquireAsync(context.Background(), req("q", 0), opts...)
	select {
	case <-f.Done():
		p, err := f.Result()
		t.Fatalf("%s call of %d tokens did not queue: %v, %v", class, n, p, err)
	default:
	}
	return &queued{class: class, reserved: n, f: f}
}

// serveAll releases the slot holder, then each admitted waiter in turn, and
// returns the waiters in the order they were admitted.
func serveAll(t *testing.T, holder *bulkhead.Permit, waiting []*queued) []*queued {
	t.Helper()
	var order []*queued
	cur := holder
	for len(waiting) > 0 {
		if err := cur.Release(nil); err != nil {
			t.Fatal(err)
		}
		next := -1
		for i, w := range waiting {
			select {
			case <-w.f.Done():
				if next >= 0 {
					t.Fatalf("two waiters admitted on one slot")
				}
				next = i
			default:
			}
		}
		if next < 0 {
			t.Fatalf("no waiter admitted after a release (%d waiting)", len(waiting))
		}
		w := waiting[next]
		p, err := w.f.Result()
		if err != nil {
			t.Fatalf("waiter of %s: %v", w.class, err)
		}
		if p.Class() != w.class || p.Reservation().Reserved != w.reserved {
			t.Fatalf("admitted %s/%d, want %s/%d", p.Class(), p.Reservation().Reserved, w.class, w.reserved)
		}
		order = append(order, w)
		waiting = append(waiting[:next], waiting[next+1:]...)
		cur = p
	}
	if err := cur.Release(nil); err != nil {
		t.Fatal(err)
	}
	return order
}

// TestFairQueueBound checks the fair queue's guarantee: while two classes
// both have calls waiting, the tokens each has been admitted (divided by
// its weight) never differ by more than twice the largest reservation,
// however the calls arrived; here class a's whole burst arrives before
// class b's first call, so a first-come, first-served queue would serve
// all of a first.
func TestFairQueueBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		weight map[string]int
	}{
		{"equal", nil},
		{"a weighs 3", map[string]int{"a": 3}},
		{"b weighs 2", map[string]int{"b": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 20; seed++ {
				rng := rand.New(rand.NewPCG(seed, 7))
				b := newBulkhead(t, twoTenants(bulkhead.QueuePolicy{Fair: true, Weights: tc.weight}))
				holder := mustAcquire(t, b, req("h", 0), override(1, 0))
				const rmax = 1000
				var waiting []*queued
				left := map[string]int{}
				for _, class := range []string{"a", "b"} {
					for range 40 {
						waiting = append(waiting, enqueue(t, b, class, 1+rng.Int64N(rmax)))
						left[class]++
					}
				}
				weight := func(c string) float64 {
					if w := tc.weight[c]; w > 0 {
						return float64(w)
					}
					return 1
				}
				served := map[string]float64{}
				for i, w := range serveAll(t, holder, waiting) {
					served[w.class] += float64(w.reserved) / weight(w.class)
					left[w.class]--
					if left["a"] == 0 || left["b"] == 0 {
						break // one class is no longer backlogged
					}
					if gap := served["a"] - served["b"]; gap > 2*rmax || gap < -2*rmax {
						t.Fatalf("seed %d, admission %d: weighted tokens served a %.0f, b %.0f: gap over 2 x %d", seed, i, served["a"], served["b"], rmax)
					}
				}
			}
		})
	}
}

// TestFairQueueHighFirstWithinClass checks that within a class High
// priority calls go first, and that otherwise calls go in arrival order.
func TestFairQueueHighFirstWithinClass(t *testing.T) {
	b := newBulkhead(t, twoTenants(bulkhead.QueuePolicy{Fair: true}))
	holder := mustAcquire(t, b, req("h", 0), override(1, 0))
	n1 := enqueue(t, b, "a", 1)
	n2 := enqueue(t, b, "a", 2)
	h3 := enqueue(t, b, "a", 3, bulkhead.WithPriority(bulkhead.High))
	got := serveAll(t, holder, []*queued{n1, n2, h3})
	if got[0] != h3 || got[1] != n1 || got[2] != n2 {
		t.Fatalf("order %d %d %d, want 3 1 2", got[0].reserved, got[1].reserved, got[2].reserved)
	}
}

// TestFairQueueIdleClassSavesNoCredit checks that a class which was idle
// while another was served starts level with it, not far behind: after a's
// long run alone, b's newcomer alternates with a rather than taking every
// slot.
func TestFairQueueIdleClassSavesNoCredit(t *testing.T) {
	b := newBulkhead(t, twoTenants(bulkhead.QueuePolicy{Fair: true}))
	for range 50 {
		p := mustAcquire(t, b, req("a", 0), override(100, 0), bulkhead.WithClass("a"))
		if err := p.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
	holder := mustAcquire(t, b, req("h", 0), override(100, 0))
	var waiting []*queued
	for range 4 {
		waiting = append(waiting, enqueue(t, b, "b", 100), enqueue(t, b, "a", 100))
	}
	got := serveAll(t, holder, waiting)
	run := 0
	for i := 1; i < len(got); i++ {
		if got[i].class == got[i-1].class {
			run++
		}
	}
	if run > 1 {
		var s []string
		for _, w := range got {
			s = append(s, w.class)
		}
		t.Fatalf("served %v: want the classes to alternate", s)
	}
}

// TestFIFOQueueIsArrivalOrder checks that without Fair the queue is served
// in arrival order, across classes and priorities.
func TestFIFOQueueIsArrivalOrder(t *testing.T) {
	b := newBulkhead(t, twoTenants(bulkhead.QueuePolicy{}))
	holder := mustAcquire(t, b, req("h", 0), override(1, 0))
	w := []*queued{enqueue(t, b, "a", 1), enqueue(t, b, "b", 2), enqueue(t, b, "a", 3, bulkhead.WithPriority(bulkhead.High))}
	got := serveAll(t, holder, append([]*queued(nil), w...))
	for i := range w {
		if got[i] != w[i] {
			t.Fatalf("admission %d reserved %d, want %d", i, got[i].reserved, w[i].reserved)
		}
	}
	if st := b.Stats(); st.Classes.Classes["a"].Pending != 0 {
		t.Fatalf("pending %+v", st.Classes.Classes["a"])
	}
}

// waitConfig is a bulkhead of 4 slots and 100 tokens that lets calls wait
// for capacity, with classes x (at most 1 call) and y.
func waitConfig(clk clock.Clock) bulkhead.Config {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.MaxQueue = 8
	cfg.QueueTimeout = time.Second
	cfg.Clock = clk
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100}
	cfg.Classes = &bulkhead.Classes{Default: "y", Limits: map[string]bulkhead.ClassLimits{
		"x": {MaxConcurrent: bulkhead.Ceiling(1)},
		"y": {},
	}}
	cfg.Queue.WaitForCapacity = true
	return cfg
}

// admitted waits for a queued call's admission.
func admitted(t *testing.T, q *queued) *bulkhead.Permit {
	t.Helper()
	p, err := q.f.Result()
	if err != nil {
		t.Fatalf("%s call of %d tokens: %v", q.class, q.reserved, err)
	}
	return p
}

// stillQueued fails unless q is still waiting.
func stillQueued(t *testing.T, q *queued) {
	t.Helper()
	select {
	case <-q.f.Done():
		p, err := q.f.Result()
		t.Fatalf("%s call of %d tokens ended: %v, %v; want it waiting", q.class, q.reserved, p, err)
	default:
	}
}

func TestWaitForCapacityBudget(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	big := mustAcquire(t, b, req("a", 0), override(80, 0))
	w := enqueue(t, b, "y", 50) // fails the budget only: waits
	if st := b.Stats(); st.Gate.Pending != 1 || st.Classes.Classes["y"].Pending != 1 || st.Gate.InFlight != 1 {
		t.Fatalf("gate %+v", st.Gate)
	}
	if d, err := b.WouldAdmit(req("a", 0), override(50, 0)); err != nil || !d.Admit {
		t.Fatalf("WouldAdmit = %+v, %v; want admit (it would wait)", d, err)
	}
	if err := big.Release(nil); err != nil {
		t.Fatal(err)
	}
	p := admitted(t, w)
	if st := b.Stats(); st.TokenBudget.InFlightTokens != 50 || st.Calls.Rejected != 0 {
		t.Fatalf("after the release: %+v, %+v", st.TokenBudget, st.Calls)
	}
	if err := p.Release(nil); err != nil {
		t.Fatal(err)
	}
}

func TestWaitForCapacityOffFailsFast(t *testing.T) {
	cfg := waitConfig(clock.NewMock())
	cfg.Queue.WaitForCapacity = false
	b := newBulkhead(t, cfg)
	big := mustAcquire(t, b, req("a", 0), override(80, 0))
	defer big.Release(nil)
	_, err := b.Acquire(context.Background(), req("a", 0), override(50, 0))
	wantReason(t, err, bulkhead.BudgetLimit)
}

func TestWaitForCapacityNeverFitsNeverWaits(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	_, err := b.Acquire(context.Background(), req("a", 0), override(150, 0))
	if rej := wantReason(t, err, bulkhead.BudgetLimit); !rej.NeverFits() {
		t.Fatalf("%v: want NeverFits", err)
	}
	if st := b.Stats(); st.Gate.Pending != 0 {
		t.Fatalf("pending %d", st.Gate.Pending)
	}
}

// TestWaitForCapacityClassIsolation checks that a class at its ceiling
// waits without holding back another class, and that its own calls keep
// their order: a small call waits behind its class's waiter.
func TestWaitForCapacityClassIsolation(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	x1 := mustAcquire(t, b, req("a", 0), override(10, 0), bulkhead.WithClass("x"))
	x2 := enqueue(t, b, "x", 10)
	x3 := enqueue(t, b, "x", 1)
	y := mustAcquire(t, b, req("a", 0), override(10, 0), bulkhead.WithClass("y")) // goes ahead
	if err := y.Release(nil); err != nil {
		t.Fatal(err)
	}
	stillQueued(t, x2)
	stillQueued(t, x3)
	if err := x1.Release(nil); err != nil {
		t.Fatal(err)
	}
	p2 := admitted(t, x2)
	stillQueued(t, x3)
	if err := p2.Release(nil); err != nil {
		t.Fatal(err)
	}
	if err := admitted(t, x3).Release(nil); err != nil {
		t.Fatal(err)
	}
}

// TestWaitForCapacityFreedByUsage checks that a usage report lowering a
// hold admits a waiter that now fits.
func TestWaitForCapacityFreedByUsage(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	p := mustAcquire(t, b, req("a", 0), override(10, 70)) // holds 80
	w := enqueue(t, b, "y", 50)
	if _, err := p.ReportUsage(bulkhead.Usage{Input: 10, Output: 5}, &bulkhead.Progressive{RemainingOutput: 10, SafetyMargin: 5}); err != nil {
		t.Fatal(err)
	}
	q := admitted(t, w)
	for _, x := range []*bulkhead.Permit{p, q} {
		if err := x.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitForCapacityLimits checks new limits: a raised budget admits a
// waiter; a budget it can never fit rejects it, saying so.
func TestWaitForCapacityLimits(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	p := mustAcquire(t, b, req("a", 0), override(80, 0))
	defer p.Release(nil)
	w1 := enqueue(t, b, "y", 50)
	if _, err := b.SetBudget(130); err != nil {
		t.Fatal(err)
	}
	defer admitted(t, w1).Release(nil)
	w2 := enqueue(t, b, "y", 60)
	if _, err := b.SetBudget(50); err != nil {
		t.Fatal(err)
	}
	_, err := w2.f.Result()
	if rej := wantReason(t, err, bulkhead.BudgetLimit); !rej.NeverFits() {
		t.Fatalf("%v: want NeverFits", err)
	}
}

// TestWaitForCapacityTimeoutAndCancel checks that a waiter for capacity is
// bounded by its queue timeout and its context, and that one leaving lets
// the next of its class be admitted.
func TestWaitForCapacityTimeoutAndCancel(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, waitConfig(clk))
	p := mustAcquire(t, b, req("a", 0), override(60, 0))
	defer p.Release(nil)
	w1 := enqueue(t, b, "y", 50)
	w2 := enqueue(t, b, "y", 30, bulkhead.WithQueueTimeout(2*time.Second)) // fits, but waits behind w1
	stillQueued(t, w2)
	ctx, cancel := context.WithCancel(context.Background())
	w3 := b.AcquireAsync(ctx, req("a", 0), override(45, 0))
	cancel()
	if _, err := w3.Result(); !errors.Is(err, bulkhead.ErrAborted) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	stillQueued(t, w2)
	clk.Add(time.Second) // w1's timeout, not w2's
	if _, err := w1.f.Result(); !errors.Is(err, bulkhead.ErrTimeout) {
		t.Fatalf("waiter past its queue timeout: %v", err)
	}
	if err := admitted(t, w2).Release(nil); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Gate.Pending != 0 || st.Gate.TimedOut != 1 || st.Gate.Aborted != 1 {
		t.Fatalf("gate %+v", st.Gate)
	}
}

func TestQueuePolicyInvalid(t *testing.T) {
	classes := &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}}
	for _, tc := range []struct {
		name  string
		q     bulkhead.QueuePolicy
		cls   *bulkhead.Classes
		field string
	}{
		{"fair without classes", bulkhead.QueuePolicy{Fair: true}, nil, "Config.Queue.Fair"},
		{"weights without fair", bulkhead.QueuePolicy{Weights: map[string]int{"a": 2}}, classes, "Config.Queue.Weights"},
		{"unknown class", bulkhead.QueuePolicy{Fair: true, Weights: map[string]int{"z": 2}}, classes, "Config.Queue.Weights"},
		{"zero weight", bulkhead.QueuePolicy{Fair: true, Weights: map[string]int{"a": 0}}, classes, "Config.Queue.Weights"},
		{"huge weight", bulkhead.QueuePolicy{Fair: true, Weights: map[string]int{"a": 1_000_001}}, classes, "Config.Queue.Weights"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := bulkhead.Interactive("gpt-4o", 1)
			cfg.Classes, cfg.Queue = tc.cls, tc.q
			_, err := bulkhead.New(cfg)
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, bulkhead.ErrInvalid) {
				t.Fatalf("New = %v; want a *ConfigError for %s", err, tc.field)
			}
		})
	}
}

func ExampleQueuePolicy() {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.Classes = &bulkhead.Classes{Default: "free", Limits: map[string]bulkhead.ClassLimits{"free": {}, "paid": {}}}
	// A freed slot goes to the waiting class admitted the fewest tokens;
	// paid's count only half, so paid gets two slots for free's one.
	cfg.Queue = bulkhead.QueuePolicy{Fair: true, Weights: map[string]int{"paid": 2}}
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())

	ctx := context.Background()
	p, _ := b.Acquire(ctx, &bulkhead.Request{}) // takes the slot
	var waiting []*bulkhead.AcquireFuture
	for _, class := range []string{"free", "free", "free", "paid", "paid", "paid"} {
		waiting = append(waiting, b.AcquireAsync(ctx, &bulkhead.Request{}, bulkhead.WithClass(class)))
	}
	for len(waiting) > 0 {
		_ = p.Release(nil) // the slot goes to the next waiter
		for i, f := range waiting {
			if isDone(f) {
				p, _ = f.Result()
				waiting = append(waiting[:i], waiting[i+1:]...)
				fmt.Print(p.Class(), " ")
				break
			}
		}
	}
	_ = p.Release(nil)
	fmt.Println()
	// Output: free paid paid free paid free
}

// isDone reports whether f has its answer.
func isDone(f *bulkhead.AcquireFuture) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}

func ExampleQueuePolicy_waitForCapacity() {
	cfg := bulkhead.Batch("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	cfg.Queue.WaitForCapacity = true // wait for tokens, not only for a slot
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())

	big, _ := b.Acquire(context.Background(), &bulkhead.Request{}, bulkhead.WithReservation(bulkhead.Reservation{Input: 8_000}))
	f := b.AcquireAsync(context.Background(), &bulkhead.Request{}, bulkhead.WithReservation(bulkhead.Reservation{Input: 5_000}))
	fmt.Println("waiting:", b.Stats().Gate.Pending)
	_ = big.Release(nil) // the tokens come back: the waiter fits now
	p, err := f.Result()
	fmt.Println("admitted:", err == nil, p.Reservation().Reserved)
	_ = p.Release(nil)
	// Output:
	// waiting: 1
	// admitted: true 5000
}

// TestWaitForCapacityWaiterLeavingDuringCooldownHoldsTheNext checks that a
// waiter for capacity holds back its class from the moment it queues: when
// it leaves, the call queued behind it is looked at again, and during a
// cool-down it is counted held, as it would be had a slot been freed.
func TestWaitForCapacityWaiterLeavingDuringCooldownHoldsTheNext(t *testing.T) {
	b := newBulkhead(t, waitConfig(clock.NewMock()))
	p := mustAcquire(t, b, req("a", 0), override(60, 0))
	defer p.Release(nil)
	ctx, cancel := context.WithCancel(context.Background())
	w1 := b.AcquireAsync(ctx, req("a", 0), override(50, 0), bulkhead.WithClass("y")) // fails the budget: waits
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	w2 := enqueue(t, b, "y", 45) // fails the budget too: waits behind w1
	if st := b.Stats(); st.Cooldown.Held != 0 || st.Gate.Pending != 2 {
		t.Fatalf("before w1 leaves: held %d, pending %d", st.Cooldown.Held, st.Gate.Pending)
	}
	cancel()
	if _, err := w1.Result(); !errors.Is(err, bulkhead.ErrAborted) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if st := b.Stats(); st.Cooldown.Held != 1 || st.Gate.Pending != 1 {
		t.Fatalf("after w1 left: held %d, pending %d; want w2 looked at again, and held for the cool-down", st.Cooldown.Held, st.Gate.Pending)
	}
	stillQueued(t, w2)
}

// classQueueConfig is a bulkhead with n slots, a budget, a roomy queue
// without a timeout, the classes given and the queue policy q.
func classQueueConfig(n int, budget int64, cls map[string]bulkhead.ClassLimits, def string, q bulkhead.QueuePolicy) bulkhead.Config {
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

// TestFairQueueBudgetWaiterNotStarvedByBurst: with Fair and WaitForCapacity,
// a class whose first waiter needs more of the global budget than is free
// was skipped ("other classes go ahead") every time a slot freed, so another
// class's burst of smaller calls was admitted indefinitely while it waited.
// QueuePolicy.Fair and README promise that "one class's burst cannot starve
// another's waiters" and that two backlogged classes of equal weight are
// admitted within twice the largest reservation of each other (SPEC X3).
// Here b was admitted 20 x 30 = 600 tokens while a's one 50-token call,
// which would fit an idle bulkhead many times over, was admitted nothing.
func TestFairQueueBudgetWaiterNotStarvedByBurst(t *testing.T) {
	cfg := classQueueConfig(10, 100, map[string]bulkhead.ClassLimits{"a": {}, "b": {}}, "a",
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

// TestFairQueueBlockedClassLendsNoCredit: a class blocked for capacity (here
// at its concurrency ceiling) stays backlogged with an old, low counter; a
// class that started to wait was lifted only to that low counter, so a class
// that was idle while another was served started far below it and took
// every slot. README: "A class that starts to wait begins level with the
// classes already waiting, so an idle class saves up no credit"; the two
// servable classes a and b both wait, yet b was admitted all 10 of its calls
// (1000 tokens) before a's first.
func TestFairQueueBlockedClassLendsNoCredit(t *testing.T) {
	one := 1
	cfg := classQueueConfig(2, 1<<40, map[string]bulkhead.ClassLimits{"a": {}, "b": {}, "x": {MaxConcurrent: &one}}, "a",
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
	checkServedEvenly(t, got, 200, "while both waited; b saved up credit while idle")
}

// TestFairQueueCountersKeepPrecisionWhenLarge: the virtual token counters
// were float64 sums, so once they were large an admission's charge
// (reservation / weight) rounded away and the counter stopped moving: the
// class with the lower handle then won every tie and was served exclusively.
// Classes a and b have equal weights (1,000,000, within the documented range)
// and both keep calls waiting, yet a was admitted all 10 of its calls before
// b's first, past the "within twice the largest reservation" bound. The
// counters reach this size after a weight-1 class has been admitted about
// 1e13 tokens (here in one call, to keep the test short; in a long-lived
// gateway, cumulatively).
func TestFairQueueCountersKeepPrecisionWhenLarge(t *testing.T) {
	cfg := classQueueConfig(1, 1<<44, map[string]bulkhead.ClassLimits{"a": {}, "b": {}, "c": {}}, "c",
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
	checkServedEvenly(t, got, 200, "while both waited with equal weights")
}

// checkServedEvenly fails t once, along the order got were served in, the
// tokens served to classes a and b (of equal weights) are more than bound
// apart; what says what the classes did meanwhile.
func checkServedEvenly(t *testing.T, got []*queued, bound int64, what string) {
	t.Helper()
	served := map[string]int64{}
	for _, w := range got {
		served[w.class] += w.reserved
		if gap := served["a"] - served["b"]; gap > bound || gap < -bound {
			var s []string
			for _, w := range got {
				s = append(s, w.class)
			}
			t.Fatalf("served %v: a %d, b %d %s", s, served["a"], served["b"], what)
		}
	}
}

// TestUnfittableWaiterRejectedWhileSlotsBusy: README (waiting for capacity):
// "a waiter that new limits make unfittable is rejected then". With every
// slot in use the pump served no one, so a waiter that SetBudget made unable
// ever to fit stayed queued (Stats showed it pending, WouldAdmit already
// said never fits) until some slot freed.
func TestUnfittableWaiterRejectedWhileSlotsBusy(t *testing.T) {
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

// TestUnfittableWaiterRejectedBehindItsClass: the same README promise with
// slots free: the pump looks only at the first waiter of each class, so a
// waiter behind it that new limits made unable ever to fit stayed queued
// (until its queue timeout) instead of being rejected then.
func TestUnfittableWaiterRejectedBehindItsClass(t *testing.T) {
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

// TestWaitForCapacityHighWaitsBehindNormalOfItsClass: in the plain queue a
// High call that fits the High priority reserve waits behind a Normal call
// of its class that waits for the Normal budget (F15's own check, "a high 20
// is admitted", no longer holds with WaitForCapacity). Documented ("a call
// waits behind the calls of its class that are already waiting, even if it
// would fit now"), but it defeats the reserve; with Fair, High goes first
// within the class.
func TestWaitForCapacityHighWaitsBehindNormalOfItsClass(t *testing.T) {
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

// TestCloseRejectsWaitersOfEveryLane: Close rejects Shutdown every waiter of
// the fair queue, whatever its class, priority or what it waits for, and
// leaves no class with a call pending.
func TestCloseRejectsWaitersOfEveryLane(t *testing.T) {
	one := 1
	cfg := classQueueConfig(1, 100, map[string]bulkhead.ClassLimits{"a": {}, "b": {}, "x": {MaxConcurrent: &one}}, "a",
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

// TestWaitForCapacityWaiterSurvivesKillSwitch: a waiter for capacity stays
// queued while MaxConcurrent is 0 (new calls are turned away) and is
// admitted once the limit is raised.
func TestWaitForCapacityWaiterSurvivesKillSwitch(t *testing.T) {
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

// TestObserveWaiterForCapacityAdmittedNotBypassed: an observe-mode call that
// waits for capacity is admitted, not bypassed, once capacity frees.
func TestObserveWaiterForCapacityAdmittedNotBypassed(t *testing.T) {
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

// TestRateRefusalAtGrantPumpsWaitersForCapacity: a waiter for capacity that
// its rate turns away at its grant gives its slot to the next waiter, on
// every rate store.
func TestRateRefusalAtGrantPumpsWaitersForCapacity(t *testing.T) {
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
