package fleet

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

// faultConfig is a Config for the fault tests: short leases and timeouts.
func faultConfig(client redis.UniversalClient) Config {
	cfg := testConfig(client)
	cfg.LeaseTTL, cfg.RenewEvery = time.Second, 200*time.Millisecond
	cfg.GenCheckEvery = 100 * time.Millisecond
	cfg.RelearnWindow = 450 * time.Millisecond
	cfg.CallTimeout = 200 * time.Millisecond
	cfg.BreakerCooldown = 50 * time.Millisecond
	return cfg
}

// TestKillRestart kills Redis (-9) while the fleet is full and restarts it
// empty. With a relearn window the replicas that knew the pool hold back
// until the running calls are registered again, so the fleet never runs
// more calls than its limit; without one it may, until they are.
func TestKillRestart(t *testing.T) {
	for _, relearn := range []time.Duration{450 * time.Millisecond, -1} {
		t.Run(fmt.Sprintf("RelearnWindow=%v", relearn), func(t *testing.T) {
			srv, client := startRedis(t)
			const limit = 6
			cfg := faultConfig(client)
			cfg.MaxConcurrent, cfg.TokenBudget, cfg.RelearnWindow = limit, -1, relearn
			pools := make([]*Pool, 3)
			for i := range pools {
				pools[i] = mustPool(t, cfg)
			}
			var running, maxRunning atomic.Int64
			enter := func() {
				n := running.Add(1)
				for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
				}
			}
			// Fill the fleet with long calls.
			n := 0
			for i := 0; i < limit; i++ {
				reserveOK(t, pools[i%3], idn(n), Hold{1, 0}, false)
				enter()
				n++
			}
			var seq atomic.Int64
			seq.Store(1000)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, p := range pools {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						case <-time.After(time.Millisecond): // paces the load
						}
						id := idn(int(seq.Add(1)))
						res, err := p.Reserve(bg, id, Hold{1, 0}, false)
						if err != nil {
							t.Errorf("reserve: %v", err)
							return
						}
						if res.Admitted {
							enter()
							running.Add(-1)
							p.Release(id)
						}
					}
				}()
			}
			srv.Stop()
			outage := time.After(300 * time.Millisecond) // the outage
			<-outage
			srv.Restart()
			// The live calls are registered again.
			poll(t, 3*time.Second, "holds reinstated", func() bool {
				var n uint64
				for _, p := range pools {
					n += p.Stats().Renews.Reinstated
				}
				return n >= limit
			})
			// Half the long calls end: there is room again.
			for i := 0; i < limit/2; i++ {
				pools[i%3].Release(idn(i))
				running.Add(-1)
			}
			poll(t, 3*time.Second, "admissions after the restart", func() bool {
				var a uint64
				for _, p := range pools {
					a += p.Stats().Reserves.Admitted
				}
				return a > limit+10
			})
			close(stop)
			wg.Wait()
			var reinstated, losses, relearning uint64
			for _, p := range pools {
				st := p.Stats()
				reinstated += st.Renews.Reinstated
				losses += st.StateLosses
				relearning += st.Reserves.Relearning
			}
			t.Logf("max running %d (limit %d); %d holds reinstated, %d state losses seen, %d reserves refused while relearning",
				maxRunning.Load(), limit, reinstated, losses, relearning)
			if reinstated < limit {
				t.Errorf("%d holds reinstated, want %d", reinstated, limit)
			}
			if relearn > 0 && maxRunning.Load() > limit {
				t.Errorf("%d calls ran at once, limit %d", maxRunning.Load(), limit)
			}
			for _, p := range pools {
				if err := p.Close(bg); err != nil {
					t.Fatal(err)
				}
			}
			if l := checkLedger(t, client, pools[0].st.keys); l.slots != 0 || len(l.holds) != 0 {
				t.Fatalf("ledger after Close: %d slots, %d holds", l.slots, len(l.holds))
			}
		})
	}
}

