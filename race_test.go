package bulkhead_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// TestStaleTimersAndCancelsOnReusedRequests hammers the moments when a
// queue timeout fires, or a context ends, just as the waiter is answered:
// the engine then still holds a timer or cancel message for a pooled request
// the facade may already be reusing. Under -race this caught a data race on
// the request's generation; the checks catch a stale message acting on the
// request's next use.
func TestStaleTimersAndCancelsOnReusedRequests(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 2)
	cfg.MaxQueue = 4
	cfg.QueueTimeout = 200 * time.Microsecond
	b := newBulkhead(t, cfg)
	r := req("hi", 10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%3 == 0 {
					// Cancel at about the time the call would be admitted.
					time.AfterFunc(100*time.Microsecond, cancel)
				}
				_, _ = bulkhead.Run(ctx, b, r, func(context.Context, *bulkhead.RunContext) (int, error) {
					for t0 := time.Now(); time.Since(t0) < 150*time.Microsecond; {
					}
					return 0, nil
				})
				cancel()
			}
		}()
	}
	wg.Wait()
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.Admitted != st.Calls.Released {
		t.Fatalf("leak after the storm: %+v %+v", st.Gate, st.Calls)
	}
	total := st.Calls.Admitted + st.Calls.Rejected
	if total != 8*300 {
		t.Fatalf("%d calls ended, want %d (one outcome each)", total, 8*300)
	}
}

// TestPacedCallsRaceFree hammers pace mode where a pooled request meets a
// stale timer message: 64 callers whose turns are a millisecond apart, with
// deadlines close to their turns, contexts cancelled as their turns come,
// and 429s whose cool-downs hold the paced calls back, while the clock
// moves a millisecond at a time; with both cool-down modes. Run with
// -race: the engine must never touch a request that its caller has taken
// back (answered, returned to the pool, reused), and every call ends once.
func TestPacedCallsRaceFree(t *testing.T) {
	for _, mode := range []bulkhead.CooldownMode{bulkhead.HoldCooldown, bulkhead.ShedCooldown} {
		t.Run(mode.String(), func(t *testing.T) { pacedStorm(t, mode) })
	}
}

func pacedStorm(t *testing.T, mode bulkhead.CooldownMode) {
	clk := &togetherClock{Mock: clock.NewMock()}
	cfg := rateConfig(clk.Mock, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60_000, RequestBurst: bulkhead.NoBurst}})
	cfg.Clock, cfg.MaxConcurrent, cfg.MaxQueue = clk, 64, 64
	cfg.Adaptive = &bulkhead.Adaptive{Cooldown: mode, MinConcurrent: 64, MaxConcurrent: 64}
	b := newBulkhead(t, cfg)
	const callers, calls = 64, 40
	var wg sync.WaitGroup
	var ended atomic.Int64
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				ctx, cancel := context.WithCancel(context.Background())
				var opts []bulkhead.Option
				switch (g + i) % 4 {
				case 1:
					// A deadline about when the turn comes.
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(g+i%8+2)*time.Millisecond)
				case 2:
					// Cancelled about when the turn comes.
					time.AfterFunc(time.Duration(g%5)*time.Millisecond, cancel)
				case 3:
					// A queue timeout that ends about when the turn comes
					// after a cool-down.
					opts = append(opts, bulkhead.WithQueueTimeout(time.Duration(100+g)*time.Millisecond))
				}
				tok, err := b.Acquire(ctx, req("hi", 10), opts...)
				cancel()
				if err == nil {
					_ = tok.Release(nil)
				}
				ended.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
drive:
	for step := 0; ; step++ {
		select {
		case <-done:
			break drive
		default:
		}
		if step%150 == 75 {
			// A 429: the paced calls wait its cool-down out, or are shed
			// while it lasts.
			retry := 100 * time.Millisecond
			if mode == bulkhead.ShedCooldown {
				retry = 10 * time.Millisecond
			}
			_ = b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: retry})
		}
		clk.Add(time.Millisecond)
	}
	st := b.Stats()
	if ended.Load() != callers*calls || st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Rate.Waiting != 0 ||
		st.Calls.Admitted != st.Calls.Released || st.Calls.Admitted+st.Calls.Rejected != callers*calls {
		t.Fatalf("after the storm: %d ended, %+v %+v waiting %d", ended.Load(), st.Gate, st.Calls, st.Rate.Waiting)
	}
	if st.Cooldown.Started == 0 || st.Rate.Paced == 0 {
		t.Fatalf("the storm paced %d calls under %d cool-downs: it tested nothing", st.Rate.Paced, st.Cooldown.Started)
	}
}

// togetherClock is a mock clock whose timers due by one Add all start
// their functions together once it returns, as on the wall clock, where
// timers due at one instant run at once and a timer stopped as it fires
// may still run its function.
type togetherClock struct {
	*clock.Mock
	mu  sync.Mutex
	due []func()
}

func (c *togetherClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.Mock.AfterFunc(d, func() {
		c.mu.Lock()
		c.due = append(c.due, f)
		c.mu.Unlock()
	})
}

// Add moves the clock by d, then starts the functions of the timers that
// came due, each on its own goroutine.
func (c *togetherClock) Add(d time.Duration) {
	c.Mock.Add(d)
	c.mu.Lock()
	due := c.due
	c.due = nil
	c.mu.Unlock()
	for _, f := range due {
		go f()
	}
}
