package bulkhead_test

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// afterHook runs after(cmd) once each command's reply is in, on the
// goroutine that sent it.
type afterHook struct{ after func(redis.Cmder) }

func (h afterHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(cmd)
		return err
	}
}
func (h afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hookedRedis starts a redis-server (or skips) and returns a client that
// gives up at its context's deadline (so the stores call it on the calling
// goroutine), with once: the function stored there runs once, on the
// goroutine that sent the next command, after its reply is in.
func hookedRedis(t *testing.T) (*redis.Client, *atomic.Pointer[func()]) {
	t.Helper()
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	once := new(atomic.Pointer[func()])
	client.AddHook(afterHook{func(redis.Cmder) {
		if f := once.Swap(nil); f != nil {
			(*f)()
		}
	}})
	return client, once
}

// hookedRateStore is a Redis rate store on clk over a hookedRedis client.
func hookedRateStore(t *testing.T, clk *clock.Mock) (*pacer.Redis, *atomic.Pointer[func()]) {
	t.Helper()
	client, once := hookedRedis(t)
	store, err := pacer.NewRedis(client, pacer.RedisOptions{Clock: clk, Prefix: t.Name() + ":", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return store, once
}

// callerWaitsAfterCancel reports whether a caller of Acquire has sent its
// cancel message and waits for the engine's answer (the plain receive
// after the select on its context).
func callerWaitsAfterCancel() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[chan receive")) && bytes.Contains(g, []byte("actor.(*Engine).Acquire(")) {
			return true
		}
	}
	return false
}

// drainNow is a Drain that gives up at once.
func drainNow(b *bulkhead.Bulkhead) bulkhead.DrainResult {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, _ := b.Drain(ctx)
	return res
}

// A paced call whose turn a Redis store books, and whose caller leaves
// right after Redis booked it, before the worker's verdict reaches the
// engine: the caller's cancel message arrives while the call is checking
// (the engine leaves it to the verdict), then the verdict parked the call
// for its turn; at its turn the engine saw the context ended and waited
// for a cancel message that was already spent. The caller's Acquire never
// returned, and Drain never completed.
func TestReviewPacedRemoteTurnCallerLeavesWhileChecking(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	armed := make(chan time.Duration, 4)
	bulkhead.SetRateWaitHook(func(d time.Duration) { armed <- d })
	defer bulkhead.SetRateWaitHook(nil)
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
	a := mustAcquire(t, b, req("a", 10))
	_ = a.Release(nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var hookErr error
	leave := func() {
		// Redis has booked b's turn, a second away; its caller leaves.
		cancel()
		hookErr = testutil.Poll("the caller's cancel to reach the engine", func() (bool, error) { return callerWaitsAfterCancel(), nil })
	}
	once.Store(&leave)
	res := acquireAsync(ctx, b, req("b", 10))
	var r result
	select {
	case r = <-res: // answered with its verdict
	case d := <-armed:
		clk.Add(d) // parked for its turn: let it come
		select {
		case r = <-res:
		case <-time.After(testutil.Settle):
			t.Fatalf("the caller who left is never answered (drain: %+v)", drainNow(b))
		}
	}
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	wantReason(t, r.err, bulkhead.Aborted)
}
