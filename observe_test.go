package bulkhead_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// observeLog records the events of an observe-mode test, in order.
type observeLog struct {
	mu       sync.Mutex
	order    []string
	rejects  []bulkhead.RejectEvent
	bypasses []bulkhead.BypassEvent
	usages   []bulkhead.BypassUsageEvent
	releases []bulkhead.BypassReleaseEvent
	admits   int
}

func (l *observeLog) add(what string, f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order = append(l.order, what)
	f()
}

func subscribeObserve(b *bulkhead.Bulkhead) *observeLog {
	l := &observeLog{}
	b.Subscribe(bulkhead.Hooks{
		Admit:   func(bulkhead.AdmitEvent) { l.add("admit", func() { l.admits++ }) },
		Release: func(bulkhead.ReleaseEvent) { l.add("release", func() {}) },
		Reject: func(e bulkhead.RejectEvent) {
			l.add("reject:"+e.Reason.String(), func() { l.rejects = append(l.rejects, e) })
		},
		Bypass: func(e bulkhead.BypassEvent) {
			l.add("bypass:"+e.Reason.String(), func() { l.bypasses = append(l.bypasses, e) })
		},
		BypassUsage: func(e bulkhead.BypassUsageEvent) {
			l.add("bypass_usage", func() { l.usages = append(l.usages, e) })
		},
		BypassRelease: func(e bulkhead.BypassReleaseEvent) {
			l.add("bypass_release", func() { l.releases = append(l.releases, e) })
		},
	})
	return l
}

// events returns the order of the events seen, once b is drained.
func (l *observeLog) events() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.order, " ")
}

// capacityOf is st without the observe statistics and the event delivery:
// what bypassed work must never change.
func capacityOf(st bulkhead.Stats) bulkhead.Stats {
	st.Observe = bulkhead.ObserveStats{}
	st.Events = bulkhead.EventStats{}
	return st
}

// seenCall is what an observe-mode callback saw of itself.
type seenCall struct {
	id       bulkhead.ID
	rev      int64
	bypass   *bulkhead.Bypass
	res      *bulkhead.Reservation
	rsrc     bulkhead.Resources
	abandon  bool
	capacity bulkhead.Stats // Stats while it ran, without Observe
	observe  bulkhead.ObserveStats
}

// observed runs one observe-mode Run and returns what its callback saw
// (nil if it did not run) and Run's error.
func observed(ctx context.Context, b *bulkhead.Bulkhead, r *bulkhead.Request, opts ...bulkhead.Option) (*seenCall, error) {
	var seen *seenCall
	opts = append([]bulkhead.Option{bulkhead.WithMode(bulkhead.Observe)}, opts...)
	_, err := bulkhead.Run(ctx, b, r, func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
		st := b.Stats()
		seen = &seenCall{id: rc.ID(), rev: rc.LimitRevision(), bypass: rc.Bypass(), res: rc.Reservation(), rsrc: rc.Resources(),
			abandon: rc.AbandonBorrowedConcurrency(), capacity: capacityOf(st), observe: st.Observe}
		return 1, rc.SetUsage(bulkhead.Usage{Input: 3, Output: 4})
	}, opts...)
	return seen, err
}

