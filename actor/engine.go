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
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/dedup"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// Config is what the engine needs to start.
type Config struct {
	// Limits is the initial snapshot; it is assumed valid.
	Limits admission.Limits
	// Clock is the time source; nil means the wall clock.
	Clock clock.Clock
	// Logger receives the actor system's own logging; nil discards it.
	Logger *slog.Logger
	// Dedup starts the dedup actor, a child of the admission actor.
	Dedup bool
	// Queue is how the queue serves waiting calls.
	Queue QueuePolicy

	// Model is the bulkhead's own model, for calls and feedback that name
	// none.
	Model string
	// ShedCooldown turns away at once a call whose model is cooling down;
	// otherwise it is held back until the cool-down ends.
	ShedCooldown bool
	// Adaptive, Rates and Fleet are the adaptive limit, the rate limits
	// and the fleet pool; nil for none.
	Adaptive *Adaptive
	Rates    *Rates
	Fleet    *fleet.Pool
	// OnPark, when set, is called on the admission actor each time a paced
	// call starts to wait outside the queue, once its timer is armed (its
	// own for its turn, the hold timer for a cool-down before it), with
	// the time it will wait: for tests that move a mock clock.
	OnPark func(time.Duration)
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
	// dedup is the dedup actor, nil when deduplication is off.
	dedup *actor.PID
	clk   clock.Clock

	// stopMu guards the shutdown of event delivery, and is never held
	// while waiting for it: flushed is closed once every event emitted
	// before emission stopped has been delivered; stopped is set once the
	// events actor and the actor system are down.
	stopMu  sync.Mutex
	flushed chan struct{}
	stopped bool

	// timing is true while anyone listens for admit or reject events.
	timing         atomic.Bool
	doubleReleases atomic.Int64
	listenerPanics atomic.Int64
	// backlog counts events emitted and not yet delivered.
	backlog atomic.Int64

	logger *slog.Logger

	requests           sync.Pool
	usageRequests      sync.Pool
	wouldAdmitRequests sync.Pool
	joins              sync.Pool

	// classes is the class table, for lookups only: Lookup reads what the
	// table fixed at construction, so it is safe off the actor.
	classes *classes.Table
}

// Start starts an engine. cfg.Limits is assumed valid but for the class
// table, which Start validates.
func Start(cfg Config) (*Engine, error) {
	logger := slog.New(slog.DiscardHandler)
	if cfg.Logger != nil {
		// A handler that panics must not take the engine down with it.
		logger = slog.New(guardedHandler{cfg.Logger.Handler()})
	}
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }),
		actor.WithDeadLetterRequestLogging(false),
	)
	e := &Engine{
		sys:    sys,
		root:   sys.Root,
		clk:    clock.OrReal(cfg.Clock),
		logger: logger,
	}
	e.requests.New = func() any { return newAcquireRequest(make(chan struct{}, 1), false) }
	e.usageRequests.New = func() any { return &usageRequest{done: make(chan struct{}, 1)} }
	e.wouldAdmitRequests.New = func() any { return &wouldAdmitRequest{done: make(chan struct{}, 1)} }
	e.joins.New = func() any { return dedup.NewJoin() }
	ev := &eventsActor{engine: e}
	e.events = e.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return ev },
		actor.WithMailbox(newMailbox)))
	adm := &admissionActor{engine: e, withDedup: cfg.Dedup, onPark: cfg.OnPark}
	var seed [32]byte
	_, _ = rand.Read(seed[:])
	sc := stageConfig{model: cfg.Model, shed: cfg.ShedCooldown, adaptive: cfg.Adaptive, rates: cfg.Rates, fleet: cfg.Fleet}
	st, err := newState(cfg.Limits, cfg.Queue, sc, adm, seed)
	if err != nil {
		return nil, err
	}
	adm.state = st
	e.classes = st.tab
	// Receive recovers its own panics; the guardian is the second line: a
	// failure that escapes anyway resumes the actor with its state, never
	// restarts it empty.
	resume := actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.ResumeDirective })
	e.pid = e.root.Spawn(actor.PropsFromProducer(func() actor.Actor { return adm },
		actor.WithMailbox(newMailbox),
		actor.WithDispatcher(actor.NewSynchronizedDispatcher(300)),
		actor.WithGuardian(resume)))
	return e, nil
}

