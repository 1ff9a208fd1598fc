// Package actor is bulkhead's admission engine: one protoactor actor that
// owns every piece of admission state and changes it one message at a time,
// and one events actor that hands events to listeners in order.
//
// The facade (the root package) talks to it through Engine, which turns each
// call into a message and waits for the answer on a pooled, one-shot reply
// channel rather than a protoactor future (ten times cheaper). The admission
// actor runs on protoactor's synchronized dispatcher and a mailbox that
// allocates nothing, so an uncontended acquire is decided on the caller's
// own goroutine, and under contention whichever caller holds the mailbox
// decides for everyone queued behind it.
//
// Nothing in this package blocks inside a handler or calls user code from
// the admission actor: listeners run on the events actor, timers deliver
// messages, and a panic in a handler is recovered without losing state.
package actor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

// Config is what the engine needs to start.
type Config struct {
	// Limits is the initial snapshot; it is assumed valid.
	Limits admission.Limits
	// Clock is the time source; nil means the wall clock.
	Clock clock.Clock
	// Logger receives the actor system's own logging; nil discards it.
	Logger *slog.Logger
}

// ErrStopped is returned by calls that reach an engine after it stopped.
var ErrStopped = errors.New("bulkhead: engine stopped")

// ErrInternal wraps a panic recovered inside the admission actor.
var ErrInternal = errors.New("bulkhead: internal error")

// Engine is a running admission engine.
type Engine struct {
	sys    *actor.ActorSystem
	root   *actor.RootContext
	pid    *actor.PID
	events *actor.PID
	clk    clock.Clock

	// stopped is closed once the engine has stopped for good.
	stopped  chan struct{}
	stopOnce sync.Once
	closed   atomic.Bool
	final    atomic.Pointer[admission.Stats]

	// timing is true while anyone listens for admit or reject events.
	timing         atomic.Bool
	doubleReleases atomic.Int64
	listenerPanics atomic.Int64

	requests sync.Pool
}

// Start starts an engine.
func Start(cfg Config) *Engine {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }),
		actor.WithDeadLetterRequestLogging(false),
	)
	e := &Engine{
		sys:     sys,
		root:    sys.Root,
		clk:     clock.OrReal(cfg.Clock),
		stopped: make(chan struct{}),
	}
	e.requests.New = func() any {
		r := &AcquireRequest{done: make(chan struct{}, 1)}
		r.cancel.r = r
		return r
	}
	ev := &eventsActor{engine: e}
	e.events = e.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return ev },
		actor.WithMailbox(newMailbox)))
	adm := &admissionActor{engine: e}
	adm.state = newState(e, cfg.Limits, e.clk, adm.emit)
	e.pid = e.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return adm },
		actor.WithMailbox(newMailbox),
		actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))))
	return e
}

// send posts a message to the admission actor.
func (e *Engine) send(msg any) { e.root.Send(e.pid, msg) }

// Stopped returns a channel closed once the engine has stopped.
func (e *Engine) Stopped() <-chan struct{} { return e.stopped }

// isStopped reports whether the engine has stopped.
func (e *Engine) isStopped() bool {
	select {
	case <-e.stopped:
		return true
	default:
		return false
	}
}

// WantTiming reports whether the facade should record decision start times.
func (e *Engine) WantTiming() bool { return e.timing.Load() }

// Now reads the engine's clock.
func (e *Engine) Now() time.Time { return e.clk.Now() }

// NewRequest takes an acquire request from the pool.
func (e *Engine) NewRequest() *AcquireRequest {
	return e.requests.Get().(*AcquireRequest)
}

// PutRequest returns a request to the pool once its answer has been read.
func (e *Engine) PutRequest(r *AcquireRequest) {
	r.reset()
	e.requests.Put(r)
}