// TestObserveBypassesEachReason: for each shadowable reason, a call that
// would be rejected runs bypassed, holding nothing and changing no capacity
// counter. A refusal on arrival emits no reject event; a queue timeout is
// rejected first, then bypassed as a race.
func TestObserveBypassesEachReason(t *testing.T) {
	bg := context.Background()
	tests := []struct {
		name string
		why  bulkhead.Reason
		race bool
		// setup builds the bulkhead full in the way the test needs; wait,
		// when set, lets a queued call reach its refusal; free ends what
		// setup holds.
		setup func(t *testing.T) (b *bulkhead.Bulkhead, opts []bulkhead.Option, wait, free func())
	}{
		{"budget", bulkhead.BudgetLimit, false, func(t *testing.T) (*bulkhead.Bulkhead, []bulkhead.Option, func(), func()) {
			b := budgetBulkhead(t, 4, 100, 0)
			held := mustAcquire(t, b, req("a", 0), override(60, 20))
			return b, []bulkhead.Option{override(10, 20)}, nil, func() { _ = held.Release(nil) }
		}},
		{"concurrency", bulkhead.ConcurrencyLimit, false, func(t *testing.T) (*bulkhead.Bulkhead, []bulkhead.Option, func(), func()) {
			b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
			held := mustAcquire(t, b, req("a", 0))
			return b, nil, nil, func() { _ = held.Release(nil) }
		}},
		{"queue", bulkhead.QueueLimit, false, func(t *testing.T) (*bulkhead.Bulkhead, []bulkhead.Option, func(), func()) {
			cfg := bulkhead.Batch("gpt-4o", 1)
			cfg.MaxQueue = 1
			b := newBulkhead(t, cfg)
			held := mustAcquire(t, b, req("a", 0))
			w := acquireAsync(bg, b, req("w", 0))
			testutil.WaitFor(t, "the waiter to queue", pending(b))
			return b, nil, nil, func() {
				_ = held.Release(nil)
				_ = (<-w).tok.Release(nil)
			}
		}},
		{"timeout", bulkhead.Timeout, true, func(t *testing.T) (*bulkhead.Bulkhead, []bulkhead.Option, func(), func()) {
			clk := clock.NewMock()
			cfg := bulkhead.Batch("gpt-4o", 1)
			cfg.Clock = clk
			b := newBulkhead(t, cfg)
			held := mustAcquire(t, b, req("a", 0))
			wait := func() {
				// Stats answers after the engine queued the call and
				// armed its timer.
				testutil.WaitFor(t, "the call to queue", pending(b))
				clk.Add(time.Second)
			}
			return b, []bulkhead.Option{bulkhead.WithQueueTimeout(time.Second)}, wait, func() { _ = held.Release(nil) }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, opts, wait, free := tc.setup(t)
			log := subscribeObserve(b)
			before := b.Stats()
			r := req("observed", 0)
			type ran struct {
				seen *seenCall
				err  error
			}
			done := make(chan ran, 1)
			go func() {
				seen, err := observed(bg, b, r, opts...)
				done <- ran{seen, err}
			}()
			if wait != nil {
				wait()
			}
			got := <-done
			if got.err != nil || got.seen == nil {
				t.Fatalf("Run = %v, callback ran %v; want it bypassed", got.err, got.seen != nil)
			}
			seen := got.seen
			if bp := seen.bypass; bp == nil || bp.Reason != tc.why || bp.Race != tc.race || bp.Detail == nil {
				t.Fatalf("Bypass() = %+v, want reason %v race %v with a detail", seen.bypass, tc.why, tc.race)
			}
			if seen.rsrc != (bulkhead.Resources{}) || seen.abandon || !strings.HasPrefix(seen.id.String(), "shadow-") {
				t.Fatalf("bypassed call: resources %+v, abandoned %v, ID %s", seen.rsrc, seen.abandon, seen.id)
			}
			// While it ran: it held nothing, and counted as in flight
			// only in Observe.
			wantCap := capacityOf(before)
			if tc.race {
				wantCap.Gate.Rejected++
				wantCap.Gate.TimedOut++
				wantCap.Gate.RejectedByReason[bulkhead.Timeout]++
				wantCap.Calls.Rejected++
				wantCap.Calls.RejectedByReason[bulkhead.Timeout]++
			}
			if !reflect.DeepEqual(seen.capacity, wantCap) {
				t.Fatalf("capacity while bypassed:\n got %v\nwant %v", seen.capacity, wantCap)
			}
			if o := seen.observe; o.InFlight != 1 || o.Bypassed != 1 {
				t.Fatalf("Observe while bypassed: %+v", o)
			}
			after := b.Stats()
			if !reflect.DeepEqual(capacityOf(after), wantCap) {
				t.Fatalf("capacity after:\n got %v\nwant %v", capacityOf(after), wantCap)
			}
			raced := int64(0)
			if tc.race {
				raced = 1
			}
			want := bulkhead.ObserveStats{Bypassed: 1, RaceBypassed: raced, BypassedByReason: map[bulkhead.Reason]int64{tc.why: 1},
				UsageReported: 1, InputTokens: 3, OutputTokens: 4}
			if !reflect.DeepEqual(after.Observe, want) {
				t.Fatalf("Observe = %+v, want %+v", after.Observe, want)
			}
			free()
			closeAndDrain(t, b)
			wantEvents := "bypass:" + tc.why.String() + " bypass_release release"
			if tc.race {
				wantEvents = "reject:timeout " + wantEvents
			}
			if got := log.events(); !strings.HasPrefix(got, wantEvents) {
				t.Fatalf("events = %q, want %q first", got, wantEvents)
			}
			ev := log.bypasses[0]
			if ev.ID != seen.id || ev.Request != r || ev.Race != tc.race || ev.Detail == nil || ev.Resources != (bulkhead.Resources{}) ||
				ev.LimitRevision != seen.rev {
				t.Fatalf("bypass event %v", ev)
			}
			if rel := log.releases[0]; rel.ID != seen.id || rel.Reason != tc.why || rel.Usage == nil ||
				*rel.Usage != (bulkhead.Usage{Input: 3, Output: 4}) || rel.UsageSequence != 0 {
				t.Fatalf("bypass release event %v", rel)
			}
		})
	}
}

