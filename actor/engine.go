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

// ErrInternal wraps a panic recovered inside the admission actor.
var ErrInternal = errors.New("bulkhead: internal error")

// Engine is a running admission engine.
//
// The admission actor runs on the synchronized dispatcher and so owns no
// goroutine: it lives as long as the Engine and answers every message, even
// after Close (with Shutdown). The events actor does own one while it has
// events to deliver; a Drain that finds a closed engine idle stops it, after
// which no events are delivered.
type Engine struct {
	sys    *actor.ActorSystem
	root   *actor.RootContext
	pid    *actor.PID
	events *actor.PID
	clk    clock.Clock

	closed   atomic.Bool
	stopOnce sync.Once

	// timing is true while anyone listens for admit or reject events.
	timing         atomic.Bool
	doubleReleases atomic.Int64
	listenerPanics atomic.Int64

	requests      sync.Pool
	usageRequests sync.Pool
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
		sys:  sys,
		root: sys.Root,
		clk:  clock.OrReal(cfg.Clock),
	}
	e.requests.New = func() any {
		r := &AcquireRequest{done: make(chan struct{}, 1)}
		r.cancel.r = r
		return r
	}
	e.usageRequests.New = func() any { return &usageRequest{done: make(chan struct{}, 1)} }
	ev := &eventsActor{engine: e}
	e.events = e.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return ev },
		actor.WithMailbox(newMailbox)))
	adm := &admissionActor{engine: e}
	adm.state = newState(e, cfg.Limits, e.clk, adm.emit)
	// Receive recovers its own panics; the guardian is the second line: a
	// failure that escapes anyway resumes the actor with its state, never
	// restarts it empty.
	resume := actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.ResumeDirective })
	e.pid = e.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return adm },
		actor.WithMailbox(newMailbox),
		actor.WithDispatcher(actor.NewSynchronizedDispatcher(300)),
		actor.WithGuardian(resume)))
	return e
}

// send posts a message to the admission actor.
func (e *Engine) send(msg any) { e.root.Send(e.pid, msg) }

// WantTiming reports whether the facade should record decision start times.
func (e *Engine) WantTiming() bool { return e.timing.Load() }

// Now reads the engine's clock.
func (e *Engine) Now() time.Time { return e.clk.Now() }

// NewRequest takes an acquire request from the pool.
func (e *Engine) NewRequest() *AcquireRequest {
	return e.requests.Get().(*AcquireRequest)
}

// PutRequest returns a request to the pool once its answer has been read.
// A request that was withdrawn is dropped instead: its cancel message may
// still be on its way to the engine.
func (e *Engine) PutRequest(r *AcquireRequest) {
	if r.cancelSent {
		return
	}
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
	e.send(r)
	if ctxDone := r.Ctx.Done(); ctxDone != nil {
		select {
		case <-r.done:
			return r.Err
		case <-ctxDone:
			r.cancelSent = true
			e.send(&r.cancel)
		}
	}
	<-r.done
	return r.Err
}

// call sends msg and waits for done.
func (e *Engine) call(msg any, done chan struct{}) {
	e.send(msg)
	<-done
}

// WouldAdmit returns the advisory decision for a call.
func (e *Engine) WouldAdmit(p admission.Priority, res admission.Reservation, detail bool) admission.Decision {
	q := &wouldAdmitRequest{priority: p, reservation: res, detail: detail, done: make(chan struct{}, 1)}
	e.call(q, q.done)
	return q.result
}

// Stats returns a copy of the statistics.
func (e *Engine) Stats() admission.Stats {
	q := &statsRequest{done: make(chan struct{}, 1)}
	e.call(q, q.done)
	return q.result
}

// Limits returns the current limits snapshot.
func (e *Engine) Limits() admission.Limits {
	q := &limitsRequest{done: make(chan struct{}, 1)}
	e.call(q, q.done)
	return q.result
}

// ApplyLimits installs next, atomically, if its revision is newer.
func (e *Engine) ApplyLimits(next admission.Limits) (admission.ApplyResult, error) {
	q := &applyRequest{next: next.Clone(), done: make(chan struct{}, 1)}
	e.call(q, q.done)
	return q.result, q.err
}

// SetBudget applies the current limits with a new budget at the next
// revision.
func (e *Engine) SetBudget(budget int64) (admission.ApplyResult, error) {
	q := &applyRequest{setBudget: true, budget: budget, done: make(chan struct{}, 1)}
	e.call(q, q.done)
	return q.result, q.err
}

