package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func adaptiveConfig(clk clock.Clock, a bulkhead.Adaptive) bulkhead.Config {
	return bulkhead.Config{
		Model: "gpt-4o", MaxConcurrent: 8, MaxQueue: 4, Clock: clk,
		TokenBudget: &bulkhead.TokenBudget{Budget: 8000, Estimator: estimatorFunc(nil)},
		Adaptive:    &a,
	}
}

// acquireN takes n permits or fails the test.
func acquireN(t *testing.T, b *bulkhead.Bulkhead, n int) []*bulkhead.Permit {
	t.Helper()
	ps := make([]*bulkhead.Permit, n)
	for i := range ps {
		ps[i] = mustAcquire(t, b, req("hi", 10))
	}
	return ps
}

func releaseAll(ps []*bulkhead.Permit) {
	for _, p := range ps {
		_ = p.Release(nil)
	}
}

func TestAdaptiveMovesThroughApplyLimits(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{MinConcurrent: 2}))
	var mu sync.Mutex
	var events []bulkhead.ReconfigureEvent
	defer b.Subscribe(bulkhead.Hooks{Reconfigure: func(e bulkhead.ReconfigureEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}})()

	ps := acquireN(t, b, 8)
	clk.Add(time.Second)
	// A burst of 429s from calls sent under the old limit: one decrease.
	for _, p := range ps[:3] {
		if err := p.Feedback(bulkhead.OutcomeRateLimited, 0); err != nil {
			t.Fatal(err)
		}
	}
	l := b.Limits()
	if l.Revision != 1 || l.MaxConcurrent != 6 || l.TokenBudget.Budget != 6000 {
		t.Fatalf("after the burst: %v, want revision 1, 6 slots, budget 6000", l)
	}
	// A success of a call sent before the decrease does not undo it.
	if err := ps[3].Feedback(bulkhead.OutcomeSuccess, 0); err != nil {
		t.Fatal(err)
	}
	if got := b.Limits().MaxConcurrent; got != 6 {
		t.Fatalf("MaxConcurrent = %d after an old success, want 6", got)
	}
	releaseAll(ps)

	clk.Add(time.Second)
	ps = acquireN(t, b, 4)
	clk.Add(100 * time.Millisecond)
	for i, p := range ps[2:] { // admitted with 3 and 4 of 6 in flight: the limit is in use
		if err := p.Feedback(bulkhead.OutcomeSuccess, 0); err != nil {
			t.Fatal(err)
		}
		if got, want := b.Limits().MaxConcurrent, 7+i; got != want {
			t.Fatalf("MaxConcurrent = %d, want %d", got, want)
		}
	}
	if err := ps[0].Feedback(bulkhead.OutcomeSuccess, 0); err != nil { // admitted alone: holds
		t.Fatal(err)
	}
	releaseAll(ps)

	st := b.Stats()
	a := st.Adaptive
	if a == nil || a.MaxConcurrent != 8 || a.Budget != 8000 || a.MinConcurrent != 2 || a.MaxConcurrentBound != 8 ||
		a.MinBudget != 2000 || a.MaxBudget != 8000 || a.Increases != 2 || a.Decreases != 1 || a.Samples != 7 ||
		!a.LastChange.Equal(clk.Now()) || a.Rule != bulkhead.AIMD {
		t.Fatalf("Stats().Adaptive = %+v", a)
	}
	if st.Limits.Revision != 3 {
		t.Fatalf("revision = %d, want 3", st.Limits.Revision)
	}
	testutil.WaitFor(t, "three reconfigure events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	for i, want := range []int{6, 7, 8} {
		if e := events[i]; e.Current.MaxConcurrent != want || e.Current.Revision != int64(i+1) {
			t.Fatalf("event %d = %v, want %d slots at revision %d", i, e.Current, want, i+1)
		}
	}
}

