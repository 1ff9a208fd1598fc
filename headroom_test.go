package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// report tells b what the provider said is left for the default model.
func report(t *testing.T, b *bulkhead.Bulkhead, h bulkhead.Headroom) {
	t.Helper()
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess, Headroom: &h}); err != nil {
		t.Fatal(err)
	}
}

func wantHeadroomShed(t *testing.T, err error, retry time.Duration) {
	t.Helper()
	rej := wantReason(t, err, bulkhead.Cooldown)
	if d, ok := rej.RetryAfter(); !ok || d != retry || rej.Detail.Cooldown == nil || !rej.Detail.Cooldown.Headroom || rej.Detail.Cooldown.Model != "gpt-4o" {
		t.Fatalf("RetryAfter = %v, %v (detail %+v), want %v from the headroom", d, ok, rej.Detail.Cooldown, retry)
	}
}

// Admissions spend their reservation from the reported tokens, and the
// window refills linearly towards its limit over its reset.
func TestHeadroomLinearRefill(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown})
	cfg.TokenBudget.Budget = 1 << 20
	b := newBulkhead(t, cfg)
	// 1,000 of 61,000 left, full in 60s: 1,000 tokens a second.
	report(t, b, bulkhead.Headroom{Tokens: 1000, TokensLimit: 61000, TokensReset: time.Minute, Requests: -1})
	mustAcquire(t, b, req("hi", 499)).Release(nil) // reserves 500
	if h := b.Stats().Cooldown.Headroom["gpt-4o"]; h.Tokens != 500 || h.Requests != -1 || h.TokensLimit != 61000 ||
		!h.Reported.Equal(clk.Now()) || !h.Full.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("headroom %+v", h)
	}
	mustAcquire(t, b, req("hi", 499)).Release(nil)
	_, err := b.Acquire(context.Background(), req("hi", 499))
	wantHeadroomShed(t, err, 500*time.Millisecond) // 500 tokens refill in 0.5s
	if d, err := b.WouldAdmit(req("hi", 499), bulkhead.WithDetail()); err != nil || d.Admit || d.Reason != bulkhead.Cooldown || !d.Detail.Cooldown.Headroom {
		t.Fatalf("WouldAdmit = %+v, %v", d, err)
	}
	clk.Add(200 * time.Millisecond)
	_, err = b.Acquire(context.Background(), req("hi", 499))
	wantHeadroomShed(t, err, 300*time.Millisecond)
	clk.Add(300 * time.Millisecond)
	mustAcquire(t, b, req("hi", 499)).Release(nil)
	// Another model is unaffected.
	other := req("hi", 100_000)
	other.Model = "gpt-4.1"
	mustAcquire(t, b, other).Release(nil)
	// A call larger than the window's limit fits only once it is full
	// again, and forgotten.
	_, err = b.Acquire(context.Background(), req("hi", 70_000))
	wantHeadroomShed(t, err, time.Minute-500*time.Millisecond)
	st := b.Stats()
	if st.Calls.RejectedByReason[bulkhead.Cooldown] != 3 || st.Cooldown.HeadroomReports != 1 || st.Cooldown.Active != nil {
		t.Fatalf("stats %v, %+v", st.Calls.RejectedByReason, st.Cooldown)
	}
	clk.Add(time.Minute)
	mustAcquire(t, b, req("hi", 70_000)).Release(nil)
	if h := b.Stats().Cooldown.Headroom; h != nil {
		t.Fatalf("headroom kept once the window is full: %+v", h)
	}
}

// With no limit said, the window is full again at once, at its reset; the
// requests' window is spent one per admission.
func TestHeadroomStepRefill(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.Adaptive = nil // shed: the default hold mode, with no queue timeout to wait in
	cfg.QueueTimeout = time.Second
	b := newBulkhead(t, cfg)
	report(t, b, bulkhead.Headroom{Tokens: 1000, TokensReset: 10 * time.Second, Requests: 2, RequestsReset: 4 * time.Second})
	mustAcquire(t, b, req("hi", 99)).Release(nil)
	mustAcquire(t, b, req("hi", 99)).Release(nil)
	if h := b.Stats().Cooldown.Headroom["gpt-4o"]; h.Tokens != 800 || h.Requests != 0 {
		t.Fatalf("headroom %+v", h)
	}
	_, err := b.Acquire(context.Background(), req("hi", 99))
	wantHeadroomShed(t, err, 4*time.Second) // no request left until the reset
	clk.Add(4 * time.Second)
	mustAcquire(t, b, req("hi", 699)).Release(nil) // the tokens: 100 left
	_, err = b.Acquire(context.Background(), req("hi", 199))
	wantHeadroomShed(t, err, 6*time.Second)
	clk.Add(6 * time.Second)
	mustAcquire(t, b, req("hi", 199)).Release(nil)
	if st := b.Stats(); st.Cooldown.Headroom != nil || st.Adaptive != nil {
		t.Fatalf("stats %+v", st.Cooldown)
	}
}