// Acquire sends r to the admission actor and waits for its answer. It
// returns nil when r was admitted (r.Lease then holds the admission) and
// the rejection otherwise.
//
// When r.Ctx ends while r waits in the queue, Acquire withdraws it and
// still waits for the engine's one answer: either the rejection Aborted or,
// when the admission won the race, the admission itself. So a request
// always ends with exactly one outcome, and nothing is leaked.
func (e *Engine) Acquire(r *AcquireRequest) error {
	if e.isStopped() {
		return &admission.RejectedError{Reason: admission.Shutdown}
	}
	e.send(r)
	select {
	case <-r.done:
		return r.Err
	default:
	}
	select {
	case <-r.done:
		return r.Err
	case <-r.Ctx.Done():
		e.send(&r.cancel)
	case <-e.stopped:
		return &admission.RejectedError{Reason: admission.Shutdown}
	}
	select {
	case <-r.done:
		return r.Err
	case <-e.stopped:
		return &admission.RejectedError{Reason: admission.Shutdown}
	}
}

// call sends msg and waits for done, or for the engine to stop.
func (e *Engine) call(msg any, done chan struct{}) error {
	if e.isStopped() {
		return ErrStopped
	}
	e.send(msg)
	select {
	case <-done:
		return nil
	case <-e.stopped:
		// The engine may have answered just before it stopped.
		select {
		case <-done:
			return nil
		default:
			return ErrStopped
		}
	}
}

// WouldAdmit returns the advisory decision for a call.
func (e *Engine) WouldAdmit(p admission.Priority, res admission.Reservation, detail bool) admission.Decision {
	q := &wouldAdmitRequest{priority: p, reservation: res, detail: detail, done: make(chan struct{}, 1)}
	if err := e.call(q, q.done); err != nil {
		d := admission.Decision{Reason: admission.Shutdown}
		if detail {
			st := e.Stats()
			d.Detail = &admission.RejectDetail{LimitRevision: st.Limits.Revision, MaxConcurrent: st.Limits.MaxConcurrent, MaxQueue: st.Limits.MaxQueue}
		}
		return d
	}
	return q.result
}

// Stats returns a copy of the statistics.
func (e *Engine) Stats() admission.Stats {
	q := &statsRequest{done: make(chan struct{}, 1)}
	if err := e.call(q, q.done); err != nil {
		return *e.final.Load()
	}
	return q.result
}

// Limits returns the current limits snapshot.
func (e *Engine) Limits() admission.Limits {
	q := &limitsRequest{done: make(chan struct{}, 1)}
	if err := e.call(q, q.done); err != nil {
		return e.final.Load().Limits.Clone()
	}
	return q.result
}

// ApplyLimits installs next, atomically, if its revision is newer.
func (e *Engine) ApplyLimits(next admission.Limits) (admission.ApplyResult, error) {
	q := &applyRequest{next: next.Clone(), done: make(chan struct{}, 1)}
	if err := e.call(q, q.done); err != nil {
		return admission.ApplyResult{}, &admission.RejectedError{Reason: admission.Shutdown}
	}
	return q.result, q.err
}

// SetBudget applies the current limits with a new budget at the next
// revision.
func (e *Engine) SetBudget(budget int64) (admission.ApplyResult, error) {
	q := &applyRequest{setBudget: true, budget: budget, done: make(chan struct{}, 1)}
	if err := e.call(q, q.done); err != nil {
		return admission.ApplyResult{}, &admission.RejectedError{Reason: admission.Shutdown}
	}
	return q.result, q.err
}

// Close closes the engine to new work. It is idempotent.
func (e *Engine) Close() {
	if e.closed.Swap(true) {
		return
	}
	q := &closeRequest{done: make(chan struct{}, 1)}
	_ = e.call(q, q.done)
}

// Closed reports whether Close has been called.
func (e *Engine) Closed() bool { return e.closed.Load() }

// Drain waits until nothing is in flight or queued and every admission has
// been released, or until ctx ends. When the engine is closed and drained
// it also stops the engine's actors, so no goroutine of it remains.
func (e *Engine) Drain(ctx context.Context) admission.DrainResult {
	if e.isStopped() {
		return admission.DrainResult{Drained: true}
	}
	d := &drainRequest{done: make(chan struct{}, 1)}
	e.send(d)
	select {
	case <-d.done:
	case <-ctx.Done():
		e.send(&drainCancel{d: d})
		select {
		case <-d.done:
		case <-e.stopped:
			return admission.DrainResult{Drained: true}
		}
	case <-e.stopped:
		return admission.DrainResult{Drained: true}
	}
	if d.result.Drained && e.closed.Load() {
		e.stop(ctx)
	}
	return d.result
}

