package bulkhead

// This file converts between the engine's own types (package
// actor/admission) and the public ones, at the boundary and on cold
// paths only: rejections, statistics, events and limits.

import (
	"errors"

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
		return &ConfigError{Field: ce.Field, Problem: ce.Problem}
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

func usageReport(r admission.UsageReport) UsageReport {
	return UsageReport{
		AdmissionID: ID(r.AdmissionID), LimitRevision: r.LimitRevision, Class: r.Class, Sequence: r.Sequence,
		Reserved: r.Reserved, Held: r.Held, Consumed: r.Consumed,
		OutputCap: clonePtr(r.OutputCap), OutputRemaining: clonePtr(r.OutputRemaining), OverReservation: r.OverReservation,
	}
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
	}
	if f := d.Fleet; f != nil {
		out.Fleet = &FleetDetail{Pool: f.Pool, InFlight: f.InFlight, InFlightTokens: f.InFlightTokens,
			MaxConcurrent: f.MaxConcurrent, TokenBudget: f.TokenBudget, Generation: f.Generation, Fallback: f.Fallback}
	}
	if r := d.Rate; r != nil {
		out.Rate = &RateDetail{Scope: r.Scope, Key: r.Key, Limit: r.Limit, PerMinute: r.PerMinute, Burst: r.Burst,
			Weight: r.Weight, Remaining: r.Remaining, RetryAfter: r.RetryAfter, Fallback: r.Fallback}
	}
	if c := d.Cooldown; c != nil {
		out.Cooldown = &CooldownDetail{Model: c.Model, Until: c.Until, RetryAfter: c.RetryAfter, Headroom: c.Headroom}
	}
	if b := d.TokenBudget; b != nil {
		out.TokenBudget = &BudgetDetail{Budget: b.Budget, EffectiveBudget: b.EffectiveBudget, InFlightTokens: b.InFlightTokens, Available: b.Available, Reserved: b.Requested}
	}
	if s := d.SharedCapacity; s != nil {
		out.Shared = &SharedPool{MaxConcurrent: s.Concurrency.Capacity, InFlight: s.Concurrency.InUse, AvailableConcurrent: s.Concurrency.Available}
		out.WouldBorrow.BorrowedConcurrency = s.Concurrency.RequestedBorrowed > 0
		if t := s.TokenBudget; t != nil {
			out.Shared.TokenBudget = &SharedBudget{Budget: t.Capacity, InFlightTokens: t.InUse, Available: t.Available}
			out.WouldBorrow.BorrowedTokens = t.RequestedBorrowed
		}
	}
	if c := d.Class; c != nil {
		cd := &ClassDetail{Name: c.ID, ClassUse: ClassUse{
			InFlight: c.InFlight, ProtectedConcurrentInUse: c.ProtectedConcurrentInUse, BorrowedConcurrent: c.BorrowedConcurrent,
		}}
		cd.Limits.ProtectedConcurrent = c.ProtectedConcurrent
		if c.MaxConcurrent != nil {
			cd.Limits.MaxConcurrent = Ceiling(*c.MaxConcurrent)
		}
		if t := c.TokenBudget; t != nil {
			cd.InFlightTokens, cd.ProtectedTokensInUse, cd.BorrowedInFlightTokens = t.InFlightTokens, t.ProtectedTokensInUse, t.BorrowedInFlightTokens
			cd.Limits.ProtectedInFlightTokens = t.ProtectedInFlightTokens
			if t.MaxInFlightTokens != nil {
				cd.Limits.MaxInFlightTokens = Ceiling(*t.MaxInFlightTokens)
			}
		}
		out.Class = cd
	}
	out.NeverFits = d.NeverFits || (why == BudgetLimit || why == ConcurrencyLimit) && d.Unfittable()
	return out
}

func reasonCounts(m map[admission.Reason]int64) map[Reason]int64 {
	out := make(map[Reason]int64, len(m))
	for k, v := range m {
		out[Reason(k)] = v
	}
	return out
}

func causeCounts(m map[admission.AbandonCause]int64) map[AbandonCause]int64 {
	out := make(map[AbandonCause]int64, len(m))
	for k, v := range m {
		out[AbandonCause(k)] = v
	}
	return out
}

