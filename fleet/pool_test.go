package fleet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

func TestConfigValidation(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	ok := Config{Client: client, Pool: "p", MaxConcurrent: -1, TokenBudget: -1}
	cases := []struct {
		field string
		edit  func(*Config)
	}{
		{"Config.Client", func(c *Config) { c.Client = nil }},
		{"Config.Pool", func(c *Config) { c.Pool = "" }},
		{"Config.Pool", func(c *Config) { c.Pool = "a{b" }},
		{"Config.Prefix", func(c *Config) { c.Prefix = "x}" }},
		{"Config.MaxConcurrent", func(c *Config) { c.MaxConcurrent = -2 }},
		{"Config.TokenBudget", func(c *Config) { c.TokenBudget = 1 << 60 }},
		{"Config.HighPriorityReserve", func(c *Config) { c.TokenBudget, c.HighPriorityReserve = 10, 11 }},
		{"Config.HighPriorityReserve", func(c *Config) { c.HighPriorityReserve = -1 }},
		{"Config.LeaseTTL", func(c *Config) { c.LeaseTTL = -time.Second }},
		{"Config.LeaseTTL", func(c *Config) { c.LeaseTTL = time.Microsecond }},
		{"Config.RenewEvery", func(c *Config) { c.RenewEvery = 30 * time.Second }},
		{"Config.RenewBatch", func(c *Config) { c.RenewBatch = -1 }},
		{"Config.ReclaimBatch", func(c *Config) { c.ReclaimBatch = maxBatch + 1 }},
		{"Config.CallTimeout", func(c *Config) { c.CallTimeout = -1 }},
		{"Config.OnFailure", func(c *Config) { c.OnFailure = 9 }},
		{"Config.LocalShare", func(c *Config) { c.LocalShare.Tokens = -1 }},
	}
	for _, c := range cases {
		cfg := ok
		c.edit(&cfg)
		_, err := New(cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, admission.ErrInvalid) {
			t.Errorf("%s: error %v", c.field, err)
		}
	}
	p, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetLimits(1, 10, 20); err == nil || !errors.Is(err, admission.ErrInvalid) {
		t.Errorf("SetLimits reserve above budget: %v", err)
	}
	if _, err := p.Reserve(bg, idn(1), Hold{2, 0}, false); !errors.Is(err, admission.ErrInvalid) {
		t.Errorf("Slots 2: %v", err)
	}
	if _, err := p.Reserve(bg, ID{}, Hold{1, 0}, false); !errors.Is(err, admission.ErrInvalid) {
		t.Errorf("zero ID: %v", err)
	}
	if err := p.Close(bg); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(bg); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := p.Reserve(bg, idn(1), Hold{1, 0}, false); err != ErrClosed {
		t.Errorf("Reserve after Close: %v", err)
	}
	if err := p.SetLimits(1, 1, 0); err != ErrClosed {
		t.Errorf("SetLimits after Close: %v", err)
	}
	p.Release(idn(1)) // no-op
	p.Adjust(idn(1), Hold{1, 1}, 1)
}

func TestNames(t *testing.T) {
	if FailClosed.String() != "closed" || FailOpen.String() != "open" || FailLocalShare.String() != "local_share" || FailurePolicy(7).String() != "FailurePolicy(7)" {
		t.Error("FailurePolicy names")
	}
	want := []string{"", "slots", "tokens", "relearning", "released", "unavailable"}
	for i, w := range want {
		if Reason(i).String() != w {
			t.Errorf("Reason(%d) = %q", i, Reason(i).String())
		}
	}
	if Reason(99).String() != "Reason(99)" {
		t.Error(Reason(99).String())
	}
	id := ID{0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x41, 0xd2, 0x88, 0x3f, 0x00, 0x16, 0xd3, 0xcc, 0xa4, 0x27}
	if id.String() != "1b4e28ba-2fa1-41d2-883f-0016d3cca427" {
		t.Error(id.String())
	}
}

// reserveOK reserves and fails the test unless the result is admitted as
// wanted.
func reserveOK(t *testing.T, p *Pool, id ID, h Hold, high bool) Result {
	t.Helper()
	res, err := p.Reserve(bg, id, h, high)
	if err != nil || !res.Admitted || res.Fallback != nil {
		t.Fatalf("reserve %v: %+v, %v", id, res, err)
	}
	return res
}

