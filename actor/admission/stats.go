package admission

import "time"

// Stats is the engine's form of bulkhead.Stats; the facade
// converts it, and the root type documents the fields.
type Stats struct {
	Limits         Limits
	Gate           GateStats
	Calls          CallStats
	TokenBudget    *BudgetStats
	Classes        *ClassesStats
	Observe        ObserveStats
	Dedup          *DedupStats
	ListenerPanics int64
	LedgerDrift    int64
	Cooldown       CooldownStats
	Rate           *RateStats
	Fleet          *FleetStats
	Adaptive       *AdaptiveStats
}

// GateStats is the engine's form of bulkhead.GateStats; the facade
// converts it, and the root type documents the fields.
type GateStats struct {
	InFlight         int
	Pending          int
	MaxConcurrent    int
	MaxQueue         int
	Closed           bool
	Admitted         int64
	Released         int64
	Aborted          int64
	TimedOut         int64
	Rejected         int64
	RejectedByReason map[Reason]int64
	DoubleReleases   int64
}

// CallStats is the engine's form of bulkhead.CallStats; the facade
// converts it, and the root type documents the fields.
type CallStats struct {
	InFlight         int64
	Admitted         int64
	Released         int64
	Abandoned        int64
	AbandonedByCause map[AbandonCause]int64
	Rejected         int64
	RejectedByReason map[Reason]int64
}

// BudgetStats is the engine's form of bulkhead.BudgetStats; the facade
// converts it, and the root type documents the fields.
type BudgetStats struct {
	Budget              int64
	HighPriorityReserve int64
	InFlightTokens      int64
	Available           int64
	TotalReserved       int64
	TotalConsumed       int64
	TotalRefunded       int64
	TotalOverrun        int64
}

// DedupStats is the engine's form of bulkhead.DedupStats; the facade
// converts it, and the root type documents the fields.
type DedupStats struct {
	Active int64
	Hits   int64
}

// CooldownStats is the engine's form of bulkhead.CooldownStats; the facade
// converts it, and the root type documents the fields.
type CooldownStats struct {
	Active          map[string]time.Time
	Started         int64
	Held            int64
	Headroom        map[string]HeadroomStats
	HeadroomReports int64
}

// HeadroomStats is the engine's form of bulkhead.HeadroomStats.
type HeadroomStats struct {
	Tokens, Requests           int64
	TokensLimit, RequestsLimit int64
	Reported, Full             time.Time
}

// Headroom is the engine's form of bulkhead.Headroom, a provider's report
// of what is left of its rate limits; the facade validates it.
type Headroom struct {
	Tokens, Requests           int64
	TokensLimit, RequestsLimit int64
	TokensReset, RequestsReset time.Duration
}

// RateStats is the engine's form of bulkhead.RateStats.
type RateStats struct {
	Checked, Paced                int64
	PacedTime                     time.Duration
	Fallbacks                     int64
	Overruns, OverrunTokens       int64
	OverrunErrors, OverrunDropped int64
	Refunds, RefundedTokens       int64
	Waiting                       int
}

// FleetStats is the engine's form of bulkhead.FleetStats.
type FleetStats struct {
	Checked, Admitted, PolicyAdmitted int64
	InFlight, InFlightTokens          int64
	MaxConcurrent, TokenBudget        int64
}

// AdaptiveStats is the engine's form of bulkhead.AdaptiveStats; Rule is
// the adaptive rule's number.
type AdaptiveStats struct {
	Rule                                             uint8
	MaxConcurrent, MinConcurrent, MaxConcurrentBound int
	Budget, MinBudget, MaxBudget                     int64
	Samples, Increases, Decreases                    int64
	LastChange                                       time.Time
}