// LookupClass resolves a class name ("" is the default class) to the
// handle an AcquireRequest carries. Without classes only "" is valid.
func (e *Engine) LookupClass(name string) (classes.Class, error) { return e.classes.Lookup(name) }

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
	ctxDone := e.prepare(r)
	// Uncontended, the answer is already there when send returns: the
	// mailbox ran on this goroutine. Spinning for it before blocking, when
	// another goroutine runs the mailbox, measured slower (10% at 64
	// goroutines on 2 cores; no gain with one goroutine or one core).
	e.send(r)
	if ctxDone != nil {
		select {
		case <-r.done:
			return r.Err
		case <-ctxDone:
			select {
			case <-r.done: // answered before the context ended
				return r.Err
			default:
			}
			r.cancelSent = true
			r.cancel.cause = contextCause(r.Ctx)
			e.send(&r.cancel)
		}
	}
	<-r.done
	return r.Err
}

// prepare readies r to be sent, on the caller's goroutine: it points r's
// lease at the engine, and reads r.Ctx's Done channel and, if it has ended,
// why, so the engine decides on what they said and never calls a method of
// the caller's context itself. It returns the Done channel.
func (e *Engine) prepare(r *AcquireRequest) <-chan struct{} {
	if r.Lease != nil {
		r.Lease.engine = e
	}
	done := r.Ctx.Done()
	r.ctxDone = done
	if done != nil {
		select {
		case <-done:
			r.ended = contextCause(r.Ctx)
		default:
		}
	}
	return done
}

// contextCause returns why ctx ended: context.Cause, or context.Canceled
// from a context that gives none. When ctx's methods panic, it returns an
// error describing the panic instead: a broken context counts as ended, and
// its panic reaches nobody.
func contextCause(ctx context.Context) (cause error) {
	defer func() {
		if p := recover(); p != nil {
			cause = fmt.Errorf("bulkhead: the caller's context panicked: %v", p)
		}
	}()
	if cause = context.Cause(ctx); cause == nil {
		cause = context.Canceled
	}
	return cause
}

// guardedContext passes a caller's context to context.AfterFunc with its
// Err and Value guarded: for a context type of its own, AfterFunc calls
// them on a goroutine of its own when the context ends, where a panic
// would end the process. A panicking Err reads as context.Canceled, a
// panicking Value as nil.
type guardedContext struct{ context.Context }

func (g guardedContext) Err() (err error) {
	defer func() {
		if recover() != nil {
			err = context.Canceled
		}
	}()
	return g.Context.Err()
}

func (g guardedContext) Value(key any) (v any) {
	defer func() {
		if recover() != nil {
			v = nil
		}
	}()
	return g.Context.Value(key)
}

// NewAsyncRequest returns a request for AcquireAsync. It is not pooled.
func (e *Engine) NewAsyncRequest() *AcquireRequest {
	return newAcquireRequest(make(chan struct{}), true)
}

// newAcquireRequest returns a request answered on done; its cancel message
// points back at it.
func newAcquireRequest(done chan struct{}, async bool) *AcquireRequest {
	r := &AcquireRequest{done: done, async: async}
	r.cancel.r = r
	return r
}

// AcquireAsync sends r, from NewAsyncRequest, to the admission actor and
// returns at once. r's answer (r.Err, r.Lease) is ready once the returned
// channel is closed. When r.Ctx ends while r waits in the queue, r is
// withdrawn (rejected Aborted); stop, called once the answer is in, drops
// that watch.
func (e *Engine) AcquireAsync(r *AcquireRequest) (done <-chan struct{}, stop func() bool) {
	e.prepare(r)
	stop = context.AfterFunc(guardedContext{r.Ctx}, func() {
		r.cancel.cause = contextCause(r.Ctx)
		e.send(&r.cancel)
	})
	e.send(r)
	return r.done, stop
}

// Feedback hands the engine what a provider answered a call: a
// Retry-After starts a cool-down of the model, a headroom report replaces
// the model's, and the adaptive limit learns from the outcome. It returns
// once the engine has taken it in.
func (e *Engine) Feedback(f Feedback) {
	q := &feedbackRequest{f: f, done: make(chan struct{}, 1)}
	e.call(q, q.done)
}