// TestObserveRaceBypassOnPostcheck: a call that queues while its tokens
// fit, and no longer fits when its slot comes, is rejected (with its reject
// event) and then bypassed as a race; the slot it was handed goes to the
// next waiter.
func TestObserveRaceBypassOnPostcheck(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100}
	b := newBulkhead(t, cfg)
	log := subscribeObserve(b)
	held := mustAcquire(t, b, req("a", 0), override(5, 5))
	done := make(chan *seenCall, 1)
	go func() {
		seen, err := observed(context.Background(), b, req("o", 0), override(20, 30))
		if err != nil {
			t.Error(err)
		}
		done <- seen
	}()
	testutil.WaitFor(t, "the call to queue", pending(b))
	if _, err := b.SetBudget(40); err != nil {
		t.Fatal(err)
	}
	_ = held.Release(nil)
	seen := <-done
	if seen == nil || seen.bypass == nil || seen.bypass.Reason != bulkhead.BudgetLimit || !seen.bypass.Race || seen.rev != 1 {
		t.Fatalf("callback saw %+v", seen)
	}
	if d := seen.bypass.Detail; d.TokenBudget == nil || d.TokenBudget.Budget != 40 || d.TokenBudget.Reserved != 50 {
		t.Fatalf("race detail %v", d)
	}
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.TokenBudget.InFlightTokens != 0 || st.Calls.RejectedByReason[bulkhead.BudgetLimit] != 1 ||
		st.Observe.RaceBypassed != 1 || st.Observe.InFlight != 0 {
		t.Fatalf("stats %v", st)
	}
	closeAndDrain(t, b)
	if got, want := log.events(), "admit release reject:budget_limit bypass:budget_limit bypass_release"; got != want {
		t.Fatalf("events = %q, want %q", got, want)
	}
}

