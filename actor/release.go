package actor

import (
	"math"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// Releases, usage reports and abandoned slots: what an admission gives back,
// and when.

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
	s.admissions.Released++
	held, refunded := l.held, int64(0)
	m.settleUsage()
	settled := classes.Settlement{Held: held, SlotAbandoned: l.abandoned}
	if s.hasBudget {
		if m.hasUsage {
			actual := m.usage.Total()
			s.ledger.Consumed = admission.AddSat(s.ledger.Consumed, actual)
			if actual < held {
				refunded = held - actual
				s.ledger.Refunded = admission.AddSat(s.ledger.Refunded, refunded)
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
	if s.listeners[admission.EventRelease] > 0 {
		ev := leaseEvent(admission.EventRelease, l)
		ev.Held, ev.Refunded, ev.Sequence = held, refunded, l.sequence
		ev.Usage, ev.HasUsage = m.usage, m.hasUsage
		s.fx.emit(ev)
	}
	s.pump() // and answers any Drain this release completed
}

// applyUsage applies a cumulative usage report to a lease and returns
// what it left the lease with, or why the report is invalid (then nothing
// changed).
func (s *state) applyUsage(l *Lease, u admission.Usage, p *admission.Progressive) (admission.UsageResult, error) {
	var none admission.UsageResult
	res := l.Reservation
	if p != nil && s.hasBudget && p.RemainingOutput > res.MaxOutput {
		return none, admission.Invalidf("Progressive.RemainingOutput",
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
		return none, admission.Invalidf("Usage",
			"cumulative Input + Output overflows int64 (%d + %d, each the larger of this report and the ones before)", u.Input, u.Output)
	}
	rep := admission.UsageResult{Usage: u, Sequence: l.sequence}
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
			return none, err
		}
		// The other admissions' holds plus this one must fit too.
		if admission.Exceeds(s.tokens-l.held, hold, math.MaxInt64) {
			return none, admission.Invalidf(usageField(p),
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
		s.ledger.Overrun = admission.AddSat(s.ledger.Overrun, delta)
	} else {
		s.ledger.Refunded = admission.AddSat(s.ledger.Refunded, -delta)
	}
	s.tokens += delta
	s.tab.AdjustHold(l.classID, delta)
	l.held, l.last, l.reported = hold, u, true
	l.sequence++
	rep.Sequence, rep.Held = l.sequence, hold
	if s.fleet != nil {
		s.fx.fleetAdjust(l, hold, l.sequence, l.abandoned)
	}
	if s.listeners[admission.EventUsage] > 0 {
		ev := leaseEvent(admission.EventUsage, l)
		ev.Sequence, ev.PreviousHeld, ev.Held = l.sequence, prev, hold
		ev.Usage, ev.Progressive = u, copyProgressive(p)
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
	s.admissions.Abandoned[cause]++
	if cause == admission.AbandonDeadline {
		s.fx.expire(l)
	} else {
		s.endDeadline(l)
	}
	if s.listeners[admission.EventAbandon] > 0 {
		ev := leaseEvent(admission.EventAbandon, l)
		ev.Cause, ev.Held = cause, l.held
		s.fx.emit(ev)
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
