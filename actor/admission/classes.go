package admission

// This file holds the admission class parts of a reject detail and of the
// statistics. Package classes computes them; the engine attaches them to
// RejectDetail and Stats.

// SharedCapacityDetail is the engine's form of bulkhead.SharedPool; the facade
// converts it, and the root type documents the fields.
type SharedCapacityDetail struct {
	Concurrency SharedConcurrencyDetail
	TokenBudget *SharedBudgetDetail
}

// SharedConcurrencyDetail is the engine's form of bulkhead.SharedPool; the facade
// converts it, and the root type documents the fields.
type SharedConcurrencyDetail struct {
	Capacity          int
	InUse             int
	Available         int
	RequestedBorrowed int
}

// SharedBudgetDetail is the engine's form of bulkhead.SharedBudget; the facade
// converts it, and the root type documents the fields.
type SharedBudgetDetail struct {
	Capacity          int64
	InUse             int64
	Available         int64
	RequestedBorrowed int64
}

// ClassDetail is the engine's form of bulkhead.ClassDetail; the facade
// converts it, and the root type documents the fields.
type ClassDetail struct {
	ID                           string
	InFlight                     int
	ProtectedConcurrent          int
	ProtectedConcurrentInUse     int
	BorrowedConcurrent           int
	AvailableProtectedConcurrent int
	MaxConcurrent                *int
	AvailableConcurrent          *int
	TokenBudget                  *ClassBudgetDetail
}

// ClassBudgetDetail is the engine's form of bulkhead.ClassDetail; the facade
// converts it, and the root type documents the fields.
type ClassBudgetDetail struct {
	InFlightTokens           int64
	ProtectedInFlightTokens  int64
	ProtectedTokensInUse     int64
	BorrowedInFlightTokens   int64
	AvailableProtectedTokens int64
	MaxInFlightTokens        *int64
	Available                *int64
	Requested                int64
}

// ClassesStats is the engine's form of bulkhead.ClassesStats; the facade
// converts it, and the root type documents the fields.
type ClassesStats struct {
	Default string
	Shared  SharedStats
	Classes map[string]ClassStats
}

// SharedStats is the engine's form of bulkhead.SharedPool; the facade
// converts it, and the root type documents the fields.
type SharedStats struct {
	MaxConcurrent       int
	InFlight            int
	AvailableConcurrent int
	TokenBudget         *SharedBudgetStats
}

// SharedBudgetStats is the engine's form of bulkhead.SharedBudget; the facade
// converts it, and the root type documents the fields.
type SharedBudgetStats struct {
	Budget         int64
	InFlightTokens int64
	Available      int64
}

// ClassStats is the engine's form of bulkhead.ClassStats; the facade
// converts it, and the root type documents the fields.
type ClassStats struct {
	Limits                      ClassLimits
	InFlight                    int
	Pending                     int
	ProtectedConcurrentInUse    int
	BorrowedConcurrent          int
	InFlightTokens              int64
	ProtectedTokensInUse        int64
	BorrowedInFlightTokens      int64
	Admitted                    int64
	Released                    int64
	Abandoned                   int64
	AbandonedByCause            map[AbandonCause]int64
	Rejected                    int64
	RejectedByReason            map[Reason]int64
	TotalReserved               int64
	TotalConsumed               int64
	TotalRefunded               int64
	TotalOverrun                int64
	TotalBorrowedAdmissions     int64
	TotalBorrowedTokensReserved int64
	Deadlines                   DeadlineStats
}

// DeadlineStats is the engine's form of bulkhead.DeadlineStats; the facade
// converts it, and the root type documents the fields.
type DeadlineStats struct {
	Active  int64
	Started int64
	Expired int64
	Ended   int64
}