// stop shuts the engine down: it waits for the events actor to deliver
// what it holds (until ctx ends), records the final statistics, stops both
// actors and the actor system.
func (e *Engine) stop(ctx context.Context) {
	e.stopOnce.Do(func() {
		st := e.Stats()
		e.final.Store(&st)
		flushed := make(chan struct{})
		e.root.Send(e.events, &flushMsg{done: flushed})
		select {
		case <-flushed:
		case <-ctx.Done():
		}
		e.root.Stop(e.pid)
		e.root.Stop(e.events)
		close(e.stopped)
		e.sys.Shutdown()
	})
}

// admissionActor is the protoactor actor around the state machine.
type admissionActor struct {
	engine *Engine
	state  *state
	ctx    actor.Context
}

func (a *admissionActor) emit(ev any) { a.ctx.Send(a.engine.events, ev) }

// Receive handles one message. A panic is recovered here, so protoactor's
// supervisor never restarts the actor with an empty state; the caller of
// the failed message is answered with ErrInternal where it can be.
func (a *admissionActor) Receive(ctx actor.Context) {
	a.ctx = ctx
	msg := ctx.Message()
	defer func() {
		if p := recover(); p != nil {
			a.recovered(msg, p)
		}
	}()
	s := a.state
	switch m := msg.(type) {
	case *AcquireRequest:
		s.acquire(m)
	case *releaseMsg:
		s.release(m)
	case *cancelMsg:
		s.cancel(m.r)
	case *timeoutMsg:
		s.timeout(m)
	case *wouldAdmitRequest:
		s.wouldAdmit(m)
	case *statsRequest:
		m.result = s.stats()
		m.done <- struct{}{}
	case *limitsRequest:
		m.result = s.limits.Clone()
		m.done <- struct{}{}
	case *applyRequest:
		s.apply(m)
	case *closeRequest:
		s.close()
		m.done <- struct{}{}
	case *drainRequest:
		s.drain(m)
	case *drainCancel:
		s.cancelDrain(m.d)
	case *subscribeRequest:
		a.subscribe(m)
	case *unsubscribeMsg:
		a.unsubscribe(m)
	}
}

// recovered answers the sender of a message whose handler panicked.
func (a *admissionActor) recovered(msg any, p any) {
	err := fmt.Errorf("%w: panic handling %T: %v", ErrInternal, msg, p)
	a.engine.sys.Logger().Error("bulkhead: recovered panic in admission actor", "error", err)
	switch m := msg.(type) {
	case *AcquireRequest:
		if !m.answered && !m.queued {
			m.Err = err
			m.done <- struct{}{}
		}
	}
}

func (a *admissionActor) subscribe(m *subscribeRequest) {
	s := a.state
	h := &m.sub.hooks
	for kind, set := range [numKinds]bool{h.Admit != nil, h.Reject != nil, h.Release != nil, h.Reconfigure != nil} {
		if set {
			s.listeners[kind]++
		}
	}
	a.engine.timing.Store(s.listeners[kindAdmit]+s.listeners[kindReject] > 0)
	a.ctx.Send(a.engine.events, m.sub)
	m.done <- struct{}{}
}

func (a *admissionActor) unsubscribe(m *unsubscribeMsg) {
	s := a.state
	h := &m.sub.hooks
	for kind, set := range [numKinds]bool{h.Admit != nil, h.Reject != nil, h.Release != nil, h.Reconfigure != nil} {
		if set {
			s.listeners[kind]--
		}
	}
	a.engine.timing.Store(s.listeners[kindAdmit]+s.listeners[kindReject] > 0)
	a.ctx.Send(a.engine.events, m)
}
