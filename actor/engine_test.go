package actor

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/seam"
)

func startEngine(t *testing.T, limits admission.Limits) *Engine {
	t.Helper()
	return startConfig(t, Config{Limits: limits})
}

// startConfig starts an engine, closed and drained when the test ends.
func startConfig(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		if res := e.Drain(context.Background()); !res.Drained {
			t.Errorf("Drain = %+v", res)
		}
	})
	return e
}

func acquire(t *testing.T, e *Engine) *Lease {
	t.Helper()
	r := e.NewRequest()
	defer e.PutRequest(r)
	r.Ctx, r.Request, r.Lease = context.Background(), "request", &Lease{}
	if err := e.Acquire(r); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return r.Lease
}

// TestPanicInHandlerKeepsState makes a handler panic and checks that the
// caller gets ErrInternal while the actor keeps its state and goes on:
// protoactor never restarts it empty.
func TestPanicInHandlerKeepsState(t *testing.T) {
	e := startEngine(t, admission.Limits{MaxConcurrent: 2})
	held := acquire(t, e)

	// A usage report for no lease panics inside the handler.
	_, err := e.ReportUsage(nil, admission.Usage{}, nil)
	if !errors.Is(err, ErrInternal) {
		t.Fatalf("ReportUsage(nil) = %v, want ErrInternal", err)
	}
	st := e.Stats()
	if st.Admissions.Admitted != 1 || st.InFlight != 1 {
		t.Fatalf("state after the panic: %+v", st)
	}
	// The actor still decides: one more slot, then full.
	second := acquire(t, e)
	r := e.NewRequest()
	r.Ctx, r.Request, r.Lease = context.Background(), "request", &Lease{}
	if err := e.Acquire(r); !isReason(err, admission.ConcurrencyLimit) {
		t.Fatalf("third Acquire = %v", err)
	}
	e.PutRequest(r)
	held.Release(nil)
	second.Release(nil)
	if st := e.Stats(); st.InFlight != 0 || st.Admissions.Released != 2 {
		t.Fatalf("final stats: %+v", st)
	}
}

// TestPumpPassesOverEndedWaiters: a waiter whose context has ended is not
// admitted by a release while its cancel message is still on the way; the
// next waiter gets the slot, and the cancel then rejects it with the cause
// its sender read.
func TestPumpPassesOverEndedWaiters(t *testing.T) {
	e := startEngine(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 2})
	held := acquire(t, e)
	ended := make(chan struct{})
	dead := newAcquireRequest(make(chan struct{}, 1), false)
	dead.Ctx, dead.Lease, dead.ctxDone = context.Background(), &Lease{}, ended
	e.send(dead) // as Acquire would, without its watch on the context
	live := e.NewRequest()
	live.Ctx, live.Lease = context.Background(), &Lease{}
	got := make(chan error, 1)
	go func() { got <- e.Acquire(live) }()
	for e.Stats().Pending != 2 {
		runtime.Gosched()
	}
	close(ended)
	held.Release(nil)
	if err := <-got; err != nil {
		t.Fatalf("the live waiter: %v", err)
	}
	if st := e.Stats(); st.Pending != 1 || st.InFlight != 1 || len(dead.done) != 0 {
		t.Fatalf("the ended waiter was answered or dropped: %+v", st.Gate)
	}
	cause := errors.New("the caller gave up")
	dead.cancel.cause = cause
	e.send(&dead.cancel)
	<-dead.done
	var rej *admission.RejectedError
	if !errors.As(dead.Err, &rej) || rej.Reason != admission.Aborted || !errors.Is(dead.Err, cause) {
		t.Fatalf("the ended waiter: %v", dead.Err)
	}
	live.Lease.Release(nil)
	e.PutRequest(live)
	if st := e.Stats(); st.Pending != 0 || st.InFlight != 0 || st.Gate.Rejected[admission.Aborted] != 1 {
		t.Fatalf("final: %+v", st.Gate)
	}
}

// TestRecoveredAnswersAcquires: when deciding a request panics, the
// request is answered with ErrInternal unless it was answered or queued
// already, blocking and asynchronous alike (an async future is done).
func TestRecoveredAnswersAcquires(t *testing.T) {
	a := &admissionActor{engine: &Engine{logger: slog.New(slog.DiscardHandler)}}
	a.state = &state{fx: a}
	for _, r := range []*AcquireRequest{
		newAcquireRequest(make(chan struct{}, 1), false),
		newAcquireRequest(make(chan struct{}), true),
	} {
		a.recovered(r, "boom")
		<-r.done
		if !errors.Is(r.Err, ErrInternal) || !r.answered {
			t.Fatalf("async %v: Err = %v", r.async, r.Err)
		}
	}
	queued := newAcquireRequest(make(chan struct{}, 1), false)
	queued.queued = true
	a.recovered(queued, "boom")
	if len(queued.done) != 0 || queued.Err != nil {
		t.Fatal("a queued request was answered: the queue still holds it")
	}
}