func TestAdaptiveBoundsAndKillSwitch(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{MinConcurrent: 3, Backoff: 0.5, Window: time.Second}))
	for range 5 {
		clk.Add(time.Second)
		if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeOverloaded}); err != nil {
			t.Fatal(err)
		}
	}
	if l := b.Limits(); l.MaxConcurrent != 3 || l.TokenBudget.Budget != 3000 {
		t.Fatalf("limits = %v, want the minimum 3 and its budget 3000", l)
	}
	// The caller's kill switch stands.
	cur := b.Limits()
	cur.Revision++
	cur.MaxConcurrent = 0
	if _, err := b.ApplyLimits(cur); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		clk.Add(time.Second)
		if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess}); err != nil {
			t.Fatal(err)
		}
	}
	if l := b.Limits(); l.MaxConcurrent != 0 || l.Revision != cur.Revision {
		t.Fatalf("limits = %v, want the kill switch left alone", l)
	}
	// A limit the caller applies is where the next move starts from.
	cur.Revision++
	cur.MaxConcurrent = 5
	if _, err := b.ApplyLimits(cur); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeTimeout}); err != nil {
		t.Fatal(err)
	}
	if l := b.Limits(); l.MaxConcurrent != 3 || l.Revision != cur.Revision+1 {
		t.Fatalf("limits = %v, want 3 (half of the caller's 5, at the minimum) at the next revision", l)
	}
}

func TestFeedbackInvalid(t *testing.T) {
	b := newBulkhead(t, adaptiveConfig(clock.NewMock(), bulkhead.Adaptive{}))
	for _, f := range []bulkhead.Feedback{
		{Outcome: 9},
		{Latency: -1},
		{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: -time.Second},
		{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: bulkhead.MaxRetryAfter + 1},
		{Outcome: bulkhead.OutcomeSuccess, RetryAfter: time.Second},
	} {
		err := b.Feedback(f)
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Fatalf("Feedback(%+v) = %v, want a *ConfigError", f, err)
		}
	}
	var nilPermit *bulkhead.Permit
	if err := nilPermit.Feedback(bulkhead.OutcomeSuccess, 0); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("nil Permit.Feedback = %v", err)
	}
	p := mustAcquire(t, b, req("hi", 1))
	defer p.Release(nil)
	if err := p.Feedback(bulkhead.OutcomeTimeout, time.Second); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("Permit.Feedback with a retry-after on a timeout = %v", err)
	}
	if st := b.Stats(); st.Limits.Revision != 0 || st.Adaptive.Samples != 0 || st.Cooldown.Active != nil {
		t.Fatalf("invalid feedback changed something: %+v %+v", st.Adaptive, st.Cooldown)
	}
}

func TestNewAdaptiveInvalid(t *testing.T) {
	for _, tt := range []struct {
		a     bulkhead.Adaptive
		field string
	}{
		{bulkhead.Adaptive{Rule: 7}, "Config.Adaptive.Rule"},
		{bulkhead.Adaptive{Cooldown: 7}, "Config.Adaptive.Cooldown"},
		{bulkhead.Adaptive{MinConcurrent: -1}, "Config.Adaptive.MinConcurrent"},
		{bulkhead.Adaptive{MinConcurrent: 9}, "Config.Adaptive.MaxConcurrent"},
		{bulkhead.Adaptive{Backoff: 1}, "Config.Adaptive.Backoff"},
		{bulkhead.Adaptive{Tolerance: 0.5}, "Config.Adaptive.Tolerance"},
		{bulkhead.Adaptive{Smoothing: 1.5}, "Config.Adaptive.Smoothing"},
		{bulkhead.Adaptive{Increase: -1}, "Config.Adaptive.Increase"},
		{bulkhead.Adaptive{Window: -1}, "Config.Adaptive.Window"},
		{bulkhead.Adaptive{MinBudget: -1}, "Config.Adaptive.MinBudget"},
		{bulkhead.Adaptive{MinBudget: 9000}, "Config.Adaptive.MinBudget"},
	} {
		_, err := bulkhead.New(adaptiveConfig(nil, tt.a))
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field {
			t.Fatalf("New with %+v = %v, want a *ConfigError on %s", tt.a, err, tt.field)
		}
	}
	_, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 2, Adaptive: &bulkhead.Adaptive{MaxBudget: 5}})
	if !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("a budget bound without a budget = %v", err)
	}
}