func wantReject(t *testing.T, p *Pool, id ID, h Hold, high bool, why Reason) Result {
	t.Helper()
	res, err := p.Reserve(bg, id, h, high)
	if err != nil || res.Admitted || res.Reason != why {
		t.Fatalf("reserve %v: %+v, %v; want rejected %v", id, res, err, why)
	}
	return res
}

func TestPoolReserveRelease(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget, cfg.HighPriorityReserve = 3, 1000, 200
	p := mustPool(t, cfg)

	res := reserveOK(t, p, idn(1), Hold{1, 500}, false)
	if res.Duplicate || res.View.Slots != 1 || res.View.Tokens != 500 || res.View.MaxConcurrent != 3 || res.View.TokenBudget != 800 || res.View.Gen == "" {
		t.Fatalf("first reserve: %+v", res)
	}
	if res := reserveOK(t, p, idn(1), Hold{1, 500}, false); !res.Duplicate || res.View.Tokens != 500 {
		t.Fatalf("duplicate: %+v", res)
	}
	wantReject(t, p, idn(2), Hold{1, 400}, false, Tokens)
	if res := reserveOK(t, p, idn(2), Hold{1, 400}, true); res.View.TokenBudget != 1000 {
		t.Fatalf("high: %+v", res)
	}
	wantReject(t, p, idn(3), Hold{1, 0}, false, Tokens) // 900 > 800 for normal priority
	reserveOK(t, p, idn(3), Hold{1, 0}, true)
	wantReject(t, p, idn(4), Hold{1, 0}, true, Slots)

	st := p.Stats()
	if st.Reserves.Admitted != 3 || st.Reserves.Duplicate != 1 || st.Reserves.RejectedTokens != 2 || st.Reserves.RejectedSlots != 1 ||
		st.LocalHolds != 3 || st.LocalTokens != 900 || st.LastView.Slots != 3 {
		t.Fatalf("stats %+v", st)
	}

	p.Release(idn(1))
	p.Release(idn(1))
	p.Release(idn(9))
	poll(t, 5*time.Second, "the release", func() bool { return checkLedger(t, client, p.st.keys).tokens == 400 })
	wantReject(t, p, idn(1), Hold{1, 1}, false, Released)
	if err := p.SetLimits(-1, -1, 0); err != nil {
		t.Fatal(err)
	}
	reserveOK(t, p, idn(5), Hold{1, 1 << 40}, false)
	if err := p.Close(bg); err != nil {
		t.Fatal(err)
	}
	if l := checkLedger(t, client, p.st.keys); len(l.holds) != 0 || l.slots != 0 || l.tokens != 0 {
		t.Fatalf("after Close: %+v", l)
	}
	if st := p.Stats(); st.LocalHolds != 0 || st.ReleaseBacklog != 0 {
		t.Fatalf("stats after Close %+v", st)
	}
}

// TestPoolAdjust checks that adjustments reach Redis, coalesced per hold
// within AdjustMinInterval except for overruns.
func TestPoolAdjust(t *testing.T) {
	_, client := startRedis(t)
	clk := clock.NewMock()
	cfg := testConfig(client)
	cfg.Clock = clk
	cfg.RenewEvery = 2 * time.Second // no renewal carries the values first
	p := mustPool(t, cfg)
	reserveOK(t, p, idn(1), Hold{1, 500}, false)
	val := func() string { return client.HGet(bg, p.st.keys[1], idn(1).String()).Val() }
	waitVal := func(want string) {
		t.Helper()
		poll(t, 5*time.Second, "vals "+want, func() bool { return val() == want })
		checkLedger(t, client, p.st.keys)
	}

	p.Adjust(idn(1), Hold{1, 400}, 1) // the first goes at once
	waitVal("1 400 1")
	// Redis has it before the pool has its reply: until then, the next
	// adjustments wait behind it and would be coalesced with it.
	poll(t, 5*time.Second, "the first adjustment's reply", func() bool { return p.Stats().Adjusts.Applied == 1 })
	p.Adjust(idn(1), Hold{1, 300}, 2) // a refund within the interval waits
	p.Adjust(idn(1), Hold{1, 200}, 3) // and is coalesced with this one
	p.Adjust(idn(1), Hold{1, 900}, 2) // stale: ignored
	if st := p.Stats(); st.Adjusts.Coalesced != 1 || st.LocalTokens != 200 {
		t.Fatalf("stats %+v", st.Adjusts)
	}
	if v := val(); v != "1 400 1" {
		t.Fatalf("a refund went before its interval: %q", v)
	}
	p.Adjust(idn(1), Hold{1, 450}, 4) // an overrun above the last sent goes at once
	waitVal("1 450 4")
	p.Adjust(idn(1), Hold{0, 100}, 5) // abandon + refund: waits for the interval
	clk.Add(time.Second)
	waitVal("0 100 5")
	// 2 and 3 were coalesced into 4, which went at once.
	poll(t, 5*time.Second, "adjust stats", func() bool {
		a := p.Stats().Adjusts
		return a == AdjustStats{Applied: 3, Coalesced: 2}
	})
	p.Adjust(idn(9), Hold{1, 1}, 1) // not live: ignored
}