func stats(s admission.Stats) Stats {
	out := Stats{Limits: publicLimits(s.Limits), Events: EventStats{ListenerPanics: s.ListenerPanics}, LedgerDrift: s.LedgerDrift}
	g := s.Gate
	out.Gate = GateStats{
		InFlight: g.InFlight, Pending: g.Pending, MaxConcurrent: g.MaxConcurrent, MaxQueue: g.MaxQueue, Closed: g.Closed,
		Admitted: g.Admitted, Released: g.Released, Aborted: g.Aborted, TimedOut: g.TimedOut,
		Rejected: g.Rejected, RejectedByReason: reasonCounts(g.RejectedByReason), DoubleReleases: g.DoubleReleases,
	}
	c := s.Calls
	out.Calls = CallStats{
		InFlight: c.InFlight, Admitted: c.Admitted, Released: c.Released,
		Abandoned: c.Abandoned, AbandonedByCause: causeCounts(c.AbandonedByCause),
		Rejected: c.Rejected, RejectedByReason: reasonCounts(c.RejectedByReason),
	}
	if b := s.TokenBudget; b != nil {
		bs := BudgetStats(*b)
		out.TokenBudget = &bs
	}
	o := s.Observe
	out.Observe = ObserveStats{
		Bypassed: o.Bypassed, RaceBypassed: o.RaceBypassed, BypassedByReason: reasonCounts(o.BypassedByReason),
		InFlight: o.InFlight, UsageReported: o.UsageReported, InputTokens: o.InputTokens, OutputTokens: o.OutputTokens,
	}
	if d := s.Dedup; d != nil {
		out.Dedup = &DedupStats{Active: d.Active, Hits: d.Hits}
	}
	if r := s.Rate; r != nil {
		rs := RateStats(*r)
		out.Rate = &rs
	}
	if f := s.Fleet; f != nil {
		fs := FleetStats(*f)
		out.Fleet = &fs
	}
	if a := s.Adaptive; a != nil {
		as := AdaptiveStats{Rule: AdaptiveRule(a.Rule), MaxConcurrent: a.MaxConcurrent, MinConcurrent: a.MinConcurrent,
			MaxConcurrentBound: a.MaxConcurrentBound, Budget: a.Budget, MinBudget: a.MinBudget, MaxBudget: a.MaxBudget,
			Samples: a.Samples, Increases: a.Increases, Decreases: a.Decreases, LastChange: a.LastChange}
		out.Adaptive = &as
	}
	cd := s.Cooldown
	out.Cooldown = CooldownStats{Active: cd.Active, Started: cd.Started, Held: cd.Held, HeadroomReports: cd.HeadroomReports}
	if len(cd.Headroom) > 0 {
		out.Cooldown.Headroom = make(map[string]HeadroomStats, len(cd.Headroom))
		for m, h := range cd.Headroom {
			out.Cooldown.Headroom[m] = HeadroomStats(h)
		}
	}
	if cs := s.Classes; cs != nil {
		out.Classes = &ClassesStats{
			Default: cs.Default,
			Shared:  SharedPool{MaxConcurrent: cs.Shared.MaxConcurrent, InFlight: cs.Shared.InFlight, AvailableConcurrent: cs.Shared.AvailableConcurrent},
			Classes: make(map[string]ClassStats, len(cs.Classes)),
		}
		if t := cs.Shared.TokenBudget; t != nil {
			out.Classes.Shared.TokenBudget = &SharedBudget{Budget: t.Budget, InFlightTokens: t.InFlightTokens, Available: t.Available}
		}
		for name, k := range cs.Classes {
			out.Classes.Classes[name] = ClassStats{
				ClassUse: ClassUse{
					Limits:   ClassLimits(k.Limits).clone(),
					InFlight: k.InFlight, ProtectedConcurrentInUse: k.ProtectedConcurrentInUse, BorrowedConcurrent: k.BorrowedConcurrent,
					InFlightTokens: k.InFlightTokens, ProtectedTokensInUse: k.ProtectedTokensInUse, BorrowedInFlightTokens: k.BorrowedInFlightTokens,
				},
				Pending:  k.Pending,
				Admitted: k.Admitted, Released: k.Released,
				Abandoned: k.Abandoned, AbandonedByCause: causeCounts(k.AbandonedByCause),
				Rejected: k.Rejected, RejectedByReason: reasonCounts(k.RejectedByReason),
				TotalReserved: k.TotalReserved, TotalConsumed: k.TotalConsumed, TotalRefunded: k.TotalRefunded, TotalOverrun: k.TotalOverrun,
				TotalBorrowedAdmissions: k.TotalBorrowedAdmissions, TotalBorrowedTokensReserved: k.TotalBorrowedTokensReserved,
				Deadlines: DeadlineStats(k.Deadlines),
			}
		}
	}
	return out
}

// taggedCall is what the engine carries for a call with a tag; a call
// without one carries its *Request alone, so tagging costs nothing when it
// is not used.
type taggedCall struct {
	req *Request
	tag string
}

