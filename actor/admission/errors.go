package admission

import (
	"errors"
	"fmt"
)

// Reason says why a call was not admitted.
type Reason uint8

// The rejection reasons. The zero value, NoReason, means "admitted".
const (
	NoReason          Reason = iota
	ConcurrencyLimit         // every slot is taken and the call may not wait
	QueueLimit               // every slot and every queue position is taken
	Timeout                  // the call waited its whole queue timeout
	Aborted                  // the caller's context ended first
	Shutdown                 // the bulkhead is closed
	BudgetLimit              // the token reservation does not fit the budget
	UnshareableResult        // a dedup follower cannot share its leader's value
	RateLimit                // the call is over a rate limit
	RateUnavailable          // the rate limit's store could not decide
	FleetUnavailable         // the fleet pool could not decide
	Cooldown                 // the call's model is cooling down after a provider's 429
	RetryBudget              // a retry over its retry budget
	numReasons
)

// NumReasons is the number of reasons, NoReason included; reasons index
// arrays of that size.
const NumReasons = int(numReasons)

var reasonNames = [...]string{
	NoReason:          "",
	ConcurrencyLimit:  "concurrency_limit",
	QueueLimit:        "queue_limit",
	Timeout:           "timeout",
	Aborted:           "aborted",
	Shutdown:          "shutdown",
	BudgetLimit:       "budget_limit",
	UnshareableResult: "unshareable_result",
	RateLimit:         "rate_limit",
	RateUnavailable:   "rate_unavailable",
	FleetUnavailable:  "fleet_unavailable",
	Cooldown:          "cooldown",
	RetryBudget:       "retry_budget",
}

// String returns the reason's wire name, such as "concurrency_limit".
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// RejectedError carries a rejection from the engine to the facade, which
// turns it into a *bulkhead.RejectedError.
type RejectedError struct {
	// Reason says why.
	Reason Reason

	// Detail is the capacity snapshot the decision was made on. Every
	// rejection on the admission path carries one; a dedup follower's own
	// wait ending carries none.
	Detail *RejectDetail

	// Cause is what ended an Aborted wait: the context's cause.
	Cause error
}

// Error returns a one-line message naming the reason.
func (e *RejectedError) Error() string {
	msg := "bulkhead: rejected: " + e.Reason.String()
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns the cause of an Aborted rejection, or nil.
func (e *RejectedError) Unwrap() error { return e.Cause }

// ErrInvalid matches every error about invalid input: errors.Is(err,
// ErrInvalid) is true for any *ConfigError.
var ErrInvalid = errors.New("bulkhead: invalid input")

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
func (e *ConfigError) Error() string {
	return "bulkhead: invalid " + e.Field + ": " + e.Problem
}

// Is reports whether target is ErrInvalid.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalid }

// Invalidf returns a *ConfigError for field with a formatted problem.
func Invalidf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// CheckNonNegative returns a *ConfigError for field when v is negative.
func CheckNonNegative(field string, v int64) error {
	if v < 0 {
		return Invalidf(field, "must be >= 0, got %d", v)
	}
	return nil
}

// ReasonSet is a set of reasons, one bit per reason.
type ReasonSet uint16

// Has reports whether r is in the set.
func (s ReasonSet) Has(r Reason) bool { return s&(1<<r) != 0 }

// With returns the set with r added.
func (s ReasonSet) With(r Reason) ReasonSet { return s | 1<<r }