// call sends msg and waits for done.
func (e *Engine) call(msg any, done chan struct{}) {
	e.send(msg)
	<-done
}

// WouldAdmit returns the advisory decision for a call of model, with the
// bulkhead's queue timeout (a cool-down that outlasts it turns the call
// away). A rate
// kept in Redis is asked here, on the caller's goroutine, once the engine
// has answered for everything else; like the rest, it books nothing.
func (e *Engine) WouldAdmit(c classes.Class, p admission.Priority, res admission.Reservation, model string, timeout time.Duration, detail bool) admission.Decision {
	q := e.wouldAdmitRequests.Get().(*wouldAdmitRequest)
	q.class, q.priority, q.reservation, q.model, q.timeout, q.detail = c, p, res, model, timeout, detail
	e.call(q, q.done)
	d, set, rs := q.result, q.remote, q.rates
	q.result, q.detail, q.remote, q.rates = admission.Decision{}, false, nil, nil
	e.wouldAdmitRequests.Put(q)
	if set != nil {
		if why, rd := rs.peek(background, set, &res); why != admission.NoReason {
			d.Admit, d.Reason = false, why
			if d.Detail != nil {
				d.Detail.Rate = rd
			}
		}
	}
	if !detail {
		d.Detail = nil
	}
	return d
}

// Stats returns a copy of the statistics. With deduplication on, the
// dedup actor's are read first, behind every join, settlement and leave
// sent before.
func (e *Engine) Stats() admission.Stats {
	var d *admission.DedupStats
	if e.dedup != nil {
		dq := dedup.NewStatsRequest()
		e.root.Send(e.dedup, dq)
		dq.Await()
		d = &admission.DedupStats{Active: dq.Active, Hits: dq.Hits}
	}
	q := &statsRequest{done: make(chan struct{}, 1)}
	e.call(q, q.done)
	q.result.Dedup = d
	return q.result
}

// Dedup reports whether deduplication is on.
func (e *Engine) Dedup() bool { return e.dedup != nil }

// ClassName returns the name of class c, "" for None. It reads the class
// table fixed at construction, so it is safe off the actor.
func (e *Engine) ClassName(c classes.Class) string { return e.classes.Name(c) }

// NewJoin takes a dedup join from the pool.
func (e *Engine) NewJoin() *dedup.Join { return e.joins.Get().(*dedup.Join) }

// PutJoin returns a join to the pool once its last answer has been read
// (for a leader, once it has settled). A follower that left is not put
// back: its leave message may still be on its way (see Follow).
func (e *Engine) PutJoin(j *dedup.Join) {
	j.Reset()
	e.joins.Put(j)
}

// Join places a deduplicated call (see package dedup) and returns once its
// role is known.
func (e *Engine) Join(j *dedup.Join) {
	e.root.Send(e.dedup, j)
	j.AwaitRole()
}

// Follow waits for follower j's final answer: its leader's outcome, or its
// own end. When ctx ends first, j leaves (and may still get the outcome,
// when the leader settled in the meantime): each follower ends exactly one
// way. ctx's methods are called on this goroutine only. It reports
// whether j may go back to the pool once read: not when it left, nor when
// it had a wait bound (its timer's message may still be on its way).
func (e *Engine) Follow(ctx context.Context, j *dedup.Join) (reusable bool) {
	done := ctx.Done()
	select {
	case <-j.Answered():
		return j.Wait == 0
	case <-done:
	}
	select {
	case <-j.Answered(): // answered before the context ended
		return j.Wait == 0
	default:
	}
	e.root.Send(e.dedup, j.Leave(contextCause(ctx)))
	<-j.Answered()
	return false
}

// Settle ends leader j's entry: its followers get outcome. It does not
// wait: every later join is ordered behind it. A leader that no follower
// joined settles without a message; alone says so (nobody reads outcome).
func (e *Engine) Settle(j *dedup.Join, outcome any) (alone bool) {
	if settled, wake := j.SettleAlone(); settled {
		if wake {
			e.root.Send(e.dedup, dedupWake)
		}
		return true
	}
	e.root.Send(e.dedup, j.Settle(outcome))
	return false
}

