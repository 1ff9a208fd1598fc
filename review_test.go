package bulkhead_test

// Regression tests for what an adversarial review of the rate-limit and
// fleet admission paths found.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// AcquireAsync asks the fleet pool too (it used to take the engine's
// direct path whenever the bulkhead had no rate limits).
func TestFleetAcquireAsync(t *testing.T) {
	_, client := fleetRedis(t)
	b := newBulkhead(t, fleetConfig(newFleetPool(t, client, "async", 1, -1, fleet.FailClosed), 4))
	a, err := b.AcquireAsync(context.Background(), req("a", 1)).Result()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(nil)
	_, err = b.AcquireAsync(context.Background(), req("b", 1)).Result()
	wantFleetReject(t, err, bulkhead.ConcurrencyLimit, 1)
}

// Drain waits for a provisional admission (its fleet reserve under way):
// it answers only once that call has its outcome.
func TestFleetDrainWaitsForProvisional(t *testing.T) {
	srv, client := fleetRedis(t)
	b, err := bulkhead.New(fleetConfig(newFleetPool(t, client, "drainprov", 4, -1, fleet.FailClosed), 4))
	if err != nil {
		t.Fatal(err)
	}
	_ = mustAcquire(t, b, req("warm", 1)).Release(nil)
	if _, err := srv.Do("CLIENT", "PAUSE", "300", "ALL"); err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(context.Background(), b, req("a", 1))
	testutil.WaitFor(t, "the provisional admission", func() bool { return b.Stats().Gate.InFlight == 1 })
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // within the pause
	defer cancel()
	if res, _ := b.Drain(ctx); res.Drained || res.InFlight != 1 {
		t.Fatalf("Drain answered %+v while the provisional admission was outstanding", res)
	}
	if r := <-got; r.err == nil {
		_ = r.tok.Release(nil) // admitted before Close: it runs and releases normally
	}
	if res, err := b.Drain(context.Background()); err != nil || !res.Drained {
		t.Fatalf("Drain: %+v, %v", res, err)
	}
}

// errPanicCtx never ends, but its Err panics.
type errPanicCtx struct{ context.Context }

func (errPanicCtx) Done() <-chan struct{} { return nil }
func (errPanicCtx) Err() error            { panic("broken ctx") }

// A panic on the caller's goroutine during the fleet reserve gives the
// provisional admission back before it goes on.
func TestFleetPanicDuringChecks(t *testing.T) {
	_, client := fleetRedis(t)
	cfg := fleetConfig(newFleetPool(t, client, "panic", 4, -1, fleet.FailClosed), 1)
	cfg.MaxQueue = 0
	b := newBulkhead(t, cfg)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not reach the caller")
			}
		}()
		_, _ = b.Acquire(errPanicCtx{context.Background()}, req("a", 10))
	}()
	if st := b.Stats(); st.Gate.InFlight != 0 || st.TokenBudget.InFlightTokens != 0 || st.Calls.RejectedByReason[bulkhead.Aborted] != 1 {
		t.Fatalf("after the panic: %v", st)
	}
	_ = mustAcquire(t, b, req("b", 1)).Release(nil)
}

// A borrowed slot given back at its deadline gives its fleet slot back too.
func TestFleetDeadlineAbandonFreesFleetSlot(t *testing.T) {
	_, client := fleetRedis(t)
	pool := newFleetPool(t, client, "deadline", 1, -1, fleet.FailClosed)
	clk := clock.NewMock()
	cfg := fleetConfig(pool, 4)
	cfg.Clock = clk
	cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}} // every call borrows
	b := newBulkhead(t, cfg)
	release, started := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := bulkhead.Run(context.Background(), b, req("a", 1), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
			close(started)
			<-release // a runaway call: it ignores its context
			return 0, nil
		}, bulkhead.WithBorrowedDeadline(time.Second))
		done <- err
	}()
	defer close(release)
	<-started
	var err error
	testutil.WaitFor(t, "the deadline", func() bool {
		clk.Add(100 * time.Millisecond)
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err, bulkhead.ErrBorrowedDeadline) {
		t.Fatalf("Run: %v", err)
	}
	testutil.WaitFor(t, "the fleet slot back", func() bool { return pool.Stats().Adjusts.Applied == 1 })
	p, err := b.Acquire(context.Background(), req("b", 1))
	if err != nil {
		t.Fatalf("after the deadline gave the slot back: %v", err)
	}
	_ = p.Release(nil)
}