// TestFlushAll checks that a pool holding live holds notices FLUSHALL
// through its generation check, registers them again at once, and that its
// reserves are held back during the relearn window.
func TestFlushAll(t *testing.T) {
	srv, client := startRedis(t)
	cfg := faultConfig(client)
	cfg.LeaseTTL, cfg.RenewEvery = 5*time.Second, 4*time.Second // the check, not a renewal, must notice
	cfg.GenCheckEvery, cfg.RelearnWindow = 50*time.Millisecond, 400*time.Millisecond
	p := mustPool(t, cfg)
	reserveOK(t, p, idn(1), Hold{1, 100}, false)
	reserveOK(t, p, idn(2), Hold{1, 200}, false)
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wantReject(t, p, idn(3), Hold{1, 1}, false, Relearning)
	poll(t, 2*time.Second, "holds registered again", func() bool {
		l := checkLedger(t, client, p.st.keys)
		return l.slots == 2 && l.tokens == 300
	})
	if d := time.Since(start); d > cfg.RelearnWindow {
		t.Errorf("registered after %v", d)
	}
	poll(t, 2*time.Second, "the window's end", func() bool {
		res, err := p.Reserve(bg, idn(4), Hold{1, 1}, false)
		return err == nil && res.Admitted
	})
	if st := p.Stats(); st.StateLosses != 1 || st.Renews.Reinstated != 2 || st.Reserves.Relearning == 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestScriptFlush checks that every script is sent in full once the
// server's script cache has lost it.
func TestScriptFlush(t *testing.T) {
	srv, client := startRedis(t)
	cfg := faultConfig(client)
	cfg.AdjustMinInterval = -1
	p := mustPool(t, cfg)
	reserveOK(t, p, idn(1), Hold{1, 100}, false)
	before := p.Stats().Errors.Reserve.NoScript // a new server lacks the scripts too
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	reserveOK(t, p, idn(2), Hold{1, 100}, false)
	p.Adjust(idn(2), Hold{1, 50}, 1)
	p.Release(idn(1))
	poll(t, 2*time.Second, "release and adjust", func() bool {
		l := checkLedger(t, client, p.st.keys)
		return l.slots == 1 && l.tokens == 50
	})
	if st := p.Stats(); st.Errors.Reserve.NoScript != before+1 || st.Errors.Reserve.Other != 0 || st.Reserves.Error != 0 {
		t.Errorf("stats %+v", st.Errors)
	}
}

// TestSlowRedis pauses Redis longer than CallTimeout and checks that
// reserves get the policy's answer in about CallTimeout, that the breaker
// then answers without calling Redis, that goroutines do not pile up, and
// that the breaker closes once Redis answers, with clients that honour
// context deadlines and with clients that do not.
func TestSlowRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, ctxTimeout := range []bool{true, false} {
		t.Run("ContextTimeoutEnabled="+strconv.FormatBool(ctxTimeout), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 5 * time.Second,
				WriteTimeout: 5 * time.Second, ContextTimeoutEnabled: ctxTimeout})
			t.Cleanup(func() { client.Close() })
			cfg := faultConfig(client)
			cfg.CallTimeout, cfg.BreakerCooldown = 100*time.Millisecond, 200*time.Millisecond
			p := mustPool(t, cfg)
			reserveOK(t, p, idn(1), Hold{1, 1}, false)
			before := runtime.NumGoroutine()
			const pause = 1500 * time.Millisecond
			if _, err := srv.Do("CLIENT", "PAUSE", strconv.Itoa(int(pause/time.Millisecond)), "ALL"); err != nil {
				t.Fatal(err)
			}
			paused := time.Now()
			for i := 0; ; i++ {
				start := time.Now()
				res, err := p.Reserve(bg, idn(100+i), Hold{1, 1}, false)
				d := time.Since(start)
				if err != nil || res.Admitted || res.Reason != Unavailable || !errors.Is(res.Fallback, ErrUnavailable) {
					t.Fatalf("reserve %d: %+v, %v", i, res, err)
				}
				if p.Stats().BreakerOpen {
					break
				}
				if d < cfg.CallTimeout || d > 4*cfg.CallTimeout {
					t.Errorf("reserve %d took %v, CallTimeout %v", i, d, cfg.CallTimeout)
				}
				if !strings.Contains(res.Fallback.Error(), "did not answer within") || errors.Is(res.Fallback, context.DeadlineExceeded) {
					t.Errorf("reserve %d: fallback %v", i, res.Fallback)
				}
				if i > breakerErrors {
					t.Fatal("the breaker does not open")
				}
			}
			for i := 0; i < 50; i++ {
				start := time.Now()
				res, _ := p.Reserve(bg, idn(200+i), Hold{1, 1}, false)
				if d := time.Since(start); d > cfg.CallTimeout/2 && res.Fallback != nil && strings.Contains(res.Fallback.Error(), "breaker") {
					t.Errorf("a breaker answer took %v", d)
				}
				if res.Fallback != nil && strings.Contains(res.Fallback.Error(), "breaker") && !strings.Contains(res.Fallback.Error(), "did not answer within") {
					t.Errorf("a breaker answer does not wrap the last error: %v", res.Fallback)
				}
			}
			if n := runtime.NumGoroutine(); n > before+10 {
				t.Errorf("%d goroutines, %d before the pause", n, before)
			}
			poll(t, pause+2*time.Second, "Redis answering again", func() bool {
				res, err := p.Reserve(bg, idn(1000+int(time.Since(paused))), Hold{1, 1}, false)
				return err == nil && res.Admitted
			})
			if st := p.Stats(); st.BreakerOpen || st.Errors.Reserve.Timeout == 0 || st.ReleaseBacklog > 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestPoliciesUnderOutage stops Redis and checks what each failure policy
// does, then that the holds it admitted are registered once Redis is back.
func TestPoliciesUnderOutage(t *testing.T) {
	for _, policy := range []FailurePolicy{FailClosed, FailOpen, FailLocalShare} {
		t.Run(policy.String(), func(t *testing.T) {
			srv, client := startRedis(t)
			cfg := faultConfig(client)
			cfg.OnFailure, cfg.LocalShare = policy, Share{Slots: 3, Tokens: 1000}
			p := mustPool(t, cfg)
			reserveOK(t, p, idn(0), Hold{1, 100}, false)
			srv.Stop()
			var admitted, unavailable, slots int
			for i := 1; i <= 5; i++ {
				res, err := p.Reserve(bg, idn(i), Hold{1, 100}, false)
				if err != nil || !errors.Is(res.Fallback, ErrUnavailable) {
					t.Fatalf("reserve %d: %+v, %v", i, res, err)
				}
				switch {
				case res.Admitted && res.Unaccounted:
					admitted++
				case res.Reason == Unavailable:
					unavailable++
				case res.Reason == Slots:
					slots++
				default:
					t.Fatalf("reserve %d: %+v", i, res)
				}
			}
			st := p.Stats()
			switch policy {
			case FailClosed:
				if unavailable != 5 || st.PolicyRejections != 5 {
					t.Fatalf("closed: %d unavailable, stats %+v", unavailable, st)
				}
			case FailOpen:
				if admitted != 5 || st.Unaccounted != 5 || st.PolicyAdmissions != 5 {
					t.Fatalf("open: %d admitted, stats %+v", admitted, st)
				}
			case FailLocalShare:
				// One hold from before the outage, two more fit the share.
				if admitted != 2 || slots != 3 || st.Unaccounted != 2 {
					t.Fatalf("local share: %d admitted, %d over the share, stats %+v", admitted, slots, st)
				}
				p.Release(idn(1))
				res, _ := p.Reserve(bg, idn(9), Hold{1, 100}, false)
				if !res.Admitted {
					t.Fatalf("after a release: %+v", res)
				}
				admitted++
			}
			srv.Restart()
			poll(t, 3*time.Second, "unaccounted holds registered", func() bool {
				l, err := snapshotLedger(client, p.st.keys)
				return err == nil && p.Stats().Unaccounted == 0 && len(l.holds) >= 1+admitted-boolInt(policy == FailLocalShare)
			})
			l := checkLedger(t, client, p.st.keys)
			if policy == FailOpen && l.tokens != 600 {
				t.Errorf("open: %d tokens registered, want 600", l.tokens)
			}
			// Close in an outage gives up at its context's end.
			srv.Stop()
			ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
			defer cancel()
			if err := p.Close(ctx); err == nil || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Close in an outage: %v", err)
			}
		})
	}
}

