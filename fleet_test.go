package bulkhead_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// fleetRedis starts a redis-server for the fleet tests, or skips the test
// when none is installed (and CI is unset).
func fleetRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	return srv, client
}

// newFleetPool opens a pool, closed when the test ends (after the
// bulkheads' cleanup, which runs first). It has no relearn window: a new
// pool would otherwise admit nothing for its first window.
func newFleetPool(t *testing.T, client *redis.Client, name string, maxConc, budget int64, policy fleet.FailurePolicy) *fleet.Pool {
	t.Helper()
	p, err := fleet.New(fleet.Config{Client: client, Pool: name, MaxConcurrent: maxConc, TokenBudget: budget,
		LeaseTTL: 2 * time.Second, OnFailure: policy, CallTimeout: 5 * time.Second, BreakerCooldown: 50 * time.Millisecond,
		RelearnWindow: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	return p
}

func fleetConfig(pool *fleet.Pool, maxConc int) bulkhead.Config {
	return bulkhead.Config{
		Model: "gpt-4o", MaxConcurrent: maxConc, MaxQueue: 4, Fleet: pool,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1 << 40, Estimator: estimatorFunc(nil)},
	}
}

// wantFleetReject checks a rejection by the fleet's limits.
func wantFleetReject(t *testing.T, err error, why bulkhead.Reason, inFlight int64) *bulkhead.RejectedError {
	t.Helper()
	re := wantReason(t, err, why)
	d := re.Detail
	if d == nil || d.Constraint != bulkhead.ConstraintFleet || d.Fleet == nil || d.Fleet.InFlight != inFlight {
		t.Fatalf("detail %+v (fleet %+v); want constraint fleet, %d in flight fleet-wide", d, d.Fleet, inFlight)
	}
	return re
}

// TestFleetShared checks that two replicas (two bulkheads, each with its
// own pool handle on one pool) share the fleet's limits, that a fleet
// rejection holds nothing locally, and that a release frees fleet capacity
// at once for the next reserve.
func TestFleetShared(t *testing.T) {
	_, client := fleetRedis(t)
	poolA := newFleetPool(t, client, "shared", 3, 1000, fleet.FailClosed)
	a := newBulkhead(t, fleetConfig(poolA, 4))
	poolB := newFleetPool(t, client, "shared", 3, 1000, fleet.FailClosed)
	b := newBulkhead(t, fleetConfig(poolB, 4))
	// released waits until pool's own release reached Redis: its last
	// reply shows the fleet holding slots.
	released := func(pool *fleet.Pool, slots int64) {
		testutil.WaitFor(t, "the release to reach Redis", func() bool { return pool.Stats().LastView.Slots == slots })
	}
	p1 := mustAcquire(t, a, req("1", 99))
	p2 := mustAcquire(t, b, req("2", 99))
	p3 := mustAcquire(t, a, req("3", 99))
	_, err := b.Acquire(context.Background(), req("4", 99), bulkhead.WithTag("fourth"))
	re := wantFleetReject(t, err, bulkhead.ConcurrencyLimit, 3)
	if re.Tag != "fourth" || re.NeverFits() || re.Detail.Fleet.Pool != "shared" || re.Detail.Fleet.MaxConcurrent != 3 {
		t.Fatalf("rejection %v: %+v", err, re.Detail.Fleet)
	}
	if st := b.Stats(); st.Gate.InFlight != 1 || st.TokenBudget.InFlightTokens != 100 || st.Calls.RejectedByReason[bulkhead.ConcurrencyLimit] != 1 ||
		st.Fleet == nil || st.Fleet.Checked != 2 || st.Fleet.Admitted != 1 || st.Fleet.InFlight != 3 {
		t.Fatalf("replica b after the fleet rejection: %v", st)
	}
	// A release on one replica frees fleet capacity for the others as soon
	// as it reaches Redis (at once for this replica's own next reserve).
	_ = p1.Release(nil)
	released(poolA, 2)
	p4 := mustAcquire(t, b, req("4", 99))
	// Tokens: 200 held, 800 left; an 801-token call does not fit now, a
	// 1001-token one never fits.
	_ = p2.Release(nil)
	released(poolB, 2)
	_, err = a.Acquire(context.Background(), req("5", 800))
	wantFleetReject(t, err, bulkhead.BudgetLimit, 2)
	_, err = a.Acquire(context.Background(), req("6", 1000))
	if re := wantFleetReject(t, err, bulkhead.BudgetLimit, 2); !re.NeverFits() {
		t.Fatalf("a call above the fleet budget: %v, want never fits", err)
	}
	_ = p3.Release(nil)
	_ = p4.Release(nil)
}

// TestFleetRollbackAdmitsWaiter checks that a queued call the fleet turns
// away gives its local slot to the next waiter, which the fleet admits.
func TestFleetRollbackAdmitsWaiter(t *testing.T) {
	_, client := fleetRedis(t)
	other := newBulkhead(t, fleetConfig(newFleetPool(t, client, "rollback", -1, 100, fleet.FailClosed), 4))
	b := newBulkhead(t, fleetConfig(newFleetPool(t, client, "rollback", -1, 100, fleet.FailClosed), 1))
	theirs := mustAcquire(t, other, req("theirs", 59)) // 60 of the fleet's 100 tokens
	mine := mustAcquire(t, b, req("mine", 29))         // 30 more, and b's one slot
	big := acquireAsync(context.Background(), b, req("big", 49), bulkhead.WithTag("big"))
	testutil.WaitFor(t, "the big waiter", pending(b))
	small := acquireAsync(context.Background(), b, req("small", 19), bulkhead.WithTag("small"))
	testutil.WaitFor(t, "two waiters", func() bool { return b.Stats().Gate.Pending == 2 })
	// mine's release frees b's slot and 30 fleet tokens: the big call
	// (50 tokens) does not fit beside theirs, the small one (20) does.
	_ = mine.Release(nil)
	wantFleetReject(t, (<-big).err, bulkhead.BudgetLimit, 1)
	r := <-small
	if r.err != nil {
		t.Fatalf("the small waiter: %v", r.err)
	}
	_ = r.tok.Release(nil)
	_ = theirs.Release(nil)
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.TokenBudget.InFlightTokens != 0 ||
		st.Calls.Admitted != 2 || st.Calls.RejectedByReason[bulkhead.BudgetLimit] != 1 || st.TokenBudget.TotalReserved != 50 {
		t.Fatalf("stats: %v", st)
	}
}

// TestFleetFailure checks the failure policies while Redis is down.
func TestFleetFailure(t *testing.T) {
	srv, client := fleetRedis(t)
	closed := newBulkhead(t, fleetConfig(newFleetPool(t, client, "down", 8, -1, fleet.FailClosed), 4))
	open := newBulkhead(t, fleetConfig(newFleetPool(t, client, "down", 8, -1, fleet.FailOpen), 4))
	srv.Stop()
	_, err := closed.Acquire(context.Background(), req("a", 10))
	re := wantReason(t, err, bulkhead.FleetUnavailable)
	if re.Detail.Fleet == nil || !errors.Is(re.Detail.Fleet.Fallback, fleet.ErrUnavailable) || !errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("FailClosed: %v, detail %+v", err, re.Detail.Fleet)
	}
	p, err := open.Acquire(context.Background(), req("b", 10))
	if err != nil {
		t.Fatalf("FailOpen: %v", err)
	}
	if st := open.Stats().Fleet; st.PolicyAdmitted != 1 {
		t.Fatalf("fleet stats %+v", st)
	}
	_ = p.Release(nil)
	if st := closed.Stats(); st.Gate.InFlight != 0 || st.Calls.RejectedByReason[bulkhead.FleetUnavailable] != 1 {
		t.Fatalf("closed: %v", st)
	}
}