// TestObserveNeverBypassesHardReasons: a done context, a closed bulkhead
// and invalid input fail as in Enforce mode, even when the limits would
// also turn the call away; a queued call cancelled or shut down is not
// bypassed either.
func TestObserveNeverBypassesHardReasons(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100}
	b := newBulkhead(t, cfg)
	held := mustAcquire(t, b, req("a", 0), override(50, 50))
	bg := context.Background()
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	ran := func(_ context.Context, _ *bulkhead.RunContext) (int, error) {
		t.Error("the callback ran")
		return 0, nil
	}
	observe := bulkhead.WithMode(bulkhead.Observe)

	// A done context, with the budget full: aborted, not bypassed.
	_, err := bulkhead.Run(cancelled, b, req("x", 0), ran, observe, override(1, 1))
	wantReason(t, err, bulkhead.Aborted)
	// Invalid input is a *ConfigError.
	for _, bad := range []*bulkhead.Request{nil, {MaxTokens: -1}} {
		if _, err := bulkhead.Run(bg, b, bad, ran, observe); !errors.Is(err, bulkhead.ErrInvalid) {
			t.Fatalf("Run(%v) = %v, want invalid input", bad, err)
		}
	}
	// A queued call whose context ends is aborted.
	ctx, cancelQueued := context.WithCancel(bg)
	errs := make(chan error, 2)
	go func() {
		_, err := bulkhead.Run(ctx, b, req("q", 0), ran, observe, override(0, 0))
		errs <- err
	}()
	testutil.WaitFor(t, "the call to queue", pending(b))
	cancelQueued()
	wantReason(t, <-errs, bulkhead.Aborted)
	// A queued call shut down by Close gets Shutdown; so does every call
	// after it.
	go func() {
		_, err := bulkhead.Run(bg, b, req("q", 0), ran, observe, override(0, 0))
		errs <- err
	}()
	testutil.WaitFor(t, "the call to queue", pending(b))
	b.Close()
	wantReason(t, <-errs, bulkhead.Shutdown)
	_, err = bulkhead.Run(bg, b, req("x", 0), ran, observe, override(100, 100))
	wantReason(t, err, bulkhead.Shutdown)
	_ = held.Release(nil)
	if st := b.Stats(); st.Observe.Bypassed != 0 || st.Calls.Rejected != 4 {
		t.Fatalf("stats %v", st)
	}
}

// TestObserveShadowReasons: WithShadowReasons narrows what is bypassed;
// with no reasons every rejection is enforced and an admitted call's
// context says it was admitted.
func TestObserveShadowReasons(t *testing.T) {
	bg := context.Background()
	b := budgetBulkhead(t, 1, 100, 0)
	held := mustAcquire(t, b, req("a", 0), override(10, 10))
	defer held.Release(nil)
	onlyBudget := bulkhead.WithShadowReasons(bulkhead.BudgetLimit)

	// Concurrency is not shadowed: rejected.
	seen, err := observed(bg, b, req("x", 0), onlyBudget, override(1, 1))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	if seen != nil {
		t.Fatal("the callback ran")
	}
	// The budget is.
	seen, err = observed(bg, b, req("x", 0), onlyBudget, override(90, 10))
	if err != nil || seen.bypass == nil || seen.bypass.Reason != bulkhead.BudgetLimit {
		t.Fatalf("Run = %v, saw %+v", err, seen)
	}
	// None: enforced.
	_, err = observed(bg, b, req("x", 0), bulkhead.WithShadowReasons(), override(90, 10))
	wantReason(t, err, bulkhead.BudgetLimit)
	_ = held.Release(nil)
	seen, err = observed(bg, b, req("x", 0), bulkhead.WithShadowReasons(), override(1, 1))
	if err != nil || seen.bypass != nil || strings.HasPrefix(seen.id.String(), "shadow-") {
		t.Fatalf("Run = %v, saw %+v", err, seen)
	}
	if st := b.Stats(); st.Observe.Bypassed != 1 || st.Calls.Admitted != 2 || st.Calls.Rejected != 2 {
		t.Fatalf("stats %v", st)
	}

	// Only the capacity reasons can be shadowed.
	for _, why := range []bulkhead.Reason{bulkhead.Aborted, bulkhead.Shutdown, 0, 99} {
		_, err := observed(bg, b, req("x", 0), bulkhead.WithShadowReasons(bulkhead.Timeout, why))
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != "WithShadowReasons" {
			t.Fatalf("WithShadowReasons(%v) = %v, want a *ConfigError", why, err)
		}
	}
}

// TestObserveAdmitted: with room, an observe-mode call is admitted as in
// Enforce mode.
func TestObserveAdmitted(t *testing.T) {
	b := budgetBulkhead(t, 1, 100, 0)
	log := subscribeObserve(b)
	seen, err := observed(context.Background(), b, req("x", 0), override(10, 10))
	if err != nil || seen.bypass != nil || seen.capacity.Calls.InFlight != 1 || seen.res == nil || seen.res.Reserved != 20 {
		t.Fatalf("Run = %v, saw %+v", err, seen)
	}
	closeAndDrain(t, b)
	if got := log.events(); got != "admit release" {
		t.Fatalf("events %q", got)
	}
}

