package admission

// Stats is a copy of the bulkhead's counters and gauges at one instant.
type Stats struct {
	// Limits is the current limits snapshot.
	Limits Limits
	// Gate is the concurrency gate: slots and the queue.
	Gate GateStats
	// Calls is the admission layer: admissions from admit to release.
	Calls CallStats
	// TokenBudget is the token budget, nil without one.
	TokenBudget *BudgetStats
	// Classes is the admission classes and their shared pool, nil without
	// classes.
	Classes *ClassesStats
	// ListenerPanics counts event listeners that panicked.
	ListenerPanics int64
	// LedgerDrift counts the times the engine found its books out of
	// balance: a release, abandonment or hold change that would have taken
	// an in-flight count (slots or tokens, global or of a class) below zero.
	// Each is logged and the count stops at zero. It is 0 unless the engine
	// has a bug.
	LedgerDrift int64
}

// GateStats counts what happened at the concurrency gate.
type GateStats struct {
	// InFlight is the number of slots taken.
	InFlight int
	// Pending is the number of waiting calls.
	Pending int
	// MaxConcurrent and MaxQueue are the current limits.
	MaxConcurrent int
	MaxQueue      int
	// Closed is true after Close.
	Closed bool
	// Admitted counts slots granted, including a slot that a queued call
	// gave straight back because its capacity postcheck failed.
	Admitted int64
	// Released counts slots returned.
	Released int64
	// Aborted counts waiters whose context ended.
	Aborted int64
	// TimedOut counts waiters whose queue timeout expired.
	TimedOut int64
	// Rejected counts gate-level rejections; RejectedByReason splits them.
	Rejected         int64
	RejectedByReason map[Reason]int64
	// DoubleReleases counts Release calls on an already released token.
	DoubleReleases int64
}

// CallStats counts admissions.
type CallStats struct {
	// InFlight is Admitted - Released: admissions not yet released,
	// including any whose borrowed slot was abandoned.
	InFlight int64
	// Admitted and Released count admissions and their releases.
	Admitted int64
	Released int64
	// Abandoned counts borrowed slots given back early; AbandonedByCause
	// splits them.
	Abandoned        int64
	AbandonedByCause map[AbandonCause]int64
	// Rejected counts every rejection; RejectedByReason splits them.
	Rejected         int64
	RejectedByReason map[Reason]int64
}

// BudgetStats is the token budget's state and its cumulative ledger.
type BudgetStats struct {
	// Budget is the current budget.
	Budget int64
	// HighPriorityReserve is the current high-priority reserve.
	HighPriorityReserve int64
	// InFlightTokens is what admitted calls hold now.
	InFlightTokens int64
	// Available is max(0, Budget - InFlightTokens), not priority-adjusted.
	Available int64
	// TotalReserved sums every admission's reservation. This total and the
	// three after it saturate at math.MaxInt64 rather than wrap: the ledger
	// identities over them hold while none has saturated.
	TotalReserved int64
	// TotalConsumed sums the usage reported at release.
	TotalConsumed int64
	// TotalRefunded sums what releases gave back unused.
	TotalRefunded int64
	// TotalOverrun sums hold growth beyond the reservation.
	TotalOverrun int64
}
