package actor

import (
	"math"
	mrand "math/rand/v2"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// effects is everything the state machine asks of the world outside it:
// the time, and the effects of its decisions. The admission actor
// implements it; the state machine's tests record the calls instead.
// None of the methods may call back into the state.
type effects interface {
	// now reads the clock.
	now() time.Time
	// emit hands an event to the listeners.
	emit(ev any)
	// tell sends msg to the child actor of class c.
	tell(c classes.Class, msg any)
	// armTimer starts r's queue timeout: once r.QueueTimeout has passed,
	// a timeoutMsg for r's current generation comes back to the state.
	armTimer(r *AcquireRequest)
	// stopTimer stops r's queue timeout, if one runs.
	stopTimer(r *AcquireRequest)
	// armHold makes a holdMsg come back to the state once d has passed,
	// unless one is due sooner; stopHold stops that.
	armHold(d time.Duration)
	stopHold()
	// answer hands r's answer (r.Err, and r.Lease when admitted) to its
	// caller, who may reuse r at once.
	answer(r *AcquireRequest)
	// armPark makes a parkMsg for r's current generation and park seq
	// come back once d has passed (r.timer holds it).
	armPark(r *AcquireRequest, d time.Duration)
	// armCooldown arms the hold timer (as armHold) for paced call r, which
	// waits d in the cooling line.
	armCooldown(r *AcquireRequest, d time.Duration)
	// startRemote runs j's remote stages off the actor; j comes back as
	// the message with its verdict.
	startRemote(j *remoteJob)
	// fleetRelease and fleetAdjust send l's fleet hold's end or new value
	// to the pool (they never block).
	fleetRelease(l *Lease)
	fleetAdjust(l *Lease, held, seq int64, abandoned bool)
	// bookRemote settles a release on rates kept in Redis, off the actor:
	// deltas are the members' corrections (see rateStage.deltas).
	bookRemote(rs *rateStage, set *rateSet, deltas []float64, l *Lease)
	// warn logs a warning.
	warn(msg string, args ...any)
	// answerDrain hands d's result to its caller.
	answerDrain(d *drainRequest)
	// expire tells the holder of l that its borrowed-slot deadline expired
	// and its slot was abandoned.
	expire(l *Lease)
	// drifted logs that an in-flight count was found out of balance: got
	// is the value it would have taken; args name where (a class).
	drifted(quantity string, got int64, args ...any)
}

// external is what the statistics need from outside the state machine:
// counters that the engine and the class actors keep, passed in by the
// actor when it asks for them.
type external struct {
	doubleReleases int64
	listenerPanics int64
	// deadlines is each class actor's deadline counts, by class handle - 1.
	deadlines []admission.DeadlineStats
}

// state is the admission state machine. Only the admission actor touches
// it, one message at a time. It is pure: its methods never block, never
// call user code, start no timer and read no clock or shared counter; time
// and every effect of a decision go through fx.
type state struct {
	fx  effects
	ids *mrand.ChaCha8

	limits    admission.Limits
	hasBudget bool
	closed    bool

	// The gate.
	inFlight int
	q        queue
	pending  int

	// The admission layer.
	calls  int64 // admitted - released
	tokens int64 // tokens held by admitted calls, provisional ones included
	// provisional counts the admissions waiting for the facade's verdict
	// (AcquireRequest.Confirm): Drain waits for them too.
	provisional int64

	gate       admission.GateStats
	gateByWhy  [admission.NumReasons]int64
	callStats  admission.CallStats
	callsByWhy [admission.NumReasons]int64
	abandoned  [2]int64
	budget     admission.BudgetStats

	// Observe mode: calls run without admission.
	observe     admission.ObserveStats
	bypassByWhy [admission.NumReasons]int64

	listeners [NumKinds]int
	drains    []*drainRequest

	// drift counts the global gauges found out of balance; the class
	// table counts its own.
	drift int64

	// tab is the admission class table, nil without classes.
	tab *classes.Table

	// The stages beyond capacity (stages.go): model is the bulkhead's own
	// model; cool the cool-downs and headroom reports; adapt the adaptive
	// limit, rates the rate limits and fleet the fleet pool, nil when the
	// bulkhead has none. The paced calls waiting outside the queue
	// (nparked of them) stand in turns, each waiting for its turn on its
	// own timer, or in cooling, in the order they came (arrivals numbers
	// the calls), waiting for a cool-down to end before their turns, on
	// the hold timer; checking counts the calls whose paced turn a remote
	// store is deciding.
	model    string
	cool     cooling
	adapt    *adapting
	rates    *rateStage
	fleet    *fleetStage
	turns    line
	cooling  line
	nparked  int
	arrivals uint64
	checking int
	// booking counts the overruns being booked on rates kept in Redis,
	// after their release: Drain waits for them.
	booking int
}

// newState returns the state machine for limits (assumed valid but for
// the class table, which it validates) and the queue policy qp, with its
// effects going to fx and admission IDs drawn from a generator seeded with
// seed.
func newState(limits admission.Limits, qp QueuePolicy, sc stageConfig, fx effects, seed [32]byte) (*state, error) {
	s := &state{
		fx:        fx,
		ids:       mrand.NewChaCha8(seed),
		limits:    limits.Clone(),
		hasBudget: limits.TokenBudget != nil,
		model:     sc.model,
		cool:      newCooling(sc.shed),
		adapt:     newAdapting(sc.adaptive),
		rates:     newRateStage(sc.rates),
	}
	if sc.fleet != nil {
		s.fleet = &fleetStage{pool: sc.fleet}
	}
	if limits.Classes != nil {
		tab, err := classes.New("Config.Classes", *limits.Classes, limits)
		if err != nil {
			return nil, err
		}
		s.tab = tab
		tab.OnDrift(func(class, quantity string, got int64) {
			fx.drifted(quantity, got, "class", class)
		})
		c := tab.Classes()
		s.limits.Classes = &c
	}
	q, err := newQueue(qp, s.tab.Len(), s.tab)
	if err != nil {
		return nil, err
	}
	s.q = q
	return s, nil
}

// newID mints a random version 4 UUID.
func (s *state) newID() admission.ID {
	var id admission.ID
	_, _ = s.ids.Read(id[:])
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}

// effectiveBudget is the budget a call of priority p may fill.
func (s *state) effectiveBudget(p admission.Priority) int64 {
	b := s.limits.TokenBudget
	if p == admission.High {
		return b.Budget
	}
	return max(0, b.Budget-b.HighPriorityReserve)
}

// capacity is the global view the class checks take. slotHeld says the
// deciding call's own slot is already counted in inFlight (the postcheck).
func (s *state) capacity(p admission.Priority, slotHeld bool) classes.Capacity {
	g := classes.Capacity{MaxConcurrent: s.limits.MaxConcurrent, InFlight: s.inFlight, SlotHeld: slotHeld, InFlightTokens: s.tokens}
	if s.hasBudget {
		g.Budget = s.effectiveBudget(p)
	}
	return g
}

// checkCapacity runs the capacity checks other than the gate itself, in
// SPEC F17's order (global budget, then the class checks), and returns the
// reason and constraint of the first that fails, or NoReason.
func (s *state) checkCapacity(p admission.Priority, reserved int64, c classes.Class, slotHeld bool) (admission.Reason, admission.Constraint) {
	if s.hasBudget && admission.Exceeds(s.tokens, reserved, s.effectiveBudget(p)) {
		return admission.BudgetLimit, s.globalConstraint()
	}
	if s.tab == nil {
		return admission.NoReason, ""
	}
	return s.tab.Check(c, s.capacity(p, slotHeld), reserved)
}

// globalConstraint is the constraint of a rejection by a global limit: set
// only when the bulkhead has classes.
func (s *state) globalConstraint() admission.Constraint {
	if s.tab == nil {
		return ""
	}
	return admission.ConstraintGlobal
}

// gateReason is the gate's answer for a call that finds no free slot, or
// NoReason when it may wait.
func (s *state) gateReason() admission.Reason {
	switch {
	case s.limits.MaxConcurrent == 0 || s.limits.MaxQueue == 0:
		return admission.ConcurrencyLimit
	case s.pending >= s.limits.MaxQueue:
		return admission.QueueLimit
	}
	return admission.NoReason
}

// detail snapshots capacity for a call of priority p and class c needing
// reserved tokens.
func (s *state) detail(p admission.Priority, reserved int64, c classes.Class, constraint admission.Constraint) *admission.RejectDetail {
	d := &admission.RejectDetail{
		LimitRevision: s.limits.Revision,
		Constraint:    constraint,
		InFlight:      s.inFlight,
		MaxConcurrent: s.limits.MaxConcurrent,
		Pending:       s.pending,
		MaxQueue:      s.limits.MaxQueue,
	}
	if s.hasBudget {
		eff := s.effectiveBudget(p)
		d.TokenBudget = &admission.BudgetDetail{
			Budget:          s.limits.TokenBudget.Budget,
			InFlightTokens:  s.tokens,
			EffectiveBudget: eff,
			Available:       max(0, eff-s.tokens),
			Requested:       reserved,
		}
	}
	if s.tab != nil {
		d.SharedCapacity, d.Class = s.tab.Detail(c, s.capacity(p, false), reserved)
	}
	return d
}

// acquire decides a new request: admit, queue or reject.
func (s *state) acquire(r *AcquireRequest) {
	r.answered = false // a new use of a pooled request
	s.arrivals++
	r.arrival = s.arrivals
	switch {
	case r.Follower != admission.NoReason:
		s.rejectFollower(r)
		return
	case s.closed:
		s.reject(r, admission.Shutdown, true, nil, "")
		return
	case r.ended != nil:
		s.reject(r, admission.Aborted, true, r.ended, "")
		return
	case r.gone != nil:
		s.reject(r, admission.Aborted, true, r.gone, "")
		return
	}
	if _, err := s.rateSet(r); err != nil {
		r.Err = err // a rate the store cannot name: invalid input, counted nowhere
		s.answer(r)
		return
	}
	s.proceed(r)
}

// proceed runs r's stages from where it stands: a new call from the
// start, a parked one from after its wait.
func (s *state) proceed(r *AcquireRequest) {
	if s.cooldownStage(r) {
		return
	}
	if why, cons := s.checkCapacity(r.Priority, r.Reservation.Reserved, r.Class, false); why != admission.NoReason {
		if s.mayWait(r.Priority, r.Reservation.Reserved, r.Class) {
			if s.turnStage(r) {
				return
			}
			s.enqueue(r)
			return
		}
		s.refuse(r, why, false, cons)
		return
	}
	if d := s.holdFor(r); d > 0 {
		// Held back (a provider's cool-down): it waits in the queue; with
		// no room there, it is turned away.
		if s.gateReason() != admission.NoReason {
			dd, _, _ := s.cool.left(r.Model, r.Reservation.Reserved, s.fx.now(), false)
			s.rejectCooldown(r, dd)
			return
		}
		s.markHeld(r)
		s.enqueue(r)
		s.fx.armHold(d)
		return
	}
	if s.inFlight >= s.limits.MaxConcurrent || s.q.ahead(r.Class, r.Priority) {
		// It would wait: a call the queue has no room for is turned away
		// before it books a paced turn.
		if why := s.gateReason(); why != admission.NoReason {
			s.refuse(r, why, true, s.globalConstraint())
			return
		}
	}
	if s.turnStage(r) {
		return
	}
	if s.q.ahead(r.Class, r.Priority) && (s.q.wait || s.inFlight < s.limits.MaxConcurrent) {
		// First in, first out within a class: a call that fits waits behind
		// its class's waiters, which wait for capacity or are held back.
		if why := s.gateReason(); why != admission.NoReason {
			s.refuse(r, why, true, s.globalConstraint())
			return
		}
		s.enqueue(r)
		s.pump()
		return
	}
	if s.inFlight < s.limits.MaxConcurrent {
		s.grantSlot()
		if s.grantStages(r) {
			s.admit(r)
		}
		return
	}
	if why := s.gateReason(); why != admission.NoReason {
		s.refuse(r, why, true, s.globalConstraint())
		return
	}
	s.enqueue(r)
}

// refuse turns a new call away for a capacity reason: observe mode
// bypasses it at once when it shadows why, without a rejection; otherwise
// it is rejected.
func (s *state) refuse(r *AcquireRequest, why admission.Reason, atGate bool, constraint admission.Constraint) {
	if r.Shadow.Has(why) {
		s.bypass(r, why, false, s.detail(r.Priority, r.Reservation.Reserved, r.Class, constraint))
		return
	}
	s.reject(r, why, atGate, nil, constraint)
}

// mayWait reports whether a call of priority p and class c reserving
// reserved tokens, which fails a capacity check now, may wait in the queue
// for capacity: the bulkhead lets calls wait for capacity, the queue has
// room, and the call could fit these limits at all.
func (s *state) mayWait(p admission.Priority, reserved int64, c classes.Class) bool {
	return s.q.wait && s.gateReason() == admission.NoReason && !s.unfittable(p, reserved, c)
}

// unfittable reports whether a call of priority p and class c reserving
// reserved tokens can never be admitted under the current limits, however
// long it waits.
func (s *state) unfittable(p admission.Priority, reserved int64, c classes.Class) bool {
	return s.detail(p, reserved, c, "").Unfittable()
}

func (s *state) grantSlot() {
	s.inFlight++
	s.gate.Admitted++
}

func (s *state) returnSlot() {
	s.inFlight--
	s.gate.Released++
}

// admit commits a request whose slot is already granted. A request made
// with Confirm is only held: it is counted and announced by confirm.
func (s *state) admit(r *AcquireRequest) {
	reserved := r.Reservation.Reserved
	if s.hasBudget {
		s.tokens += reserved // fits: the budget check passed
	}
	l := r.Lease
	l.ID = s.newID()
	l.Revision = s.limits.Revision
	l.Priority = r.Priority
	l.Reservation = r.Reservation
	l.Request = r.Request
	l.held = reserved
	l.classID = r.Class
	l.Class = s.tab.Name(r.Class)
	l.Resources = s.tab.Hold(r.Class, reserved)
	l.deadline = 0
	if r.BorrowedDeadline > 0 && l.Resources.BorrowedConcurrency {
		// Fixed now, as every field the caller reads; the timer starts
		// when the admission is counted.
		l.deadline = r.BorrowedDeadline
		l.expired = make(chan struct{})
	}
	l.timing = s.timing(r)
	l.shadow = r.Shadow
	s.noteGrant(l)
	s.q.served(r.Class, reserved)
	if set, remote := s.remoteStages(r); remote {
		// Provisional until the remote stages' verdict: the caller is
		// answered then.
		l.provisional = true
		s.provisional++
		r.checking = true
		s.fx.startRemote(&remoteJob{r: r, kind: remoteAdmit, set: set, fleet: s.fleet, rates: s.rates})
		return
	}
	l.provisional = false
	s.count(l)
	r.Err = nil
	s.answer(r)
}

// count counts and announces admission l, and starts its borrowed-slot
// deadline.
func (s *state) count(l *Lease) {
	s.calls++
	s.callStats.Admitted++
	if s.hasBudget {
		s.budget.TotalReserved = admission.AddSat(s.budget.TotalReserved, l.held)
	}
	s.tab.Count(l.classID, l.held, l.Resources)
	if l.deadline > 0 {
		// The class's child actor owns the deadline; it tells us if it
		// fires before the admission ends.
		s.fx.tell(l.classID, &classes.StartDeadline[*Lease]{Lease: l, At: s.fx.now().Add(l.deadline)})
	}
	if s.listeners[KindAdmit] > 0 {
		s.fx.emit(&admission.AdmitEvent{
			Request:        l.Request,
			AdmissionID:    l.ID,
			LimitRevision:  l.Revision,
			Priority:       l.Priority,
			Class:          l.Class,
			ReservedTokens: l.held,
			Resources:      l.Resources,
			Timing:         l.timing,
		})
	}
}

// confirm makes provisional admission l an admission like any other.
func (s *state) confirm(l *Lease) {
	if !l.provisional {
		return
	}
	l.provisional = false
	s.provisional--
	s.count(l)
}

// rollback turns provisional admission l down for why: the slot, the
// tokens and the headroom it spent go back, and the call is counted and
// announced as a rejection (a rejection changes no token counter: the hold
// was never counted as reserved). It returns the rejection, or nil when
// observe mode bypasses the call instead (l.Bypass is then set; the call
// still reaches the provider, so its headroom stays spent).
func (s *state) rollback(l *Lease, why admission.Reason, ext *admission.External, cause error) error {
	if !l.provisional {
		return admission.Invalidf("Lease", "is not a provisional admission")
	}
	l.provisional, l.released = false, true
	s.provisional--
	s.returnSlot()
	s.q.unserve(l.classID, l.Reservation.Reserved)
	held := l.held
	if s.hasBudget {
		s.tokens -= held
	}
	s.tab.Unhold(l.classID, held)
	l.held = 0
	err := s.rejectOutside(l.Request, l.Priority, l.Reservation.Reserved, l.classID, why, ext, cause, l.timing)
	if l.shadow.Has(why) {
		// Observe mode: refused after admission's own checks passed, so a
		// race bypass, as for a queued call refused by its postcheck.
		// It runs against the provider all the same: the headroom it
		// spent stays spent.
		l.released, l.deadline, l.expired = false, 0, nil
		s.bypassLease(l, why, true, err.(*admission.RejectedError).Detail)
		err = nil
	} else {
		s.cool.refund(l.model, l.Reservation.Reserved, l.headGen)
	}
	l.headGen = 0
	s.pump()
	return err
}

// rejectOutside counts and announces the rejection of a call for a check
// made outside the engine, and returns it.
func (s *state) rejectOutside(req any, p admission.Priority, reserved int64, c classes.Class, why admission.Reason, ext *admission.External, cause error, t admission.Timing) error {
	s.callStats.Rejected++
	s.callsByWhy[why]++
	s.tab.Reject(c, why)
	d := s.detail(p, reserved, c, "")
	if ext != nil {
		d.Constraint, d.Rate, d.Fleet, d.NeverFits = ext.Constraint, ext.Rate, ext.Fleet, ext.NeverFits
		d.Cooldown = ext.Cooldown
	}
	if s.listeners[KindReject] > 0 {
		s.fx.emit(&admission.RejectEvent{
			Request:       req,
			Reason:        why,
			LimitRevision: d.LimitRevision,
			Detail:        d,
			Priority:      p,
			Class:         s.tab.Name(c),
			Timing:        t,
		})
	}
	return &admission.RejectedError{Reason: why, Detail: d, Cause: cause}
}

// reject answers r with a rejection. atGate counts it as a gate-level one;
// constraint names the limit it hit (with classes). A queued observe-mode
// call whose rejection its mode shadows is then bypassed (a race bypass),
// unless its context has ended.
func (s *state) reject(r *AcquireRequest, why admission.Reason, atGate bool, cause error, constraint admission.Constraint) {
	if atGate {
		s.gate.Rejected++
		s.gateByWhy[why]++
		switch why {
		case admission.Aborted:
			s.gate.Aborted++
		case admission.Timeout:
			s.gate.TimedOut++
		}
	}
	s.callStats.Rejected++
	s.callsByWhy[why]++
	s.tab.Reject(r.Class, why)
	d := s.detail(r.Priority, r.Reservation.Reserved, r.Class, constraint)
	if s.listeners[KindReject] > 0 {
		s.fx.emit(&admission.RejectEvent{
			Request:       r.Request,
			Reason:        why,
			LimitRevision: d.LimitRevision,
			Detail:        d,
			Priority:      r.Priority,
			Class:         s.tab.Name(r.Class),
			Timing:        s.timing(r),
		})
	}
	if r.Shadow.Has(why) && !r.ctxEnded() {
		s.bypass(r, why, true, d)
		return
	}
	r.Err = &admission.RejectedError{Reason: why, Detail: d, Cause: cause}
	s.answer(r)
}

// answer replies to r. It first settles the engine's own fields, since the
// facade may reuse r as soon as the reply is sent: a new generation, so any
// timer message still in flight for this use is ignored, and the stages'
// marks cleared for the next use.
func (s *state) answer(r *AcquireRequest) {
	r.gen++
	r.enqueuedAt = time.Time{}
	r.turned, r.paced, r.held, r.set, r.setDone, r.gone = false, false, false, nil, false, nil
	r.answered = true
	s.fx.answer(r)
}

// timing measures a decision that ends now. It reads the clock only when
// the facade asked for timing.
func (s *state) timing(r *AcquireRequest) admission.Timing {
	if r.Start.IsZero() {
		return admission.Timing{}
	}
	now := s.fx.now()
	if r.enqueuedAt.IsZero() {
		return admission.Timing{DecisionDuration: now.Sub(r.Start), RateWait: r.RateWait}
	}
	// A request that queued waited from enqueue to now; its own work was
	// what came before the enqueue (the work after the grant is this call).
	wait := now.Sub(r.enqueuedAt)
	return admission.Timing{DecisionDuration: r.enqueuedAt.Sub(r.Start), QueueWait: wait, RateWait: r.RateWait}
}

func (s *state) enqueue(r *AcquireRequest) {
	r.queued = true
	s.q.push(r)
	s.pending++
	if !r.Start.IsZero() {
		r.enqueuedAt = s.fx.now()
	}
	if r.QueueTimeout > 0 {
		r.queuedAt = s.fx.now()
		s.fx.armTimer(r)
	}
}

// dequeue removes r from the queue and stops its timer.
func (s *state) dequeue(r *AcquireRequest) {
	s.q.remove(r)
	r.queued = false
	s.pending--
	if r.QueueTimeout > 0 {
		s.fx.stopTimer(r)
	}
}

// pump admits waiters while slots are free, then answers waiting Drains if
// the engine is idle. Plain, waiters go in arrival order; fair, the class
// with the lowest virtual token counter goes next. A waiter whose context
// has ended is passed over: its cancel message, with the context's cause, is
// on its way.
func (s *state) pump() {
	s.q.clearBlocked()
	if s.q.fair {
		for s.inFlight < s.limits.MaxConcurrent {
			w := s.q.next()
			if w == nil || !s.serve(w) {
				break
			}
		}
	} else {
		for w := s.q.plain.head; w != nil && s.inFlight < s.limits.MaxConcurrent && !s.q.allBlocked(); {
			next := w.next
			if !w.ctxEnded() && !s.q.blocked[w.Class] && !s.serve(w) {
				break
			}
			w = next
		}
	}
	s.checkDrains()
}

// serve gives waiter w a free slot. A waiter that waits for capacity which
// has not come stays: short of its class's own room (a ceiling, the shared
// pool the floors leave), it holds back its class for the rest of the pump
// (first in, first out within a class); short of a global limit (the token
// budget), it holds back the whole queue, so that no later call, of any
// class, takes the capacity it waits for (serve then returns false). A
// waiter the limits now make unfittable is rejected. Otherwise capacity is
// postchecked with the slot held, as it may have changed while w waited.
func (s *state) serve(w *AcquireRequest) bool {
	if d := s.holdFor(w); d > 0 {
		if w.turned {
			// A paced call whose turn passed as it waited for a slot: it
			// waits the cool-down out in the cooling line and takes a new
			// turn after it (the calls held here would all go at its end).
			w.QueueTimeout = w.queueLeft(s.fx.now())
			s.dequeue(w)
			w.turned, w.enqueuedAt = false, time.Time{}
			s.parkCooling(w, d)
			return true
		}
		// Held back (a provider's cool-down): so is its class, until the
		// time has passed (the other classes' waiters are looked at: those
		// of the same model are held too).
		s.markHeld(w)
		s.fx.armHold(d)
		s.q.block(w.Class)
		return true
	}
	if s.q.wait {
		if why, cons := s.checkCapacity(w.Priority, w.Reservation.Reserved, w.Class, false); why != admission.NoReason {
			if !s.unfittable(w.Priority, w.Reservation.Reserved, w.Class) {
				if cons == "" || cons == admission.ConstraintGlobal {
					return false
				}
				s.q.block(w.Class)
				return true
			}
			s.dequeue(w)
			s.reject(w, why, false, nil, cons)
			return true
		}
	}
	s.dequeue(w)
	s.grantSlot()
	if why, cons := s.checkCapacity(w.Priority, w.Reservation.Reserved, w.Class, true); why != admission.NoReason {
		s.returnSlot()
		s.reject(w, why, false, nil, cons)
	} else if s.grantStages(w) {
		s.admit(w)
	}
	return true
}

// cancel withdraws a waiter whose context ended. A request that was already
// answered is left alone: its answer stands.
func (s *state) cancel(m *cancelMsg) {
	r := m.r
	if r.parked {
		s.endPark(r, s.fx.now())
		s.reject(r, admission.Aborted, true, m.cause, "")
		s.checkDrains()
		return
	}
	if !r.queued {
		if r.checking || !r.answered {
			// A remote stage decides it, and its verdict answers it; or
			// the request is still on its way (AcquireAsync's watch fired
			// as it was sent), and is turned away as it arrives.
			r.gone = m.cause
		}
		return // else answered
	}
	s.dequeue(r)
	s.reject(r, admission.Aborted, true, m.cause, "")
	s.unblocked(r)
}

// unblocked runs after waiter r left the queue other than by admission:
// the queue is looked at again, as r may have held back the calls behind
// it (a waiter for capacity, or one held by a cool-down, holds back its
// class), and those it held back may be due an answer now (a cool-down
// extended past what is left of their queue timeout turns them away). With
// every slot taken, that is one comparison.
func (s *state) unblocked(*AcquireRequest) { s.pump() }

// timeout ends a waiter whose queue timeout fired.
func (s *state) timeout(m *timeoutMsg) {
	if m.r.gen != m.gen || !m.r.queued {
		return // answered before the timer's message arrived
	}
	s.dequeue(m.r)
	s.reject(m.r, admission.Timeout, true, nil, s.globalConstraint())
	s.unblocked(m.r)
}

// release settles a lease.
func (s *state) release(m *releaseMsg) {
	l := m.l
	if l.released {
		return
	}
	if l.Bypass != nil {
		s.endBypass(m)
		return
	}
	if l.provisional {
		s.confirm(l) // a caller releases only what it was given; never lose a count
	}
	l.released = true
	if !l.abandoned {
		s.returnSlot()
		s.endDeadline(l)
	}
	s.calls--
	s.callStats.Released++
	held, refunded := l.held, int64(0)
	m.settleUsage()
	settled := classes.Settlement{Held: held, SlotAbandoned: l.abandoned}
	if s.hasBudget {
		if m.hasUsage {
			actual := m.usage.Total()
			s.budget.TotalConsumed = admission.AddSat(s.budget.TotalConsumed, actual)
			if actual < held {
				refunded = held - actual
				s.budget.TotalRefunded = admission.AddSat(s.budget.TotalRefunded, refunded)
			}
			settled.Consumed, settled.Refunded = actual, refunded
		}
		if held > s.tokens {
			s.drift++
			s.fx.drifted("in-flight tokens", s.tokens-held)
			s.tokens = 0
		} else {
			s.tokens -= held
		}
	}
	s.tab.Release(l.classID, settled)
	l.held = 0
	s.releaseStages(l, m)
	if s.listeners[KindRelease] > 0 {
		s.fx.emit(&admission.ReleaseEvent{
			Request:        l.Request,
			AdmissionID:    l.ID,
			LimitRevision:  l.Revision,
			Priority:       l.Priority,
			Class:          l.Class,
			ReservedTokens: l.Reservation.Reserved,
			Resources:      l.Resources,
			HeldTokens:     held,
			RefundedTokens: refunded,
			UsageSequence:  l.sequence,
			Usage:          m.usageCopy(),
		})
	}
	s.pump() // and answers any Drain this release completed
}

// applyUsage applies a cumulative usage report to a lease and returns the
// report, or why the report is invalid (then nothing changed).
func (s *state) applyUsage(l *Lease, u admission.Usage, p *admission.Progressive) (admission.UsageReport, error) {
	res := l.Reservation
	if p != nil && s.hasBudget && p.RemainingOutput > res.MaxOutput {
		return admission.UsageReport{}, admission.Invalidf("Progressive.RemainingOutput",
			"must not exceed the reserved max output %d, got %d", res.MaxOutput, p.RemainingOutput)
	}
	// Usage is cumulative: no field ever goes down. Clamping the breakdown
	// field by field may leave its parts above their totals; nothing counts
	// them, and Valid checks only the totals.
	u.Input = max(u.Input, l.last.Input)
	u.Output = max(u.Output, l.last.Output)
	u.CachedInput = max(u.CachedInput, l.last.CachedInput)
	u.CacheCreation = max(u.CacheCreation, l.last.CacheCreation)
	u.Reasoning = max(u.Reasoning, l.last.Reasoning)
	if !u.Valid() {
		return admission.UsageReport{}, admission.Invalidf("Usage",
			"cumulative Input + Output overflows int64 (%d + %d, each the larger of this report and the ones before)", u.Input, u.Output)
	}
	rep := admission.UsageReport{
		AdmissionID:   l.ID,
		LimitRevision: l.Revision,
		Class:         l.Class,
		Sequence:      l.sequence,
		Reserved:      res.Reserved,
		Consumed:      u.Total(),
	}
	if s.hasBudget {
		rep.OverReservation = max(0, u.Total()-res.Reserved)
		outputCap, remaining := res.MaxOutput, max(0, res.MaxOutput-u.Output)
		rep.OutputCap, rep.OutputRemaining = &outputCap, &remaining
	}
	if l.released {
		return rep, nil
	}
	if l.Bypass != nil {
		return s.bypassUsage(l, u, p, rep), nil
	}
	hold := l.held
	if s.hasBudget {
		var err error
		if hold, err = newHold(res, u, p); err != nil {
			return admission.UsageReport{}, err
		}
		// The other admissions' holds plus this one must fit too.
		if admission.Exceeds(s.tokens-l.held, hold, math.MaxInt64) {
			return admission.UsageReport{}, admission.Invalidf(usageField(p),
				"the new hold %d would take the in-flight tokens past int64 (%d held by other admissions)", hold, s.tokens-l.held)
		}
	}
	if u == l.last && l.reported && hold == l.held {
		rep.Held = hold
		return rep, nil // stale or duplicate: nothing changes
	}
	prev := l.held
	delta := hold - prev
	if delta > 0 {
		s.budget.TotalOverrun = admission.AddSat(s.budget.TotalOverrun, delta)
	} else {
		s.budget.TotalRefunded = admission.AddSat(s.budget.TotalRefunded, -delta)
	}
	s.tokens += delta
	s.tab.AdjustHold(l.classID, delta)
	l.held, l.last, l.reported = hold, u, true
	l.sequence++
	rep.Sequence, rep.Held = l.sequence, hold
	if s.fleet != nil {
		s.fx.fleetAdjust(l, hold, l.sequence, l.abandoned)
	}
	if s.listeners[KindUsage] > 0 {
		ev := &admission.UsageEvent{
			Request:         l.Request,
			AdmissionID:     l.ID,
			LimitRevision:   l.Revision,
			Priority:        l.Priority,
			Class:           l.Class,
			Sequence:        l.sequence,
			ReservedTokens:  res.Reserved,
			Resources:       l.Resources,
			PreviousHeld:    prev,
			Held:            hold,
			Delta:           delta,
			Usage:           u,
			OutputCap:       rep.OutputCap,
			OutputRemaining: rep.OutputRemaining,
			OverReservation: rep.OverReservation,
		}
		ev.Progressive = copyProgressive(p)
		s.fx.emit(ev)
	}
	if delta < 0 && s.q.wait {
		s.pump() // capacity freed: waiters for it may fit now
	}
	return rep, nil
}

// copyProgressive returns a copy of *p for an event, nil for nil.
func copyProgressive(p *admission.Progressive) *admission.Progressive {
	if p == nil {
		return nil
	}
	pc := *p
	return &pc
}

// newHold is the hold a usage report asks for with a budget: input +
// max(reserved max output, output), or with p, remaining + margin + the
// output beyond the reserved max output. A hold past int64 is an error.
func newHold(res admission.Reservation, u admission.Usage, p *admission.Progressive) (int64, error) {
	if p == nil {
		h, ok := admission.Add(u.Input, max(res.MaxOutput, u.Output))
		if !ok {
			return 0, admission.Invalidf("Usage.Input",
				"%d + the output held (%d) overflows int64", u.Input, max(res.MaxOutput, u.Output))
		}
		return h, nil
	}
	excess := max(0, u.Output-res.MaxOutput)
	h, ok := admission.Add(p.RemainingOutput, p.SafetyMargin)
	if ok {
		h, ok = admission.Add(h, excess)
	}
	if !ok {
		return 0, admission.Invalidf("Progressive.SafetyMargin",
			"RemainingOutput %d + SafetyMargin %d + output beyond the reservation %d overflows int64", p.RemainingOutput, p.SafetyMargin, excess)
	}
	return h, nil
}

// usageField names the input of a report whose hold does not fit.
func usageField(p *admission.Progressive) string {
	if p != nil {
		return "Progressive"
	}
	return "Usage"
}

// wouldAdmit answers an advisory question without changing anything: the
// decision for a call of class c and priority p reserving res, with the
// detail when asked for.
func (s *state) wouldAdmit(c classes.Class, p admission.Priority, res admission.Reservation, detail bool) admission.Decision {
	why, cons := admission.NoReason, admission.Constraint("")
	switch {
	case s.closed:
		why = admission.Shutdown
	default:
		why, cons = s.checkCapacity(p, res.Reserved, c, false)
		switch {
		case why != admission.NoReason:
			if s.mayWait(p, res.Reserved, c) {
				why, cons = admission.NoReason, "" // would wait for capacity
			}
		case s.inFlight >= s.limits.MaxConcurrent || s.q.ahead(c, p):
			if why = s.gateReason(); why != admission.NoReason {
				cons = s.globalConstraint()
			}
		}
	}
	d := admission.Decision{Admit: why == admission.NoReason, Reason: why}
	if detail {
		d.Detail = s.detail(p, res.Reserved, c, cons)
	}
	return d
}

// validateLimits checks a snapshot against the bulkhead's shape and
// returns the class table update it carries, if any.
func (s *state) validateLimits(next admission.Limits) (*classes.Update, error) {
	if err := s.validateGlobal(next); err != nil {
		return nil, err
	}
	switch {
	case next.Classes == nil && s.tab != nil:
		return nil, admission.Invalidf("Limits.Classes", "must be set: the bulkhead has admission classes")
	case next.Classes != nil && s.tab == nil:
		return nil, admission.Invalidf("Limits.Classes", "must be nil: the bulkhead has no admission classes")
	case next.Classes != nil:
		return s.tab.Prepare("Limits.Classes", *next.Classes, next)
	}
	return nil, nil
}

// validateGlobal checks the global part of a snapshot.
func (s *state) validateGlobal(next admission.Limits) error {
	if next.MaxConcurrent < 0 {
		return admission.Invalidf("Limits.MaxConcurrent", "must be >= 0, got %d", next.MaxConcurrent)
	}
	if next.MaxQueue < 0 {
		return admission.Invalidf("Limits.MaxQueue", "must be >= 0, got %d", next.MaxQueue)
	}
	switch b := next.TokenBudget; {
	case b == nil && s.hasBudget:
		return admission.Invalidf("Limits.TokenBudget", "must be set: the bulkhead has a token budget")
	case b != nil && !s.hasBudget:
		return admission.Invalidf("Limits.TokenBudget", "must be nil: the bulkhead has no token budget")
	case b != nil:
		if err := admission.CheckNonNegative("Limits.TokenBudget.Budget", b.Budget); err != nil {
			return err
		}
		if err := admission.CheckNonNegative("Limits.TokenBudget.HighPriorityReserve", b.HighPriorityReserve); err != nil {
			return err
		}
	}
	return nil
}

// applyLimits installs the limits snapshot q asks for, or says why not.
func (s *state) applyLimits(q *applyRequest) (admission.ApplyResult, error) {
	next := q.next
	if q.setBudget {
		if !s.hasBudget {
			return admission.ApplyResult{}, admission.Invalidf("TokenBudget", "the bulkhead has no token budget to set")
		}
		if s.limits.Revision == math.MaxInt64 {
			return admission.ApplyResult{}, admission.Invalidf("Limits.Revision", "is at its maximum; no later revision exists")
		}
		next = s.limits.Clone()
		next.Revision++
		next.TokenBudget.Budget = q.budget
	}
	if next.Revision < 0 {
		return admission.ApplyResult{}, admission.Invalidf("Limits.Revision", "must be >= 0, got %d", next.Revision)
	}
	prev := s.limits.Clone()
	if next.Revision <= s.limits.Revision {
		return admission.ApplyResult{Reason: admission.StaleRevision, Previous: prev, Current: prev}, nil
	}
	update, err := s.validateLimits(next)
	if err != nil {
		return admission.ApplyResult{}, err
	}
	s.limits = next.Clone()
	if update != nil {
		s.tab.Apply(update)
		c := s.tab.Classes()
		s.limits.Classes = &c
	}
	if s.listeners[KindReconfigure] > 0 {
		s.fx.emit(&admission.ReconfigureEvent{Previous: prev, Current: s.limits.Clone()})
	}
	s.rejectUnfittable()
	s.pump()
	return admission.ApplyResult{Applied: true, Previous: prev, Current: s.limits.Clone()}, nil
}

// holdEnded looks again, once a hold's time has passed, at the calls the
// cool-downs hold back: the paced ones waiting before their turns, then
// the queue.
func (s *state) holdEnded() {
	s.wakeCooling()
	s.pump()
}

// rejectUnfittable rejects, after new limits, each waiter for capacity
// that can never fit them, wherever it is in the queue.
func (s *state) rejectUnfittable() {
	if !s.q.wait {
		return
	}
	s.q.each(func(w *AcquireRequest) {
		if w.ctxEnded() {
			return // its cancel message is on its way
		}
		why, cons := s.checkCapacity(w.Priority, w.Reservation.Reserved, w.Class, false)
		if why != admission.NoReason && s.unfittable(w.Priority, w.Reservation.Reserved, w.Class) {
			s.dequeue(w)
			s.reject(w, why, false, nil, cons)
		}
	})
}

// abandon gives back the borrowed slot of a live admission early (F19): the
// slot returns (admitting the next waiter) and the class's in-flight count
// falls, while the token hold stays until release. It is effective once,
// and only for an admission that borrowed its slot.
func (s *state) abandon(l *Lease, cause admission.AbandonCause) bool {
	if l.released || l.abandoned || !l.Resources.BorrowedConcurrency ||
		cause == admission.AbandonDeadline && l.deadlineOff {
		return false
	}
	l.abandoned = true
	s.returnSlot()
	if s.fleet != nil {
		s.fx.fleetAdjust(l, l.held, l.sequence, true)
	}
	s.tab.Abandon(l.classID, cause)
	s.abandoned[cause]++
	s.callStats.Abandoned++
	if cause == admission.AbandonDeadline {
		s.fx.expire(l)
	} else {
		s.endDeadline(l)
	}
	if s.listeners[KindAbandon] > 0 {
		s.fx.emit(&admission.AbandonEvent{
			Request:       l.Request,
			AdmissionID:   l.ID,
			LimitRevision: l.Revision,
			Priority:      l.Priority,
			Class:         l.Class,
			Resources:     l.Resources,
			Reserved:      l.Reservation.Reserved,
			Cause:         cause,
			HeldTokens:    l.held,
		})
	}
	s.pump()
	return true
}

// endDeadline stops l's borrowed-slot deadline, if it has one running.
func (s *state) endDeadline(l *Lease) {
	if l.deadline > 0 {
		s.fx.tell(l.classID, &classes.EndDeadline[*Lease]{Lease: l})
	}
}

// stopDeadline ends l's borrowed-slot deadline before its release, unless
// it has expired already: from now on it never expires.
func (s *state) stopDeadline(l *Lease) {
	if l.released || l.abandoned || l.deadlineOff {
		return
	}
	l.deadlineOff = true
	s.endDeadline(l)
}

// close rejects every waiter and every later call with Shutdown.
func (s *state) close() {
	if s.closed {
		return
	}
	s.closed = true
	s.q.each(func(w *AcquireRequest) {
		s.dequeue(w)
		s.reject(w, admission.Shutdown, true, nil, "")
	})
	s.closeStages()
	s.fx.stopHold() // nothing is held any more
	s.checkDrains()
}

// listen adds delta to the listener count of each kind in kinds, so that
// events are built only for kinds someone listens for, and reports whether
// anyone listens for admit or reject events (which carry decision timing).
func (s *state) listen(kinds Kinds, delta int) (timing bool) {
	for kind, set := range kinds {
		if set {
			s.listeners[kind] += delta
		}
	}
	return s.listeners[KindAdmit]+s.listeners[KindReject] > 0
}

// silence stops the emission of events for good: event delivery is over.
func (s *state) silence() { s.listeners = [NumKinds]int{} }

func (s *state) idle() bool {
	return s.calls == 0 && s.provisional == 0 && s.pending == 0 && s.observe.InFlight == 0 && s.nparked == 0 && s.checking == 0 && s.booking == 0
}

func (s *state) drainResult() admission.DrainResult {
	return admission.DrainResult{Drained: s.idle(), InFlight: int(s.calls+s.provisional) + s.booking, Pending: s.pending + s.nparked + s.checking, Bypassed: int(s.observe.InFlight)}
}

// answerDrain replies to d with the current result.
func (s *state) answerDrain(d *drainRequest) {
	d.result, d.closed = s.drainResult(), s.closed
	s.fx.answerDrain(d)
}

func (s *state) drain(d *drainRequest) {
	if s.idle() {
		s.answerDrain(d)
		return
	}
	s.drains = append(s.drains, d)
}

func (s *state) cancelDrain(d *drainRequest) {
	for i, w := range s.drains {
		if w == d {
			s.drains = append(s.drains[:i], s.drains[i+1:]...)
			s.answerDrain(d)
			return
		}
	}
}

func (s *state) checkDrains() {
	if len(s.drains) == 0 || !s.idle() {
		return
	}
	for _, d := range s.drains {
		s.answerDrain(d)
	}
	s.drains = nil
}

// stats copies the counters, with those kept outside the state from ext.
func (s *state) stats(ext external) admission.Stats {
	st := admission.Stats{Limits: s.limits.Clone(), Gate: s.gate, Calls: s.callStats}
	st.Gate.InFlight = s.inFlight
	st.Gate.Pending = s.pending
	st.Gate.MaxConcurrent = s.limits.MaxConcurrent
	st.Gate.MaxQueue = s.limits.MaxQueue
	st.Gate.Closed = s.closed
	st.Gate.DoubleReleases = ext.doubleReleases
	st.Gate.RejectedByReason = byReason(&s.gateByWhy)
	st.Calls.InFlight = s.calls
	st.Calls.RejectedByReason = byReason(&s.callsByWhy)
	st.Calls.AbandonedByCause = map[admission.AbandonCause]int64{}
	for c, n := range s.abandoned {
		if n > 0 {
			st.Calls.AbandonedByCause[admission.AbandonCause(c)] = n
		}
	}
	if s.tab != nil {
		g := s.capacity(admission.High, false) // High: the whole budget
		st.Classes = s.tab.Stats(g)
		for i, dl := range ext.deadlines {
			name := s.tab.Name(classes.Class(i + 1))
			cs := st.Classes.Classes[name]
			cs.Deadlines = dl
			st.Classes.Classes[name] = cs
		}
		for c := 1; c < len(s.q.waiting); c++ {
			name := s.tab.Name(classes.Class(c))
			cs := st.Classes.Classes[name]
			cs.Pending = s.q.waiting[c]
			st.Classes.Classes[name] = cs
		}
	}
	if s.hasBudget {
		b := s.budget
		b.Budget = s.limits.TokenBudget.Budget
		b.HighPriorityReserve = s.limits.TokenBudget.HighPriorityReserve
		b.InFlightTokens = s.tokens
		b.Available = max(0, b.Budget-s.tokens)
		st.TokenBudget = &b
	}
	st.Observe = s.observe
	st.Observe.BypassedByReason = byReason(&s.bypassByWhy)
	st.ListenerPanics = ext.listenerPanics
	st.LedgerDrift = s.drift + s.tab.Drift()
	st.Cooldown = s.cool.stats(s.fx.now())
	st.Adaptive = s.adaptiveStats()
	st.Fleet = s.fleet.stats()
	if st.Rate = s.rates.stats(); st.Rate != nil {
		st.Rate.Waiting = s.nparked + s.checking
	}
	return st
}

func byReason(counts *[admission.NumReasons]int64) map[admission.Reason]int64 {
	m := make(map[admission.Reason]int64)
	for r, n := range counts {
		if n > 0 {
			m[admission.Reason(r)] = n
		}
	}
	return m
}