func TestCooldownShed(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}))
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(context.Background(), req("hi", 1))
	rej := wantReason(t, err, bulkhead.Cooldown)
	if d, ok := rej.RetryAfter(); !ok || d != 5*time.Second {
		t.Fatalf("RetryAfter = %v, %v, want 5s", d, ok)
	}
	if d, err := b.WouldAdmit(req("hi", 1), bulkhead.WithDetail()); err != nil || d.Admit || d.Reason != bulkhead.Cooldown || d.Detail.Cooldown.RetryAfter != 5*time.Second {
		t.Fatalf("WouldAdmit = %+v, %v", d, err)
	}
	// Another model is not cooling down.
	other := req("hi", 1)
	other.Model = "gpt-4.1"
	mustAcquire(t, b, other).Release(nil)

	clk.Add(2 * time.Second)
	_, err = b.Acquire(context.Background(), req("hi", 1))
	if d, _ := wantReason(t, err, bulkhead.Cooldown).RetryAfter(); d != 3*time.Second {
		t.Fatalf("RetryAfter = %v, want the 3s left", d)
	}
	st := b.Stats()
	if st.Calls.RejectedByReason[bulkhead.Cooldown] != 2 || !st.Cooldown.Active["gpt-4o"].Equal(clk.Now().Add(3*time.Second)) {
		t.Fatalf("stats: %v, %+v", st.Calls.RejectedByReason, st.Cooldown)
	}
	clk.Add(3 * time.Second)
	mustAcquire(t, b, req("hi", 1)).Release(nil)
	if st := b.Stats(); st.Cooldown.Active != nil {
		t.Fatalf("cool-down still active: %+v", st.Cooldown)
	}
}

func TestCooldownHold(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.Adaptive = nil // cool-downs work without adaptive limits
	cfg.QueueTimeout = 10 * time.Second
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("hi", 1))
	if err := p.Feedback(bulkhead.OutcomeRateLimited, 4*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = p.Release(nil)
	if b.Stats().Adaptive != nil || b.Limits().Revision != 0 {
		t.Fatal("limits moved without Config.Adaptive")
	}
	held := acquireAsync(context.Background(), b, req("hi", 1))
	testutil.WaitFor(t, "the call to hold", holding(b))
	clk.Add(3 * time.Second)
	select {
	case r := <-held:
		t.Fatalf("admitted during the cool-down: %v", r.err)
	default:
	}
	clk.Add(time.Second)
	r := <-held
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.tok.Release(nil)
	if st := b.Stats().Cooldown; st.Held != 1 || st.Started != 1 {
		t.Fatalf("cool-down stats %+v", st)
	}

	// A cool-down longer than the queue timeout rejects at once.
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeOverloaded, RetryAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(context.Background(), req("hi", 1))
	if d, _ := wantReason(t, err, bulkhead.Cooldown).RetryAfter(); d != 10*time.Second {
		t.Fatalf("RetryAfter = %v, want 10s", d)
	}
	// A shorter per-call queue timeout too.
	clk.Add(5 * time.Second)
	_, err = b.Acquire(context.Background(), req("hi", 1), bulkhead.WithQueueTimeout(time.Second))
	wantReason(t, err, bulkhead.Cooldown)

	// Cancelling a held call ends its wait, and it is rejected Aborted.
	ctx, cancel := context.WithCancel(context.Background())
	held = acquireAsync(ctx, b, req("hi", 1))
	testutil.WaitFor(t, "the call to hold", holding(b))
	cancel()
	wantReason(t, (<-held).err, bulkhead.Aborted)

	// Close ends a hold: Shutdown.
	held = acquireAsync(context.Background(), b, req("hi", 1))
	testutil.WaitFor(t, "the call to hold", holding(b))
	b.Close()
	wantReason(t, (<-held).err, bulkhead.Shutdown)
	if st := b.Stats(); st.Gate.Pending != 0 || st.Gate.InFlight != 0 {
		t.Fatalf("after the holds: %+v, %d in flight", st.Cooldown, st.Gate.InFlight)
	}
}

// A later 429 with a longer Retry-After extends a cool-down that a call
// is waiting out.
func TestCooldownExtended(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	b := newBulkhead(t, cfg)
	_ = b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 2 * time.Second})
	held := acquireAsync(context.Background(), b, req("hi", 1))
	testutil.WaitFor(t, "the call to hold", holding(b))
	_ = b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 5 * time.Second})
	clk.Add(2 * time.Second)
	testutil.WaitFor(t, "the call to hold again", func() bool { st := b.Stats(); return st.Gate.Pending == 1 && st.Cooldown.Held == 1 })
	clk.Add(3 * time.Second)
	r := <-held
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.tok.Release(nil)
}

