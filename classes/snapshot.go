package classes

import "github.com/llmbulkhead/bulkhead/actor/admission"

// Detail returns the class parts of a reject detail for a call of class c
// reserving reserved tokens, from the same numbers Check decides on (so g
// is given as to Check: the effective budget, and SlotHeld when the caller
// still holds the call's slot). It returns nil, nil for None.
//
// Its floors, and all that is computed from them (the shared pools, the
// protected and borrowed parts, the available protected capacity), are the
// floors in effect: the configured ones, shrunk while MaxConcurrent or the
// token budget is below the sum of the floors (see Prepare). The ceilings
// are as configured.
// The caller sets RejectDetail.Constraint from Check and ConstraintGlobal
// for a global rejection. The results share no memory with the table.
func (t *Table) Detail(c Class, g Capacity, reserved int64) (*admission.SharedCapacityDetail, *admission.ClassDetail) {
	k := t.get(c)
	if k == nil {
		return nil, nil
	}
	l := &k.limits
	floor, tokFloor := k.floor, k.tokFloor
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
		ProtectedConcurrent:          floor,
		ProtectedConcurrentInUse:     min(k.inFlight, floor),
		BorrowedConcurrent:           max(0, k.inFlight-floor),
		AvailableProtectedConcurrent: max(0, floor-k.inFlight),
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
			ProtectedInFlightTokens:  tokFloor,
			ProtectedTokensInUse:     min(k.tokens, tokFloor),
			BorrowedInFlightTokens:   max(0, k.tokens-tokFloor),
			AvailableProtectedTokens: max(0, tokFloor-k.tokens),
			Requested:                reserved,
		}
		if l.hasMaxTok {
			m, a := l.maxTok, max(0, l.maxTok-k.tokens)
			cd.TokenBudget.MaxInFlightTokens, cd.TokenBudget.Available = &m, &a
		}
	}
	return shared, cd
}

// Stats returns the class part of the statistics, nil on a nil Table.
// g.Budget is the whole budget (the shared token pool in Stats is not
// priority-adjusted); g.SlotHeld is ignored. The result shares no memory
// with the table.
//
// Like Detail it works with the floors in effect. Each class's Limits
// holds its floors in effect (ProtectedConcurrent, ProtectedInFlightTokens)
// and its configured ceilings, so the protected and borrowed fields are
// computed from the Limits beside them. While MaxConcurrent or the token
// budget is below the sum of the floors, those floors are smaller than the
// configured ones, which Classes reports (and the bulkhead's Limits).
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
		lim := k.limits.public()
		lim.ProtectedConcurrent, lim.ProtectedInFlightTokens = k.floor, k.tokFloor
		cs := admission.ClassStats{
			Limits:                      lim,
			InFlight:                    k.inFlight,
			ProtectedConcurrentInUse:    min(k.inFlight, k.floor),
			BorrowedConcurrent:          max(0, k.inFlight-k.floor),
			InFlightTokens:              k.tokens,
			ProtectedTokensInUse:        min(k.tokens, k.tokFloor),
			BorrowedInFlightTokens:      max(0, k.tokens-k.tokFloor),
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

// Classes returns the current class table as configured: the default class
// and every class's limits, for Limits() and Stats().Limits. Its floors are
// the configured ones, even while smaller floors are in effect (see Stats).
// It is a deep copy; an empty admission.Classes on a nil Table.
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
