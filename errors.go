package bulkhead

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Reason says why a call was not admitted.
type Reason uint8

// The rejection reasons. The zero Reason means "admitted".
const (
	// ConcurrencyLimit: every slot is taken and the call may not wait, or
	// its class may not take another slot.
	ConcurrencyLimit Reason = iota + 1
	// QueueLimit: every slot and every queue position is taken.
	QueueLimit
	// Timeout: the call waited its whole queue timeout.
	Timeout
	// Aborted: the caller's context ended first.
	Aborted
	// Shutdown: the bulkhead is closed.
	Shutdown
	// BudgetLimit: the token reservation does not fit the budget.
	BudgetLimit
	// UnshareableResult: the call followed an identical one in flight (see
	// Config.Dedup), whose value is for a single consumer (a reader, a
	// channel, an iterator, a response with a body) and cannot be shared
	// without DedupConfig.ShareResult.
	UnshareableResult
	// RateLimit: the call is over one of Config.RateLimits; RetryAfter
	// says when it would go.
	RateLimit
	// RateUnavailable: the rate limits' store (Redis) could not decide, and
	// its failure policy is to say so.
	RateUnavailable
	// FleetUnavailable: the fleet pool (Config.Fleet) could not decide:
	// Redis failed under its FailClosed policy, or lost its state a moment
	// ago and the running calls are registering again.
	FleetUnavailable
	// Cooldown: the provider answered a call for the same model with a 429
	// and a Retry-After that has not passed yet (see Bulkhead.Feedback);
	// RetryAfter says when the cool-down ends.
	Cooldown
	// RetryBudget: the call is a retry (WithAttempt above 0) and its
	// retry budget (Config.RetryBudgets) has no room left; the detail's
	// RetryBudget says which budget, with its numbers. Retrying again does
	// not help: the budget frees as first attempts are admitted.
	RetryBudget
	numReasons
)

// The reasons are the engine's, value for value: the facade converts them
// by a cast, and the engine's table names them.
var _ = [1]struct{}{}[int(numReasons)-admission.NumReasons]

// String returns the reason's wire name, such as "concurrency_limit"; ""
// for the zero Reason.
func (r Reason) String() string { return admission.Reason(r).String() }

// MarshalText encodes the reason as its wire name.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// ErrRejected matches every rejection: errors.Is(err, ErrRejected) is true
// for any *RejectedError.
var ErrRejected = errors.New("bulkhead: rejected")

// One sentinel per reason: errors.Is(err, ErrBudgetLimit) is true for a
// rejection with reason BudgetLimit.
var (
	ErrConcurrencyLimit  = errors.New("bulkhead: rejected: concurrency_limit")
	ErrQueueLimit        = errors.New("bulkhead: rejected: queue_limit")
	ErrTimeout           = errors.New("bulkhead: rejected: timeout")
	ErrAborted           = errors.New("bulkhead: rejected: aborted")
	ErrShutdown          = errors.New("bulkhead: rejected: shutdown")
	ErrBudgetLimit       = errors.New("bulkhead: rejected: budget_limit")
	ErrUnshareableResult = errors.New("bulkhead: rejected: unshareable_result")
	ErrRateLimit         = errors.New("bulkhead: rejected: rate_limit")
	ErrRateUnavailable   = errors.New("bulkhead: rejected: rate_unavailable")
	ErrFleetUnavailable  = errors.New("bulkhead: rejected: fleet_unavailable")
	ErrCooldown          = errors.New("bulkhead: rejected: cooldown")
	ErrRetryBudget       = errors.New("bulkhead: rejected: retry_budget")
)

var sentinels = [...]error{
	ConcurrencyLimit:  ErrConcurrencyLimit,
	QueueLimit:        ErrQueueLimit,
	Timeout:           ErrTimeout,
	Aborted:           ErrAborted,
	Shutdown:          ErrShutdown,
	BudgetLimit:       ErrBudgetLimit,
	UnshareableResult: ErrUnshareableResult,
	RateLimit:         ErrRateLimit,
	RateUnavailable:   ErrRateUnavailable,
	FleetUnavailable:  ErrFleetUnavailable,
	Cooldown:          ErrCooldown,
	RetryBudget:       ErrRetryBudget,
}