// A change starts from the limits in force: the caller's own ApplyLimits
// (its queue, its limit) is kept, and the change takes the next revision.
func TestAdaptiveStartsFromCallersLimits(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Backoff: 0.5}))
	l := b.Limits()
	l.Revision = 10
	l.MaxConcurrent = 6
	l.MaxQueue = 2
	if res, err := b.ApplyLimits(l); err != nil || !res.Applied {
		t.Fatalf("the caller's ApplyLimits: %+v, %v", res, err)
	}
	clk.Add(time.Second)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited}); err != nil {
		t.Fatal(err)
	}
	// Half of the caller's 6, with the caller's queue, at the revision after
	// theirs.
	if l := b.Limits(); l.Revision != 11 || l.MaxConcurrent != 3 || l.MaxQueue != 2 || l.TokenBudget.Budget != 3000 {
		t.Fatalf("limits = %v", l)
	}
	if a := b.Stats().Adaptive; a.Decreases != 1 || a.Samples != 1 {
		t.Fatalf("adaptive stats %+v", a)
	}
}

// holding reports whether a call is waiting out a cool-down.
func holding(b *bulkhead.Bulkhead) func() bool {
	return func() bool { return b.Stats().Gate.Pending == 1 } // held calls wait in the queue
}

// With the Gradient rule, Permit.Feedback measures each call's latency on
// the bulkhead's clock: steady latency raises the limit, rising latency
// lowers it.
func TestAdaptiveGradientMeasuresLatency(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Rule: bulkhead.Gradient, MaxConcurrent: 16}))
	round := func(lat time.Duration) int {
		n := b.Limits().MaxConcurrent
		ps := acquireN(t, b, n)
		clk.Add(lat)
		for _, p := range ps {
			if err := p.Feedback(bulkhead.OutcomeSuccess, 0); err != nil {
				t.Fatal(err)
			}
		}
		releaseAll(ps)
		return b.Limits().MaxConcurrent
	}
	var got []int
	for range 3 {
		got = append(got, round(100*time.Millisecond))
	}
	for range 3 {
		got = append(got, round(time.Second))
	}
	// Up to the bound at 100ms; down when latency jumps tenfold, then up
	// again slowly as the long-term latency learns the new level.
	if want := []int{10, 15, 16, 10, 10, 11}; !slices.Equal(got, want) {
		t.Fatalf("limits by round = %v, want %v", got, want)
	}
	if a := b.Stats().Adaptive; a.Rule != bulkhead.Gradient || a.Decreases == 0 || a.Increases == 0 {
		t.Fatalf("adaptive stats %+v", a)
	}
}

// At most 1024 models cool down at once: a new one makes room by dropping
// the cool-down that ends first.
func TestCooldownBounded(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{}))
	for i := range 1025 {
		f := bulkhead.Feedback{Model: fmt.Sprintf("m%d", i), Outcome: bulkhead.OutcomeRateLimited, RetryAfter: time.Duration(i+1) * time.Second}
		if i == 1024 {
			f.RetryAfter = 5000 * time.Second
		}
		if err := b.Feedback(f); err != nil {
			t.Fatal(err)
		}
	}
	active := b.Stats().Cooldown.Active
	if _, ok := active["m0"]; len(active) != 1024 || ok || active["m1024"].IsZero() {
		t.Fatalf("%d active, m0 %v, m1024 %v", len(active), active["m0"], active["m1024"])
	}
	clk.Add(2000 * time.Second) // m1..m1023 end
	if active := b.Stats().Cooldown.Active; len(active) != 1 {
		t.Fatalf("%d active after most ended, want 1", len(active))
	}
}

// TestAcquireAsyncAdaptiveAndShed checks AcquireAsync with the controller:
// a shed cool-down is decided before AcquireAsync returns, and an
// admission made through it counts as in flight for AIMD (a success of a
// call admitted with the limit in use raises it).
func TestAcquireAsyncAdaptiveAndShed(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown, MaxConcurrent: 16}))
	var ps []*bulkhead.Permit
	for range 6 {
		f := b.AcquireAsync(context.Background(), req("hi", 10))
		if !isDone(f) {
			t.Fatal("AcquireAsync did not decide before it returned")
		}
		p, err := f.Result()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if err := ps[5].Feedback(bulkhead.OutcomeSuccess, 0); err != nil { // admitted with 6 of 8 in flight
		t.Fatal(err)
	}
	if got := b.Limits().MaxConcurrent; got != 9 {
		t.Fatalf("MaxConcurrent = %d after a success with the limit in use, want 9", got)
	}
	releaseAll(ps)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f := b.AcquireAsync(context.Background(), req("hi", 10))
	if !isDone(f) {
		t.Fatal("a shed cool-down was not decided before AcquireAsync returned")
	}
	_, err := f.Result()
	if d, ok := wantReason(t, err, bulkhead.Cooldown).RetryAfter(); !ok || d != 2*time.Second {
		t.Fatalf("RetryAfter = %v, %v; want 2s", d, ok)
	}
}