// isReason reports whether err is an engine rejection for why.
func isReason(err error, why admission.Reason) bool {
	var rej *admission.RejectedError
	return errors.As(err, &rej) && rej.Reason == why
}

// heldClock is a mock clock whose AfterFunc timers, once due, hand their
// functions to the test instead of running them: the test delivers the
// timer messages when and in the order it likes, late included, as on the
// wall clock, where a timer stopped as it fires still runs its function.
type heldClock struct {
	*clock.Mock
	mu    sync.Mutex
	n     int
	fired []heldFunc
}

// heldFunc is a due timer's function and the order its timer was made in.
type heldFunc struct {
	i int
	f func()
}

func (c *heldClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	i := c.n
	c.n++
	c.mu.Unlock()
	return c.Mock.AfterFunc(d, func() {
		c.mu.Lock()
		c.fired = append(c.fired, heldFunc{i, f})
		c.mu.Unlock()
	})
}

// take waits until n timers have fired and returns their functions, in the
// order their timers were made.
func (c *heldClock) take(t *testing.T, n int) []func() {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		c.mu.Lock()
		if len(c.fired) >= n {
			break
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("%d timers did not fire", n)
		}
	}
	defer c.mu.Unlock()
	slices.SortFunc(c.fired, func(a, b heldFunc) int { return a.i - b.i })
	fs := make([]func(), len(c.fired))
	for i, h := range c.fired {
		fs[i] = h.f
	}
	c.fired = nil
	return fs
}

// startPaced starts an engine pacing model m at 60 calls a minute on clk,
// and returns it with a channel that receives each wait a call parks for.
func startPaced(t *testing.T, clk clock.Clock) (*Engine, chan time.Duration) {
	t.Helper()
	parks := make(chan time.Duration, 16)
	seam.SetPark(func(d time.Duration) { parks <- d })
	t.Cleanup(func() { seam.SetPark(nil) }) // after the engine's shutdown
	e := startConfig(t, Config{Limits: admission.Limits{MaxConcurrent: 4}, Clock: clk, Model: "m",
		Rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}})
	return e, parks
}

// pacedCall starts a call on its own goroutine, as the facade makes one:
// once answered, its request goes back to the pool at once (the admission
// is released first). The channel receives its answer.
func pacedCall(e *Engine) <-chan error {
	got := make(chan error, 1)
	go func() {
		r := e.NewRequest()
		r.Ctx, r.Request, r.Lease, r.Model = context.Background(), "request", &Lease{}, "m"
		err := e.Acquire(r)
		l := r.Lease
		e.PutRequest(r) // the facade's reuse: before anything else
		if err == nil {
			l.Release(nil)
		}
		got <- err
	}()
	return got
}

// TestStaleTurnTimerLeavesReusedRequestAlone delivers a paced call's turn
// timer message after Close ended its wait, its request back in the pool:
// the engine must not read a field of such a request (under -race, the
// pool's reuse writes them as the stale message is handled).
func TestStaleTurnTimerLeavesReusedRequestAlone(t *testing.T) {
	clk := &heldClock{Mock: clock.NewMock()}
	e, parks := startPaced(t, clk)
	if err := <-pacedCall(e); err != nil {
		t.Fatal(err)
	}
	a := pacedCall(e)
	<-parks
	clk.Add(time.Second) // its turn: the timer fires, its message held
	fs := clk.take(t, 1)
	e.Close()
	sent := make(chan struct{})
	go func() { fs[0](); close(sent) }()
	if err := <-a; !isReason(err, admission.Shutdown) {
		t.Fatalf("the parked call: %v, want shutdown", err)
	}
	<-sent
	e.Stats() // behind the stale message
}

// The engine's Config is public: it carries what a caller configures and
// no test hook, which would run on the admission actor in production. A
// test reaches the engine through package internal/seam instead.
func TestConfigCarriesNoHooks(t *testing.T) {
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Type.Kind() == reflect.Func {
			t.Errorf("Config.%s is a func: a hook in the public configuration", f.Name)
		}
	}
}
