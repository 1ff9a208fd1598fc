package actor

import (
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// Capacity and the queue: the checks a call must pass against the global
// limits and its class's, the capacity snapshot a rejection carries, and the
// queue's own work: waiters served as capacity frees, withdrawn when their
// context ends, or timed out.

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
		d.TokenBudget = &admission.BudgetDetail{Budget: s.limits.TokenBudget.Budget, EffectiveBudget: s.effectiveBudget(p),
			InFlightTokens: s.tokens, Reserved: reserved}
	}
	if s.tab != nil {
		d.Shared, d.Class, d.WouldBorrow = s.tab.Detail(c, s.capacity(p, false), reserved)
	}
	return d
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

func (s *state) enqueue(r *AcquireRequest) {
	r.queued = true
	if s.q.setsApart(r) {
		r.pushedAt = s.fx.now()
	}
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

// apartNow reads the clock when retries wait apart from first attempts,
// whose order depends on how long they have waited; zero otherwise.
func (s *state) apartNow() time.Time {
	if s.q.apart > 0 {
		return s.fx.now()
	}
	return time.Time{}
}

// pump admits waiters while slots are free, then answers waiting Drains if
// the engine is idle. Plain, waiters go in arrival order; fair, the class
// with the lowest virtual token counter goes next; either way, first
// attempts go ahead of retries until these have waited their aging. A
// waiter whose context has ended is passed over: its cancel message, with
// the context's cause, is on its way.
func (s *state) pump() {
	s.q.clearBlocked()
	now := s.apartNow()
	if s.q.fair {
		for s.inFlight < s.limits.MaxConcurrent {
			w := s.q.next(now)
			if w == nil || !s.serve(w) {
				break
			}
		}
	} else {
		// The first attempts and the retries, merged (see queue.pick).
		a, b := s.q.plain.head, s.q.retries.head
		for s.inFlight < s.limits.MaxConcurrent && !s.q.allBlocked() {
			w := s.q.pick(a, b, now)
			if w == nil {
				break
			}
			if w == a {
				a = a.next
			} else {
				b = b.next
			}
			if !w.ctxEnded() && !s.q.blocked[w.Class] && !s.serve(w) {
				break
			}
		}
	}
	if s.q.apart > 0 && s.pending > 0 && s.inFlight < s.limits.MaxConcurrent {
		// Waiters left with a slot free (waiting for capacity, or held):
		// when a retry has waited its aging the order changes, and the
		// queue is served again then, on the hold timer.
		if d, ok := s.q.untilAged(now); ok {
			s.fx.armHold(d)
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
	s.unblocked()
	s.reject(r, admission.Aborted, true, m.cause, "")
}

// unblocked runs when a waiter leaves the queue other than by admission:
// the queue is to be looked at again, as the waiter may have held back the
// calls behind it (a waiter for capacity, or one held by a cool-down,
// holds back its class), and those it held back may be due an answer now
// (a cool-down extended past what is left of their queue timeout turns
// them away). The look is a message of its own, asked for before the
// leaving waiter is answered (so that whatever its caller asks next finds
// it done) and once for all the waiters that leave together: waiters whose
// context ended at once (a client gone, a common deadline) are passed
// over by every look until their own cancel messages arrive, so a look
// per leaving would cost the square of their number.
func (s *state) unblocked() { s.fx.repump() }

// timeout ends a waiter whose queue timeout fired.
func (s *state) timeout(m *timeoutMsg) {
	if m.r.gen != m.gen || !m.r.queued {
		return // answered before the timer's message arrived
	}
	s.dequeue(m.r)
	s.unblocked()
	s.reject(m.r, admission.Timeout, true, nil, s.globalConstraint())
}