// TestCooldownQueuedCalls checks that a call waiting in the queue when a
// cool-down begins is not sent into another 429 when a slot frees: shed,
// it is turned away with the time left (and the slot goes to no one);
// held, it stays in the queue until the cool-down ends, and is admitted
// then.
func TestCooldownQueuedCalls(t *testing.T) {
	for _, mode := range []bulkhead.CooldownMode{bulkhead.HoldCooldown, bulkhead.ShedCooldown} {
		t.Run(mode.String(), func(t *testing.T) {
			clk := clock.NewMock()
			cfg := adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: mode})
			cfg.MaxConcurrent = 1
			b := newBulkhead(t, cfg)
			p := mustAcquire(t, b, req("hi", 10))
			f := b.AcquireAsync(context.Background(), req("hi", 10))
			if isDone(f) {
				t.Fatal("the second call did not queue")
			}
			if err := p.Feedback(bulkhead.OutcomeRateLimited, 4*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := p.Release(nil); err != nil {
				t.Fatal(err)
			}
			if mode == bulkhead.ShedCooldown {
				_, err := f.Result()
				if d, ok := wantReason(t, err, bulkhead.Cooldown).RetryAfter(); !ok || d != 4*time.Second {
					t.Fatalf("RetryAfter = %v, %v; want 4s", d, ok)
				}
				if st := b.Stats(); st.Gate.InFlight != 0 || st.Gate.Pending != 0 {
					t.Fatalf("gate %+v", st.Gate)
				}
				return
			}
			if isDone(f) {
				_, err := f.Result()
				t.Fatalf("a held call ended during the cool-down: %v", err)
			}
			if st := b.Stats(); st.Gate.InFlight != 0 || st.Gate.Pending != 1 || st.Cooldown.Held != 1 {
				t.Fatalf("during the cool-down: gate %+v, held %d", st.Gate, st.Cooldown.Held)
			}
			clk.Add(4 * time.Second) // the engine looks at the queue again then
			q, err := f.Result()
			if err != nil {
				t.Fatalf("after the cool-down: %v", err)
			}
			_ = q.Release(nil)
		})
	}
}

// TestCooldownHoldPaced checks that in pace mode a held call waits the
// cool-down out before it takes its rate turn: when the cool-down ends,
// the paced calls still go one turn apart, not all at once.
func TestCooldownHoldPaced(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	cfg.QueueTimeout = 30 * time.Second
	b := newBulkhead(t, cfg)
	armed := make(chan time.Duration, 16)
	bulkhead.SetRateWaitHook(func(d time.Duration) { armed <- d })
	defer bulkhead.SetRateWaitHook(nil)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	next := func() time.Duration {
		select {
		case d := <-armed:
			return d
		case <-time.After(testutil.Settle):
			t.Fatal("no wait was armed")
			return 0
		}
	}
	var calls []<-chan result
	for range 3 {
		calls = append(calls, acquireAsync(context.Background(), b, req("x", 10)))
		if d := next(); d != 10*time.Second { // waiting out the cool-down
			t.Fatalf("first wait %v, want the 10s cool-down", d)
		}
	}
	clk.Add(10 * time.Second) // the cool-down ends: one goes, the others wait for their turns
	// The three waits end at the same instant, on the engine's hold
	// timer: the calls take their turns in the order they came.
	first := <-calls[0]
	calls = calls[1:]
	if first.err != nil {
		t.Fatal(first.err)
	}
	for i := range 2 {
		if d := next(); d != time.Duration(i+1)*time.Second {
			t.Fatalf("paced wait %d after the cool-down: %v, want %ds", i, d, i+1)
		}
	}
	if st := b.Stats(); st.Gate.InFlight != 1 || st.Cooldown.Held != 3 {
		t.Fatalf("right after the cool-down: %d in flight (want 1), %d held (want 3)", st.Gate.InFlight, st.Cooldown.Held)
	}
	_ = first.tok.Release(nil)
	for range 3 {
		clk.Add(time.Second)
	}
	for _, ch := range calls {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		_ = r.tok.Release(nil)
	}
}