// A newer report replaces the state and what was spent against it.
func TestHeadroomNewerReportReplaces(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}))
	report(t, b, bulkhead.Headroom{Tokens: 100, TokensReset: time.Minute, Requests: -1})
	p := mustAcquire(t, b, req("hi", 99))
	_, err := b.Acquire(context.Background(), req("hi", 0))
	wantHeadroomShed(t, err, time.Minute) // an exhausted window turns away even a call reserving 1
	if err := p.FeedbackHeadroom(bulkhead.OutcomeSuccess, 0, &bulkhead.Headroom{Tokens: 5000, TokensReset: time.Minute, Requests: -1}); err != nil {
		t.Fatal(err)
	}
	_ = p.Release(nil)
	if h := b.Stats().Cooldown.Headroom["gpt-4o"]; h.Tokens != 5000 {
		t.Fatalf("headroom %+v", h)
	}
	// A report that says nothing usable forgets what was known.
	report(t, b, bulkhead.Headroom{Tokens: 7, Requests: -1})
	if h := b.Stats().Cooldown.Headroom; h != nil {
		t.Fatalf("headroom %+v", h)
	}
}

// A call that does not fit is held until it would, in HoldCooldown mode.
func TestHeadroomHold(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.QueueTimeout = 10 * time.Second
	b := newBulkhead(t, cfg)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: 60000, TokensReset: time.Minute, Requests: -1})
	ch := acquireAsync(context.Background(), b, req("hi", 1999)) // 2,000 tokens: 2s of refill
	testutil.WaitFor(t, "the call to hold", holding(b))
	clk.Add(time.Second)
	select {
	case r := <-ch:
		t.Fatalf("admitted early: %v", r.err)
	default:
	}
	clk.Add(time.Second)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.tok.Release(nil)
	if st := b.Stats().Cooldown; st.Held != 1 {
		t.Fatalf("cooldown stats %+v", st)
	}
	// One that would wait beyond its queue timeout is turned away at once.
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: 60000, TokensReset: time.Minute, Requests: -1})
	_, err := b.Acquire(context.Background(), req("hi", 19_999))
	wantHeadroomShed(t, err, 20*time.Second)
}

// A call queued before the report is turned away as the engine grants it
// a slot, with the time until it would fit; one that fits spends there.
func TestHeadroomTurnsAwayQueuedCalls(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown})
	cfg.MaxConcurrent = 1
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("hi", 10))
	big := b.AcquireAsync(context.Background(), req("hi", 999))
	small := b.AcquireAsync(context.Background(), req("hi", 99))
	if isDone(big) || isDone(small) {
		t.Fatal("the calls did not queue")
	}
	if err := p.FeedbackHeadroom(bulkhead.OutcomeSuccess, 0, &bulkhead.Headroom{Tokens: 500, TokensLimit: 6500, TokensReset: time.Minute, Requests: -1}); err != nil {
		t.Fatal(err)
	}
	_ = p.Release(nil)
	_, err := big.Result()
	wantHeadroomShed(t, err, 5*time.Second) // 500 more tokens at 100 a second
	ps, err := small.Result()
	if err != nil {
		t.Fatal(err)
	}
	if h := b.Stats().Cooldown.Headroom["gpt-4o"]; h.Tokens != 400 {
		t.Fatalf("headroom %+v, want 400 left after the small call", h)
	}
	_ = ps.Release(nil)
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Gate.Pending != 0 {
		t.Fatalf("gate %+v", st.Gate)
	}
}

// A call the rate limits turn down at its grant gives its spend back.
func TestHeadroomRefundedOnRateLimit(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: 1}}))
	report(t, b, bulkhead.Headroom{Tokens: 1000, TokensReset: time.Minute, Requests: 10, RequestsReset: time.Minute})
	mustAcquire(t, b, req("hi", 99)).Release(nil)
	mustAcquire(t, b, req("hi", 99)).Release(nil) // the burst's second call
	_, err := b.Acquire(context.Background(), req("hi", 99))
	wantReason(t, err, bulkhead.RateLimit)
	if h := b.Stats().Cooldown.Headroom["gpt-4o"]; h.Tokens != 800 || h.Requests != 8 {
		t.Fatalf("headroom %+v, want only the admitted call's spend", h)
	}
}

