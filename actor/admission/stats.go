package admission

import "time"

// Stats is the engine's statistics in its own form: the counts and gauges
// it keeps, from which the facade derives what users see (the totals of
// the counts, what a limit leaves available, the limits in effect).
type Stats struct {
	Limits Limits
	// The gate: the slots taken, the calls waiting, whether it is closed,
	// and its counts (slots granted and returned, gate-level rejections).
	InFlight, Pending int
	Closed            bool
	Gate              Counts
	// Admissions counts the admissions and releases, every rejection and
	// the abandoned slots; Tokens is what admitted calls hold, with a
	// budget, and Ledger the budget's totals.
	Admissions Counts
	Tokens     int64
	Ledger     Ledger
	Observe    ObserveStats
	// DoubleReleases, ListenerPanics and LedgerDrift count releases of a
	// released lease, listeners that panicked and books found out of
	// balance.
	DoubleReleases, ListenerPanics, LedgerDrift int64
	Cooldown                                    CooldownStats
	// Retries is the retries admitted and the bulkhead's retry budget.
	Retries RetryStats
	// The parts of the features the bulkhead may lack, nil without them.
	Classes  *ClassesStats
	Dedup    *DedupStats
	Rate     *RateStats
	Fleet    *FleetStats
	Adaptive *AdaptiveStats
}

// Counts is what the engine counts at one level (the gate, the admissions,
// a class): grants and returns, rejections by reason and abandoned slots by
// cause. The totals are their sums.
type Counts struct {
	Admitted, Released int64
	Rejected           [NumReasons]int64
	Abandoned          [NumCauses]int64
}

// Rejections returns the rejections of every reason.
func (c Counts) Rejections() int64 { return sum(c.Rejected[:]) }

// Abandonments returns the slots abandoned for every cause.
func (c Counts) Abandonments() int64 { return sum(c.Abandoned[:]) }

func sum(counts []int64) int64 {
	var n int64
	for _, c := range counts {
		n += c
	}
	return n
}

// Ledger is the cumulative token totals of the budget or of a class: what
// was reserved, consumed, refunded and held beyond the reservation. Each
// saturates at math.MaxInt64.
type Ledger struct{ Reserved, Consumed, Refunded, Overrun int64 }

// ObserveStats counts the calls observe mode bypassed, by the rejection
// each was spared, those refused only after they queued, those running,
// and the usage of those that ended with one.
type ObserveStats struct {
	Bypassed                              [NumReasons]int64
	RaceBypassed, InFlight, UsageReported int64
	Input, Output                         int64
}

// CooldownStats is the cool-down stage's state: each model cooling down,
// by the end of its cool-down, and each model's headroom report in force;
// the cool-downs started, the calls held and the headroom reports taken.
type CooldownStats struct {
	Active                         map[string]time.Time
	Headroom                       map[string]HeadroomStats
	Started, Held, HeadroomReports int64
}

// The engine's forms of bulkhead.DedupStats, bulkhead.HeadroomStats,
// bulkhead.RateStats, bulkhead.FleetStats and bulkhead.DeadlineStats, and
// of a provider's report of what is left of its rate limits
// (bulkhead.Headroom), which the facade validates: the facade converts
// each with a type conversion, so the fields stay the same, in the same
// order, and the root types document them.
type (
	DedupStats    struct{ Active, Hits int64 }
	HeadroomStats struct {
		Tokens, Requests, TokensLimit, RequestsLimit int64
		Reported, Full                               time.Time
	}
	RateStats struct {
		Checked, Paced                                    int64
		PacedTime                                         time.Duration
		Fallbacks, Overruns, OverrunTokens, OverrunErrors int64
		OverrunDropped, Refunds, RefundedTokens           int64
		Waiting                                           int
	}
	FleetStats struct {
		Checked, Admitted, PolicyAdmitted                    int64
		InFlight, InFlightTokens, MaxConcurrent, TokenBudget int64
	}
	DeadlineStats struct{ Active, Started, Expired, Ended int64 }
	Headroom      struct {
		Tokens, Requests, TokensLimit, RequestsLimit int64
		TokensReset, RequestsReset                   time.Duration
	}
)

// AdaptiveStats is the adaptive limit's state beside the limits it moves:
// its rule's number, its bounds, the feedback it took and the changes it
// made, and when it last made one.
type AdaptiveStats struct {
	Rule                              uint8
	MinConcurrent, MaxConcurrentBound int
	MinBudget, MaxBudget              int64
	Samples, Increases, Decreases     int64
	LastChange                        time.Time
}
