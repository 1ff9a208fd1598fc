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
	// Cooldown is the cool-down that decided a Cooldown rejection, nil for
	// every other.
	Cooldown *CooldownDetail
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
	Cooldown   *CooldownDetail
	NeverFits  bool
}

// CooldownDetail is the engine's form of bulkhead.CooldownDetail; the
// facade fills it in and converts it, and the root type documents the
// fields.
type CooldownDetail struct {
	Model      string
	Until      time.Time
	RetryAfter time.Duration
	Headroom   bool
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

// Unfittable reports whether the call this detail describes cannot be
// admitted under its limits however long it waits: its reservation is above
// its whole effective budget or its class's token ceiling, its class's
// concurrency ceiling is 0, or it would have to borrow from a shared pool
// that is too small (no shared slot for a class without a floor, or more
// tokens to borrow than the shared budget holds).
func (d *RejectDetail) Unfittable() bool {
	var reserved int64
	if b := d.TokenBudget; b != nil {
		if b.Requested > b.EffectiveBudget {
			return true
		}
		reserved = b.Requested
	}
	c := d.Class
	if c == nil {
		return false
	}
	if m := c.MaxConcurrent; m != nil && *m == 0 {
		return true
	}
	var floorTokens int64
	if t := c.TokenBudget; t != nil {
		if m := t.MaxInFlightTokens; m != nil && reserved > *m {
			return true
		}
		floorTokens = t.ProtectedInFlightTokens
	}
	if s := d.SharedCapacity; s != nil {
		// A class without a floor borrows every slot: with no shared slot it
		// never gets one (MaxConcurrent 0 is a kill switch, not this).
		if d.MaxConcurrent > 0 && s.Concurrency.Capacity == 0 && c.ProtectedConcurrent == 0 {
			return true
		}
		if t := s.TokenBudget; t != nil && reserved-floorTokens > t.Capacity {
			return true
		}
	}
	return false
}