var dedupWake = &dedup.WakeDrains{}

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
	q.l, q.progressive, q.result, q.err = nil, nil, admission.UsageReport{}, nil
	e.usageRequests.Put(q)
	return rep, err
}

// Close closes the engine to new work, deduplication included. It is
// idempotent.
// Every call waits until the close has taken effect.
func (e *Engine) Close() {
	q := &closeRequest{done: make(chan struct{}, 1)}
	e.call(q, q.done)
	if e.dedup != nil {
		// Every join sent after Close returns is ordered behind this, so
		// none joins a call in flight: it is rejected Shutdown instead.
		e.root.Send(e.dedup, dedupClose)
	}
}

var dedupClose = &dedup.Close{}

// Drain waits until nothing is in flight or queued and every admission has
// been released, or until ctx ends. When the engine is closed and drained
// it also stops event delivery, so no goroutine of the engine remains.
//
// Drain returns when ctx ends, whatever the listeners do: a Drain that
// gives up while a listener still holds an event leaves the rest of the
// shutdown to a later Drain. A listener that calls Drain waits for itself
// (the events behind the one it is handling cannot be delivered until it
// returns), so its Drain ends only with its ctx; other Drains are not held
// up by it and keep their own deadlines.
//
// With deduplication on, Drain also waits until no deduplicated key is in
// flight: a leader rejected in the queue (by Close, say) releases
// nothing, and its followers wait until its entry settles.
func (e *Engine) Drain(ctx context.Context) admission.DrainResult {
	var d *drainRequest
	for {
		d = &drainRequest{done: make(chan struct{}, 1)}
		e.send(d)
		select {
		case <-d.done:
		case <-ctx.Done():
			e.send(&drainCancel{d: d})
			<-d.done
		}
		if e.dedup == nil {
			break
		}
		if !d.result.Drained {
			d.result.DedupActive = int(e.dedupActive())
			return d.result
		}
		active, waited := e.drainDedup(ctx)
		if active > 0 {
			d.result.Drained, d.result.DedupActive = false, int(active)
			return d.result
		}
		if !waited {
			// The table was empty right behind the engine's idle answer:
			// after Close neither can fill again.
			break
		}
		// The table emptied while Drain waited: check the engine again.
	}
	if d.result.Drained && d.closed && !e.stop(ctx) {
		// The work has drained but listeners are still being handed
		// events: not a complete drain yet.
		d.result.Drained = false
	}
	return d.result
}

// drainDedup waits until the dedup table is empty, or until ctx ends. It
// returns the number of keys still in flight (0 once empty) and whether it
// had to wait.
func (e *Engine) drainDedup(ctx context.Context) (active int64, waited bool) {
	q := dedup.NewDrain()
	e.root.Send(e.dedup, q)
	select {
	case <-q.Done():
	case <-ctx.Done():
		e.root.Send(e.dedup, q.Cancel())
		<-q.Done()
	}
	return q.Active, q.Waited
}

// dedupActive returns the number of deduplicated keys in flight.
func (e *Engine) dedupActive() int64 {
	q := dedup.NewStatsRequest()
	e.root.Send(e.dedup, q)
	q.Await()
	return q.Active
}

// stop ends event delivery and reports whether it has: the admission actor
// stops emitting (and its class actors stop), the events actor delivers
// what it holds, then it stops and the actor system shuts down. When ctx
// ends before the last event is delivered, stop returns false and a later
// call picks up where it left off. Concurrent calls wait together, each
// until its own ctx ends; no lock is held while they wait. The admission
// actor, which owns no goroutine, keeps answering.
func (e *Engine) stop(ctx context.Context) bool {
	flushed := e.stopEvents()
	if e.backlog.Load() == 0 {
		// Every event emitted has been delivered: the flush is a message
		// away and runs no listener, so an idle bulkhead drains whatever
		// the context says (a context that has already ended included).
		<-flushed
	} else {
		select {
		case <-flushed:
		case <-ctx.Done():
			return false
		}
	}
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if !e.stopped {
		e.root.Stop(e.events)
		e.sys.Shutdown()
		e.stopped = true
	}
	return true
}

