package admission

import "time"

// Limits is the engine's form of bulkhead.Limits; the facade
// converts it, and the root type documents the fields.
type Limits struct {
	Revision      int64
	MaxConcurrent int
	MaxQueue      int
	TokenBudget   *BudgetLimits
	Classes       *Classes
}

// BudgetLimits is the engine's form of bulkhead.BudgetLimits; the facade
// converts it, and the root type documents the fields.
type BudgetLimits struct {
	Budget              int64
	HighPriorityReserve int64
}

// Clone returns a deep copy of l.
func (l Limits) Clone() Limits {
	if l.TokenBudget != nil {
		b := *l.TokenBudget
		l.TokenBudget = &b
	}
	if l.Classes != nil {
		c := l.Classes.Clone()
		l.Classes = &c
	}
	return l
}

// ApplyResult is the engine's form of bulkhead.ApplyResult; the facade
// converts it, and the root type documents the fields.
type ApplyResult struct {
	Applied  bool
	Reason   string
	Previous Limits
	Current  Limits
}

// StaleRevision is ApplyResult.Reason for a snapshot whose revision was not
// above the current one.
const StaleRevision = "stale_revision"

// Constraint names which limit a capacity rejection hit. It is set only when
// the bulkhead has admission classes.
type Constraint string

// The constraints.
const (
	ConstraintGlobal          Constraint = "global"
	ConstraintFleet           Constraint = "fleet"
	ConstraintClass           Constraint = "admission_class"
	ConstraintClassProtection Constraint = "admission_class_protection"
)

// RejectDetail is the engine's form of bulkhead.RejectDetail; the facade
// converts it, and the root type documents the fields.
type RejectDetail struct {
	LimitRevision  int64
	Constraint     Constraint
	InFlight       int
	MaxConcurrent  int
	Pending        int
	MaxQueue       int
	TokenBudget    *BudgetDetail
	SharedCapacity *SharedCapacityDetail
	Class          *ClassDetail
	// Rate is the rate limit that decided a RateLimit or RateUnavailable
	// rejection, nil for every other.
	Rate *RateDetail
	// Fleet is the fleet pool that decided a rejection, nil for every
	// other.
	Fleet *FleetDetail
	// NeverFits is set by the facade's checks (a reservation above the
	// fleet's token budget); the facade works out the engine's own.
	NeverFits bool
}

// FleetDetail is the engine's form of bulkhead.FleetDetail; the facade
// fills it in and converts it, and the root type documents the fields.
type FleetDetail struct {
	Pool                       string
	InFlight, InFlightTokens   int64
	MaxConcurrent, TokenBudget int64
	Generation                 string
	Fallback                   error
}

// External is the verdict of a check made outside the engine (a rate
// limit, a fleet pool) on a call it turns away: the constraint it names and
// the detail it adds to the capacity snapshot.
type External struct {
	Constraint Constraint
	Rate       *RateDetail
	Fleet      *FleetDetail
	NeverFits  bool
}

// RateDetail is the engine's form of bulkhead.RateDetail; the facade
// fills it in and converts it, and the root type documents the fields.
type RateDetail struct {
	Scope      string
	Key        string
	Limit      string
	PerMinute  float64
	Burst      float64
	Weight     float64
	Remaining  float64
	RetryAfter time.Duration
	Fallback   error
}

// BudgetDetail is the engine's form of bulkhead.BudgetDetail; the facade
// converts it, and the root type documents the fields.
type BudgetDetail struct {
	Budget          int64
	InFlightTokens  int64
	EffectiveBudget int64
	Available       int64
	Requested       int64
}

// Classes is the engine's form of bulkhead.Classes; the facade
// converts it, and the root type documents the fields.
type Classes struct {
	Default string
	Limits  map[string]ClassLimits
}

// ClassLimits is the engine's form of bulkhead.ClassLimits; the facade
// converts it, and the root type documents the fields.
type ClassLimits struct {
	ProtectedConcurrent     int
	MaxConcurrent           *int
	ProtectedInFlightTokens int64
	MaxInFlightTokens       *int64
}

// Clone returns a deep copy of c.
func (c Classes) Clone() Classes {
	if c.Limits == nil {
		return c
	}
	m := make(map[string]ClassLimits, len(c.Limits))
	for k, v := range c.Limits {
		if v.MaxConcurrent != nil {
			n := *v.MaxConcurrent
			v.MaxConcurrent = &n
		}
		if v.MaxInFlightTokens != nil {
			n := *v.MaxInFlightTokens
			v.MaxInFlightTokens = &n
		}
		m[k] = v
	}
	c.Limits = m
	return c
}

// Reserved returns the deciding call's reservation, 0 without a budget or
// for a nil detail.
func (d *RejectDetail) Reserved() int64 {
	if d == nil || d.TokenBudget == nil {
		return 0
	}
	return d.TokenBudget.Requested
}