// TestFleetRun checks Run, usage reports and abandonment through the fleet:
// the pool's view follows the hold.
func TestFleetRun(t *testing.T) {
	_, client := fleetRedis(t)
	pool := newFleetPool(t, client, "run", 4, 1000, fleet.FailClosed)
	b := newBulkhead(t, fleetConfig(pool, 4))
	v, err := bulkhead.Run(context.Background(), b, req("a", 99), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		return 1, rc.SetUsage(bulkhead.Usage{Input: 1, Output: 20})
	})
	if err != nil || v != 1 {
		t.Fatalf("Run: %v, %v", v, err)
	}
	// An overrun reported during the call reaches the pool at once; an
	// abandoned slot too.
	p := mustAcquire(t, b, req("b", 99))
	if _, err := p.ReportUsage(bulkhead.Usage{Input: 1, Output: 200}, nil); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the overrun to reach Redis", func() bool { return pool.Stats().Adjusts.Applied == 1 })
	if st := pool.Stats(); st.LocalHolds != 1 || st.LocalTokens != 201 {
		t.Fatalf("pool stats %+v; want one hold of 201 tokens", st)
	}
	_ = p.Release(nil)
	testutil.WaitFor(t, "the release to reach Redis", func() bool {
		st := pool.Stats()
		return st.LocalHolds == 0 && st.ReleaseBacklog == 0
	})
}