// stopEvents stops the emission of events, the first time it is called,
// and returns the channel closed once every event emitted before that has
// been delivered.
func (e *Engine) stopEvents() <-chan struct{} {
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if e.flushed == nil {
		// The admission actor answers at once: it runs no user code.
		q := &eventsOffRequest{done: make(chan struct{}, 1)}
		e.call(q, q.done)
		e.flushed = q.flushed
	}
	return e.flushed
}

// admissionActor is the protoactor actor around the state machine. It
// carries out the state's effects.
type admissionActor struct {
	engine *Engine
	state  *state
	ctx    actor.Context
	// children are the class actors and telemetry their deadline counts,
	// indexed by class handle - 1.
	children  []*actor.PID
	telemetry []*classes.Telemetry
	// eventsOff is set once event delivery has stopped for good.
	eventsOff bool
	// withDedup says to start the dedup actor.
	withDedup bool
	// holdTimer is the one timer of the calls held back (a provider's
	// cool-down), due at holdAt; holdGen tells its message from a stopped
	// one's.
	holdTimer clock.Timer
	holdAt    time.Time
	holdGen   uint64
	// onPark is Config.OnPark.
	onPark func(time.Duration)
}

func (a *admissionActor) now() time.Time { return a.engine.clk.Now() }

func (a *admissionActor) emit(ev any) {
	a.engine.backlog.Add(1)
	a.ctx.Send(a.engine.events, ev)
}

func (a *admissionActor) tell(c classes.Class, msg any) {
	if c != classes.None && int(c) <= len(a.children) {
		a.ctx.Send(a.children[c-1], msg)
	}
}

func (a *admissionActor) armTimer(r *AcquireRequest) {
	msg := &timeoutMsg{r: r, gen: r.gen}
	e := a.engine
	r.timer = e.clk.AfterFunc(r.QueueTimeout, func() { e.send(msg) })
}

// armPark arms r's timer to wake it, parked, after d.
func (a *admissionActor) armPark(r *AcquireRequest, d time.Duration) {
	msg := &parkMsg{r: r, gen: r.gen, seq: r.parkSeq}
	e := a.engine
	r.timer = e.clk.AfterFunc(d, func() { e.send(msg) })
	if a.onPark != nil {
		a.onPark(d)
	}
}

// armCooldown arms the hold timer for a paced call that waits d for a
// cool-down to end, in the cooling line.
func (a *admissionActor) armCooldown(_ *AcquireRequest, d time.Duration) {
	a.armHold(d)
	if a.onPark != nil {
		a.onPark(d)
	}
}

// startRemote runs a remote job on a goroutine of its own; its verdict
// comes back as a message, even when code it runs (a Redis hook) ends the
// goroutine with runtime.Goexit.
func (a *admissionActor) startRemote(j *remoteJob) {
	e := a.engine
	go func() {
		ran := false
		defer func() {
			if !ran {
				j.why, j.ext = admission.Aborted, nil
				j.cause = errors.New("bulkhead: the admission's checks called runtime.Goexit")
			}
			e.send(j)
		}()
		j.run()
		ran = true
	}()
}

// fleetRelease ends l's fleet hold, in the pool's background batches.
func (a *admissionActor) fleetRelease(l *Lease) { a.state.fleet.pool.Release(fleetID(l)) }

// fleetAdjust moves l's fleet hold, in the pool's background batches.
func (a *admissionActor) fleetAdjust(l *Lease, held, seq int64, abandoned bool) {
	a.state.fleet.adjust(l, held, seq, abandoned)
}

// bookRemote settles a release on rates kept in Redis (see
// rateStage.settle), on a goroutine of its own (the engine never waits
// for Redis), and tells the state when it is done. A panic there (a Redis
// hook's) is counted as a failed booking and logged: nobody is on that
// goroutine to receive it.
func (a *admissionActor) bookRemote(rs *rateStage, set *rateSet, deltas []float64, l *Lease) {
	e := a.engine
	done := make(chan struct{})
	l.booked = done
	go func() {
		defer func() {
			if p := recover(); p != nil {
				rs.overrunErr.Add(1)
				e.log(slog.LevelError, "bulkhead: panic while booking an overrun on the rates",
					"admission", l.ID.String(), "deltas", deltas, "panic", p)
			}
			e.send(bookedMsg) // before done: what the releaser does next comes after it
			close(done)
		}()
		if dropped := rs.settle(background, set, deltas); dropped > 0 {
			e.log(slog.LevelWarn, "bulkhead: overrun larger than a rate window, partly dropped",
				"admission", l.ID.String(), "overrun", slices.Max(deltas), "dropped", dropped)
		}
	}()
}

