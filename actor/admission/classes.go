package admission

// This file holds the admission classes' parts of a reject detail and of
// the statistics. Package classes computes them; the engine attaches them
// to RejectDetail and Stats.

// SharedPool is the capacity above the sum of the classes' floors, which
// every class may borrow: its slots and, with a budget (HasTokens), its
// tokens, and what is in use of each. Reject details and statistics
// describe it alike.
type SharedPool struct {
	Slots, SlotsInUse   int
	Tokens, TokensInUse int64
	HasTokens           bool
}

// Available returns the shared slots and tokens not in use, 0 for a pool
// used beyond its size.
func (p SharedPool) Available() (slots int, tokens int64) {
	return max(0, p.Slots-p.SlotsInUse), max(0, p.Tokens-p.TokensInUse)
}

// ClassUse is what one class holds, with its limits in effect (its floors
// as in effect, its ceilings as configured). Reject details and statistics
// describe a class alike; the protected and borrowed parts follow from
// these.
type ClassUse struct {
	Name           string
	Limits         ClassLimits
	InFlight       int
	InFlightTokens int64
}

// ProtectedConcurrentInUse is the part of InFlight the class's floor
// covers.
func (u ClassUse) ProtectedConcurrentInUse() int {
	return min(u.InFlight, u.Limits.ProtectedConcurrent)
}

// BorrowedConcurrent is the part of InFlight taken from the shared pool.
func (u ClassUse) BorrowedConcurrent() int { return max(0, u.InFlight-u.Limits.ProtectedConcurrent) }

// ProtectedTokensInUse is the part of InFlightTokens the class's token
// floor covers.
func (u ClassUse) ProtectedTokensInUse() int64 {
	return min(u.InFlightTokens, u.Limits.ProtectedInFlightTokens)
}

// BorrowedInFlightTokens is the part of InFlightTokens taken from the
// shared pool.
func (u ClassUse) BorrowedInFlightTokens() int64 {
	return max(0, u.InFlightTokens-u.Limits.ProtectedInFlightTokens)
}

// ClassesStats is the classes' part of the statistics: the default class,
// the shared pool (its tokens taken from the whole budget) and every
// class's, in the order of their handles.
type ClassesStats struct {
	Default string
	Shared  SharedPool
	Classes []ClassStats
}

// ClassStats is one class's statistics: what it holds and has waiting, its
// counts and token ledger, the admissions that borrowed a slot and the
// borrowed part of reservations, and its borrowed-slot deadlines.
type ClassStats struct {
	ClassUse
	Counts
	Ledger
	Pending                                    int
	BorrowedAdmissions, BorrowedTokensReserved int64
	Deadlines                                  DeadlineStats
	Retries                                    RetryStats
}