// pacedSchedule starts n paced calls on b, one after the other, at the
// clock's current time, and records the instant (since start) and order in
// which they are admitted, from the admit events.
type pacedSchedule struct {
	t      *testing.T
	clk    *clock.Mock
	start  time.Time
	reqs   []*bulkhead.Request
	calls  []<-chan result
	errs   []error
	mu     sync.Mutex
	admits []pacedAdmit
}

type pacedAdmit struct {
	call int
	at   time.Duration
}

// startPaced starts them, with options(i) for call i (options may be nil).
func startPaced(t *testing.T, b *bulkhead.Bulkhead, clk *clock.Mock, n int, options func(i int) []bulkhead.Option) *pacedSchedule {
	t.Helper()
	s := &pacedSchedule{t: t, clk: clk, start: clk.Now()}
	b.Subscribe(bulkhead.Hooks{Admit: func(e bulkhead.AdmitEvent) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.admits = append(s.admits, pacedAdmit{slices.Index(s.reqs, e.Request), clk.Now().Sub(s.start)})
	}})
	for i := range n {
		r := req(fmt.Sprint(i), 10)
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		var opts []bulkhead.Option
		if options != nil {
			opts = options(i)
		}
		s.calls = append(s.calls, acquireAsync(context.Background(), b, r, opts...))
		testutil.WaitFor(t, "the call to be admitted or to wait for its turn", func() bool {
			st := b.Stats()
			return st.Calls.Admitted+st.Calls.Rejected+int64(st.Rate.Waiting) == int64(i+1)
		})
	}
	t.Cleanup(func() {
		// Before the bulkhead's drain; a failed test's calls may still be
		// waiting: Close ends their wait.
		if t.Failed() {
			b.Close()
		}
		s.results()
	})
	return s
}

// results returns each call's outcome, once, its permit released.
func (s *pacedSchedule) results() []error {
	if s.errs == nil {
		for _, ch := range s.calls {
			r := <-ch
			if r.err == nil {
				_ = r.tok.Release(nil)
			}
			s.errs = append(s.errs, r.err)
		}
	}
	return s.errs
}

// admitted returns the admissions recorded so far.
func (s *pacedSchedule) admitted() []pacedAdmit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.admits)
}

// advance moves the clock to at (since start) in steps of step, waiting
// after each until the admissions want expects by then have been recorded
// (a wrong schedule shows in the final comparison, not as a hang).
func (s *pacedSchedule) advance(at, step time.Duration, want []pacedAdmit) {
	for {
		now := s.clk.Now().Sub(s.start)
		n := 0
		for _, w := range want {
			if w.at <= now {
				n++
			}
		}
		_ = testutil.Poll("the admissions due", func() (bool, error) { return len(s.admitted()) >= n, nil })
		if now >= at {
			return
		}
		s.clk.Add(step)
	}
}

// TestPacedCallsKeepArrivalOrderAfterCooldown: in pace mode, the calls
// whose booked turns fall inside a cool-down take new turns after it, in
// the order they came and spaced by the rate, rather than all going at its
// end. 600 a minute, no burst: ten calls at 0 book turns 100 ms apart; a
// 429 with Retry-After 1s comes at 250 ms; the three calls whose turns had
// come went, and the seven others go at 1.25 s, 1.35 s, ..., 1.85 s, in
// their order.
func TestPacedCallsKeepArrivalOrderAfterCooldown(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 600, RequestBurst: bulkhead.NoBurst}})
	cfg.MaxConcurrent = 16
	b := newBulkhead(t, cfg)
	s := startPaced(t, b, clk, 10, nil)
	var want []pacedAdmit
	for i := range 10 {
		at := time.Duration(i) * 100 * time.Millisecond
		if i >= 3 {
			at = 1250*time.Millisecond + time.Duration(i-3)*100*time.Millisecond
		}
		want = append(want, pacedAdmit{i, at})
	}
	s.advance(250*time.Millisecond, 50*time.Millisecond, want)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	s.advance(2*time.Second, 50*time.Millisecond, want)
	if got := s.admitted(); !slices.Equal(got, want) {
		t.Fatalf("admissions (call, instant):\n got %v\nwant %v", got, want)
	}
	for _, err := range s.results() {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats(); st.Cooldown.Held != 7 || st.Rate.Paced != 9 {
		t.Fatalf("held %d (want the 7 calls the cool-down held back), paced %d (want 9)", st.Cooldown.Held, st.Rate.Paced)
	}
}

