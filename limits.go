package bulkhead

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

// String formats the snapshot with its pointers followed.
func (l Limits) String() string { return format(l) }

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

// ApplyResult is the outcome of ApplyLimits and SetBudget.
type ApplyResult struct {
	// Applied is true when the snapshot was installed.
	Applied bool

	// Reason says why the snapshot was not applied, when Applied is false.
	Reason ApplyReason

	// Previous is the snapshot that was current before the call.
	Previous Limits

	// Current is the snapshot current after the call.
	Current Limits
}

// ApplyReason says why ApplyLimits left the limits as they were.
type ApplyReason string

// StaleRevision is the ApplyReason of a snapshot whose revision was not
// above the current one.
const StaleRevision ApplyReason = "stale_revision"

// Constraint names which limit a capacity rejection hit. It is set only when
// the bulkhead has admission classes, or for the fleet pool's limits.
type Constraint string

// The constraints.
const (
	// ConstraintGlobal is a bulkhead-wide limit: MaxConcurrent, MaxQueue or
	// the token budget.
	ConstraintGlobal Constraint = "global"
	// ConstraintClass is a ceiling of the call's class.
	ConstraintClass Constraint = "admission_class"
	// ConstraintClassProtection is the shared pool: the call would borrow
	// capacity that other classes' floors protect.
	ConstraintClassProtection Constraint = "admission_class_protection"
	// ConstraintFleet is a limit of Config.Fleet, shared by every replica.
	ConstraintFleet Constraint = "fleet"
)

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

// String formats the table with its ceilings followed.
func (c Classes) String() string { return format(c) }

// ClassLimits is one class's floors and ceilings. A nil ceiling means the
// class is bound by the global limits only. A ceiling of zero is valid: a
// concurrency ceiling of 0 admits nothing, a token ceiling of 0 admits only
// calls that reserve no tokens.
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

// String formats the limits with the ceilings' values, not their
// addresses.
func (l ClassLimits) String() string { return format(l) }

// Ceiling returns a pointer to n, for the optional ceilings of ClassLimits:
// ClassLimits{MaxConcurrent: bulkhead.Ceiling(2)}.
func Ceiling[T int | int64](n T) *T { return &n }

// Clone returns a deep copy of c.
func (c Classes) Clone() Classes {
	if c.Limits == nil {
		return c
	}
	m := make(map[string]ClassLimits, len(c.Limits))
	for k, v := range c.Limits {
		m[k] = v.clone()
	}
	c.Limits = m
	return c
}
