package actor

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/dedup"
	"github.com/llmbulkhead/bulkhead/internal/seam"
)

// The admission actor: the protoactor actor around the state machine. It
// hands each message to the state (Receive) and carries out the state's
// effects: timers, answers, events, the class actors' deadlines and the
// remote stages' workers.

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
}

func (a *admissionActor) now() time.Time { return a.engine.clk.Now() }

func (a *admissionActor) emit(ev *admission.Event) {
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
	seam.Parked(d)
}

// armCooldown arms the hold timer for a paced call that waits d for a
// cool-down to end, in the cooling line.
func (a *admissionActor) armCooldown(_ *AcquireRequest, d time.Duration) {
	a.armHold(d)
	seam.Parked(d)
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