// RejectedError is the error of a call the bulkhead did not admit.
//
// errors.Is(err, ErrRejected) matches every rejection, and the sentinel of
// its reason (ErrQueueLimit, ErrBudgetLimit...) matches it too. For an
// Aborted rejection, errors.Is also matches the context's error
// (context.Canceled, context.DeadlineExceeded, or the cancel cause).
//
// Its message is one line with the numbers that decided it, such as
// "bulkhead: rejected: budget_limit: 5000 tokens requested, 1200 of 8000
// available".
type RejectedError struct {
	// Reason says why.
	Reason Reason

	// Detail is the capacity snapshot the decision was made on. Detail's
	// NeverFits tells a call that cannot be admitted under the current
	// limits however long it waits (answer it like an oversized request)
	// from one that does not fit now (retry later).
	Detail *RejectDetail

	// Tag is the caller's tag for the call (see WithTag), "" for none.
	Tag string

	// Cause is what ended an Aborted wait (the context's cause), or the
	// Redis error of a RateUnavailable or FleetUnavailable rejection. For a
	// deduplicated follower that shares its leader's own Aborted or
	// Timeout, it is an error matching ErrLeaderRejected instead.
	Cause error
}

// Error returns a one-line message naming the reason and the numbers that
// decided it.
func (e *RejectedError) Error() string {
	if e.Reason == 0 {
		return "bulkhead: rejected"
	}
	msg := "bulkhead: rejected: " + e.Reason.String()
	if why := explain(e.Reason, e.Detail); why != "" {
		msg += ": " + why
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	if e.Tag != "" {
		msg += " (tag " + strconv.Quote(e.Tag) + ")"
	}
	return msg
}

// Is reports whether target is ErrRejected or the sentinel of e's reason.
func (e *RejectedError) Is(target error) bool {
	if target == ErrRejected {
		return true
	}
	return target != nil && int(e.Reason) < len(sentinels) && target == sentinels[e.Reason]
}

// Unwrap returns the cause of an Aborted, RateUnavailable or
// FleetUnavailable rejection (and of a fleet rejection decided by its
// failure policy while Redis failed), or nil.
func (e *RejectedError) Unwrap() error { return e.Cause }

// RetryAfter returns how long after the rejection the call would be
// admitted, when the bulkhead knows: for a RateLimit rejection, the time
// its rate limit frees its turn (exact, unless other calls take it first);
// for a Cooldown rejection, the time left of its model's cool-down. ok is
// false for every other rejection: capacity frees when calls finish, at no
// time the bulkhead can promise.
func (e *RejectedError) RetryAfter() (d time.Duration, ok bool) {
	if e.Detail == nil {
		return 0, false
	}
	switch {
	case e.Reason == RateLimit && e.Detail.Rate != nil && e.Detail.Rate.RetryAfter > 0:
		return e.Detail.Rate.RetryAfter, true
	case e.Reason == Cooldown && e.Detail.Cooldown != nil && e.Detail.Cooldown.RetryAfter > 0:
		return e.Detail.Cooldown.RetryAfter, true
	}
	return 0, false
}

// NeverFits reports whether the call cannot be admitted under the current
// limits however long it waits: its reservation exceeds the whole budget
// its priority may use or its class's token ceiling, or its class's
// concurrency ceiling is 0. A gateway answers such a call as too large
// rather than as overloaded.
func (e *RejectedError) NeverFits() bool { return e.Detail != nil && e.Detail.NeverFits }

// LogValue logs the rejection as a group: its reason, tag, message and the
// detail's numbers.
func (e *RejectedError) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("reason", e.Reason.String())}
	if e.Tag != "" {
		attrs = append(attrs, slog.String("tag", e.Tag))
	}
	if e.Cause != nil {
		attrs = append(attrs, slog.String("cause", e.Cause.Error()))
	}
	if e.Detail != nil {
		attrs = append(attrs, slog.Any("detail", e.Detail))
	}
	attrs = append(attrs, slog.String("msg", e.Error()))
	return slog.GroupValue(attrs...)
}

