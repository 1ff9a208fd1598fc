package fleet

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests make many.
	redis.SetLogger(quietLogger{})
	// After failed dials go-redis retries in a goroutine of its own that
	// sleeps a second between attempts and ends at its first attempt after
	// the client is closed.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

var bg = context.Background()

var poolSeq atomic.Int64

// uniquePool returns a pool name no other test uses.
func uniquePool() string { return "p" + strconv.FormatInt(poolSeq.Add(1), 10) }

// idn returns a distinct, valid ID for n.
func idn(n int) ID {
	var id ID
	binary.BigEndian.PutUint64(id[8:], uint64(n)+1)
	id[6] = 0x40
	return id
}

// newClient returns a client of addr that gives up at context deadlines,
// closed when t ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           time.Second,
		DialerRetries:         1,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// startRedis starts a redis-server for the test and returns a client of it.
func startRedis(t testing.TB) (*redistest.Server, *redis.Client) {
	t.Helper()
	s := redistest.Start(t)
	return s, newClient(t, s.Addr())
}

// testConfig is a Config for tests on client: a fresh pool, generous call
// timeouts (the race detector on a loaded machine is slow), short leases.
func testConfig(client redis.UniversalClient) Config {
	return Config{
		Client:        client,
		Pool:          uniquePool(),
		MaxConcurrent: 4,
		TokenBudget:   1000,
		LeaseTTL:      3 * time.Second,
		CallTimeout:   5 * time.Second,
	}
}

// mustPool returns a pool for cfg, closed when t ends. The pool's state
// is created first, with no relearn window (see createState).
func mustPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	createState(t, cfg, 0)
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(bg) })
	return p
}

// createState creates cfg's pool in Redis, at the script time now (0:
// Redis TIME), as a pool handle with no relearn window would: a pool
// created deliberately, so that the tests need not wait out the window a
// new pool starts with. It does nothing to a pool that exists.
func createState(t testing.TB, cfg Config, now int64) {
	t.Helper()
	cfg.RelearnWindow, cfg.CallTimeout = -1, 5*time.Second
	s, err := cfg.settings()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newStore(&s).renew(bg, now, seen{}, false, nil); err != nil {
		t.Fatal(err)
	}
}

// dumpKeys returns a copy of keys ("" for a missing one), as a snapshot of
// Redis would keep them.
func dumpKeys(client redis.UniversalClient, keys []string) (map[string]string, error) {
	dumps := map[string]string{}
	for _, k := range keys {
		d, err := client.Dump(bg, k).Result()
		if err != nil && err != redis.Nil {
			return nil, err
		}
		dumps[k] = d
	}
	return dumps, nil
}

// restoreKeys brings keys back to what dumpKeys returned, as a Redis
// restarted from that snapshot would.
func restoreKeys(client redis.UniversalClient, dumps map[string]string) error {
	for k, d := range dumps {
		var err error
		if d == "" {
			err = client.Del(bg, k).Err()
		} else {
			err = client.RestoreReplace(bg, k, 0, d).Err()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ledger is a pool's state read from Redis.
type ledger struct {
	slots, tokens int64 // agg
	gen           string
	holds         map[string]float64 // holds ZSET
	vals          map[string]string
	gone          map[string]float64
}

func readLedger(t testing.TB, client redis.UniversalClient, keys []string) ledger {
	t.Helper()
	l, err := snapshotLedger(client, keys)
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	return l
}

// snapshotLedger reads the ledger in one transaction: a consistent
// snapshot between two scripts.
func snapshotLedger(client redis.UniversalClient, keys []string) (ledger, error) {
	var l ledger
	var agg, vals *redis.MapStringStringCmd
	var holds, gone *redis.ZSliceCmd
	_, err := client.TxPipelined(bg, func(pipe redis.Pipeliner) error {
		holds = pipe.ZRangeWithScores(bg, keys[0], 0, -1)
		vals = pipe.HGetAll(bg, keys[1])
		agg = pipe.HGetAll(bg, keys[2])
		gone = pipe.ZRangeWithScores(bg, keys[3], 0, -1)
		return nil
	})
	if err != nil {
		return l, err
	}
	a := agg.Val()
	l.slots, _ = strconv.ParseInt(a["slots"], 10, 64)
	l.tokens, _ = strconv.ParseInt(a["tokens"], 10, 64)
	l.gen = a["gen"]
	zset := func(zs []redis.Z) map[string]float64 {
		m := make(map[string]float64, len(zs))
		for _, z := range zs {
			m[z.Member.(string)] = z.Score
		}
		return m
	}
	l.holds, l.gone, l.vals = zset(holds.Val()), zset(gone.Val()), vals.Val()
	return l, nil
}

// consistent returns what is wrong with the ledger ("" when nothing): the
// aggregate must be the sums over vals, holds and vals must name the same
// ids, and nothing may be negative or malformed.
func (l ledger) consistent() string {
	var slots, tokens int64
	for id, v := range l.vals {
		f := strings.Fields(v)
		if len(f) != 3 {
			return fmt.Sprintf("vals[%s] = %q", id, v)
		}
		s, err1 := strconv.ParseInt(f[0], 10, 64)
		tk, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil || s < 0 || s > 1 || tk < 0 {
			return fmt.Sprintf("vals[%s] = %q", id, v)
		}
		slots += s
		tokens += tk
		if _, ok := l.holds[id]; !ok {
			return fmt.Sprintf("vals[%s] has no lease (orphan)", id)
		}
	}
	if len(l.holds) != len(l.vals) {
		return fmt.Sprintf("ZCARD holds %d != HLEN vals %d", len(l.holds), len(l.vals))
	}
	if l.gen == "" && len(l.vals) == 0 {
		return "" // no pool yet, or state lost
	}
	if l.slots != slots || l.tokens != tokens {
		return fmt.Sprintf("agg %d/%d, sums over vals %d/%d", l.slots, l.tokens, slots, tokens)
	}
	if slots < 0 || tokens < 0 {
		return fmt.Sprintf("negative sums %d/%d", slots, tokens)
	}
	return ""
}

// checkLedger fails the test when the pool's ledger is inconsistent, and
// returns it.
func checkLedger(t testing.TB, client redis.UniversalClient, keys []string) ledger {
	t.Helper()
	l := readLedger(t, client, keys)
	if msg := l.consistent(); msg != "" {
		t.Fatalf("ledger inconsistent: %s", msg)
	}
	return l
}

// poll calls cond until it holds, failing the test after d. It yields the
// processor between calls and sleeps a millisecond, since what it waits
// for runs on real time (Redis TIME, leases).
func poll(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond) // waiting on Redis time and leases
	}
}

// openBreaker reserves on p, whose Redis is down, until its circuit
// breaker opens (the policy admits or refuses those reserves).
func openBreaker(t testing.TB, p *Pool) {
	t.Helper()
	for i := 0; !p.Stats().BreakerOpen; i++ {
		if i > breakerErrors {
			t.Fatal("the breaker does not open")
		}
		p.Reserve(bg, idn(100+i), Hold{1, 10}, false)
	}
}

// forget drops a live hold without releasing or renewing it again: its call
// crashed. For tests.
func (p *Pool) forget(id ID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(id)
}
