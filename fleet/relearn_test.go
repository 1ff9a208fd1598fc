package fleet

import (
	"log/slog"
	"math/rand/v2"
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

// fleetLoad runs workers on replicas of one pool. Each worker reserves
// holds one after another and runs every admitted call: a short one, or
// now and then a long one that outlives the faults the test injects. At
// every admission it checks the calls running across the fleet, and the
// fleet-wide state the reserve saw, against the pool's limits.
type fleetLoad struct {
	t             *testing.T
	slots, tokens int64         // the pool's limits
	long          time.Duration // a long call's duration

	running, runningTokens atomic.Int64 // calls admitted and not ended
	maxRunning, maxTokens  atomic.Int64
	admitted, overView     atomic.Int64
	ids                    atomic.Int64
	stop                   chan struct{}
	stopOnce               sync.Once
	wg                     sync.WaitGroup
}

func newFleetLoad(t *testing.T, slots, tokens int64, long time.Duration) *fleetLoad {
	return &fleetLoad{t: t, slots: slots, tokens: tokens, long: long, stop: make(chan struct{})}
}

// start runs workers on p, stopped when the test ends if not before (and
// before p is closed).
func (l *fleetLoad) start(p *Pool, workers int) {
	l.t.Cleanup(l.halt)
	for w := 0; w < workers; w++ {
		rng := rand.New(rand.NewPCG(uint64(l.ids.Add(1)), uint64(w)))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.worker(p, rng)
		}()
	}
}

// wait waits for d of real time, or less when the load stops.
func (l *fleetLoad) wait(d time.Duration) bool {
	select {
	case <-time.After(d): // the calls and the load run on real time
		return true
	case <-l.stop:
		return false
	}
}

func (l *fleetLoad) worker(p *Pool, rng *rand.Rand) {
	for l.wait(time.Millisecond) { // paces the load
		id := idn(int(l.ids.Add(1)) + 1_000_000)
		h := Hold{1, 100 + rng.Int64N(900)}
		res, err := p.Reserve(bg, id, h, false)
		if err != nil {
			l.t.Errorf("reserve: %v", err)
			return
		}
		if !res.Admitted {
			continue
		}
		if res.Fallback == nil && (res.View.Slots > l.slots || res.View.Tokens > l.tokens) {
			l.overView.Add(1)
			l.t.Errorf("the reserve saw the fleet over its limits: %+v", res.View)
		}
		l.admitted.Add(1)
		n, tk := l.running.Add(1), l.runningTokens.Add(h.Tokens)
		for m := l.maxRunning.Load(); n > m && !l.maxRunning.CompareAndSwap(m, n); m = l.maxRunning.Load() {
		}
		for m := l.maxTokens.Load(); tk > m && !l.maxTokens.CompareAndSwap(m, tk); m = l.maxTokens.Load() {
		}
		if n > l.slots || tk > l.tokens {
			l.t.Logf("over the limits at %v: %d calls, %d tokens; the reserve saw %+v; the replica's stats %+v",
				time.Now().Format("15:04:05.000"), n, tk, res.View, p.Stats())
		}
		d := time.Duration(1+rng.IntN(20)) * time.Millisecond
		if rng.IntN(3) == 0 {
			d = l.long
		}
		l.wait(d)
		l.running.Add(-1)
		l.runningTokens.Add(-h.Tokens)
		p.Release(id)
	}
}

// halt stops the load and waits for its workers.
func (l *fleetLoad) halt() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// end stops the load and checks that the fleet never ran more calls, nor
// more tokens, than its limits.
func (l *fleetLoad) end() {
	l.t.Helper()
	l.halt()
	l.t.Logf("%d admissions; at most %d calls and %d tokens running (limits %d and %d)",
		l.admitted.Load(), l.maxRunning.Load(), l.maxTokens.Load(), l.slots, l.tokens)
	if l.maxRunning.Load() > l.slots || l.maxTokens.Load() > l.tokens {
		l.t.Errorf("the fleet ran %d calls and %d tokens at once, limits %d and %d",
			l.maxRunning.Load(), l.maxTokens.Load(), l.slots, l.tokens)
	}
	if n := l.overView.Load(); n > 0 {
		l.t.Errorf("%d reserves saw the fleet over its limits", n)
	}
}

