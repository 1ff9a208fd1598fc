package bulkhead

// This file converts between the engine's own types (package
// actor/admission) and the public ones, at the boundary and on cold
// paths only: rejections, statistics, events and limits.

import (
	"errors"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// publicError turns an engine error into the public one: a rejection into
// a *RejectedError, an engine *ConfigError into ours. Anything else (an
// internal error) passes as is.
func publicError(err error) error {
	var rej *admission.RejectedError
	if errors.As(err, &rej) {
		return &RejectedError{Reason: Reason(rej.Reason), Detail: rejectDetailFor(rej.Detail, Reason(rej.Reason)), Cause: rej.Cause}
	}
	var ce *admission.ConfigError
	if errors.As(err, &ce) {
		c := ConfigError(*ce)
		return &c
	}
	return err
}

// clone returns l with its own copies of the ceilings.
func (l ClassLimits) clone() ClassLimits {
	if l.MaxConcurrent != nil {
		l.MaxConcurrent = Ceiling(*l.MaxConcurrent)
	}
	if l.MaxInFlightTokens != nil {
		l.MaxInFlightTokens = Ceiling(*l.MaxInFlightTokens)
	}
	return l
}

func publicLimits(l admission.Limits) Limits {
	out := Limits{Revision: l.Revision, MaxConcurrent: l.MaxConcurrent, MaxQueue: l.MaxQueue}
	if l.TokenBudget != nil {
		out.TokenBudget = &BudgetLimits{Budget: l.TokenBudget.Budget, HighPriorityReserve: l.TokenBudget.HighPriorityReserve}
	}
	if l.Classes != nil {
		c := Classes{Default: l.Classes.Default}
		if l.Classes.Limits != nil {
			c.Limits = make(map[string]ClassLimits, len(l.Classes.Limits))
			for k, v := range l.Classes.Limits {
				c.Limits[k] = ClassLimits(v).clone()
			}
		}
		out.Classes = &c
	}
	return out
}

func applyResult(r admission.ApplyResult) ApplyResult {
	return ApplyResult{Applied: r.Applied, Reason: ApplyReason(r.Reason), Previous: publicLimits(r.Previous), Current: publicLimits(r.Current)}
}

// usageReport is the report of a usage report on admission (or bypass) l
// that left it with r.
func (b *Bulkhead) usageReport(l *actor.Lease, r admission.UsageResult) UsageReport {
	rep := UsageReport{AdmissionID: ID(l.ID), LimitRevision: l.Revision, Class: l.Class, Sequence: r.Sequence,
		Reserved: l.Reservation.Reserved, Held: r.Held, Consumed: r.Usage.Total()}
	rep.OutputCap, rep.OutputRemaining, rep.OverReservation = b.output(l.Reservation, r.Usage)
	return rep
}

// output is what a report says of cumulative usage u against reservation
// res: the reservation's max output and what is left of it, and how far u
// exceeds the reservation; nil, nil and 0 without a budget, where nothing
// is reserved.
func (b *Bulkhead) output(res admission.Reservation, u admission.Usage) (outputCap, remaining *int64, over int64) {
	if !b.hasBudget {
		return nil, nil, 0
	}
	c, left := res.MaxOutput, max(0, res.MaxOutput-u.Output)
	return &c, &left, max(0, u.Total()-res.Reserved)
}

// clonePtr returns a pointer to a copy of *p, nil for nil: every caller
// and every listener gets memory of its own.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// rejectDetailFor converts the detail of a rejection for why, telling a
// call that can never fit from one that does not fit now.
func rejectDetailFor(d *admission.RejectDetail, why Reason) *RejectDetail {
	if d == nil {
		return nil
	}
	out := &RejectDetail{
		LimitRevision: d.LimitRevision, Constraint: Constraint(d.Constraint),
		InFlight: d.InFlight, MaxConcurrent: d.MaxConcurrent, Pending: d.Pending, MaxQueue: d.MaxQueue,
		WouldBorrow: Resources(d.WouldBorrow),
		Rate:        (*RateDetail)(clonePtr(d.Rate)), Fleet: (*FleetDetail)(clonePtr(d.Fleet)), Cooldown: (*CooldownDetail)(clonePtr(d.Cooldown)),
		RetryBudget: retryDetail(d.RetryBudget),
	}
	if b := d.TokenBudget; b != nil {
		out.TokenBudget = &BudgetDetail{Budget: b.Budget, EffectiveBudget: b.EffectiveBudget, InFlightTokens: b.InFlightTokens,
			Available: max(0, b.EffectiveBudget-b.InFlightTokens), Reserved: b.Reserved}
	}
	if s := d.Shared; s != nil {
		p := sharedPool(*s)
		out.Shared = &p
	}
	if c := d.Class; c != nil {
		out.Class = &ClassDetail{Name: c.Name, ClassUse: classUse(*c)}
	}
	out.NeverFits = d.NeverFits || (why == BudgetLimit || why == ConcurrencyLimit) && d.Unfittable()
	return out
}

// sharedPool is the public view of the shared pool p.
func sharedPool(p admission.SharedPool) SharedPool {
	slots, tokens := p.Available()
	out := SharedPool{MaxConcurrent: p.Slots, InFlight: p.SlotsInUse, AvailableConcurrent: slots}
	if p.HasTokens {
		out.TokenBudget = &SharedBudget{Budget: p.Tokens, InFlightTokens: p.TokensInUse, Available: tokens}
	}
	return out
}

// classUse is the public view of what a class holds.
func classUse(u admission.ClassUse) ClassUse {
	return ClassUse{
		Limits:   ClassLimits(u.Limits).clone(),
		InFlight: u.InFlight, ProtectedConcurrentInUse: u.ProtectedConcurrentInUse(), BorrowedConcurrent: u.BorrowedConcurrent(),
		InFlightTokens: u.InFlightTokens, ProtectedTokensInUse: u.ProtectedTokensInUse(), BorrowedInFlightTokens: u.BorrowedInFlightTokens(),
	}
}

// tally returns the total of counts, and the counts above 0 by their
// index (a reason, a cause).
func tally[K Reason | AbandonCause](counts []int64) (int64, map[K]int64) {
	var total int64
	m := make(map[K]int64)
	for k, n := range counts {
		if n > 0 {
			m[K(k)] = n
			total += n
		}
	}
	return total, m
}

// stats is the public view of the engine's statistics; Bulkhead.Stats adds
// the facade's own counts.
func stats(s admission.Stats) Stats {
	out := Stats{Limits: publicLimits(s.Limits), Events: EventStats{ListenerPanics: s.ListenerPanics}, LedgerDrift: s.LedgerDrift}
	g := &s.Gate
	out.Gate = GateStats{
		InFlight: s.InFlight, Pending: s.Pending, MaxConcurrent: s.Limits.MaxConcurrent, MaxQueue: s.Limits.MaxQueue, Closed: s.Closed,
		Admitted: g.Admitted, Released: g.Released, Aborted: g.Rejected[Aborted], TimedOut: g.Rejected[Timeout],
		DoubleReleases: s.DoubleReleases,
	}
	out.Gate.Rejected, out.Gate.RejectedByReason = tally[Reason](g.Rejected[:])
	a := &s.Admissions
	out.Calls = CallStats{InFlight: a.Admitted - a.Released, Admitted: a.Admitted, Released: a.Released}
	out.Calls.Abandoned, out.Calls.AbandonedByCause = tally[AbandonCause](a.Abandoned[:])
	out.Calls.Rejected, out.Calls.RejectedByReason = tally[Reason](a.Rejected[:])
	if b := s.Limits.TokenBudget; b != nil {
		out.TokenBudget = &BudgetStats{Budget: b.Budget, HighPriorityReserve: b.HighPriorityReserve,
			InFlightTokens: s.Tokens, Available: max(0, b.Budget-s.Tokens),
			TotalReserved: s.Ledger.Reserved, TotalConsumed: s.Ledger.Consumed, TotalRefunded: s.Ledger.Refunded, TotalOverrun: s.Ledger.Overrun}
	}
	o := &s.Observe
	out.Observe = ObserveStats{RaceBypassed: o.RaceBypassed, InFlight: o.InFlight, UsageReported: o.UsageReported,
		InputTokens: o.Input, OutputTokens: o.Output}
	out.Observe.Bypassed, out.Observe.BypassedByReason = tally[Reason](o.Bypassed[:])
	out.Dedup = (*DedupStats)(clonePtr(s.Dedup))
	out.Rate = (*RateStats)(clonePtr(s.Rate))
	out.Fleet = (*FleetStats)(clonePtr(s.Fleet))
	if a := s.Adaptive; a != nil {
		out.Adaptive = &AdaptiveStats{Rule: AdaptiveRule(a.Rule), MaxConcurrent: s.Limits.MaxConcurrent, MinConcurrent: a.MinConcurrent,
			MaxConcurrentBound: a.MaxConcurrentBound, MinBudget: a.MinBudget, MaxBudget: a.MaxBudget,
			Samples: a.Samples, Increases: a.Increases, Decreases: a.Decreases, LastChange: a.LastChange}
		if b := s.Limits.TokenBudget; b != nil {
			out.Adaptive.Budget = b.Budget
		}
	}
	out.Retries = retryStats(s.Retries)
	cd := &s.Cooldown
	out.Cooldown = CooldownStats{Active: cd.Active, Started: cd.Started, Held: cd.Held, HeadroomReports: cd.HeadroomReports}
	if len(cd.Headroom) > 0 {
		out.Cooldown.Headroom = make(map[string]HeadroomStats, len(cd.Headroom))
		for m, h := range cd.Headroom {
			out.Cooldown.Headroom[m] = HeadroomStats(h)
		}
	}
	if cs := s.Classes; cs != nil {
		out.Classes = &ClassesStats{Default: cs.Default, Shared: sharedPool(cs.Shared), Classes: make(map[string]ClassStats, len(cs.Classes))}
		for i := range cs.Classes {
			k := &cs.Classes[i]
			c := ClassStats{
				ClassUse: classUse(k.ClassUse), Pending: k.Pending, Admitted: k.Admitted, Released: k.Released,
				TotalReserved: k.Ledger.Reserved, TotalConsumed: k.Ledger.Consumed, TotalRefunded: k.Ledger.Refunded, TotalOverrun: k.Ledger.Overrun,
				TotalBorrowedAdmissions: k.BorrowedAdmissions, TotalBorrowedTokensReserved: k.BorrowedTokensReserved,
				Deadlines: DeadlineStats(k.Deadlines), Retries: retryStats(k.Retries),
			}
			c.Abandoned, c.AbandonedByCause = tally[AbandonCause](k.Abandoned[:])
			c.Rejected, c.RejectedByReason = tally[Reason](k.Rejected[:])
			out.Classes.Classes[k.Name] = c
		}
	}
	return out
}

// taggedCall is what the engine carries for a call with a tag or an
// attempt number above 0; a call with neither carries its *Request alone,
// so tagging costs nothing when it is not used.
type taggedCall struct {
	req     *Request
	tag     string
	attempt int
}

// call returns what the engine carries for req, tag and attempt.
func call(req *Request, tag string, attempt int) any {
	if tag == "" && attempt == 0 {
		return req
	}
	return &taggedCall{req: req, tag: tag, attempt: attempt}
}

// callOf unpacks what call packed.
func callOf(v any) (*Request, string) {
	switch c := v.(type) {
	case *Request:
		return c, ""
	case *taggedCall:
		return c.req, c.tag
	}
	return nil, ""
}

// attemptOf is the attempt number of what call packed.
func attemptOf(v any) int {
	if c, ok := v.(*taggedCall); ok {
		return c.attempt
	}
	return 0
}

// withTag sets the tag of a rejection.
func withTag(err error, tag string) error {
	if rej, ok := err.(*RejectedError); ok {
		rej.Tag = tag
	}
	return err
}

// identity builds the Admission of an engine event.
func identity(e *admission.Event) Admission {
	r, tag := callOf(e.Request)
	return Admission{ID: ID(e.ID), Request: r, Tag: tag, Attempt: attemptOf(e.Request), Priority: Priority(e.Priority), Class: e.Class,
		LimitRevision: e.Revision, Reserved: e.Reservation.Reserved, Resources: Resources(e.Resources)}
}

// finalUsage is a release's final usage, nil for none.
func finalUsage(e *admission.Event) *Usage {
	if !e.HasUsage {
		return nil
	}
	u := Usage(e.Usage)
	return &u
}

// deliver converts an engine event and hands it to h's listener for it.
func (b *Bulkhead) deliver(h *Hooks, e *admission.Event) {
	a := identity(e)
	switch e.Kind {
	case admission.EventAdmit:
		h.Admit(AdmitEvent{Admission: a, Timing: Timing(e.Timing)})
	case admission.EventReject:
		h.Reject(RejectEvent{Admission: a, Reason: Reason(e.Reason), Detail: rejectDetailFor(e.Detail, Reason(e.Reason)), Timing: Timing(e.Timing)})
	case admission.EventRelease:
		h.Release(ReleaseEvent{Admission: a, Held: e.Held, Refunded: e.Refunded, UsageSequence: e.Sequence, Usage: finalUsage(e)})
	case admission.EventUsage:
		ev := UsageEvent{Admission: a, Sequence: e.Sequence, PreviousHeld: e.PreviousHeld, Held: e.Held, Delta: e.Held - e.PreviousHeld,
			Usage: Usage(e.Usage), Progressive: (*Progressive)(clonePtr(e.Progressive))}
		ev.OutputCap, ev.OutputRemaining, ev.OverReservation = b.output(e.Reservation, e.Usage)
		h.Usage(ev)
	case admission.EventAbandon:
		h.Abandon(AbandonEvent{Admission: a, Cause: AbandonCause(e.Cause), Held: e.Held})
	case admission.EventBypass:
		a.Resources = Resources{} // a bypassed call holds nothing
		h.Bypass(BypassEvent{Admission: a, Bypass: Bypass{Reason: Reason(e.Reason), Race: e.Race, Detail: rejectDetailFor(e.Detail, Reason(e.Reason))}})
	case admission.EventBypassUsage:
		a.Resources = Resources{}
		ev := BypassUsageEvent{Admission: a, Reason: Reason(e.Reason), Sequence: e.Sequence, Usage: Usage(e.Usage),
			Progressive: (*Progressive)(clonePtr(e.Progressive))}
		ev.OutputCap, ev.OutputRemaining, ev.OverReservation = b.output(e.Reservation, e.Usage)
		h.BypassUsage(ev)
	case admission.EventBypassRelease:
		a.Resources = Resources{}
		h.BypassRelease(BypassReleaseEvent{Admission: a, Reason: Reason(e.Reason), UsageSequence: e.Sequence, Usage: finalUsage(e)})
	case admission.EventDedup:
		h.Dedup(DedupEvent{Request: a.Request, Tag: a.Tag, Class: e.Class, Scope: e.Scope})
	case admission.EventReconfigure:
		h.Reconfigure(ReconfigureEvent{Previous: publicLimits(e.Limits[0]), Current: publicLimits(e.Limits[1])})
	}
}