// TestPacedCallsOutlastedByCooldownRefused: of the paced calls whose turns
// fall inside a cool-down, one whose queue timeout ends before the
// cool-down does is turned away Cooldown as it starts, with the time left
// (as a new call would be); one that may wait the cool-down out but not
// until its new turn is turned away RateLimit then, with the exact time
// until that turn, booking nothing: the next call takes it. 600 a minute:
// ten calls at 0, call 4 with a 1 s queue timeout, call 8 with 1.6 s; a
// 429 with Retry-After 1s at 250 ms.
func TestPacedCallsOutlastedByCooldownRefused(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 600, RequestBurst: bulkhead.NoBurst}})
	cfg.MaxConcurrent = 16
	b := newBulkhead(t, cfg)
	s := startPaced(t, b, clk, 10, func(i int) []bulkhead.Option {
		switch i {
		case 4:
			return []bulkhead.Option{bulkhead.WithQueueTimeout(time.Second)}
		case 8:
			return []bulkhead.Option{bulkhead.WithQueueTimeout(1600 * time.Millisecond)}
		}
		return nil
	})
	want := []pacedAdmit{{0, 0}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}}
	for i, call := range []int{3, 5, 6, 7, 9} {
		want = append(want, pacedAdmit{call, 1250*time.Millisecond + time.Duration(i)*100*time.Millisecond})
	}
	s.advance(250*time.Millisecond, 50*time.Millisecond, want)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-s.calls[4]:
		if re := wantReason(t, r.err, bulkhead.Cooldown); re.Detail.Cooldown.RetryAfter != time.Second {
			t.Fatalf("call 4: retry after %v, want the 1s left of the cool-down", re.Detail.Cooldown.RetryAfter)
		}
		s.calls[4] = closedResult(r)
	case <-time.After(testutil.Settle):
		t.Fatal("call 4, whose queue timeout ends inside the cool-down, was not turned away as it started")
	}
	s.advance(2*time.Second, 50*time.Millisecond, want)
	if got := s.admitted(); !slices.Equal(got, want) {
		t.Fatalf("admissions (call, instant):\n got %v\nwant %v", got, want)
	}
	errs := s.results()
	wantRate(t, errs[8], 400*time.Millisecond, "model", "gpt-4o", "requests")
	if st := b.Stats(); st.Rate.Waiting != 0 || st.Gate.InFlight != 0 || st.Calls.Rejected != 2 {
		t.Fatalf("after: waiting %d, in flight %d, rejected %d", st.Rate.Waiting, st.Gate.InFlight, st.Calls.Rejected)
	}
}

// closedResult is a channel that gives r again.
func closedResult(r result) <-chan result {
	ch := make(chan result, 1)
	ch <- r
	return ch
}

// TestPacedTurnsInsideCooldownShed: with ShedCooldown, the paced calls
// whose turns fall inside a cool-down are turned away as it starts, with
// the exact time left, and their turns go back to the rate: a call made as
// the cool-down ends goes at once.
func TestPacedTurnsInsideCooldownShed(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 600, RequestBurst: bulkhead.NoBurst}})
	cfg.MaxConcurrent = 32
	cfg.Adaptive = &bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown, MinConcurrent: 32, MaxConcurrent: 32}
	b := newBulkhead(t, cfg)
	s := startPaced(t, b, clk, 20, nil) // turns to 1.9 s
	want := []pacedAdmit{{0, 0}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}}
	s.advance(250*time.Millisecond, 50*time.Millisecond, want)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 1700 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 20; i++ {
		select {
		case r := <-s.calls[i]:
			if re := wantReason(t, r.err, bulkhead.Cooldown); re.Detail.Cooldown.RetryAfter != 1700*time.Millisecond {
				t.Fatalf("call %d: retry after %v, want 1.7s", i, re.Detail.Cooldown.RetryAfter)
			}
			s.calls[i] = closedResult(r)
		case <-time.After(testutil.Settle):
			t.Fatalf("call %d, whose turn falls inside the cool-down, was not shed as it started", i)
		}
	}
	clk.Add(1700 * time.Millisecond)
	tok, err := b.Acquire(context.Background(), req("after", 10)) // its turn now, not at 2 s
	if err != nil {
		t.Fatal(err)
	}
	_ = tok.Release(nil)
	if st := b.Stats(); st.Rate.Waiting != 0 || st.Calls.RejectedByReason[bulkhead.Cooldown] != 17 {
		t.Fatalf("after: waiting %d, rejected %v", st.Rate.Waiting, st.Calls.RejectedByReason)
	}
}

