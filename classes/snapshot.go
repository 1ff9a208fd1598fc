package classes

import "github.com/llmbulkhead/bulkhead/actor/admission"

// Detail returns the class parts of a reject detail for a call of class c
// reserving reserved tokens, from the same numbers Check decides on (so g
// is given as to Check: the effective budget, and SlotHeld when the caller
// still holds the call's slot): the shared pool, the class's use, and what
// the call would borrow. It returns nil, nil and nothing borrowed for None.
//
// Its floors, and all that is computed from them (the shared pool, what
// the call would borrow), are the floors in effect: the configured ones,
// shrunk while MaxConcurrent or the token budget is below the sum of the
// floors (see Prepare). The ceilings are as configured.
// The caller sets RejectDetail.Constraint from Check and ConstraintGlobal
// for a global rejection. The results share no memory with the table.
func (t *Table) Detail(c Class, g Capacity, reserved int64) (*admission.SharedPool, *admission.ClassUse, admission.Resources) {
	k := t.get(c)
	if k == nil {
		return nil, nil, admission.Resources{}
	}
	shared, use := t.shared(&g), k.use()
	borrow := admission.Resources{BorrowedConcurrency: k.borrowsSlot()}
	if t.hasBudget {
		borrow.BorrowedTokens = k.borrowedTokens(reserved)
	}
	return &shared, &use, borrow
}

// shared is the shared pool at g.
func (t *Table) shared(g *Capacity) admission.SharedPool {
	p := admission.SharedPool{Slots: t.sharedCapacity(g), SlotsInUse: t.sharedInUse(g), HasTokens: t.hasBudget}
	if t.hasBudget {
		p.Tokens, p.TokensInUse = t.sharedTokenCapacity(g), t.sharedTokensInUse(g)
	}
	return p
}

// use is what k holds, with its limits in effect: its floors in effect and
// its configured ceilings.
func (k *state) use() admission.ClassUse {
	l := k.limits.public()
	l.ProtectedConcurrent, l.ProtectedInFlightTokens = k.floor, k.tokFloor
	return admission.ClassUse{Name: k.name, Limits: l, InFlight: k.inFlight, InFlightTokens: k.tokens}
}

// Stats returns the class part of the statistics, nil on a nil Table.
// g.Budget is the whole budget (the shared token pool in Stats is not
// priority-adjusted); g.SlotHeld is ignored. The result shares no memory
// with the table.
//
// Like Detail it works with the floors in effect. Each class's Limits
// holds its floors in effect (ProtectedConcurrent, ProtectedInFlightTokens)
// and its configured ceilings, so the protected and borrowed parts follow
// from the Limits beside them. While MaxConcurrent or the token budget is
// below the sum of the floors, those floors are smaller than the
// configured ones, which Classes reports (and the bulkhead's Limits).
func (t *Table) Stats(g Capacity) *admission.ClassesStats {
	if t == nil {
		return nil
	}
	g.SlotHeld = false
	st := &admission.ClassesStats{Default: t.names[t.def], Shared: t.shared(&g), Classes: make([]admission.ClassStats, len(t.classes))}
	for i := range t.classes {
		k := &t.classes[i]
		st.Classes[i] = admission.ClassStats{
			ClassUse: k.use(), Counts: k.counts, Ledger: k.ledger,
			BorrowedAdmissions: k.borrowedAdmissions, BorrowedTokensReserved: k.borrowedTokensReserved,
		}
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