// TestFleetReplicasStress runs many goroutines over four replicas sharing
// one pool and checks, from the fleet view after every admission and from a
// count of the calls running, that the fleet's limits are never exceeded.
func TestFleetReplicasStress(t *testing.T) {
	_, client := fleetRedis(t)
	const limit, budget = 6, 600
	var replicas []*bulkhead.Bulkhead
	for i := 0; i < 4; i++ {
		replicas = append(replicas, newBulkhead(t, fleetConfig(newFleetPool(t, client, "stress", limit, budget, fleet.FailClosed), 4)))
	}
	var running, tokens, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := replicas[g%4]
			for i := 0; i < 40; i++ {
				n := int64(20 + (g*7+i*13)%150)
				p, err := b.Acquire(context.Background(), req("x", n-1))
				if err != nil {
					var re *bulkhead.RejectedError
					if !errors.As(err, &re) {
						t.Errorf("Acquire: %v", err)
						return
					}
					continue
				}
				admitted.Add(1)
				// The pool's view is the post-state of a script: never
				// over the limits.
				if v := b.Stats().Fleet; v.InFlight > limit || v.InFlightTokens > budget {
					t.Errorf("fleet view %+v over the limits %d/%d", v, limit, budget)
				}
				r := running.Add(1)
				if r > limit {
					t.Errorf("%d calls running, over the fleet limit %d", r, limit)
				}
				for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
				}
				if tk := tokens.Add(n); tk > budget {
					t.Errorf("%d tokens held, over the fleet budget %d", tk, budget)
				}
				if i%3 == 0 {
					_, _ = p.ReportUsage(bulkhead.Usage{Input: 1, Output: n / 2}, nil)
				}
				_ = client.Ping(context.Background()).Err() // the call takes a round trip, so calls overlap
				tokens.Add(-n)
				running.Add(-1)
				_ = p.Release(nil)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() == 0 || peak.Load() < 2 {
		t.Fatalf("admitted %d, peak %d: the stress did not run concurrently", admitted.Load(), peak.Load())
	}
}

// TestFleetCancelDuringReserve checks that a caller whose context ends
// while its fleet reserve waits for a slow Redis gets exactly one outcome,
// Aborted, and leaves no hold behind, locally or in the fleet.
func TestFleetCancelDuringReserve(t *testing.T) {
	srv, client := fleetRedis(t)
	pool := newFleetPool(t, client, "cancel", 4, -1, fleet.FailClosed)
	b := newBulkhead(t, fleetConfig(pool, 4))
	_ = mustAcquire(t, b, req("warm", 1)).Release(nil) // the scripts are loaded
	if _, err := srv.Do("CLIENT", "PAUSE", "300", "ALL"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := b.Acquire(ctx, req("a", 10))
	re := wantReason(t, err, bulkhead.Aborted)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v: want the context's error as the cause (%+v)", err, re)
	}
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Calls.Admitted != 1 || st.Calls.RejectedByReason[bulkhead.Aborted] != 1 {
		t.Fatalf("stats: %v", st)
	}
	// Once Redis answers again, whatever the reserve did is released.
	testutil.WaitFor(t, "the fleet to be empty", func() bool {
		n, err := srv.Do("ZCARD", "bh:{cancel}:holds")
		st := pool.Stats()
		return err == nil && n == "0" && st.LocalHolds == 0 && st.ReleaseBacklog == 0
	})
	testutil.WaitFor(t, "an admission after the pause", func() bool {
		p, err := b.Acquire(context.Background(), req("after", 1))
		if err == nil {
			_ = p.Release(nil)
		}
		return err == nil
	})
}

// TestFleetTokensNeedABudget: a pool with a token budget on a bulkhead
// without one would hold no tokens at all; New refuses it.
func TestFleetTokensNeedABudget(t *testing.T) {
	_, client := fleetRedis(t)
	pool := newFleetPool(t, client, "nobudget", 4, 1000, fleet.FailClosed)
	_, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 4, Fleet: pool})
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Config.Fleet" {
		t.Fatalf("New: %v; want a ConfigError on Config.Fleet", err)
	}
	slotsOnly := newFleetPool(t, client, "slotsonly", 4, -1, fleet.FailClosed)
	b := newBulkhead(t, bulkhead.Config{MaxConcurrent: 4, Fleet: slotsOnly})
	_ = mustAcquire(t, b, req("a", 1)).Release(nil)
}