// TestObserveUsage: a bypassed call's usage reports hold nothing, take
// sequences 1, 2... (a stale one takes none), and its final usage (set,
// else the last report) reaches the release event and the totals, in
// order per call.
func TestObserveUsage(t *testing.T) {
	b := budgetBulkhead(t, 1, 100, 0)
	log := subscribeObserve(b)
	held := mustAcquire(t, b, req("a", 0), override(50, 50))
	bg := context.Background()
	var id bulkhead.ID
	var reps []bulkhead.UsageReport
	report := func(rc *bulkhead.RunContext, u bulkhead.Usage, p *bulkhead.Progressive) {
		rep, err := rc.ReportUsage(u, p)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep)
	}
	_, err := bulkhead.Run(bg, b, req("x", 0), func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
		id = rc.ID()
		report(rc, bulkhead.Usage{Input: 10, Output: 5}, nil)
		report(rc, bulkhead.Usage{Input: 10, Output: 5}, nil) // stale
		report(rc, bulkhead.Usage{Input: 8, Output: 12}, &bulkhead.Progressive{RemainingOutput: 3})
		if _, err := rc.ReportUsage(bulkhead.Usage{Input: 1}, &bulkhead.Progressive{RemainingOutput: 21}); !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("remaining above the reservation: %v", err)
		}
		return 0, rc.SetUsage(bulkhead.Usage{Input: 11, Output: 13})
	}, bulkhead.WithMode(bulkhead.Observe), override(10, 20))
	if err != nil {
		t.Fatal(err)
	}
	// A failing callback settles with its last report.
	_, err = bulkhead.Run(bg, b, req("y", 0), func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
		report(rc, bulkhead.Usage{Input: 2, Output: 2}, nil)
		_ = rc.SetUsage(bulkhead.Usage{Input: 100, Output: 100})
		return 0, errors.New("failed")
	}, bulkhead.WithMode(bulkhead.Observe), override(10, 20))
	if err == nil {
		t.Fatal("the callback's error was lost")
	}
	for i, want := range []struct{ seq, consumed, remaining int64 }{{1, 15, 15}, {1, 15, 15}, {2, 22, 8}, {1, 4, 18}} {
		rep := reps[i]
		if rep.Held != 0 || rep.Sequence != want.seq || rep.Consumed != want.consumed || rep.Reserved != 30 ||
			*rep.OutputCap != 20 || *rep.OutputRemaining != want.remaining {
			t.Fatalf("report %d = %v, want %+v and nothing held", i, rep, want)
		}
	}
	if reps[0].AdmissionID != id {
		t.Fatalf("report ID %s, want %s", reps[0].AdmissionID, id)
	}
	st := b.Stats()
	if st.TokenBudget.InFlightTokens != 100 || st.TokenBudget.TotalReserved != 100 || st.Calls.Admitted != 1 {
		t.Fatalf("bypassed usage changed the budget: %v", st)
	}
	if want := (bulkhead.ObserveStats{Bypassed: 2, BypassedByReason: map[bulkhead.Reason]int64{bulkhead.BudgetLimit: 2},
		UsageReported: 2, InputTokens: 13, OutputTokens: 15}); !reflect.DeepEqual(st.Observe, want) {
		t.Fatalf("Observe = %+v, want %+v", st.Observe, want)
	}
	_ = held.Release(nil)
	closeAndDrain(t, b)
	want := "admit bypass:budget_limit bypass_usage bypass_usage bypass_release bypass:budget_limit bypass_usage bypass_release release"
	if got := log.events(); got != want {
		t.Fatalf("events = %q\nwant %q", got, want)
	}
	u := log.usages[1]
	if u.ID != id || u.Sequence != 2 || u.Usage != (bulkhead.Usage{Input: 10, Output: 12}) || u.Progressive == nil ||
		u.Progressive.RemainingOutput != 3 || u.Reason != bulkhead.BudgetLimit || u.OverReservation != 0 || u.Reserved != 30 {
		t.Fatalf("bypass usage event %v", u)
	}
	if r := log.releases[0]; r.ID != id || r.UsageSequence != 2 || *r.Usage != (bulkhead.Usage{Input: 11, Output: 13}) {
		t.Fatalf("bypass release event %v", r)
	}
	if r := log.releases[1]; r.UsageSequence != 1 || *r.Usage != (bulkhead.Usage{Input: 2, Output: 2}) {
		t.Fatalf("bypass release event %v", r)
	}
}