// waitAdmitted waits until the load has admitted n calls in all.
func (l *fleetLoad) waitAdmitted(n int64, d time.Duration, pools []*Pool) {
	l.t.Helper()
	deadline := time.Now().Add(d)
	for l.admitted.Load() < n {
		if time.Now().After(deadline) {
			for i, p := range pools {
				l.t.Logf("replica %d: %+v", i, p.Stats())
			}
			l.t.Fatalf("%d admissions after %v, want %d", l.admitted.Load(), d, n)
		}
		time.Sleep(time.Millisecond) // the load runs on real time
	}
}

// loadConfig is the Config of the replicas under load: short leases, and
// call timeouts and a relearn window long enough for a loaded machine
// running the race detector (a replica must register its running calls
// again within the window).
func loadConfig(client redis.UniversalClient) Config {
	cfg := faultConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget = 8, 4000
	cfg.CallTimeout, cfg.RelearnWindow = 500*time.Millisecond, time.Second
	return cfg
}

// TestRestoreOlderSnapshot takes an RDB snapshot of Redis under load from
// four replicas, lets the load go on past the lease TTL, then brings Redis
// back with that older state: killed and restarted from the snapshot, or
// reloaded from it in place. The restored holds' leases have run out and
// the calls admitted since are missing, while most long calls still run.
// The fleet must never run more calls or tokens than its limits.
func TestRestoreOlderSnapshot(t *testing.T) {
	for _, how := range []string{"restart", "reload"} {
		t.Run(how, func(t *testing.T) {
			srv := redistest.Start(t, "--enable-debug-command", "yes")
			client := newClient(t, srv.Addr())
			cfg := loadConfig(client)
			l := newFleetLoad(t, cfg.MaxConcurrent, cfg.TokenBudget, 2500*time.Millisecond)
			pools := make([]*Pool, 4)
			for i := range pools {
				pools[i] = mustPool(t, cfg)
				l.start(pools[i], 4)
			}
			l.waitAdmitted(16, 10*time.Second, pools)
			if _, err := srv.Do("SAVE"); err != nil {
				t.Fatal(err)
			}
			l.wait(cfg.LeaseTTL + cfg.LeaseTTL/5) // the snapshot's leases run out
			switch how {
			case "restart":
				t.Logf("restarting from the snapshot at %v", time.Now().Format("15:04:05.000"))
				srv.Stop()
				l.wait(200 * time.Millisecond) // the outage
				srv.Restart()                  // from the snapshot
			case "reload":
				t.Logf("reloading the snapshot at %v", time.Now().Format("15:04:05.000"))
				if _, err := srv.Do("DEBUG", "RELOAD", "NOSAVE"); err != nil {
					t.Fatal(err)
				}
			}
			n := l.admitted.Load()
			l.waitAdmitted(n+40, 10*time.Second, pools) // admissions go on
			l.wait(time.Second)
			l.end()
			var losses uint64
			for _, p := range pools {
				losses += p.Stats().StateLosses
			}
			if losses == 0 {
				t.Errorf("no replica saw the state rewound")
			}
			closeAll(t, client, pools)
		})
	}
}

// TestFlushAllIdleReplica flushes Redis while three replicas keep the fleet
// full of long calls, and a fourth replica that never reserved before
// starts reserving at once: it must be held back too, until the running
// calls are registered again.
func TestFlushAllIdleReplica(t *testing.T) {
	srv, client := startRedis(t)
	cfg := loadConfig(client)
	l := newFleetLoad(t, cfg.MaxConcurrent, cfg.TokenBudget, 1500*time.Millisecond)
	pools := make([]*Pool, 4)
	for i := range pools {
		pools[i] = mustPool(t, cfg)
	}
	for _, p := range pools[:3] {
		l.start(p, 4)
	}
	l.waitAdmitted(16, 10*time.Second, pools)
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	l.start(pools[3], 8) // the idle replica
	n := l.admitted.Load()
	l.waitAdmitted(n+40, 10*time.Second, pools)
	l.end()
	if st := pools[3].Stats(); st.Reserves.Relearning == 0 {
		t.Errorf("the idle replica was not held back: %+v", st.Reserves)
	}
	closeAll(t, client, pools)
}

// closeAll closes the pools and checks the ledger they leave.
func closeAll(t *testing.T, client redis.UniversalClient, pools []*Pool) {
	t.Helper()
	for _, p := range pools {
		if err := p.Close(bg); err != nil {
			t.Fatal(err)
		}
	}
	checkLedger(t, client, pools[0].st.keys)
}