// explain says, with numbers, why detail d rejected a call for why.
func explain(why Reason, d *RejectDetail) string {
	// Only a deduplicated follower's own end has no detail: it never
	// reached admission.
	switch {
	case why == Shutdown:
		return "the bulkhead is closed"
	case why == Aborted && d == nil:
		return "the context ended while waiting for an identical call in flight"
	case why == Aborted:
		return "the context ended before admission"
	case why == Timeout && d == nil:
		return "the queue timeout expired while waiting for an identical call in flight"
	case why == UnshareableResult:
		return "the identical call in flight returned a single-consumer value, and Config.Dedup.ShareResult is not set"
	case d == nil:
		return ""
	case (why == RateLimit || why == RateUnavailable) && d.Rate != nil:
		return d.Rate.explain(why)
	case why == Cooldown && d.Cooldown != nil:
		return d.Cooldown.explain()
	case why == RetryBudget && d.RetryBudget != nil:
		return d.RetryBudget.explain()
	case d.Fleet != nil:
		return d.Fleet.explain(why, d.reserved())
	}
	var s string
	class := ""
	if d.Class != nil {
		class = "class " + strconv.Quote(d.Class.Name) + ": "
	}
	switch {
	case why == BudgetLimit && d.Constraint == ConstraintClass && d.Class != nil && d.Class.Limits.MaxInFlightTokens != nil:
		ceiling := *d.Class.Limits.MaxInFlightTokens
		s = fmt.Sprintf("%s%d tokens requested, %d of %d available under the class ceiling",
			class, d.reserved(), max(0, ceiling-d.Class.InFlightTokens), ceiling)
	case why == BudgetLimit && d.Constraint == ConstraintClassProtection && d.Shared != nil && d.Shared.TokenBudget != nil:
		p := d.Shared.TokenBudget
		s = fmt.Sprintf("%swould borrow %d tokens from the shared pool, %d of %d available",
			class, d.WouldBorrow.BorrowedTokens, p.Available, p.Budget)
	case why == BudgetLimit && d.TokenBudget != nil:
		b := d.TokenBudget
		s = fmt.Sprintf("%d tokens requested, %d of %d available", b.Reserved, b.Available, b.EffectiveBudget)
	case why == ConcurrencyLimit && d.Constraint == ConstraintClass && d.Class != nil && d.Class.Limits.MaxConcurrent != nil:
		s = fmt.Sprintf("%s%d of %d in flight under the class ceiling", class, d.Class.InFlight, *d.Class.Limits.MaxConcurrent)
	case why == ConcurrencyLimit && d.Constraint == ConstraintClassProtection && d.Shared != nil:
		s = fmt.Sprintf("%swould borrow a shared slot, %d of %d in use", class, d.Shared.InFlight, d.Shared.MaxConcurrent)
	case why == ConcurrencyLimit && d.MaxConcurrent == 0:
		s = "MaxConcurrent is 0: closed to new calls"
	case why == ConcurrencyLimit:
		s = fmt.Sprintf("%d of %d in flight, no queue", d.InFlight, d.MaxConcurrent)
	case why == QueueLimit:
		s = fmt.Sprintf("%d of %d in flight, %d of %d queued", d.InFlight, d.MaxConcurrent, d.Pending, d.MaxQueue)
	case why == Timeout:
		s = fmt.Sprintf("queue timeout expired, %d of %d in flight, %d of %d queued", d.InFlight, d.MaxConcurrent, d.Pending, d.MaxQueue)
	}
	if d.NeverFits && s != "" {
		s += " (never fits)"
	}
	return s
}

// ErrInvalid matches every error about invalid input: errors.Is(err,
// ErrInvalid) is true for any *ConfigError and *EstimatorError.
var ErrInvalid = admission.ErrInvalid

