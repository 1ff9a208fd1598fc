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
