package admission

// Limits is the bulkhead's whole runtime-adjustable configuration, as one
// versioned snapshot. ApplyLimits replaces it atomically.
type Limits struct {
	// Revision orders snapshots: a snapshot applies only when its Revision is
	// above the current one.
	Revision int64

	// MaxConcurrent is the number of calls that may be in flight at once.
	// Zero is the kill switch: new calls are rejected, queued ones wait.
	MaxConcurrent int

	// MaxQueue is how many calls may wait for a slot. Zero means fail fast.
	MaxQueue int

	// TokenBudget is the token budget, or nil when the bulkhead has none.
	// It must be present exactly when the bulkhead was built with one.
	TokenBudget *BudgetLimits

	// Classes is the admission class table, or nil when the bulkhead has
	// none. It must be present exactly when the bulkhead was built with
	// one, with the same class names; its Default may be left empty.
	Classes *Classes
}

// BudgetLimits is the adjustable part of a token budget.
type BudgetLimits struct {
	// Budget is the most tokens that admitted calls may hold at once.
	Budget int64

	// HighPriorityReserve is the part of Budget that only High priority
	// calls may use. It may exceed Budget after a runtime change, which then
	// rejects every Normal call that needs tokens.
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

// ApplyResult is the outcome of ApplyLimits.
type ApplyResult struct {
	// Applied is true when the snapshot was installed.
	Applied bool

	// Reason is "stale_revision" when the snapshot was not applied because
	// its revision was not above the current one.
	Reason string

	// Previous is the snapshot that was current before the call.
	Previous Limits

	// Current is the snapshot current after the call.
	Current Limits
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
	ConstraintClass           Constraint = "admission_class"
	ConstraintClassProtection Constraint = "admission_class_protection"
)

// RejectDetail is the capacity snapshot a decision was made on.
type RejectDetail struct {
	// LimitRevision is the revision of the limits the decision used.
	LimitRevision int64

	// Constraint is which limit the rejection hit, with classes only.
	Constraint Constraint

	// InFlight is the number of slots in use.
	InFlight int
	// MaxConcurrent is the slot limit.
	MaxConcurrent int
	// Pending is the number of waiting calls.
	Pending int
	// MaxQueue is the queue limit.
	MaxQueue int

	// TokenBudget is the token side, nil without a budget.
	TokenBudget *BudgetDetail

	// SharedCapacity is the shared pool the classes borrow from, and Class
	// the deciding call's class, both nil without classes.
	SharedCapacity *SharedCapacityDetail
	Class          *ClassDetail
}

// BudgetDetail is the token budget at decision time.
type BudgetDetail struct {
	// Budget is the configured budget.
	Budget int64
	// InFlightTokens is what admitted calls hold.
	InFlightTokens int64
	// EffectiveBudget is the budget for this call's priority: the whole
	// budget for High, the budget less the high-priority reserve for Normal.
	EffectiveBudget int64
	// Available is max(0, EffectiveBudget - InFlightTokens).
	Available int64
	// Requested is the call's reservation.
	Requested int64
}

// Classes is an admission class table: a fixed set of named classes, each
// with optional floors (protected capacity no other class may use) and
// ceilings (the most the class may use).
type Classes struct {
	// Default is the class of a call that names none. It must be a key of
	// Limits.
	Default string
	// Limits maps each class name to its limits. The key set is fixed for
	// the bulkhead's life.
	Limits map[string]ClassLimits
}

// ClassLimits is one class's floors and ceilings. A nil ceiling means the
// class is bound by the global limits only; a ceiling of zero is valid and
// admits nothing.
type ClassLimits struct {
	// ProtectedConcurrent is the class's concurrency floor: slots that only
	// this class may use.
	ProtectedConcurrent int
	// MaxConcurrent is the class's concurrency ceiling, or nil for none.
	MaxConcurrent *int
	// ProtectedInFlightTokens is the class's token floor. It needs a token
	// budget.
	ProtectedInFlightTokens int64
	// MaxInFlightTokens is the class's token ceiling, or nil for none. It
	// needs a token budget.
	MaxInFlightTokens *int64
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
