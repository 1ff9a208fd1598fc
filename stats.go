package bulkhead

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
	// Observe counts the calls Observe mode ran without admitting them.
	Observe ObserveStats
	// Dedup is in-flight deduplication, nil when Config.Dedup is not set.
	Dedup *DedupStats
	// Rate is the rate limits' checks, nil without Config.RateLimits. The
	// calls they turned away are in Calls.RejectedByReason, as RateLimit
	// and RateUnavailable.
	Rate *RateStats
	// Fleet is the fleet pool's decisions and its fleet-wide view, nil
	// without Config.Fleet.
	Fleet *FleetStats
	// Cooldown is the models cooling down after a provider's 429 (see
	// Bulkhead.Feedback) and the calls they held.
	Cooldown CooldownStats
	// Adaptive is the adaptive limits, nil without Config.Adaptive.
	Adaptive *AdaptiveStats
	// Retries is the retries admitted and the retry budget's use (see
	// Config.RetryBudgets). The retries it refused are in
	// Calls.RejectedByReason, as RetryBudget.
	Retries RetryStats
	// Events is the delivery of events to listeners.
	Events EventStats
	// LedgerDrift counts the times the bulkhead found its books out of
	// balance: a release, abandonment or usage report that would have taken
	// an in-flight count (slots or tokens, global or of a class) below
	// zero. Each is logged (Config.Logger) and the count is set to zero. It
	// is 0 unless the bulkhead has a bug.
	LedgerDrift int64
}

// String formats the statistics with their pointers followed.
func (s Stats) String() string { return format(s) }

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
	// DoubleReleases counts Release calls on an already released permit.
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
	// SuspectUsage counts the usage figures above Config.UsageCeiling,
	// each logged and clamped to it; SuspectTokens sums the tokens clamped
	// away (saturating at math.MaxInt64).
	SuspectUsage  int64
	SuspectTokens int64
}

// BudgetStats is the token budget's state and its cumulative ledger.
type BudgetStats struct {
	// Budget is the current budget.
	Budget int64
	// HighPriorityReserve is the current high-priority reserve.
	HighPriorityReserve int64
	// InFlightTokens is what admitted calls hold now.
	InFlightTokens int64
	// Available is Budget - InFlightTokens, 0 when in-flight tokens exceed
	// the budget; not priority-adjusted.
	Available int64
	// TotalReserved sums every admission's reservation. This total and the
	// three after it saturate at math.MaxInt64 rather than wrap around.
	TotalReserved int64
	// TotalConsumed sums the usage reported at release.
	TotalConsumed int64
	// TotalRefunded sums what was given back unused, early and at release.
	TotalRefunded int64
	// TotalOverrun sums hold growth beyond the reservation.
	TotalOverrun int64
}

// ClassesStats is the admission classes' part of the statistics.
type ClassesStats struct {
	// Default is the class of a call that names none.
	Default string
	// Shared is the shared pool above the floors. Its token side is taken
	// from the whole budget, not priority-adjusted.
	Shared SharedPool
	// Classes maps each class name to its statistics.
	Classes map[string]ClassStats
}

// ClassStats is one class's state and cumulative counters.
type ClassStats struct {
	ClassUse

	// Pending is the number of the class's calls waiting in the queue.
	Pending int

	// Admitted and Released count the class's admissions and releases.
	// Admitted - Released - InFlight is the number of admissions whose
	// borrowed slot was abandoned and that are not released yet.
	Admitted int64
	Released int64
	// Abandoned counts borrowed slots given back early; AbandonedByCause
	// splits them.
	Abandoned        int64
	AbandonedByCause map[AbandonCause]int64
	// Rejected counts the class's rejections; RejectedByReason splits them.
	Rejected         int64
	RejectedByReason map[Reason]int64

	// TotalReserved sums the class's reservations. This total and the five
	// after it saturate at math.MaxInt64 rather than wrap around.
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

	// Deadlines counts the class's borrowed-slot deadlines.
	Deadlines DeadlineStats

	// Retries is the class's retries admitted, and its own retry budget's
	// use (nil Budget without one).
	Retries RetryStats
}

// DeadlineStats counts a class's borrowed-slot deadlines.
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

// ObserveStats counts the calls Observe mode bypassed (see WithMode).
// Bypassed calls hold nothing, so they appear here only: no other count of
// Stats includes them.
type ObserveStats struct {
	// Bypassed counts the calls run without admission; RaceBypassed counts
	// those among them refused only after they queued, whose rejection
	// also counts as one; BypassedByReason splits them by the rejection
	// they were spared.
	Bypassed         int64
	RaceBypassed     int64
	BypassedByReason map[Reason]int64
	// InFlight is the bypassed calls whose callback is running.
	InFlight int64
	// UsageReported counts the bypassed calls that ended with a final
	// usage; InputTokens and OutputTokens sum those usages. Both totals
	// saturate at math.MaxInt64 rather than wrap around.
	UsageReported int64
	InputTokens   int64
	OutputTokens  int64
}

// EventStats is the delivery of events to listeners.
type EventStats struct {
	// Backlog is the number of events emitted and not yet handed to every
	// listener: it grows while a listener is slow or blocked.
	Backlog int64
	// ListenerPanics counts listener calls that panicked.
	ListenerPanics int64
}