// A fleet timeout is not the caller's deadline: the rejection does not
// match context.DeadlineExceeded.
func TestFleetTimeoutIsNotTheCallersDeadline(t *testing.T) {
	srv, client := fleetRedis(t)
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "slow", MaxConcurrent: 4, TokenBudget: -1, CallTimeout: 50 * time.Millisecond,
		RelearnWindow: -1}) // a new pool would admit nothing for its first window
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close(context.Background())
	b := newBulkhead(t, fleetConfig(pool, 4))
	_ = mustAcquire(t, b, req("warm", 1)).Release(nil)
	if _, err := srv.Do("CLIENT", "PAUSE", "300", "ALL"); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(context.Background(), req("a", 1))
	wantReason(t, err, bulkhead.FleetUnavailable)
	if errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("%v: want fleet.ErrUnavailable and not the caller's deadline", err)
	}
}

// A call turned away by the local share while Redis is down is not "never
// fits", and carries the Redis error as its cause.
func TestFleetLocalShareRejection(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer client.Close()
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "share", MaxConcurrent: -1, TokenBudget: 1000,
		OnFailure: fleet.FailLocalShare, LocalShare: fleet.Share{Slots: 10, Tokens: 15}, CallTimeout: 100 * time.Millisecond,
		RelearnWindow: -1}) // a new pool would admit nothing for its first window
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = pool.Close(ctx)
	}()
	b := newBulkhead(t, fleetConfig(pool, 4))
	a := mustAcquire(t, b, req("a", 9)) // 10 of the share's 15 tokens
	defer a.Release(nil)
	_, err = b.Acquire(context.Background(), req("b", 9))
	re := wantReason(t, err, bulkhead.BudgetLimit)
	if re.NeverFits() || !errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("%v: never fits %v; want a retryable rejection caused by the Redis error", err, re.NeverFits())
	}
}

// Pace mode: a turn that comes exactly at the queue timeout is refused
// (it used to leave a queue timeout of 0, which means none).
func TestRatePaceTurnAtQueueTimeout(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	cfg.QueueTimeout, cfg.MaxConcurrent = time.Second, 1
	b := newBulkhead(t, cfg)
	a := mustAcquire(t, b, req("a", 10))
	defer a.Release(nil)
	_, err := b.Acquire(context.Background(), req("b", 10)) // its turn is 1 s away: no time left for a slot
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
}

// Pace mode counts the time a call really waited for its turn.
func TestRatePacedTimeCutShort(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 1, RequestBurst: bulkhead.NoBurst}}))
	armed := make(chan time.Duration, 4)
	bulkhead.SetRateWaitHook(func(d time.Duration) { armed <- d })
	defer bulkhead.SetRateWaitHook(nil)
	_ = mustAcquire(t, b, req("a", 1)).Release(nil)
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, b, req("b", 1))
	<-armed
	clk.Add(time.Second)
	cancel()
	wantReason(t, (<-ch).err, bulkhead.Aborted)
	if st := b.Stats().Rate; st.Paced != 1 || st.PacedTime != time.Second {
		t.Fatalf("paced %d for %v; want 1 for the 1 s it waited", st.Paced, st.PacedTime)
	}
}

// Observe mode bypasses a call the fleet turns away for a shadowed reason,
// as a race bypass, and the call holds nothing.
func TestFleetObserveBypass(t *testing.T) {
	_, client := fleetRedis(t)
	pool := newFleetPool(t, client, "observe", 1, -1, fleet.FailClosed)
	b := newBulkhead(t, fleetConfig(pool, 4))
	a := mustAcquire(t, b, req("a", 1))
	defer a.Release(nil)
	var bp *bulkhead.Bypass
	v, err := bulkhead.Run(context.Background(), b, req("b", 1), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		bp = rc.Bypass()
		return 7, nil
	}, bulkhead.WithMode(bulkhead.Observe))
	if err != nil || v != 7 || bp == nil || bp.Reason != bulkhead.ConcurrencyLimit || !bp.Race {
		t.Fatalf("Run: %v, %v, bypass %+v; want a race bypass for the fleet's concurrency_limit", v, err, bp)
	}
	st := b.Stats()
	if st.Observe.Bypassed != 1 || st.Observe.RaceBypassed != 1 || st.Gate.InFlight != 1 || st.Calls.RejectedByReason[bulkhead.ConcurrencyLimit] != 1 || st.Observe.InFlight != 0 {
		t.Fatalf("stats: %v", st)
	}
}