// TestPausedReplica pauses a replica past its lease TTL while its calls
// run (its clock moves on while none of its Redis calls get through): the
// other replica reclaims its holds and fills the slots, which leases
// cannot prevent. Once the paused replica runs again it must refuse new
// holds, without asking Redis, until it has registered its live ones
// again; then Redis counts them, over the limit, and admits nothing new.
func TestPausedReplica(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget = 2, -1
	cfg.RelearnWindow = -1 // the pool's generation plays no part here
	clk := clock.NewMock()
	cfg.Clock = clk
	var now atomic.Int64
	now.Store(t0)
	var gate sync.RWMutex // write-locked: the paused replica's scripts wait
	paused := hookedPool(t, cfg, func() int64 {
		gate.RLock()
		defer gate.RUnlock()
		return now.Load()
	})
	other := hookedPool(t, cfg, now.Load)

	reserveOK(t, paused, idn(1), Hold{1, 10}, false)
	reserveOK(t, paused, idn(2), Hold{1, 10}, false)
	// The pause: past the lease, the other replica reclaims both holds.
	now.Add(cfg.LeaseTTL.Microseconds())
	reserveOK(t, other, idn(3), Hold{1, 10}, false)
	reserveOK(t, other, idn(4), Hold{1, 10}, false)
	other.Release(idn(3))
	poll(t, 5*time.Second, "the release", func() bool { return checkLedger(t, client, paused.st.keys).slots == 1 })

	// The paused replica resumes: its clock has moved past its leases, and
	// its renewal is on its way to Redis but not there yet.
	gate.Lock()
	clk.Add(cfg.LeaseTTL)
	got := make(chan Result, 1)
	go func() {
		res, err := paused.Reserve(bg, idn(5), Hold{1, 10}, false)
		if err != nil {
			t.Error(err)
		}
		got <- res
	}()
	var res Result
	select {
	case res = <-got:
	case <-time.After(2 * time.Second): // it is waiting for Redis
		gate.Unlock()
		res = <-got
		t.Fatalf("the reserve went to Redis before the live holds were registered again: %+v", res)
	}
	gate.Unlock()
	if res.Admitted || res.Reason != Relearning || res.Fallback != nil {
		t.Fatalf("reserve after the pause: %+v; want Relearning", res)
	}
	poll(t, 5*time.Second, "the live holds registered again", func() bool {
		return paused.Stats().Renews.Reinstated == 2
	})
	if l := checkLedger(t, client, paused.st.keys); l.slots != 3 {
		t.Fatalf("%d slots held, want 3: the two registered again, over the limit, and the other replica's", l.slots)
	}
	wantReject(t, paused, idn(6), Hold{1, 10}, false, Slots)
	other.Release(idn(4))
	paused.Release(idn(1))
	poll(t, 5*time.Second, "the releases", func() bool { return checkLedger(t, client, paused.st.keys).slots == 1 })
	reserveOK(t, paused, idn(7), Hold{1, 10}, false)
}

// TestNewPoolRelearns checks the cost of the relearn window on a pool's
// first use: Redis cannot tell a new pool from one whose state it lost, so
// nothing is admitted for the first RelearnWindow, unless a pool handle
// with no window created the pool.
func TestNewPoolRelearns(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.RelearnWindow = 300 * time.Millisecond
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(bg)
	start := time.Now()
	wantReject(t, p, idn(1), Hold{1, 1}, false, Relearning)
	poll(t, 5*time.Second, "the end of the first window", func() bool {
		res, err := p.Reserve(bg, idn(1), Hold{1, 1}, false)
		return err == nil && res.Admitted
	})
	if d := time.Since(start); d < cfg.RelearnWindow {
		t.Errorf("admitted %v after the first reserve, window %v", d, cfg.RelearnWindow)
	}

	created := testConfig(client) // another pool, created with no window
	created.RelearnWindow = -1
	first, err := New(created)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(bg)
	reserveOK(t, first, idn(2), Hold{1, 1}, false)
	created.RelearnWindow = cfg.RelearnWindow
	other, err := New(created)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(bg)
	reserveOK(t, other, idn(3), Hold{1, 1}, false)
}

