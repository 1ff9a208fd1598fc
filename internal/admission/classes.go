package admission

// This file holds the admission class parts of a reject detail and of the
// statistics. Package classes computes them; the engine attaches them to
// RejectDetail and Stats.

// SharedCapacityDetail is the shared pool at decision time: the capacity
// above the sum of the classes' floors, which every class may borrow.
type SharedCapacityDetail struct {
	// Concurrency is the shared slot pool.
	Concurrency SharedConcurrencyDetail
	// TokenBudget is the shared token pool, nil without a token budget.
	TokenBudget *SharedBudgetDetail
}

// SharedConcurrencyDetail is the shared slot pool at decision time.
type SharedConcurrencyDetail struct {
	// Capacity is max(0, MaxConcurrent - sum of ProtectedConcurrent).
	Capacity int
	// InUse is the slots in use beyond the floors: max(0, in flight - sum
	// over classes of min(class in flight, class floor)), not counting the
	// deciding call's own slot.
	InUse int
	// Available is max(0, Capacity - InUse).
	Available int
	// RequestedBorrowed is 1 when the call would take its slot from the
	// shared pool (its class is at or above its floor), else 0.
	RequestedBorrowed int
}

// SharedBudgetDetail is the shared token pool at decision time. It is
// priority-adjusted: Capacity is taken from the call's effective budget.
type SharedBudgetDetail struct {
	// Capacity is max(0, effective budget - sum of ProtectedInFlightTokens).
	Capacity int64
	// InUse is the tokens held beyond the floors: max(0, in-flight tokens -
	// sum over classes of min(class tokens, class token floor)).
	InUse int64
	// Available is max(0, Capacity - InUse).
	Available int64
	// RequestedBorrowed is the part of the call's reservation that its
	// class's unused token floor does not cover.
	RequestedBorrowed int64
}

// ClassDetail is the deciding call's class at decision time.
type ClassDetail struct {
	// ID is the class name.
	ID string
	// InFlight is the class's slots in use.
	InFlight int
	// ProtectedConcurrent is the class's concurrency floor.
	ProtectedConcurrent int
	// ProtectedConcurrentInUse is min(InFlight, ProtectedConcurrent).
	ProtectedConcurrentInUse int
	// BorrowedConcurrent is max(0, InFlight - ProtectedConcurrent): the
	// class's slots taken from the shared pool.
	BorrowedConcurrent int
	// AvailableProtectedConcurrent is max(0, ProtectedConcurrent - InFlight).
	AvailableProtectedConcurrent int
	// MaxConcurrent is the class's concurrency ceiling, nil for none.
	MaxConcurrent *int
	// AvailableConcurrent is max(0, *MaxConcurrent - InFlight), nil when the
	// class has no concurrency ceiling.
	AvailableConcurrent *int
	// TokenBudget is the class's token side, nil without a token budget.
	TokenBudget *ClassBudgetDetail
}

// ClassBudgetDetail is the token side of a ClassDetail.
type ClassBudgetDetail struct {
	// InFlightTokens is what the class's admissions hold.
	InFlightTokens int64
	// ProtectedInFlightTokens is the class's token floor.
	ProtectedInFlightTokens int64
	// ProtectedTokensInUse is min(InFlightTokens, ProtectedInFlightTokens).
	ProtectedTokensInUse int64
	// BorrowedInFlightTokens is max(0, InFlightTokens -
	// ProtectedInFlightTokens).
	BorrowedInFlightTokens int64
	// AvailableProtectedTokens is max(0, ProtectedInFlightTokens -
	// InFlightTokens).
	AvailableProtectedTokens int64
	// MaxInFlightTokens is the class's token ceiling, nil for none.
	MaxInFlightTokens *int64
	// Available is max(0, *MaxInFlightTokens - InFlightTokens), nil when the
	// class has no token ceiling.
	Available *int64
	// Requested is the call's reservation.
	Requested int64
}

