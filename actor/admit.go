package actor

import (
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// Admission: a new call's way through the stages to a slot, a place in the
// queue or a rejection; provisional admissions, which the remote stages'
// verdict confirms or rolls back; and WouldAdmit's advisory answer.

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
	case s.checkRetry(r):
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
	if s.checkCooldown(r) {
		return
	}
	if why, cons := s.checkCapacity(r.Priority, r.Reservation.Reserved, r.Class, false); why != admission.NoReason {
		if s.mayWait(r.Priority, r.Reservation.Reserved, r.Class) {
			if s.bookTurn(r) {
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
	ahead := s.q.ahead(r.Class, r.Priority, r.Retry, s.apartNow())
	if s.inFlight >= s.limits.MaxConcurrent || ahead {
		// It would wait: a call the queue has no room for is turned away
		// before it books a paced turn.
		if why := s.gateReason(); why != admission.NoReason {
			s.refuse(r, why, true, s.globalConstraint())
			return
		}
	}
	if s.bookTurn(r) {
		return
	}
	if ahead && (s.q.wait || s.inFlight < s.limits.MaxConcurrent) {
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

// admit commits a request whose slot is already granted. A request with
// remote stages to pass is only held, provisional: it is counted and
// announced by confirm once they admit it.
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
	s.countRetry(l, r)
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
	s.admissions.Admitted++
	if l.retry {
		s.retries[l.classID]++
	}
	if s.hasBudget {
		s.ledger.Reserved = admission.AddSat(s.ledger.Reserved, l.held)
	}
	s.tab.Count(l.classID, l.held, l.Resources)
	if l.deadline > 0 {
		// The class's child actor owns the deadline; it tells us if it
		// fires before the admission ends.
		s.fx.tell(l.classID, &classes.StartDeadline[*Lease]{Lease: l, At: s.fx.now().Add(l.deadline)})
	}
	if s.listeners[admission.EventAdmit] > 0 {
		ev := leaseEvent(admission.EventAdmit, l)
		ev.Timing = l.timing
		s.fx.emit(ev)
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
	s.uncountRetry(l)
	held := l.held
	if s.hasBudget {
		s.tokens -= held
	}
	s.tab.Unhold(l.classID, held)
	l.held = 0
	err := s.rejectOutside(l.Request, l.Priority, l.Reservation, l.classID, why, ext, cause, l.timing)
	if l.shadow.Has(why) {
		// Observe mode: refused after admission's own checks passed, so a
		// race bypass, as for a queued call refused by its postcheck.
		// It runs against the provider all the same: the headroom it
		// spent stays spent.
		l.released, l.deadline, l.expired = false, 0, nil
		s.bypassLease(l, why, true, err.(*admission.RejectedError).Detail)
		err = nil
	} else {
		s.cool.head.refund(l.model, l.Reservation.Reserved, l.headGen)
	}
	l.headGen = 0
	s.pump()
	return err
}

// rejectOutside counts and announces the rejection of a call for a check
// made outside the engine, and returns it.
func (s *state) rejectOutside(req any, p admission.Priority, res admission.Reservation, c classes.Class, why admission.Reason, ext *admission.External, cause error, t admission.Timing) error {
	d := s.detail(p, res.Reserved, c, "")
	if ext != nil {
		d.Constraint, d.Rate, d.Fleet, d.NeverFits = ext.Constraint, ext.Rate, ext.Fleet, ext.NeverFits
		d.Cooldown, d.RetryBudget = ext.Cooldown, ext.Retry
	}
	s.rejected(req, p, res, c, why, d, t)
	return &admission.RejectedError{Reason: why, Detail: d, Cause: cause}
}

// rejected counts the rejection of a call for why, in class c, and
// announces it with d, the capacity snapshot it was decided on (nil for a
// dedup follower, which never reached the gate).
func (s *state) rejected(req any, p admission.Priority, res admission.Reservation, c classes.Class, why admission.Reason, d *admission.RejectDetail, t admission.Timing) {
	s.admissions.Rejected[why]++
	s.tab.Reject(c, why)
	if s.listeners[admission.EventReject] > 0 {
		s.fx.emit(newEvent(admission.Event{Kind: admission.EventReject, Request: req, Revision: s.limits.Revision, Priority: p,
			Class: s.tab.Name(c), Reservation: res, Reason: why, Detail: d, Timing: t}))
	}
}

// reject answers r with a rejection. atGate counts it as a gate-level one;
// constraint names the limit it hit (with classes). A queued observe-mode
// call whose rejection its mode shadows is then bypassed (a race bypass),
// unless its context has ended.
func (s *state) reject(r *AcquireRequest, why admission.Reason, atGate bool, cause error, constraint admission.Constraint) {
	if atGate {
		s.gate.Rejected[why]++
	}
	d := s.detail(r.Priority, r.Reservation.Reserved, r.Class, constraint)
	s.rejected(r.Request, r.Priority, r.Reservation, r.Class, why, d, s.timing(r))
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

// wouldAdmit answers an advisory question without changing anything: why
// a call of class c and priority p reserving res, a retry or not, would be
// turned away
// (NoReason: it would be admitted, or would queue), with the capacity
// snapshot when asked for.
func (s *state) wouldAdmit(c classes.Class, p admission.Priority, res admission.Reservation, retry, detail bool) (admission.Reason, *admission.RejectDetail) {
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
		case s.inFlight >= s.limits.MaxConcurrent || s.q.ahead(c, p, retry, s.apartNow()):
			if why = s.gateReason(); why != admission.NoReason {
				cons = s.globalConstraint()
			}
		}
	}
	if !detail {
		return why, nil
	}
	return why, s.detail(p, res.Reserved, c, cons)
}