func (a *admissionActor) warn(msg string, args ...any) { a.engine.log(slog.LevelWarn, msg, args...) }

// armHold arms the engine's one hold timer for d from now, unless it is
// armed for sooner already.
func (a *admissionActor) armHold(d time.Duration) {
	e := a.engine
	at := e.clk.Now().Add(d)
	if a.holdTimer != nil {
		if !at.Before(a.holdAt) {
			return
		}
		a.holdTimer.Stop()
	}
	a.holdGen++
	msg := &holdMsg{gen: a.holdGen}
	a.holdAt = at
	a.holdTimer = e.clk.AfterFunc(d, func() { e.send(msg) })
}

// stopHold stops the hold timer, if one runs.
func (a *admissionActor) stopHold() {
	if a.holdTimer != nil {
		a.holdTimer.Stop()
		a.holdTimer = nil
	}
}

// holdFired handles the hold timer's message: the current timer's only.
func (a *admissionActor) holdFired(m *holdMsg) {
	if m.gen != a.holdGen || a.holdTimer == nil {
		return
	}
	a.holdTimer = nil
	a.state.holdEnded()
}

func (a *admissionActor) stopTimer(r *AcquireRequest) {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

func (a *admissionActor) answer(r *AcquireRequest) {
	if r.async {
		close(r.done)
		return
	}
	r.done <- struct{}{}
}

func (a *admissionActor) answerDrain(d *drainRequest) { d.done <- struct{}{} }

func (a *admissionActor) expire(l *Lease) { close(l.expired) }

func (a *admissionActor) drifted(quantity string, got int64, args ...any) {
	a.engine.log(slog.LevelError, "bulkhead: ledger drift: an in-flight count went out of range and was clamped",
		append([]any{"quantity", quantity, "value", got}, args...)...)
}

// external reads the counters the statistics take from outside the state.
func (a *admissionActor) external() external {
	ext := external{doubleReleases: a.engine.doubleReleases.Load(), listenerPanics: a.engine.listenerPanics.Load()}
	for _, tel := range a.telemetry {
		ext.deadlines = append(ext.deadlines, tel.Snapshot())
	}
	return ext
}

// spawnChildren starts one child actor per class, and the dedup actor.
// The dedup actor is never stopped: like the admission actor it owns no
// goroutine, and answers every join for the Engine's life.
func (a *admissionActor) spawnChildren(ctx actor.Context) {
	if a.withDedup {
		props := dedup.NewActor(a.engine.clk, a.engine.logger).Configure(actor.WithMailbox(newMailbox))
		a.engine.dedup = ctx.Spawn(props)
	}
	tab := a.state.tab
	for i := range tab.Len() {
		name := tab.Name(classes.Class(i + 1))
		props, tel := classes.NewLeaseActor[*Lease](name, a.engine.clk)
		a.children = append(a.children, ctx.Spawn(props))
		a.telemetry = append(a.telemetry, tel)
	}
}

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
	case *remoteJob:
		s.verdict(m)
	case *parkMsg:
		s.unpark(m)
	case *bookedOverrun:
		s.booked()
	case *feedbackRequest:
		s.feedback(&m.f)
		m.done <- struct{}{}
	case *usageRequest:
		m.result, m.err = s.applyUsage(m.l, m.usage, m.progressive)
		m.done <- struct{}{}
	case *abandonRequest:
		m.result = s.abandon(m.l, admission.AbandonManual)
		m.done <- struct{}{}
	case *endDeadlineRequest:
		s.stopDeadline(m.l)
		m.done <- struct{}{}
	case *classes.DeadlineExpired[*Lease]:
		s.abandon(m.Lease, admission.AbandonDeadline)
	case *dedup.Joined:
		s.dedupJoined(m)
	case *actor.Started:
		a.spawnChildren(ctx)
	case *cancelMsg:
		s.cancel(m)
	case *timeoutMsg:
		s.timeout(m)
	case *holdMsg:
		a.holdFired(m)
	case *wouldAdmitRequest:
		s.wouldAdmitRequest(m)
		m.done <- struct{}{}
	case *statsRequest:
		m.result = s.stats(a.external())
		m.done <- struct{}{}
	case *limitsRequest:
		m.result = s.limits.Clone()
		m.done <- struct{}{}
	case *applyRequest:
		m.result, m.err = s.applyLimits(m)
		m.done <- struct{}{}
	case *closeRequest:
		s.close()
		m.done <- struct{}{}
	case *syncRequest:
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
		for _, child := range a.children {
			ctx.Stop(child)
		}
		a.eventsOff = true
		// In order behind every event emitted so far.
		m.flushed = make(chan struct{})
		ctx.Send(a.engine.events, &flushMsg{done: m.flushed})
		s.silence()
		a.engine.timing.Store(false)
		m.done <- struct{}{}
	}
}

