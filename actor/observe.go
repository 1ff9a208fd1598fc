package actor

import "github.com/llmbulkhead/bulkhead/actor/admission"

// Observe mode: a call whose refusal its mode shadows runs without
// admission. It holds no slot, no tokens, no class use and no queue
// position, so it changes no capacity counter; it is counted in the observe
// statistics only, and Drain waits for it to end.

// bypass answers r with a bypass for why instead of a rejection. race says
// the call was refused only after it had queued (its rejection is already
// counted and emitted); d is the refusal's capacity snapshot.
func (s *state) bypass(r *AcquireRequest, why admission.Reason, race bool, d *admission.RejectDetail) {
	l := r.Lease
	l.Priority, l.Reservation, l.Request, l.classID = r.Priority, r.Reservation, r.Request, r.Class
	s.bypassLease(l, why, race, d)
	r.Err = nil
	s.answer(r)
}

// bypassLease makes l, whose call and class are set, a bypass for why.
func (s *state) bypassLease(l *Lease, why admission.Reason, race bool, d *admission.RejectDetail) {
	o := &s.observe
	o.Bypassed[why]++
	if race {
		o.RaceBypassed++
	}
	o.InFlight++
	l.ID = s.newBypassID()
	l.Revision = s.limits.Revision
	l.Class = s.tab.Name(l.classID)
	l.Resources = admission.Resources{} // a bypass holds nothing, even after a rolled-back admission
	l.Bypass = &Bypass{Reason: why, Race: race, Detail: d}
	if s.listeners[admission.EventBypass] > 0 {
		ev := leaseEvent(admission.EventBypass, l)
		ev.Reason, ev.Race, ev.Detail = why, race, d
		s.fx.emit(ev)
	}
}

// newBypassID mints a bypass's ID: random, but a version 8 UUID, so that it
// never equals an admission's and formats with its own prefix.
func (s *state) newBypassID() admission.ID {
	id := s.newID()
	id[6] = id[6]&0x0f | 0x80
	return id
}

// bypassUsage records a bypassed call's cumulative usage u, already
// clamped and validated, into rep: a change takes the next sequence and
// emits a bypass usage event; nothing is held.
func (s *state) bypassUsage(l *Lease, u admission.Usage, p *admission.Progressive, rep admission.UsageResult) admission.UsageResult {
	if u == l.last && l.reported {
		return rep // stale or duplicate
	}
	l.last, l.reported = u, true
	l.sequence++
	rep.Sequence = l.sequence
	if s.listeners[admission.EventBypassUsage] > 0 {
		ev := leaseEvent(admission.EventBypassUsage, l)
		ev.Reason, ev.Sequence = l.Bypass.Reason, l.sequence
		ev.Usage, ev.Progressive = u, copyProgressive(p)
		s.fx.emit(ev)
	}
	return rep
}

// endBypass settles a bypassed call: its final usage (the release's, else
// the last report) counts in the observe totals, and a bypass release
// event closes its events.
func (s *state) endBypass(m *releaseMsg) {
	l := m.l
	l.released = true
	o := &s.observe
	o.InFlight--
	m.settleUsage()
	if m.hasUsage {
		o.UsageReported++
		o.Input = admission.AddSat(o.Input, m.usage.Input)
		o.Output = admission.AddSat(o.Output, m.usage.Output)
	}
	if s.listeners[admission.EventBypassRelease] > 0 {
		ev := leaseEvent(admission.EventBypassRelease, l)
		ev.Reason, ev.Sequence = l.Bypass.Reason, l.sequence
		ev.Usage, ev.HasUsage = m.usage, m.hasUsage
		s.fx.emit(ev)
	}
	s.checkDrains()
}
