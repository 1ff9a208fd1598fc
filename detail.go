package bulkhead

import "log/slog"

// RejectDetail is the capacity snapshot a decision was made on.
type RejectDetail struct {
	// LimitRevision is the revision of the limits the decision used.
	LimitRevision int64

	// Constraint is which limit the rejection hit, with classes only.
	Constraint Constraint

	// NeverFits is true when the call cannot be admitted under these limits
	// however long it waits: its reservation exceeds the whole budget its
	// priority may use (a budget of 0 included), its class's token ceiling,
	// or what the shared pool can lend it beyond its class's token floor;
	// or its class's concurrency ceiling is 0, or it has no floor and the
	// shared pool no slot. Otherwise the call did not fit now.
	NeverFits bool

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

	// Shared is the shared pool the classes borrow from, and Class the
	// deciding call's class, both nil without classes. Shared's token side
	// is priority-adjusted: its Budget is taken from the call's effective
	// budget.
	Shared *SharedPool
	Class  *ClassDetail
	// WouldBorrow is what the call would take from the shared pool: a slot
	// when its class is at or above its floor, and the part of its
	// reservation that its class's unused token floor does not cover.
	WouldBorrow Resources

	// Rate is the rate limit that decided a RateLimit or RateUnavailable
	// rejection, nil for every other.
	Rate *RateDetail

	// Fleet is the fleet pool's state when it decided the rejection
	// (Constraint ConstraintFleet, or FleetUnavailable), nil for every
	// other.
	Fleet *FleetDetail

	// Cooldown is the cool-down that decided a Cooldown rejection, nil for
	// every other.
	Cooldown *CooldownDetail

	// RetryBudget is the retry budget that decided a RetryBudget
	// rejection, nil for every other. With classes, Constraint says whose
	// it is: ConstraintGlobal for the bulkhead's, ConstraintClass for the
	// class's own.
	RetryBudget *RetryBudgetDetail
}

// String formats the detail with its pointers followed.
func (d RejectDetail) String() string { return format(d) }

// LogValue logs the detail as a group of its numbers.
func (d *RejectDetail) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Int64("limit_revision", d.LimitRevision),
		slog.Int("in_flight", d.InFlight),
		slog.Int("max_concurrent", d.MaxConcurrent),
		slog.Int("pending", d.Pending),
		slog.Int("max_queue", d.MaxQueue),
	}
	if d.Constraint != "" {
		attrs = append(attrs, slog.String("constraint", string(d.Constraint)))
	}
	if d.NeverFits {
		attrs = append(attrs, slog.Bool("never_fits", true))
	}
	if b := d.TokenBudget; b != nil {
		attrs = append(attrs, slog.Group("token_budget",
			slog.Int64("budget", b.Budget),
			slog.Int64("effective_budget", b.EffectiveBudget),
			slog.Int64("in_flight_tokens", b.InFlightTokens),
			slog.Int64("available", b.Available),
			slog.Int64("reserved", b.Reserved)))
	}
	if c := d.Class; c != nil {
		attrs = append(attrs, slog.Group("class",
			slog.String("name", c.Name),
			slog.Int("in_flight", c.InFlight),
			slog.Int64("in_flight_tokens", c.InFlightTokens)))
	}
	if s := d.Shared; s != nil {
		g := []any{slog.Int("max_concurrent", s.MaxConcurrent), slog.Int("in_flight", s.InFlight)}
		if t := s.TokenBudget; t != nil {
			g = append(g, slog.Int64("budget", t.Budget), slog.Int64("in_flight_tokens", t.InFlightTokens))
		}
		attrs = append(attrs, slog.Group("shared", g...))
	}
	if f := d.Fleet; f != nil {
		g := []any{slog.String("pool", f.Pool), slog.Int64("in_flight", f.InFlight), slog.Int64("max_concurrent", f.MaxConcurrent),
			slog.Int64("in_flight_tokens", f.InFlightTokens), slog.Int64("token_budget", f.TokenBudget)}
		if f.Fallback != nil {
			g = append(g, slog.String("redis_error", f.Fallback.Error()))
		}
		attrs = append(attrs, slog.Group("fleet", g...))
	}
	if r := d.Rate; r != nil {
		g := []any{slog.String("scope", r.Scope), slog.String("key", r.Key), slog.String("limit", r.Limit),
			slog.Float64("per_minute", r.PerMinute), slog.Float64("burst", r.Burst), slog.Float64("weight", r.Weight),
			slog.Duration("retry_after", r.RetryAfter)}
		if r.Limit != "" {
			g = append(g, slog.Float64("remaining", r.Remaining))
		}
		if r.Fallback != nil {
			g = append(g, slog.String("store_error", r.Fallback.Error()))
		}
		attrs = append(attrs, slog.Group("rate", g...))
	}
	if c := d.Cooldown; c != nil {
		attrs = append(attrs, slog.Group("cooldown", slog.String("model", c.Model),
			slog.Time("until", c.Until), slog.Duration("retry_after", c.RetryAfter), slog.Bool("headroom", c.Headroom)))
	}
	if r := d.RetryBudget; r != nil {
		attrs = append(attrs, slog.Group("retry_budget", slog.String("class", r.Class), slog.Float64("ratio", r.Ratio),
			slog.Int("min_retries", r.MinRetries), slog.Duration("window", r.Window), slog.Int64("first_attempts", r.FirstAttempts),
			slog.Int64("retries", r.Retries), slog.Int64("allowed", r.Allowed)))
	}
	return slog.GroupValue(attrs...)
}