func TestHeadroomInvalid(t *testing.T) {
	b := newBulkhead(t, adaptiveConfig(clock.NewMock(), bulkhead.Adaptive{}))
	p := mustAcquire(t, b, req("hi", 1))
	defer p.Release(nil)
	for _, h := range []bulkhead.Headroom{
		{Tokens: 1, TokensLimit: -1, Requests: -1},
		{Tokens: 1, TokensReset: -time.Second, Requests: -1},
		{Tokens: 1, TokensReset: bulkhead.MaxRetryAfter + 1, Requests: -1},
		{Tokens: 11, TokensLimit: 10, TokensReset: time.Second, Requests: -1},
		{Tokens: -1, Requests: 3, RequestsLimit: 2},
		{Tokens: -1, Requests: 1, RequestsLimit: -2},
		{Tokens: -1, Requests: 1, RequestsReset: -1},
	} {
		err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess, Headroom: &h})
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("Feedback(%+v) = %v, want a *ConfigError", h, err)
		}
		if err := p.FeedbackHeadroom(bulkhead.OutcomeSuccess, 0, &h); !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("FeedbackHeadroom(%+v) = %v, want a *ConfigError", h, err)
		}
	}
	if st := b.Stats().Cooldown; st.HeadroomReports != 0 || st.Headroom != nil {
		t.Fatalf("invalid reports changed the state: %+v", st)
	}
	var nilPermit *bulkhead.Permit
	if err := nilPermit.FeedbackHeadroom(bulkhead.OutcomeSuccess, 0, nil); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("nil permit: %v", err)
	}
}

// At most 1024 models keep a report: a new one makes room by dropping the
// one whose window is full first.
func TestHeadroomBounded(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{}))
	for i := range 1025 {
		h := bulkhead.Headroom{Tokens: 0, Requests: -1, TokensReset: time.Duration(i+1) * time.Second}
		if i == 1024 {
			h.TokensReset = 5000 * time.Second
		}
		if err := b.Feedback(bulkhead.Feedback{Model: fmt.Sprintf("m%d", i), Outcome: bulkhead.OutcomeSuccess, Headroom: &h}); err != nil {
			t.Fatal(err)
		}
	}
	hr := b.Stats().Cooldown.Headroom
	if _, ok := hr["m0"]; len(hr) != 1024 || ok || hr["m1024"].Full.IsZero() {
		t.Fatalf("%d kept, m0 %v, m1024 %+v", len(hr), ok, hr["m1024"])
	}
	clk.Add(2000 * time.Second)
	if hr := b.Stats().Cooldown.Headroom; len(hr) != 1 {
		t.Fatalf("%d kept after most windows are full, want 1", len(hr))
	}
}

// A 429's cool-down and the headroom together: the call waits for the
// later of the two.
func TestHeadroomWithCooldown(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}))
	h := bulkhead.Headroom{Tokens: 0, TokensReset: 5 * time.Second, Requests: -1}
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 2 * time.Second, Headroom: &h}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(context.Background(), req("hi", 1))
	wantHeadroomShed(t, err, 5*time.Second)
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 8 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(context.Background(), req("hi", 1))
	rej := wantReason(t, err, bulkhead.Cooldown)
	if d, _ := rej.RetryAfter(); d != 8*time.Second || rej.Detail.Cooldown.Headroom {
		t.Fatalf("RetryAfter %v, detail %+v; want the 429's 8s", d, rej.Detail.Cooldown)
	}
	clk.Add(8 * time.Second)
	mustAcquire(t, b, req("hi", 1)).Release(nil)
	if st := b.Stats().Cooldown; st.Active != nil || st.Headroom != nil || st.HeadroomReports != 1 || st.Started != 2 {
		t.Fatalf("cooldown stats %+v", st)
	}
}

// The Headroom doc: what is left at t is min(limit, left + ...) minus what
// admissions spent since the report, and the report is forgotten only once
// EVERY window it said is full again. A token window whose reset has passed
// while the requests window has not still caps admissions at its limit
// minus the spending (it stopped being tracked, and admitted any number of
// tokens until the requests window reset).
func TestHeadroomFullTokenWindowStillCaps(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown})
	cfg.TokenBudget.Budget = 1 << 30
	b := newBulkhead(t, cfg)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: 1000, TokensReset: time.Second,
		Requests: 50, RequestsLimit: 100, RequestsReset: time.Hour})
	clk.Add(2 * time.Second) // the token window is full: 1,000 tokens
	admitted := 0
	for i := 0; i < 10; i++ {
		p, err := b.Acquire(context.Background(), req("hi", 499)) // 500 tokens each
		if err != nil {
			break
		}
		admitted++
		_ = p.Release(nil)
	}
	if admitted > 2 {
		t.Fatalf("%d calls of 500 tokens admitted against a 1,000-token window (stats %+v)", admitted, b.Stats().Cooldown.Headroom)
	}
}

type panicValueCtx struct{ context.Context }

func (panicValueCtx) Deadline() (time.Time, bool) { panic("caller's ctx bug") }

