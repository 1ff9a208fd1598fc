package bulkhead_test

// Regression tests from an adversarial review of provider headroom and
// cool-downs: each guards the fix of the defect its comment describes, or
// probes a case that held.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"net/http"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// The Headroom doc: what is left at t is min(limit, left + ...) minus what
// admissions spent since the report, and the report is forgotten only once
// EVERY window it said is full again. A token window whose reset has passed
// while the requests window has not still caps admissions at its limit
// minus the spending (it stopped being tracked, and admitted any number of
// tokens until the requests window reset).
func TestReviewHeadroomFullTokenWindowStillCaps(t *testing.T) {
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
func TestReviewHeadroomPanicDuringFleetCheckRefunds(t *testing.T) {
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

// Reset values that are not plain numbers are ignored (they were read as a
// 24h window).
func TestReviewHeadroomOfGarbageReset(t *testing.T) {
	for _, v := range []string{"inf", "Infinity", "1e400", "0x1p20"} {
		hdr := http.Header{}
		hdr.Set("X-Ratelimit-Remaining-Tokens", "10")
		hdr.Set("X-Ratelimit-Limit-Tokens", "100")
		hdr.Set("X-Ratelimit-Reset-Tokens", v)
		h := stream.HeadroomOf(hdr, time.Now())
		if h != nil && h.TokensReset != 0 {
			t.Errorf("reset %q read as %v, want it ignored", v, h.TokensReset)
		}
	}
}

// Feedback on one permit from many goroutines, before and after Release.
func TestReviewFeedbackConcurrent(t *testing.T) {
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

// Huge values: no panic, sane answers.
func TestReviewHeadroomExtremes(t *testing.T) {
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
func TestReviewHeadroomHoldCloseAndCancel(t *testing.T) {
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

func TestReviewHeadroomOfReal(t *testing.T) {
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
	}{{"6m0s", 6 * time.Minute}, {"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond}, {"20ms", 20 * time.Millisecond}, {"7.66s", 7660 * time.Millisecond}, {"1", time.Second}} {
		hdr := http.Header{}
		hdr.Set("x-ratelimit-remaining-tokens", "149984")
		hdr.Set("x-ratelimit-limit-tokens", "150000")
		hdr.Set("x-ratelimit-reset-tokens", c.v)
		hdr.Set("x-ratelimit-remaining-requests", "59")
		hdr.Set("x-ratelimit-limit-requests", "60")
		hdr.Set("x-ratelimit-reset-requests", "1s")
		h := stream.HeadroomOf(hdr, now)
		if h == nil || h.TokensReset != c.want || h.Tokens != 149984 || h.TokensLimit != 150000 || h.Requests != 59 || h.RequestsReset != time.Second {
			t.Errorf("%q: %+v", c.v, h)
		}
	}
	hdr := http.Header{}
	hdr.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
	hdr.Set("anthropic-ratelimit-tokens-remaining", "39000")
	hdr.Set("anthropic-ratelimit-tokens-limit", "40000")
	hdr.Set("anthropic-ratelimit-tokens-reset", "2024-01-01T00:00:30Z")
	hdr.Set("anthropic-ratelimit-requests-remaining", "49")
	hdr.Set("anthropic-ratelimit-requests-reset", "2024-01-01T00:00:01.5Z")
	h := stream.HeadroomOf(hdr, now.Add(time.Hour))
	if h == nil || h.TokensReset != 30*time.Second || h.RequestsReset != 1500*time.Millisecond || h.RequestsLimit != 0 || h.Tokens != 39000 {
		t.Errorf("anthropic: %+v", h)
	}
	bad := http.Header{}
	bad.Set("x-ratelimit-remaining-tokens", "lots")
	bad.Set("x-ratelimit-remaining-requests", "-3")
	if h := stream.HeadroomOf(bad, now); h != nil {
		t.Errorf("garbage read as %+v", h)
	}
}

// CooldownStats.Held counts calls: one call held twice (a newer report came
// while it waited) counts once (it counted twice).
func TestReviewHeadroomHeldCountsCalls(t *testing.T) {
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

// Permit.Feedback measures latency from the admission, also for an
// AcquireAsync future whose Result is read late (it measured from the first
// Result, ~0, and the Gradient rule saw a 10x latency jump as none).
func TestReviewAsyncLatencyFromAdmission(t *testing.T) {
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