// call returns what the engine carries for req and tag.
func call(req *Request, tag string) any {
	if tag == "" {
		return req
	}
	return &taggedCall{req: req, tag: tag}
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

// withTag sets the tag of a rejection.
func withTag(err error, tag string) error {
	if rej, ok := err.(*RejectedError); ok {
		rej.Tag = tag
	}
	return err
}

// identity builds the Admission of an engine event.
func identity(c any, id admission.ID, p admission.Priority, class string, rev, reserved int64, res admission.Resources) Admission {
	r, tag := callOf(c)
	return Admission{ID: ID(id), Request: r, Tag: tag, Priority: Priority(p), Class: class, LimitRevision: rev, Reserved: reserved, Resources: Resources(res)}
}

// deliver converts an engine event and hands it to h's listener for it.
func deliver(h *Hooks, ev any) {
	switch e := ev.(type) {
	case *admission.AdmitEvent:
		if h.Admit != nil {
			h.Admit(AdmitEvent{
				Admission: identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.ReservedTokens, e.Resources),
				Timing:    Timing(e.Timing),
			})
		}
	case *admission.RejectEvent:
		if h.Reject != nil {
			h.Reject(RejectEvent{
				Admission: identity(e.Request, admission.ID{}, e.Priority, e.Class, e.LimitRevision, e.Detail.Reserved(), admission.Resources{}),
				Reason:    Reason(e.Reason),
				Detail:    rejectDetailFor(e.Detail, Reason(e.Reason)),
				Timing:    Timing(e.Timing),
			})
		}
	case *admission.ReleaseEvent:
		if h.Release != nil {
			h.Release(ReleaseEvent{
				Admission:     identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.ReservedTokens, e.Resources),
				Held:          e.HeldTokens,
				Refunded:      e.RefundedTokens,
				UsageSequence: e.UsageSequence,
				Usage:         clonePtr((*Usage)(e.Usage)),
			})
		}
	case *admission.UsageEvent:
		if h.Usage != nil {
			h.Usage(UsageEvent{
				Admission:       identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.ReservedTokens, e.Resources),
				Sequence:        e.Sequence,
				PreviousHeld:    e.PreviousHeld,
				Held:            e.Held,
				Delta:           e.Delta,
				Usage:           Usage(e.Usage),
				OutputCap:       clonePtr(e.OutputCap),
				OutputRemaining: clonePtr(e.OutputRemaining),
				OverReservation: e.OverReservation,
				Progressive:     clonePtr((*Progressive)(e.Progressive)),
			})
		}
	case *admission.AbandonEvent:
		if h.Abandon != nil {
			h.Abandon(AbandonEvent{
				Admission: identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.Reserved, e.Resources),
				Cause:     AbandonCause(e.Cause),
				Held:      e.HeldTokens,
			})
		}
	case *admission.BypassEvent:
		if h.Bypass != nil {
			h.Bypass(BypassEvent{
				Admission: identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.ReservedTokens, admission.Resources{}),
				Bypass:    Bypass{Reason: Reason(e.Reason), Race: e.Race, Detail: rejectDetailFor(e.Detail, Reason(e.Reason))},
			})
		}
	case *admission.BypassUsageEvent:
		if h.BypassUsage != nil {
			h.BypassUsage(BypassUsageEvent{
				Admission:       identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.ReservedTokens, admission.Resources{}),
				Reason:          Reason(e.Reason),
				Sequence:        e.Sequence,
				Usage:           Usage(e.Usage),
				OutputCap:       clonePtr(e.OutputCap),
				OutputRemaining: clonePtr(e.OutputRemaining),
				OverReservation: e.OverReservation,
				Progressive:     clonePtr((*Progressive)(e.Progressive)),
			})
		}
	case *admission.BypassReleaseEvent:
		if h.BypassRelease != nil {
			h.BypassRelease(BypassReleaseEvent{
				Admission:     identity(e.Request, e.AdmissionID, e.Priority, e.Class, e.LimitRevision, e.ReservedTokens, admission.Resources{}),
				Reason:        Reason(e.Reason),
				UsageSequence: e.UsageSequence,
				Usage:         clonePtr((*Usage)(e.Usage)),
			})
		}
	case *admission.DedupEvent:
		if h.Dedup != nil {
			r, tag := callOf(e.Request)
			h.Dedup(DedupEvent{Request: r, Tag: tag, Class: e.Class, Scope: e.Scope})
		}
	case *admission.ReconfigureEvent:
		if h.Reconfigure != nil {
			h.Reconfigure(ReconfigureEvent{Previous: publicLimits(e.Previous), Current: publicLimits(e.Current)})
		}
	}
}