// TestLocalShareCountsCallsFromBeforeTheOutage fills the fleet (8 slots,
// 8,000 tokens) from four replicas whose local shares (2 slots, 2,000
// tokens each) add up to the limits, unevenly: a holds 4 calls, b 2, c
// and d 1 each. Redis goes away. Each replica counts the calls it runs
// against its share, so a admits nothing until it is under its share
// again, while c and d fill theirs: the fleet then runs what every
// replica ran beyond its share when Redis went away, on top of the
// shares (10 calls), and no more; it is back within its limits once the
// calls from before the outage end.
func TestLocalShareCountsCallsFromBeforeTheOutage(t *testing.T) {
	srv, client := startRedis(t)
	cfg := faultConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget = 8, 8000
	cfg.OnFailure, cfg.LocalShare = FailLocalShare, Share{Slots: 2, Tokens: 2000}
	cfg.Clock = clock.NewMock() // the breaker, once open, stays open
	a, b, c, d := mustPool(t, cfg), mustPool(t, cfg), mustPool(t, cfg), mustPool(t, cfg)
	var fleet fleetCalls
	h := Hold{1, 1000}
	for i, p := range []*Pool{a, a, a, a, b, b, c, d} {
		if res := fleet.admit(t, p, idn(i), h); !res.Admitted || res.Fallback != nil {
			t.Fatalf("before the outage: %+v", res)
		}
	}
	srv.Stop()
	admit := func(p *Pool, n int, h Hold, want Reason) {
		t.Helper()
		res := fleet.admit(t, p, idn(n), h)
		if res.Fallback == nil || res.Admitted != (want == NoReason) || res.Reason != want {
			t.Fatalf("reserve %d in the outage: %+v; want reason %q", n, res, want)
		}
	}
	admit(a, 100, h, Slots) // 4 of 2 slots
	admit(a, 101, Hold{0, 100}, Slots)
	admit(b, 102, h, Slots)
	admit(c, 103, h, NoReason)
	admit(c, 104, h, Slots)
	admit(d, 105, h, NoReason)
	if fleet.slots != 10 || fleet.tokens != 10_000 {
		t.Fatalf("the fleet runs %d calls and %d tokens", fleet.slots, fleet.tokens)
	}
	// a's calls from before the outage end: it is under its share again.
	for i := 0; i < 3; i++ {
		fleet.end(a, idn(i), h)
	}
	admit(a, 106, h, NoReason)
	admit(a, 107, Hold{0, 500}, Tokens)
	admit(a, 108, h, Slots)
	if fleet.slots != cfg.MaxConcurrent || fleet.tokens != cfg.TokenBudget || fleet.maxSlots != 10 {
		t.Fatalf("the fleet runs %d calls and %d tokens (at most %d calls)", fleet.slots, fleet.tokens, fleet.maxSlots)
	}
	// Close gives up on the releases at its context's end (the mock clock
	// schedules no retry).
	for _, p := range []*Pool{a, b, c, d} {
		ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
		p.Close(ctx)
		cancel()
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDebugSleep blocks the whole server (DEBUG SLEEP: no command of any
// client runs) and checks that a reserve gets the policy's answer in about
// CallTimeout, and that the pool works again once the server wakes.
func TestDebugSleep(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	client := newClient(t, srv.Addr())
	cfg := faultConfig(client)
	cfg.CallTimeout = 100 * time.Millisecond
	p := mustPool(t, cfg)
	reserveOK(t, p, idn(1), Hold{1, 1}, false)
	slept := make(chan error, 1)
	go func() {
		_, err := srv.Do("DEBUG", "SLEEP", "1")
		slept <- err
	}()
	poll(t, 2*time.Second, "the server to block", func() bool {
		start := time.Now()
		res, err := p.Reserve(bg, idn(2), Hold{1, 1}, false)
		d := time.Since(start)
		if err != nil {
			t.Fatalf("reserve: %v", err)
		}
		if res.Reason != Unavailable {
			p.Release(idn(2))
			return false // not asleep yet
		}
		if d > 4*cfg.CallTimeout || !errors.Is(res.Fallback, ErrUnavailable) {
			t.Fatalf("reserve against a sleeping server: %+v after %v", res, d)
		}
		return true
	})
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	poll(t, 3*time.Second, "Redis answering again", func() bool {
		res, err := p.Reserve(bg, idn(3), Hold{1, 1}, false)
		return err == nil && res.Admitted
	})
}
