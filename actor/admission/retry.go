package admission

import "time"

// The retry budgets' vocabulary: the engine counts, over a sliding window,
// the first attempts and the retries it admits, and refuses a retry that
// a budget has no room for (RetryBudget).

// RetryConfig is the engine's form of bulkhead.RetryBudgets: the window
// (its default applied), the bulkhead's own limit (nil for none) and the
// classes' limits, by class name.
type RetryConfig struct {
	Window   time.Duration
	Bulkhead *RetryLimit
	PerClass map[string]RetryLimit
}

// RetryLimit is one budget: retries may be at most the larger of MinRetries
// and Ratio times the first attempts admitted over the window. Ratio is
// the caller's, for details and statistics; PPM is the same ratio in
// millionths, which the engine counts with exactly.
type RetryLimit struct {
	Ratio      float64
	PPM        int64
	MinRetries int
}

// RetryBudgetStats is the engine's form of bulkhead.RetryBudgetStats, of
// which the facade derives Available; the fields are the root type's, in
// its order.
type RetryBudgetStats struct {
	Ratio                           float64
	MinRetries                      int
	Window                          time.Duration
	FirstAttempts, Retries, Allowed int64
}

// RetryBudgetDetail is the engine's form of bulkhead.RetryBudgetDetail:
// the budget that refused a retry (Class "" for the bulkhead's own) and
// its use at the decision.
type RetryBudgetDetail struct {
	Class string
	RetryBudgetStats
}

// RetryStats is the retries' part of the statistics, for the bulkhead or
// one class: the retries admitted, and the budget's use now (nil without
// one).
type RetryStats struct {
	Admitted int64
	Budget   *RetryBudgetStats
}