// ReportUsage records cumulative usage for a live admission and returns
// the hold that results; p, when not nil, makes the hold progressive. u and
// p are assumed valid (non-negative); RemainingOutput is checked here
// against the reservation.
func (e *Engine) ReportUsage(l *Lease, u admission.Usage, p *admission.Progressive) (admission.UsageReport, error) {
	q := e.usageRequests.Get().(*usageRequest)
	q.l, q.usage, q.progressive = l, u, p
	e.call(q, q.done)
	rep, err := q.result, q.err
	*q = usageRequest{done: q.done}
	e.usageRequests.Put(q)
	return rep, err
}

// Close closes the engine to new work. It is idempotent.
func (e *Engine) Close() {
	if e.closed.Swap(true) {
		return
	}
	q := &closeRequest{done: make(chan struct{}, 1)}
	e.call(q, q.done)
}

// Drain waits until nothing is in flight or queued and every admission has
// been released, or until ctx ends. When the engine is closed and drained
// it also stops event delivery, so no goroutine of the engine remains.
func (e *Engine) Drain(ctx context.Context) admission.DrainResult {
	d := &drainRequest{done: make(chan struct{}, 1)}
	e.send(d)
	select {
	case <-d.done:
	case <-ctx.Done():
		e.send(&drainCancel{d: d})
		<-d.done
	}
	if d.result.Drained && e.closed.Load() {
		e.stop(ctx)
	}
	return d.result
}

// stop ends event delivery: the admission actor stops emitting, the events
// actor delivers what it holds (until ctx ends) and stops, and the actor
// system shuts down. The admission actor, which owns no goroutine, keeps
// answering.
func (e *Engine) stop(ctx context.Context) {
	e.stopOnce.Do(func() {
		q := &eventsOffRequest{done: make(chan struct{}, 1)}
		e.call(q, q.done)
		flushed := make(chan struct{})
		e.root.Send(e.events, &flushMsg{done: flushed})
		select {
		case <-flushed:
		case <-ctx.Done():
		}
		e.root.Stop(e.events)
		e.sys.Shutdown()
	})
}

// admissionActor is the protoactor actor around the state machine.
type admissionActor struct {
	engine *Engine
	state  *state
	ctx    actor.Context
	// eventsOff is set once event delivery has stopped for good.
	eventsOff bool
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
	case *usageRequest:
		s.reportUsage(m)
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
	case *eventsOffRequest:
		a.eventsOff = true
		s.listeners = [numKinds]int{}
		a.engine.timing.Store(false)
		m.done <- struct{}{}
	}
}

// recovered answers the sender of a message whose handler panicked, so no
// caller waits forever. The state keeps whatever the handler had done.
func (a *admissionActor) recovered(msg any, p any) {
	err := fmt.Errorf("%w: panic handling %T: %v", ErrInternal, msg, p)
	a.engine.sys.Logger().Error("bulkhead: recovered panic in admission actor", "error", err)
	var done chan struct{}
	switch m := msg.(type) {
	case *AcquireRequest:
		if m.answered || m.queued {
			return
		}
		m.Err, m.answered = err, true
		done = m.done
	case *applyRequest:
		m.err = err
		done = m.done
	case *wouldAdmitRequest:
		done = m.done
	case *statsRequest:
		done = m.done
	case *limitsRequest:
		done = m.done
	case *closeRequest:
		done = m.done
	case *usageRequest:
		m.err = err
		done = m.done
	case *subscribeRequest:
		done = m.done
	case *eventsOffRequest:
		done = m.done
	}
	if done != nil && len(done) == 0 {
		done <- struct{}{}
	}
}

func (a *admissionActor) subscribe(m *subscribeRequest) {
	if a.eventsOff {
		m.done <- struct{}{}
		return
	}
	s := a.state
	for kind, set := range m.sub.kinds() {
		if set {
			s.listeners[kind]++
		}
	}
	a.engine.timing.Store(s.listeners[kindAdmit]+s.listeners[kindReject] > 0)
	a.ctx.Send(a.engine.events, m.sub)
	m.done <- struct{}{}
}

func (a *admissionActor) unsubscribe(m *unsubscribeMsg) {
	if a.eventsOff {
		return
	}
	s := a.state
	for kind, set := range m.sub.kinds() {
		if set {
			s.listeners[kind]--
		}
	}
	a.engine.timing.Store(s.listeners[kindAdmit]+s.listeners[kindReject] > 0)
	a.ctx.Send(a.engine.events, m)
}
