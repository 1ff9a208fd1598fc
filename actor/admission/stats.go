package admission

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