// ErrInternal matches the error of a call during which the engine itself
// failed (a recovered panic); the engine keeps its state and goes on.
var ErrInternal = actor.ErrInternal

// ConfigError reports a field of a configuration, request, option or usage
// report that is invalid. Invalid input is never a rejection: it is caught
// before anything is taken, so it leaks nothing.
type ConfigError struct {
	// Field names the bad field, for example "Config.MaxConcurrent" or
	// "Request.MaxTokens".
	Field string

	// Problem says what is wrong with it, for example "must be >= 0, got -1".
	Problem string
}

// Error returns "bulkhead: invalid <Field>: <Problem>".
func (e *ConfigError) Error() string { return (*admission.ConfigError)(e).Error() }

// Is reports whether target is ErrInvalid.
func (e *ConfigError) Is(target error) bool { return (*admission.ConfigError)(e).Is(target) }

// LogValue logs the error as a group of its field and problem.
func (e *ConfigError) LogValue() slog.Value {
	return slog.GroupValue(slog.String("field", e.Field), slog.String("problem", e.Problem))
}

func invalidf(field, format string, args ...any) *ConfigError {
	return (*ConfigError)(admission.Invalidf(field, format, args...))
}

func checkNonNegative(field string, v int64) error {
	if v < 0 {
		return invalidf(field, "must be >= 0, got %d", v)
	}
	return nil
}

// ErrBorrowedDeadline matches every *BorrowedDeadlineError.
var ErrBorrowedDeadline = errors.New("bulkhead: borrowed-slot deadline expired")

// BorrowedDeadlineError is the error of a Run whose admission borrowed a
// shared slot and held it past its borrowed-slot deadline. The slot has
// been given back; the callback's context is cancelled with this error as
// its cause, and the callback's later result is discarded (its tokens are
// still settled when it returns).
type BorrowedDeadlineError struct {
	// Deadline is the deadline that expired.
	Deadline time.Duration
	// AdmissionID is the admission whose slot was abandoned.
	AdmissionID ID
	// Resources is what the admission borrowed.
	Resources Resources
	// Class is the admission's class.
	Class string
	// Tag is the caller's tag for the call, "" for none.
	Tag string
}

// Error returns a one-line message.
func (e *BorrowedDeadlineError) Error() string {
	msg := fmt.Sprintf("bulkhead: borrowed-slot deadline %v expired (admission %s, class %q", e.Deadline, e.AdmissionID, e.Class)
	if e.Tag != "" {
		msg += ", tag " + strconv.Quote(e.Tag)
	}
	return msg + ")"
}

// Is reports whether target is ErrBorrowedDeadline.
func (e *BorrowedDeadlineError) Is(target error) bool { return target == ErrBorrowedDeadline }

// LogValue logs the error as a group of its fields.
func (e *BorrowedDeadlineError) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Duration("deadline", e.Deadline),
		slog.String("admission_id", e.AdmissionID.String()),
		slog.String("class", e.Class),
		slog.String("tag", e.Tag),
		slog.Int64("borrowed_tokens", e.Resources.BorrowedTokens),
	)
}

// EstimatorError reports an estimator that failed: it returned an invalid
// reservation, returned an error that is not itself about invalid input,
// or panicked. It matches ErrInvalid: the call is refused before anything
// is taken.
type EstimatorError struct {
	// Estimate is what the estimator returned, when the problem is the
	// returned value.
	Estimate Reservation

	// Problem says what went wrong.
	Problem string

	// Err is the error the estimator returned, or the panic value when it
	// was an error. Unwrap returns it.
	Err error

	// Panic is the recovered panic value when the estimator panicked, and
	// Stack the goroutine's stack at that point.
	Panic any
	Stack []byte
}

// Error returns "bulkhead: invalid estimate: <Problem>".
func (e *EstimatorError) Error() string { return "bulkhead: invalid estimate: " + e.Problem }

// Is reports whether target is ErrInvalid.
func (e *EstimatorError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns Err.
func (e *EstimatorError) Unwrap() error { return e.Err }