// reserved is the call's reservation, 0 without a budget.
func (d *RejectDetail) reserved() int64 {
	if d.TokenBudget == nil {
		return 0
	}
	return d.TokenBudget.Reserved
}

// BudgetDetail is the token budget at decision time.
type BudgetDetail struct {
	// Budget is the configured budget.
	Budget int64
	// EffectiveBudget is the budget for this call's priority: the whole
	// budget for High, the budget less the high-priority reserve for Normal
	// (0 when the reserve exceeds the budget).
	EffectiveBudget int64
	// InFlightTokens is what admitted calls hold.
	InFlightTokens int64
	// Available is EffectiveBudget - InFlightTokens, 0 when in-flight tokens
	// exceed the effective budget.
	Available int64
	// Reserved is the call's reservation.
	Reserved int64
}

// SharedPool is the capacity above the sum of the classes' floors, which
// every class may borrow. Stats and reject details describe it alike.
type SharedPool struct {
	// MaxConcurrent is the shared slot capacity: MaxConcurrent less the sum
	// of the classes' concurrency floors, 0 when the floors take it all.
	MaxConcurrent int
	// InFlight is the shared slots in use: the slots in use beyond what the
	// floors cover (each class counts min(its in flight, its floor) as
	// covered). A reject detail does not count the deciding call's own slot.
	InFlight int
	// AvailableConcurrent is MaxConcurrent - InFlight, 0 when InFlight is
	// above MaxConcurrent.
	AvailableConcurrent int
	// TokenBudget is the shared token pool, nil without a token budget.
	TokenBudget *SharedBudget
}

// SharedBudget is the shared token pool: the budget above the sum of the
// classes' token floors.
type SharedBudget struct {
	// Budget is the budget less the sum of the classes' token floors, 0 when
	// the floors take it all.
	Budget int64
	// InFlightTokens is the tokens held beyond what the floors cover.
	InFlightTokens int64
	// Available is Budget - InFlightTokens, 0 when InFlightTokens is above
	// Budget.
	Available int64
}

// ClassUse is what one class holds and the limits in effect for it. Stats
// and reject details describe a class alike.
type ClassUse struct {
	// Limits is the class's floors and ceilings in effect.
	Limits ClassLimits

	// InFlight is the class's slots in use. An admission whose borrowed
	// slot was abandoned no longer counts here, though it is not released
	// yet.
	InFlight int
	// ProtectedConcurrentInUse is the part of InFlight its floor covers:
	// min(InFlight, Limits.ProtectedConcurrent).
	ProtectedConcurrentInUse int
	// BorrowedConcurrent is the part of InFlight taken from the shared pool.
	BorrowedConcurrent int

	// InFlightTokens is what the class's unreleased admissions hold,
	// abandoned ones included.
	InFlightTokens int64
	// ProtectedTokensInUse is the part of InFlightTokens its token floor
	// covers.
	ProtectedTokensInUse int64
	// BorrowedInFlightTokens is the part of InFlightTokens taken from the
	// shared pool.
	BorrowedInFlightTokens int64
}

// ClassDetail is the deciding call's class at decision time.
type ClassDetail struct {
	// Name is the class's name.
	Name string
	ClassUse
}