// ClassesStats is the admission class table's part of the statistics.
type ClassesStats struct {
	// Default is the class of a call that names none.
	Default string
	// Shared is the shared pool above the floors.
	Shared SharedStats
	// Classes maps each class name to its statistics.
	Classes map[string]ClassStats
}

// SharedStats is the shared pool above the classes' floors.
type SharedStats struct {
	// MaxConcurrent is the shared slot capacity: max(0, MaxConcurrent - sum
	// of ProtectedConcurrent).
	MaxConcurrent int
	// InFlight is the shared slots in use: max(0, in flight - sum over
	// classes of min(class in flight, class floor)).
	InFlight int
	// AvailableConcurrent is max(0, MaxConcurrent - InFlight).
	AvailableConcurrent int
	// TokenBudget is the shared token pool, nil without a token budget.
	TokenBudget *SharedBudgetStats
}

// SharedBudgetStats is the shared token pool. Unlike a reject detail it is
// not priority-adjusted: it is taken from the whole budget.
type SharedBudgetStats struct {
	// Budget is max(0, Budget - sum of ProtectedInFlightTokens).
	Budget int64
	// InFlightTokens is the tokens held beyond the floors: max(0, in-flight
	// tokens - sum over classes of min(class tokens, class token floor)).
	InFlightTokens int64
	// Available is max(0, Budget - InFlightTokens).
	Available int64
}

// ClassStats is one class's state and cumulative counters.
type ClassStats struct {
	// Limits is the class's current floors and ceilings.
	Limits ClassLimits

	// InFlight is the class's slots in use. An admission whose borrowed
	// slot was abandoned no longer counts here, though it is not released
	// yet: Admitted - Released - InFlight is the number of those.
	InFlight int
	// ProtectedConcurrentInUse is min(InFlight, Limits.ProtectedConcurrent).
	ProtectedConcurrentInUse int
	// BorrowedConcurrent is max(0, InFlight - Limits.ProtectedConcurrent).
	BorrowedConcurrent int

	// InFlightTokens is what the class's unreleased admissions hold,
	// abandoned ones included.
	InFlightTokens int64
	// ProtectedTokensInUse is min(InFlightTokens,
	// Limits.ProtectedInFlightTokens).
	ProtectedTokensInUse int64
	// BorrowedInFlightTokens is max(0, InFlightTokens -
	// Limits.ProtectedInFlightTokens).
	BorrowedInFlightTokens int64

	// Admitted and Released count the class's admissions and releases.
	Admitted int64
	Released int64
	// Abandoned counts borrowed slots given back early; AbandonedByCause
	// splits them.
	Abandoned        int64
	AbandonedByCause map[AbandonCause]int64
	// Rejected counts the class's rejections; RejectedByReason splits them.
	Rejected         int64
	RejectedByReason map[Reason]int64

	// TotalReserved sums the class's reservations. This total and the
	// five after it saturate at math.MaxInt64 rather than wrap.
	TotalReserved int64
	// TotalConsumed sums the usage its releases reported.
	TotalConsumed int64
	// TotalRefunded sums what it gave back unused, early and at release.
	TotalRefunded int64
	// TotalOverrun sums its hold growth beyond the reservation.
	TotalOverrun int64
	// TotalBorrowedAdmissions counts admissions that took a shared slot.
	TotalBorrowedAdmissions int64
	// TotalBorrowedTokensReserved sums the borrowed part of reservations.
	TotalBorrowedTokensReserved int64

	// Deadlines is the class actor's telemetry of borrowed-slot deadlines.
	Deadlines DeadlineStats
}

// DeadlineStats counts a class's borrowed-slot deadlines, as the
// class's child actor saw them.
type DeadlineStats struct {
	// Active is the deadlines running now.
	Active int64
	// Started counts deadlines armed.
	Started int64
	// Expired counts deadlines that fired before their admission ended.
	Expired int64
	// Ended counts deadlines stopped because their admission ended first.
	Ended int64
}