// TestObserveDrainWaitsForBypassedWork: Drain counts a bypassed call still
// running, and drains once it ends; a panic in a bypassed callback still
// ends it.
func TestObserveDrainWaitsForBypassedWork(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 0)) // every call is turned away
	log := subscribeObserve(b)
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := bulkhead.Run(context.Background(), b, req("x", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
			close(started)
			<-finish
			return 0, nil
		}, bulkhead.WithMode(bulkhead.Observe))
		done <- err
	}()
	<-started
	b.Close()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := b.Drain(ended); res != (bulkhead.DrainResult{Bypassed: 1}) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain = %+v, %v; want the bypassed call outstanding", res, err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	closeAndDrain(t, b)
	if got := log.events(); got != "bypass:concurrency_limit bypass_release" {
		t.Fatalf("events %q", got)
	}

	p := newBulkhead(t, bulkhead.Interactive("gpt-4o", 0))
	func() {
		defer func() {
			if recover() != "boom" {
				t.Error("the panic did not propagate")
			}
		}()
		_, _ = bulkhead.Run(context.Background(), p, req("x", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
			panic("boom")
		}, bulkhead.WithMode(bulkhead.Observe))
	}()
	if o := p.Stats().Observe; o.Bypassed != 1 || o.InFlight != 0 {
		t.Fatalf("after a panic: %+v", o)
	}
}

// TestObserveOptions: the mode and the shadow reasons are Run's options
// only, and shadow reasons need Observe mode.
func TestObserveOptions(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	bg := context.Background()
	observe, shadow := bulkhead.WithMode(bulkhead.Observe), bulkhead.WithShadowReasons(bulkhead.Timeout)
	wantInvalid := func(what, field string, err error) {
		t.Helper()
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != field || errors.Is(err, bulkhead.ErrRejected) {
			t.Fatalf("%s: %v, want a *ConfigError for %s", what, err, field)
		}
	}
	for _, tc := range []struct {
		name  string
		opts  []bulkhead.Option
		field string
	}{
		{"WithMode", []bulkhead.Option{observe}, "WithMode"},
		{"WithMode(Enforce)", []bulkhead.Option{bulkhead.WithMode(bulkhead.Enforce)}, "WithMode"},
		{"WithShadowReasons", []bulkhead.Option{observe, shadow}, "WithMode"},
	} {
		tok, err := b.Acquire(bg, req("x", 0), tc.opts...)
		if tok != nil {
			_ = tok.Release(nil)
		}
		wantInvalid("Acquire "+tc.name, tc.field, err)
		_, err = b.AcquireAsync(bg, req("x", 0), tc.opts...).Result()
		wantInvalid("AcquireAsync "+tc.name, tc.field, err)
		_, err = b.WouldAdmit(req("x", 0), tc.opts...)
		wantInvalid("WouldAdmit "+tc.name, tc.field, err)
	}
	_, err := b.Acquire(bg, req("x", 0), shadow)
	wantInvalid("Acquire WithShadowReasons", "WithShadowReasons", err)
	_, err = observed(bg, b, req("x", 0), bulkhead.WithMode(7))
	wantInvalid("Run WithMode(7)", "WithMode", err)
	_, err = bulkhead.Run(bg, b, req("x", 0), func(context.Context, *bulkhead.RunContext) (int, error) { return 0, nil }, shadow)
	wantInvalid("Run WithShadowReasons in Enforce mode", "WithShadowReasons", err)
	if st := b.Stats(); st.Calls.Admitted != 0 || st.Calls.Rejected != 0 {
		t.Fatalf("invalid calls were counted: %v", st)
	}
	if bulkhead.Observe.String() != "observe" || bulkhead.Enforce.String() != "enforce" || bulkhead.Mode(9).String() != "mode(9)" {
		t.Fatal("Mode.String")
	}
}