// TestFleetRollbackRefundsHeadroom checks that a call the fleet turns away
// after its grant gives back what it spent of the provider's headroom.
func TestFleetRollbackRefundsHeadroom(t *testing.T) {
	_, client := fleetRedis(t)
	other := newBulkhead(t, fleetConfig(newFleetPool(t, client, "headroom", -1, 100, fleet.FailClosed), 4))
	b := newBulkhead(t, fleetConfig(newFleetPool(t, client, "headroom", -1, 100, fleet.FailClosed), 4))
	theirs := mustAcquire(t, other, req("theirs", 59)) // 60 of the fleet's 100 tokens
	defer theirs.Release(nil)
	h := bulkhead.Headroom{Tokens: 1000, TokensReset: time.Hour, Requests: 10, RequestsReset: time.Hour}
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess, Headroom: &h}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(context.Background(), req("big", 49)) // 50 tokens: not beside theirs
	wantFleetReject(t, err, bulkhead.BudgetLimit, 1)
	if hr := b.Stats().Cooldown.Headroom["gpt-4o"]; hr.Tokens != 1000 || hr.Requests != 10 {
		t.Fatalf("headroom %+v after a rollback, want it all back", hr)
	}
	mustAcquire(t, b, req("small", 19)).Release(nil)
	if hr := b.Stats().Cooldown.Headroom["gpt-4o"]; hr.Tokens != 980 || hr.Requests != 9 {
		t.Fatalf("headroom %+v after an admission", hr)
	}
}

// TestFleetRefusalBypassedInObserveModeHoldsNothing checks an observe-mode
// Run that the fleet pool turns away after its local admission: it is
// bypassed after the rejection (a race bypass), and, like every bypassed
// call, holds nothing: its RunContext reports no borrowed resources, though
// its class had lent it a slot before the fleet's verdict.
func TestFleetRefusalBypassedInObserveModeHoldsNothing(t *testing.T) {
	_, client := fleetRedis(t)
	cfg := fleetConfig(newFleetPool(t, client, "observe", 0, -1, fleet.FailClosed), 4)
	cfg.Classes = &bulkhead.Classes{Default: "batch", Limits: map[string]bulkhead.ClassLimits{"batch": {}}}
	b := newBulkhead(t, cfg)
	var by *bulkhead.Bypass
	var res bulkhead.Resources
	_, err := bulkhead.Run(context.Background(), b, req("a", 9), func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
		by, res = rc.Bypass(), rc.Resources()
		return 0, nil
	}, bulkhead.WithMode(bulkhead.Observe))
	if err != nil || by == nil || by.Reason != bulkhead.ConcurrencyLimit || !by.Race || by.Detail.Constraint != bulkhead.ConstraintFleet {
		t.Fatalf("Run: %v, bypass %+v; want a race bypass for the fleet's concurrency limit", err, by)
	}
	if res != (bulkhead.Resources{}) {
		t.Fatalf("the bypassed call holds %+v, want nothing", res)
	}
}

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

func (errPanicCtx) Err() error { panic("broken ctx") }

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

// TestFleetRefusalSpendsNoInProcessRateTurn checks that the fleet pool comes
// before an in-process rate beside it: "a fleet refusal spends no rate
// turn". The old facade decided the rate after the reserve; the engine
// decided it at the grant, before the reserve, so a call the fleet turned
// away had spent its rate turn and the next call, at the same instant, was
// turned away RateLimit though no call used that turn.
func TestFleetRefusalSpendsNoInProcessRateTurn(t *testing.T) {
	_, client := fleetRedis(t)
	otherPool := newFleetPool(t, client, "turns", 1, -1, fleet.FailClosed)
	other := newBulkhead(t, fleetConfig(otherPool, 4))
	clk := clock.NewMock()
	cfg := fleetConfig(newFleetPool(t, client, "turns", 1, -1, fleet.FailClosed), 4)
	cfg.Clock = clk
	cfg.RateLimits = &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}
	b := newBulkhead(t, cfg)
	theirs := mustAcquire(t, other, req("theirs", 9)) // the fleet's one slot
	_, err := b.Acquire(context.Background(), req("refused", 9))
	wantFleetReject(t, err, bulkhead.ConcurrencyLimit, 1)
	_ = theirs.Release(nil)
	testutil.WaitFor(t, "the release to reach Redis", func() bool { return otherPool.Stats().LastView.Slots == 0 })
	p, err := b.Acquire(context.Background(), req("next", 9))
	if err != nil {
		t.Fatalf("the call after a fleet refusal, at the same instant: %v", err)
	}
	_ = p.Release(nil)
	// That one took the turn: the next, which the fleet lets through, is
	// turned away by the rate, and gives its fleet hold back.
	_, err = b.Acquire(context.Background(), req("third", 9))
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Fleet.Checked != 3 || st.Fleet.Admitted != 2 {
		t.Fatalf("stats %+v, fleet %+v", st.Gate, st.Fleet)
	}
}
