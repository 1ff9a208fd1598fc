package actor

import (
	"math"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// Limits and statistics: a new limits snapshot, validated and applied in
// one step, and the statistics copied out of the state.

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
	if s.listeners[admission.EventReconfigure] > 0 {
		s.fx.emit(newEvent(admission.Event{Kind: admission.EventReconfigure, Limits: &[2]admission.Limits{prev, s.limits.Clone()}}))
	}
	s.rejectUnfittable()
	s.pump()
	return admission.ApplyResult{Applied: true, Previous: prev, Current: s.limits.Clone()}, nil
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

// stats copies the counters, with those kept outside the state from ext.
func (s *state) stats(ext external) admission.Stats {
	st := admission.Stats{
		Limits: s.limits.Clone(), InFlight: s.inFlight, Pending: s.pending, Closed: s.closed, Gate: s.gate,
		Admissions: s.admissions, Tokens: s.tokens, Ledger: s.ledger, Observe: s.observe,
		DoubleReleases: ext.doubleReleases, ListenerPanics: ext.listenerPanics, LedgerDrift: s.drift + s.tab.Drift(),
		Cooldown: s.cool.stats(s.fx.now()), Adaptive: s.adaptiveStats(), Fleet: s.fleet.stats(),
	}
	var perClass []*admission.RetryBudgetStats
	for _, n := range s.retries {
		st.Retries.Admitted += n
	}
	if s.retry != nil {
		st.Retries.Budget, perClass = s.retry.stats(s.fx.now(), s.tab.Len())
	}
	if s.tab != nil {
		st.Classes = s.tab.Stats(s.capacity(admission.High, false)) // High: the whole budget
		for i, dl := range ext.deadlines {
			st.Classes.Classes[i].Deadlines = dl
		}
		for c := 1; c < len(s.q.waiting); c++ {
			k := &st.Classes.Classes[c-1]
			k.Pending = s.q.waiting[c]
			k.Retries.Admitted = s.retries[c]
			if perClass != nil {
				k.Retries.Budget = perClass[c-1]
			}
		}
	}
	if st.Rate = s.rates.stats(); st.Rate != nil {
		st.Rate.Waiting = s.nparked + s.checking
	}
	return st
}