// A panic between the grant and the verdict gives everything back, the
// headroom spend booked at the grant included (it leaked until a new report
// came).
func TestHeadroomRefundedWhenFleetCheckPanics(t *testing.T) {
	_, client := fleetRedis(t)
	b := newBulkhead(t, fleetConfig(newFleetPool(t, client, "hpanic", -1, 1000, fleet.FailClosed), 4))
	h := bulkhead.Headroom{Tokens: 1000, TokensReset: time.Hour, Requests: 10, RequestsReset: time.Hour}
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess, Headroom: &h}); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("no panic")
			}
		}()
		p, err := b.Acquire(panicValueCtx{context.Background()}, req("boom", 99))
		if err == nil {
			_ = p.Release(nil)
		}
		t.Logf("Acquire err %v", err)
	}()
	st := b.Stats()
	if st.Gate.InFlight != 0 {
		t.Fatalf("slot kept: %+v", st.Gate)
	}
	if hr := st.Cooldown.Headroom["gpt-4o"]; hr.Tokens != 1000 || hr.Requests != 10 {
		t.Fatalf("headroom %+v after a call rolled back by a panic, want it all back", hr)
	}
}

// Huge values: no panic, sane answers.
func TestHeadroomExtremeValues(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown})
	cfg.TokenBudget.Budget = 1 << 62
	b := newBulkhead(t, cfg)
	const max = int64(^uint64(0) >> 1)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: max, TokensReset: bulkhead.MaxRetryAfter, Requests: 0, RequestsLimit: max, RequestsReset: bulkhead.MaxRetryAfter})
	clk.Add(12 * time.Hour)
	p := mustAcquire(t, b, req("hi", 1<<61))
	_ = p.Release(nil)
	h := b.Stats().Cooldown.Headroom["gpt-4o"]
	if h.Tokens <= 0 || h.Tokens > max/2 || h.Requests <= 0 {
		t.Fatalf("headroom %+v", h)
	}
	_, err := b.Acquire(context.Background(), req("hi", 1<<62-100))
	if err == nil {
		t.Fatalf("admitted beyond what is left: %+v", b.Stats().Cooldown.Headroom)
	}
	rej := wantReason(t, err, bulkhead.Cooldown)
	if d, ok := rej.RetryAfter(); !ok || d <= 0 || d > 12*time.Hour {
		t.Fatalf("retry %v %v", d, ok)
	}
}

// Hold mode: a held call ends on Close (Shutdown) and on its ctx (Aborted),
// and leaves the queue.
func TestHeadroomHeldCallEndsOnCloseAndCancel(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.QueueTimeout = time.Hour
	b := newBulkhead(t, cfg)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: 60000, TokensReset: time.Minute, Requests: -1})
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, b, req("hi", 1999))
	testutil.WaitFor(t, "hold", holding(b))
	cancel()
	wantReason(t, (<-ch).err, bulkhead.Aborted)
	f := b.AcquireAsync(context.Background(), req("hi", 1999))
	testutil.WaitFor(t, "hold", holding(b))
	b.Close()
	_, err := f.Result()
	wantReason(t, err, bulkhead.Shutdown)
	if st := b.Stats(); st.Cooldown.Held != 2 || st.Gate.Pending != 0 { // both were held, in the queue
		t.Fatalf("cooldown %+v, gate %+v", st.Cooldown, st.Gate)
	}
	if h := b.Stats().Cooldown.Headroom["gpt-4o"]; h.Tokens != 0 {
		t.Fatalf("headroom %+v", h)
	}
}

// CooldownStats.Held counts calls: one call held twice (a newer report came
// while it waited) counts once (it counted twice).
func TestHeadroomHeldCountsEachCallOnce(t *testing.T) {
	clk := clock.NewMock()
	cfg := adaptiveConfig(clk, bulkhead.Adaptive{})
	cfg.QueueTimeout = time.Hour
	b := newBulkhead(t, cfg)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: 60000, TokensReset: time.Minute, Requests: -1}) // 1,000/s
	ch := acquireAsync(context.Background(), b, req("hi", 999))                                            // 1s
	testutil.WaitFor(t, "hold", holding(b))
	clk.Add(500 * time.Millisecond)
	report(t, b, bulkhead.Headroom{Tokens: 0, TokensLimit: 60000, TokensReset: time.Minute, Requests: -1})
	clk.Add(500 * time.Millisecond) // wakes, 500 tokens short: held again
	testutil.WaitFor(t, "hold again", func() bool { st := b.Stats(); return st.Cooldown.Held == 1 && st.Gate.Pending == 1 })
	clk.Add(500 * time.Millisecond)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.tok.Release(nil)
	if st := b.Stats().Cooldown; st.Held != 1 {
		t.Fatalf("one call held, Held = %d", st.Held)
	}
}