// Feedback on one permit from many goroutines, before and after Release.
func TestPermitFeedbackFromManyGoroutines(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}))
	for i := 0; i < 20; i++ {
		p := mustAcquire(t, b, req("hi", 9))
		done := make(chan struct{})
		for g := 0; g < 4; g++ {
			go func() {
				defer func() { done <- struct{}{} }()
				_ = p.FeedbackHeadroom(bulkhead.OutcomeSuccess, 0, &bulkhead.Headroom{Tokens: 100000, TokensLimit: 100000, TokensReset: time.Minute, Requests: -1})
				_ = p.Release(nil)
				_ = p.Feedback(bulkhead.OutcomeRateLimited, time.Second)
			}()
		}
		for g := 0; g < 4; g++ {
			<-done
		}
	}
	if st := b.Stats(); st.Cooldown.HeadroomReports != 20 || st.Cooldown.Started != 0 || st.Gate.InFlight != 0 {
		t.Fatalf("stats %+v gate %+v", st.Cooldown, st.Gate)
	}
}

// Permit.Feedback measures latency from the admission, also for an
// AcquireAsync future whose Result is read late (it measured from the first
// Result, ~0, and the Gradient rule saw a 10x latency jump as none).
func TestFeedbackMeasuresLatencyFromAdmission(t *testing.T) {
	run := func(async bool) []int {
		clk := clock.NewMock()
		b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Rule: bulkhead.Gradient, MaxConcurrent: 16}))
		round := func(lat time.Duration) int {
			n := b.Limits().MaxConcurrent
			var ps []*bulkhead.Permit
			if async {
				fs := make([]*bulkhead.AcquireFuture, n)
				for i := range fs {
					fs[i] = b.AcquireAsync(context.Background(), req("hi", 1))
					if !isDone(fs[i]) {
						t.Fatal("not decided inline")
					}
				}
				clk.Add(lat) // the call runs; the loop reads Result on its answer
				for _, f := range fs {
					p, err := f.Result()
					if err != nil {
						t.Fatal(err)
					}
					ps = append(ps, p)
				}
			} else {
				for range n {
					ps = append(ps, mustAcquire(t, b, req("hi", 1)))
				}
				clk.Add(lat)
			}
			for _, p := range ps {
				if err := p.Feedback(bulkhead.OutcomeSuccess, 0); err != nil {
					t.Fatal(err)
				}
				_ = p.Release(nil)
			}
			return b.Limits().MaxConcurrent
		}
		var got []int
		for range 3 {
			got = append(got, round(100*time.Millisecond))
		}
		for range 3 {
			got = append(got, round(time.Second))
		}
		return got
	}
	if s, a := run(false), run(true); fmt.Sprint(s) != fmt.Sprint(a) {
		t.Fatalf("limits by round: Acquire %v, AcquireAsync %v", s, a)
	}
}

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
func TestHoldCooldownWithFullQueueRejectsCooldown(t *testing.T) {
	b := fullQueueCooling(t)
	_, err := b.Acquire(context.Background(), req("hi", 1))
	rej := wantReason(t, err, bulkhead.Cooldown)
	if d, ok := rej.RetryAfter(); !ok || d != 5*time.Second {
		t.Fatalf("RetryAfter = %v, %v", d, ok)
	}
}

// In observe mode the same call is not bypassed into the cool-down:
// Cooldown is not a shadow reason (QueueLimit, which stood in for it, was).
func TestHoldCooldownWithFullQueueDoesNotBypassObserve(t *testing.T) {
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
func TestHoldCooldownHoldsWaiterOnlyWithinItsTimeoutLeft(t *testing.T) {
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
func TestHoldCooldownLaterCallWaitsBehindHeldWaiters(t *testing.T) {
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
func TestHeadroomReportKeepsHeldCallFirst(t *testing.T) {
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
func TestHoldCooldownExtendedPastTimeoutTurnsObserveAway(t *testing.T) {
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

// A held call survives MaxConcurrent 0 and is admitted once the limit is
// raised after its cool-down ended.
func TestHoldCooldownHeldCallSurvivesKillSwitch(t *testing.T) {
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

// A dedup leader held for a cool-down: its followers share its answer once
// the cool-down ends, and Held counts the leader once.
func TestHoldCooldownDedupLeaderHeldOnce(t *testing.T) {
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