// TestPoolLeases checks on real time that renewals keep a hold past its
// TTL and that a crashed replica's holds are reclaimed within the TTL.
func TestPoolLeases(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.LeaseTTL, cfg.RenewEvery = 300*time.Millisecond, 60*time.Millisecond
	cfg.CallTimeout = time.Second
	// A loaded machine may starve the live replica's renewals for the
	// quiet gap ((300-60)/2 ms), which with a relearn window would keep
	// the crashed hold for one (see TestScriptsGenerations).
	cfg.RelearnWindow = -1
	live := mustPool(t, cfg)
	crashed := mustPool(t, cfg)
	reserveOK(t, live, idn(1), Hold{1, 100}, false)
	reserveOK(t, crashed, idn(2), Hold{1, 200}, false)
	crashed.crash()
	start := time.Now()
	time.Sleep(3 * cfg.LeaseTTL) // the point: leases on Redis time
	poll(t, time.Second, "the crashed hold reclaimed", func() bool {
		res := reserveOK(t, live, idn(1), Hold{1, 100}, false)
		return res.View.Tokens == 100
	})
	if d := time.Since(start); d > 3*cfg.LeaseTTL+200*time.Millisecond {
		t.Errorf("reclaimed after %v", d)
	}
	if st := live.Stats(); st.Renews.Renewed < 5 || st.Reclaimed != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := crashed.Reserve(bg, idn(3), Hold{1, 0}, false); err != ErrClosed {
		t.Errorf("crashed pool: %v", err)
	}
}

// TestReserveCallerContext checks that a caller's context that ends first
// returns its error, not a policy decision, and releases the id.
func TestReserveCallerContext(t *testing.T) {
	srv, client := startRedis(t)
	cfg := testConfig(client)
	cfg.OnFailure = FailOpen
	p := mustPool(t, cfg)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := p.Reserve(ctx, idn(1), Hold{1, 1}, false); err != context.Canceled {
		t.Fatalf("cancelled: %v", err)
	}
	if _, err := srv.Do("CLIENT", "PAUSE", "300", "ALL"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	res, err := p.Reserve(ctx, idn(2), Hold{1, 1}, false)
	if !errors.Is(err, context.DeadlineExceeded) || res.Admitted || res.Fallback != nil {
		t.Fatalf("deadline during the call: %+v, %v", res, err)
	}
	poll(t, 5*time.Second, "the release of the abandoned reserve", func() bool {
		return client.ZScore(bg, p.st.keys[3], idn(2).String()).Err() == nil
	})
	wantReject(t, p, idn(2), Hold{1, 1}, false, Released)
	if l := checkLedger(t, client, p.st.keys); len(l.holds) != 0 {
		t.Fatalf("ledger %+v", l)
	}
	if st := p.Stats(); st.Reserves.Error != 0 || st.PolicyAdmissions != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCloseRacingReserves closes a pool while reserves are in flight and
// checks that every hold they took is released.
func TestCloseRacingReserves(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget = -1, -1
	p := mustPool(t, cfg)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				res, err := p.Reserve(bg, idn(g*100_000+i), Hold{1, 10}, false)
				if err == ErrClosed {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if res.Admitted {
					admitted.Add(1)
				}
			}
		}()
	}
	poll(t, 5*time.Second, "some admissions", func() bool { return admitted.Load() > 50 })
	if err := p.Close(bg); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if l := checkLedger(t, client, p.st.keys); len(l.holds) != 0 || l.slots != 0 {
		t.Fatalf("after Close: %d holds, %d slots (%d admitted)", len(l.holds), l.slots, admitted.Load())
	}
}

