package classes

import "github.com/llmbulkhead/bulkhead/internal/admission"

// Detail returns the class parts of a reject detail (SPEC F21) for a call
// of class c reserving reserved tokens, from the same numbers Check decides
// on (so g is given as to Check: the effective budget, and SlotHeld when
// the caller still holds the call's slot). It returns nil, nil for None.
// The caller sets RejectDetail.Constraint from Check and ConstraintGlobal
// for a global rejection. The results share no memory with the table.
func (t *Table) Detail(c Class, g Capacity, reserved int64) (*admission.SharedCapacityDetail, *admission.ClassDetail) {
	k := t.get(c)
	if k == nil {
		return nil, nil
	}
	l := &k.limits
	shared := &admission.SharedCapacityDetail{}
	capacity, inUse := t.sharedCapacity(&g), t.sharedInUse(&g)
	shared.Concurrency = admission.SharedConcurrencyDetail{
		Capacity:  capacity,
		InUse:     inUse,
		Available: max(0, capacity-inUse),
	}
	if k.borrowsSlot() {
		shared.Concurrency.RequestedBorrowed = 1
	}
	cd := &admission.ClassDetail{
		ID:                           k.name,
		InFlight:                     k.inFlight,
		ProtectedConcurrent:          l.floor,
		ProtectedConcurrentInUse:     min(k.inFlight, l.floor),
		BorrowedConcurrent:           max(0, k.inFlight-l.floor),
		AvailableProtectedConcurrent: max(0, l.floor-k.inFlight),
	}
	if l.hasMax {
		m, a := l.max, max(0, l.max-k.inFlight)
		cd.MaxConcurrent, cd.AvailableConcurrent = &m, &a
	}
	if t.hasBudget {
		tokCap, tokInUse := t.sharedTokenCapacity(&g), t.sharedTokensInUse(&g)
		shared.TokenBudget = &admission.SharedBudgetDetail{
			Capacity:          tokCap,
			InUse:             tokInUse,
			Available:         max(0, tokCap-tokInUse),
			RequestedBorrowed: k.borrowedTokens(reserved),
		}
		cd.TokenBudget = &admission.ClassBudgetDetail{
			InFlightTokens:           k.tokens,
			ProtectedInFlightTokens:  l.tokFloor,
			ProtectedTokensInUse:     min(k.tokens, l.tokFloor),
			BorrowedInFlightTokens:   max(0, k.tokens-l.tokFloor),
			AvailableProtectedTokens: max(0, l.tokFloor-k.tokens),
			Requested:                reserved,
		}
		if l.hasMaxTok {
			m, a := l.maxTok, max(0, l.maxTok-k.tokens)
			cd.TokenBudget.MaxInFlightTokens, cd.TokenBudget.Available = &m, &a
		}
	}
	return shared, cd
}

// Stats returns the class part of the statistics (SPEC F32), nil on a nil
// Table. g.Budget is the whole budget (the shared token pool in Stats is
// not priority-adjusted); g.SlotHeld is ignored. The result shares no
// memory with the table.
func (t *Table) Stats(g Capacity) *admission.ClassesStats {
	if t == nil {
		return nil
	}
	g.SlotHeld = false
	capacity, inUse := t.sharedCapacity(&g), t.sharedInUse(&g)
	st := &admission.ClassesStats{
		Default: t.names[t.def],
		Shared: admission.SharedStats{
			MaxConcurrent:       capacity,
			InFlight:            inUse,
			AvailableConcurrent: max(0, capacity-inUse),
		},
		Classes: make(map[string]admission.ClassStats, len(t.classes)),
	}
	if t.hasBudget {
		tokCap, tokInUse := t.sharedTokenCapacity(&g), t.sharedTokensInUse(&g)
		st.Shared.TokenBudget = &admission.SharedBudgetStats{
			Budget:         tokCap,
			InFlightTokens: tokInUse,
			Available:      max(0, tokCap-tokInUse),
		}
	}
	for i := range t.classes {
		k := &t.classes[i]
		l := &k.limits
		cs := admission.ClassStats{
			Limits:                      l.public(),
			InFlight:                    k.inFlight,
			ProtectedConcurrentInUse:    min(k.inFlight, l.floor),
			BorrowedConcurrent:          max(0, k.inFlight-l.floor),
			InFlightTokens:              k.tokens,
			ProtectedTokensInUse:        min(k.tokens, l.tokFloor),
			BorrowedInFlightTokens:      max(0, k.tokens-l.tokFloor),
			Admitted:                    k.admitted,
			Released:                    k.released,
			Abandoned:                   k.abandoned,
			AbandonedByCause:            make(map[admission.AbandonCause]int64),
			Rejected:                    k.rejected,
			RejectedByReason:            make(map[admission.Reason]int64),
			TotalReserved:               k.reserved,
			TotalConsumed:               k.consumed,
			TotalRefunded:               k.refunded,
			TotalOverrun:                k.overrun,
			TotalBorrowedAdmissions:     k.borrowedAdmissions,
			TotalBorrowedTokensReserved: k.borrowedTokensReserved,
		}
		for cause, n := range k.abandonedBy {
			if n > 0 {
				cs.AbandonedByCause[admission.AbandonCause(cause)] = n
			}
		}
		for why, n := range k.rejectedBy {
			if n > 0 {
				cs.RejectedByReason[admission.Reason(why)] = n
			}
		}
		st.Classes[k.name] = cs
	}
	return st
}

// Classes returns the current class table as configuration: the default
// class and every class's limits, for Limits() and Stats().Limits. It is a
// deep copy; an empty admission.Classes on a nil Table.
func (t *Table) Classes() admission.Classes {
	if t == nil {
		return admission.Classes{}
	}
	out := admission.Classes{Default: t.names[t.def], Limits: make(map[string]admission.ClassLimits, len(t.classes))}
	for i := range t.classes {
		out.Limits[t.classes[i].name] = t.classes[i].limits.public()
	}
	return out
}