// TestLapseDuringOutage checks which outcome a replica whose leases ran out
// during a Redis outage gets: while the breaker is open the failure policy
// decides (FailOpen admits without a hold, as during any outage); once
// its live holds are registered again it reserves in Redis as before.
func TestLapseDuringOutage(t *testing.T) {
	srv, client := startRedis(t)
	cfg := faultConfig(client)
	cfg.OnFailure = FailOpen
	clk := clock.NewMock()
	cfg.Clock = clk
	p := mustPool(t, cfg)
	reserveOK(t, p, idn(1), Hold{1, 10}, false)
	srv.Stop()
	openBreaker(t, p)
	clk.Add(cfg.LeaseTTL) // the renewals fail meanwhile
	res, err := p.Reserve(bg, idn(2), Hold{1, 10}, false)
	if err != nil || !res.Admitted || !res.Unaccounted || res.Fallback == nil {
		t.Fatalf("reserve with lapsed leases during the outage: %+v, %v; want the policy's admission", res, err)
	}
	if st := p.Stats(); st.Lapses != 1 {
		t.Fatalf("%d lapses", st.Lapses)
	}
	srv.Restart()
	poll(t, 5*time.Second, "the live holds registered again", func() bool {
		clk.Add(cfg.BreakerCooldown) // the renewer's next attempt
		st := p.Stats()
		return st.Unaccounted == 0 && !st.BreakerOpen && st.Renews.Reinstated >= 2
	})
	// Redis decides again (it restarted empty: its new generation's window
	// may still be on).
	res, err = p.Reserve(bg, idn(3), Hold{1, 10}, false)
	if err != nil || res.Fallback != nil || res.View.Gen == "" {
		t.Fatalf("after the outage: %+v, %v; want Redis's answer", res, err)
	}
	if st := p.Stats(); st.Lapses != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// fleetCalls counts the calls running across the replicas of a test that
// runs them one at a time, and the most that ran at once.
type fleetCalls struct {
	slots, tokens       int64
	maxSlots, maxTokens int64
}

// admit reserves h for id on p and, when admitted, runs it as a call.
func (c *fleetCalls) admit(t *testing.T, p *Pool, id ID, h Hold) Result {
	t.Helper()
	res, err := p.Reserve(bg, id, h, false)
	if err != nil {
		t.Fatalf("reserve %v: %v", id, err)
	}
	if res.Admitted {
		c.slots, c.tokens = c.slots+h.Slots, c.tokens+h.Tokens
		c.maxSlots, c.maxTokens = max(c.maxSlots, c.slots), max(c.maxTokens, c.tokens)
	}
	return res
}

// end ends the call of id, admitted on p with h.
func (c *fleetCalls) end(p *Pool, id ID, h Hold) {
	c.slots, c.tokens = c.slots-h.Slots, c.tokens-h.Tokens
	p.Release(id)
}

// TestRestartFromSnapshotReachedFirstByBehindReplica restarts Redis from
// an RDB snapshot young enough that no lease in it has run out, and lets
// the first calls after the restart come from a replica that has not
// called the pool since the snapshot was taken (see restartFromSnapshot).
func TestRestartFromSnapshotReachedFirstByBehindReplica(t *testing.T) {
	srv := redistest.Start(t)
	clients := func() redis.UniversalClient { return newClient(t, srv.Addr()) }
	restartFromSnapshot(t, testConfig(clients()), clients, srv, srv.Restart)
}

// restartFromSnapshot runs two replicas, a and b, on cfg's pool, which
// lives in the Redis server srv; a uses cfg.Client, b a client newClient
// returns. Both take holds, srv
// saves an RDB snapshot, a takes more holds, and restart brings srv back
// from the snapshot, 1.5 s later: no lease in it has run out (they last
// 3 s). The first calls after the restart come from b, which has not
// called the pool since the snapshot was taken: b saw none of the writes
// the restart lost, and the state it finds is newer than anything it saw.
// The pool must still start a relearn window before anyone admits against
// the rewound sums: b's burst is held back, a registers its running calls
// again, and the fleet never runs more calls or tokens than its limits.
func restartFromSnapshot(t *testing.T, cfg Config, newClient func() redis.UniversalClient, srv *redistest.Server, restart func()) {
	cfg.MaxConcurrent, cfg.TokenBudget, cfg.LeaseTTL = 8, 8000, 3*time.Second
	cfg.RenewEvery = 2 * time.Second // the generation check, every second, notices first
	clk := clock.NewMock()
	cfg.Clock = clk
	var now atomic.Int64 // the scripts' time, µs
	now.Store(t0)
	a := hookedPool(t, cfg, now.Load)
	cfg.Client = newClient() // each replica its own client
	b := hookedPool(t, cfg, now.Load)

	var fleet fleetCalls
	h := Hold{1, 1000}
	for i, p := range []*Pool{a, a, b, b} {
		if res := fleet.admit(t, p, idn(i), h); !res.Admitted {
			t.Fatalf("before the snapshot: %+v", res)
		}
	}
	now.Add(1000)
	if _, err := srv.Do("SAVE"); err != nil {
		t.Fatal(err)
	}
	now.Add(500_000)
	for i := 0; i < 4; i++ { // lost with the restart
		if res := fleet.admit(t, a, idn(100+i), h); !res.Admitted {
			t.Fatalf("after the snapshot: %+v", res)
		}
	}
	now.Add(1_000_000) // the snapshot is 1.5 s old: none of its leases ran out
	restart()

	// b's burst reaches the restarted Redis first.
	var relearning int
	var gen string
	for i := 0; i < 8; i++ {
		res := fleet.admit(t, b, idn(200+i), h)
		if res.Admitted && (fleet.slots > cfg.MaxConcurrent || fleet.tokens > cfg.TokenBudget) {
			t.Errorf("b's reserve %d admitted: %d calls and %d tokens run, limits %d and %d; it saw %+v",
				i, fleet.slots, fleet.tokens, cfg.MaxConcurrent, cfg.TokenBudget, res.View)
		}
		if res.Reason == Relearning {
			relearning++
			gen = res.View.Gen
		}
	}
	if relearning == 0 {
		t.Fatalf("b's burst was not held back: %+v", b.Stats())
	}
	// a notices the new generation at its next check, and registers its
	// running calls again.
	clk.Add(a.s.GenCheckEvery)
	poll(t, 5*time.Second, "a's calls registered again", func() bool { return a.Stats().Renews.Reinstated == 4 })
	if l := checkLedger(t, a.st.client, a.st.keys); l.slots != fleet.slots || l.tokens != fleet.tokens {
		t.Fatalf("the pool holds %d slots and %d tokens, the fleet runs %d and %d", l.slots, l.tokens, fleet.slots, fleet.tokens)
	}
	// After the window the pool is full, until a call ends.
	g, err := strconv.ParseInt(gen, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	now.Store(g)
	if res := fleet.admit(t, b, idn(300), h); res.Admitted || res.Reason != Slots {
		t.Fatalf("after the window: %+v", res)
	}
	fleet.end(a, idn(100), h)
	poll(t, 5*time.Second, "the release", func() bool { return checkLedger(t, a.st.client, a.st.keys).slots == 7 })
	if res := fleet.admit(t, b, idn(301), h); !res.Admitted {
		t.Fatalf("after a release: %+v", res)
	}
	if fleet.maxSlots > cfg.MaxConcurrent || fleet.maxTokens > cfg.TokenBudget {
		t.Errorf("the fleet ran %d calls and %d tokens at once, limits %d and %d",
			fleet.maxSlots, fleet.maxTokens, cfg.MaxConcurrent, cfg.TokenBudget)
	}
	for name, p := range map[string]*Pool{"a": a, "b": b} {
		if st := p.Stats(); st.StateLosses != 1 {
			t.Errorf("replica %s saw %d state losses, want 1", name, st.StateLosses)
		}
	}
}

// lockedBuffer is a log destination the pool's goroutines and the test
// share.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestScriptsWithoutInfo runs a pool as a Redis user whose ACL denies
// INFO: the scripts cannot read which server they run on, so they cannot
// tell a restarted or replaced server by it. They must work all the same,
// record that in the pool's state, and the replicas must warn about it.
func TestScriptsWithoutInfo(t *testing.T) {
	srv, admin := startRedis(t)
	if _, err := admin.Do(bg, "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info").Result(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "secret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	if err := client.Info(bg, "server").Err(); err == nil {
		t.Fatal("the user may call INFO")
	}
	cfg := testConfig(client)
	clk := clock.NewMock()
	var logs lockedBuffer
	cfg.Clock, cfg.Logger = clk, slog.New(slog.NewTextHandler(&logs, nil))
	var now atomic.Int64
	now.Store(t0)
	p := hookedPool(t, cfg, now.Load)
	reserveOK(t, p, idn(1), Hold{1, 10}, false)
	now.Add(10 * serverCheckGap)
	reserveOK(t, p, idn(2), Hold{1, 10}, false)
	if v, err := admin.HGet(bg, p.st.keys[2], "srv").Result(); err != nil || v != "" {
		t.Fatalf("the state records server %q (%v), want \"\"", v, err)
	}
	clk.Add(p.s.GenCheckEvery)
	poll(t, 5*time.Second, "the warning", func() bool { return strings.Contains(logs.String(), "may not call INFO") })
	if e := p.Stats().Errors; e != (ErrorStats{Reserve: ErrorKinds{NoScript: 1}}) {
		t.Fatalf("errors %+v", e)
	}
}