// recovered answers the sender of a message whose handler panicked, so no
// caller waits forever. The state keeps whatever the handler had done.
func (a *admissionActor) recovered(msg any, p any) {
	err := fmt.Errorf("%w: panic handling %T: %v", ErrInternal, msg, p)
	a.engine.log(slog.LevelError, "bulkhead: recovered panic in admission actor", "error", err)
	var done chan struct{}
	switch m := msg.(type) {
	case *AcquireRequest:
		a.failRequest(m, err)
		return
	case *remoteJob:
		a.failRequest(m.r, err)
		return
	case *parkMsg:
		if m.r.gen == m.gen { // not a message for an earlier use
			a.failRequest(m.r, err)
		}
		return
	case interface{ fail(error) chan struct{} }:
		done = m.fail(err)
	}
	if done != nil && len(done) == 0 {
		done <- struct{}{}
	}
}

// failRequest answers r with err when the engine holds it nowhere: not
// answered, not queued, not parked on its timer, not waiting for a remote
// verdict (those are answered when they leave).
func (a *admissionActor) failRequest(r *AcquireRequest, err error) {
	if !r.answered && !r.queued && !r.parked && !r.checking {
		r.Err = err
		a.state.answer(r)
	}
}

func (a *admissionActor) subscribe(m *subscribeRequest) {
	if !a.eventsOff {
		a.countListeners(m.sub, +1)
		a.ctx.Send(a.engine.events, m.sub)
	}
	m.done <- struct{}{}
}

func (a *admissionActor) unsubscribe(m *unsubscribeMsg) {
	if !a.eventsOff {
		a.countListeners(m.sub, -1)
		a.ctx.Send(a.engine.events, m)
	}
}

// countListeners adds delta to the listener count of each event kind sub
// listens for, and keeps the facade's timing switch in step.
func (a *admissionActor) countListeners(sub *subscription, delta int) {
	a.engine.timing.Store(a.state.listen(sub.kinds, delta))
}

// log writes one record to the engine's logger.
func (e *Engine) log(level slog.Level, msg string, args ...any) {
	e.logger.Log(context.Background(), level, msg, args...)
}

// guardedHandler passes records to the caller's handler and swallows a
// panic in it: a broken logger loses its records, never the engine's state
// or its event delivery.
type guardedHandler struct{ h slog.Handler }

func (g guardedHandler) Enabled(ctx context.Context, l slog.Level) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return g.h.Enabled(ctx, l)
}

func (g guardedHandler) Handle(ctx context.Context, r slog.Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("bulkhead: log handler panicked: %v", p)
		}
	}()
	return g.h.Handle(ctx, r)
}

func (g guardedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return guardedHandler{g.h.WithAttrs(attrs)}
}

func (g guardedHandler) WithGroup(name string) slog.Handler {
	return guardedHandler{g.h.WithGroup(name)}
}

// Backlog returns the number of events emitted and not yet delivered.
func (e *Engine) Backlog() int64 { return e.backlog.Load() }

// LogError logs an error record through the engine's guarded logger.
func (e *Engine) LogError(msg string, args ...any) { e.log(slog.LevelError, msg, args...) }
