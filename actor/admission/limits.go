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

// RejectDetail is the capacity snapshot a decision was made on, in the
// engine's form of bulkhead.RejectDetail: the facade derives what a limit
// leaves available, and the protected and borrowed parts of the class's
// use. The root type documents the fields.
type RejectDetail struct {
	LimitRevision                              int64
	Constraint                                 Constraint
	NeverFits                                  bool
	InFlight, MaxConcurrent, Pending, MaxQueue int
	TokenBudget                                *BudgetDetail
	Shared                                     *SharedPool
	Class                                      *ClassUse
	WouldBorrow                                Resources
	Rate                                       *RateDetail
	Fleet                                      *FleetDetail
	Cooldown                                   *CooldownDetail
	RetryBudget                                *RetryBudgetDetail
}

// BudgetDetail is the token budget at a decision: the budget, the part of
// it the call's priority may fill, what admitted calls hold and what the
// call asks for.
type BudgetDetail struct{ Budget, EffectiveBudget, InFlightTokens, Reserved int64 }

// External is the verdict of a check made outside the engine (a rate
// limit, a fleet pool) on a call it turns away: the constraint it names and
// the detail it adds to the capacity snapshot.
type External struct {
	Constraint Constraint
	Rate       *RateDetail
	Fleet      *FleetDetail
	Cooldown   *CooldownDetail
	Retry      *RetryBudgetDetail
	NeverFits  bool
}

// The engine's forms of bulkhead.RateDetail, bulkhead.FleetDetail and
// bulkhead.CooldownDetail, which the stages fill in: the facade converts
// each with a type conversion, so the fields stay the same, in the same
// order, and the root types document them.
type (
	RateDetail struct {
		Scope, Key, Limit                   string
		PerMinute, Burst, Weight, Remaining float64
		RetryAfter                          time.Duration
		Fallback                            error
	}
	FleetDetail struct {
		Pool                                                 string
		InFlight, InFlightTokens, MaxConcurrent, TokenBudget int64
		Generation                                           string
		Fallback                                             error
	}
	CooldownDetail struct {
		Model      string
		Until      time.Time
		RetryAfter time.Duration
		Headroom   bool
	}
)

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

// Unfittable reports whether the call this detail describes cannot be
// admitted under its limits however long it waits: its reservation is above
// its whole effective budget or its class's token ceiling, its class's
// concurrency ceiling is 0, or it would have to borrow from a shared pool
// that is too small (no shared slot for a class without a floor, or more
// tokens to borrow than the shared budget holds).
func (d *RejectDetail) Unfittable() bool {
	var reserved int64
	if b := d.TokenBudget; b != nil {
		if b.Reserved > b.EffectiveBudget {
			return true
		}
		reserved = b.Reserved
	}
	c := d.Class
	if c == nil {
		return false
	}
	l := &c.Limits
	if m := l.MaxConcurrent; m != nil && *m == 0 {
		return true
	}
	if m := l.MaxInFlightTokens; m != nil && reserved > *m {
		return true
	}
	if s := d.Shared; s != nil {
		// A class without a floor borrows every slot: with no shared slot it
		// never gets one (MaxConcurrent 0 is a kill switch, not this).
		if d.MaxConcurrent > 0 && s.Slots == 0 && l.ProtectedConcurrent == 0 {
			return true
		}
		if s.HasTokens && reserved-l.ProtectedInFlightTokens > s.Tokens {
			return true
		}
	}
	return false
}
