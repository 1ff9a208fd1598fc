package pacer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the failure tests make many.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// startEpoch is the start time of the upstream vectors.
var startEpoch = time.UnixMilli(1723075200123)

// manualClock is a clock whose Now and Since return a time the test sets.
// It is the mock clock without the millisecond pause that Mock.Add takes to
// let timers run, for tests that replay thousands of decisions and wait on
// no timer. Timers and contexts come from the embedded Mock and do not move.
type manualClock struct {
	*clock.Mock
	ns atomic.Int64
}

func newManualClock(t time.Time) *manualClock {
	c := &manualClock{Mock: clock.NewMock()}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *manualClock) Now() time.Time                  { return time.Unix(0, c.ns.Load()) }
func (c *manualClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *manualClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }
func (c *manualClock) Add(d time.Duration)             { c.ns.Add(int64(d)) }

var prefixSeq atomic.Int64

// uniquePrefix returns a Redis key prefix no other test uses.
func uniquePrefix(t testing.TB) string {
	return fmt.Sprintf("test:%d:", prefixSeq.Add(1))
}

// newClient returns a go-redis client for addr, closed when t ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:        addr,
		DialTimeout: time.Second,
		// Fail fast when a test has stopped the server.
		DialerRetries: 1,
		ReadTimeout:   2 * time.Second,
		WriteTimeout:  2 * time.Second,
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

// newRedisStore returns a Redis store on client with a fresh prefix and,
// unless opts sets one, a generous timeout.
func newRedisStore(t testing.TB, client RedisClient, opts RedisOptions) *Redis {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = uniquePrefix(t)
	}
	if opts.Timeout == 0 {
		// Far above the default: the race detector on a loaded machine
		// can make a healthy decision take tens of milliseconds.
		opts.Timeout = 10 * time.Second
	}
	s, err := NewRedis(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustNew(t testing.TB, s Store, opts Options) *Pacer {
	t.Helper()
	p, err := New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// backend is a store under test and the clock that drives its decisions.
type backend struct {
	name  string
	store Store
	clk   *manualClock
}

// backends returns a Local store and, when redis-server is available, a
// Redis store taking time from the same kind of clock, both starting at t0.
// (Without redis-server, and with CI unset, the Local store is tested
// alone.)
func backends(t *testing.T, t0 time.Time) []backend {
	t.Helper()
	lc := newManualClock(t0)
	out := []backend{{name: "local", store: NewLocal(LocalOptions{Clock: lc}), clk: lc}}
	srv := redistest.TryStart(t)
	if srv == nil {
		return out
	}
	client := newClient(t, srv.Addr())
	rc := newManualClock(t0)
	out = append(out, backend{name: "redis", store: newRedisStore(t, client, RedisOptions{Clock: rc}), clk: rc})
	return out
}

// bg is the context of calls that need no deadline.
var bg = context.Background()

// parallel runs f(i) for i in [0, n) on n goroutines and waits for them.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

// contextCancelled returns a context that is already cancelled.
func contextCancelled() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(bg)
	cancel()
	return ctx, cancel
}