// TestReserveLooksTwice checks that a reserve rejected after reclaiming a
// full batch of expired holds reclaims once more before it answers.
func TestReserveLooksTwice(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget, cfg.ReclaimBatch = -1, 100, 1
	// Nobody renews, or writes, while the holds run out: with a relearn
	// window that would start one (see TestScriptsGenerations).
	cfg.RelearnWindow = -1
	var now atomic.Int64
	now.Store(t0)
	crashed, p := hookedPool(t, cfg, now.Load), hookedPool(t, cfg, now.Load)
	reserveOK(t, crashed, idn(1), Hold{1, 50}, false)
	reserveOK(t, crashed, idn(2), Hold{1, 50}, false)
	crashed.crash()
	now.Add(cfg.LeaseTTL.Microseconds())
	res := reserveOK(t, p, idn(3), Hold{1, 100}, false)
	if res.View.Tokens != 100 || res.View.Reclaimed != 1 {
		t.Fatalf("%+v", res)
	}
	if st := p.Stats(); st.Reclaimed != 2 || st.Reserves != (ReserveStats{Admitted: 1}) {
		t.Fatalf("stats %+v", st.Reserves)
	}
}

// TestHoldLostAndReinstated pauses a holder past its lease (through the
// time hook): another replica reclaims the hold and takes the capacity, an
// adjustment finds the hold lost, and the next renewal registers it again,
// above the limit, with the latest values.
func TestHoldLostAndReinstated(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget, cfg.AdjustMinInterval = 1, 100, -1
	// No other replica writes while the hold runs out: with a relearn
	// window that would start one (see TestScriptsGenerations).
	cfg.RelearnWindow = -1
	var now atomic.Int64
	now.Store(t0)
	paused, other := hookedPool(t, cfg, now.Load), hookedPool(t, cfg, now.Load)
	reserveOK(t, paused, idn(1), Hold{1, 80}, false)
	now.Add(cfg.LeaseTTL.Microseconds())
	reserveOK(t, other, idn(2), Hold{1, 100}, false)
	paused.Adjust(idn(1), Hold{1, 60}, 1)
	poll(t, 5*time.Second, "the adjustment", func() bool { return paused.Stats().Adjusts.Lost == 1 })
	paused.renewAll()
	l := checkLedger(t, client, paused.st.keys)
	if l.slots != 2 || l.tokens != 160 || l.vals[idn(1).String()] != "1 60 1" {
		t.Fatalf("ledger %+v", l)
	}
	if st := paused.Stats(); st.Renews.Reinstated != 1 || st.LocalHolds != 1 || st.LocalTokens != 60 {
		t.Fatalf("stats %+v", st)
	}
	wantReject(t, other, idn(3), Hold{1, 0}, false, Slots)
}

// scriptMock is a mock clock that also gives a pool's scripts their time,
// as the engine's property tests give it (see New).
type scriptMock struct{ *clock.Mock }

func (c scriptMock) ScriptMicros() int64 { return c.Now().UnixMicro() }

// TestScriptClockGivesTheScriptsTheirTime checks the seam the engine's
// property tests use from outside the package: a Config.Clock that has a
// ScriptMicros method gives the scripts their time instead of Redis TIME,
// so leases run out when that clock says.
func TestScriptClockGivesTheScriptsTheirTime(t *testing.T) {
	_, client := startRedis(t)
	cfg := testConfig(client)
	cfg.RelearnWindow = -1
	clk := scriptMock{clock.NewMockAt(time.UnixMicro(t0))}
	cfg.Clock = clk
	createState(t, cfg, t0)
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(bg)
	reserveOK(t, p, idn(1), Hold{1, 10}, false)
	if l := checkLedger(t, client, p.st.keys); l.holds[idn(1).String()] != float64(t0+cfg.LeaseTTL.Microseconds()) {
		t.Fatalf("lease expiry %v, want %d: the script did not run at the clock's time", l.holds, t0+cfg.LeaseTTL.Microseconds())
	}
	p.forget(idn(1)) // its call crashed: nobody renews it
	clk.Add(cfg.LeaseTTL)
	if res := reserveOK(t, p, idn(2), Hold{1, 10}, false); res.View.Reclaimed != 1 || res.View.Slots != 1 {
		t.Fatalf("after the lease: %+v; want the first hold reclaimed", res)
	}
}

// hookedPool returns a pool whose scripts take their time from now (µs),
// closed when t ends.
func hookedPool(t *testing.T, cfg Config, now func() int64) *Pool {
	t.Helper()
	createState(t, cfg, now())
	p, err := newPool(cfg, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(bg) })
	return p
}
