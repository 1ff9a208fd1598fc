package admission

import (
	"errors"
	"fmt"
	"time"
)

// Reason says why a call was not admitted.
type Reason uint8

// The rejection reasons. The zero value, NoReason, means "admitted".
const (
	NoReason         Reason = iota
	ConcurrencyLimit        // every slot is taken and the call may not wait
	QueueLimit              // every slot and every queue position is taken
	Timeout                 // the call waited its whole queue timeout
	Aborted                 // the caller's context ended first
	Shutdown                // the bulkhead is closed
	BudgetLimit             // the token reservation does not fit the budget
	numReasons
)

// NumReasons is the number of reasons, NoReason included; reasons index
// arrays of that size.
const NumReasons = int(numReasons)

var reasonNames = [...]string{
	NoReason:         "",
	ConcurrencyLimit: "concurrency_limit",
	QueueLimit:       "queue_limit",
	Timeout:          "timeout",
	Aborted:          "aborted",
	Shutdown:         "shutdown",
	BudgetLimit:      "budget_limit",
}

// String returns the reason's wire name, such as "concurrency_limit".
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// MarshalText encodes the reason as its wire name.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Reasons lists every rejection reason, in their numeric order.
func Reasons() []Reason {
	out := make([]Reason, 0, NumReasons-1)
	for r := Reason(1); r < numReasons; r++ {
		out = append(out, r)
	}
	return out
}

// ErrRejected matches every rejection: errors.Is(err, ErrRejected) is true
// for any *RejectedError.
var ErrRejected = errors.New("bulkhead: rejected")

// One sentinel per reason: errors.Is(err, ErrBudgetLimit) is true for a
// rejection with reason BudgetLimit.
var (
	ErrConcurrencyLimit = errors.New("bulkhead: rejected: concurrency_limit")
	ErrQueueLimit       = errors.New("bulkhead: rejected: queue_limit")
	ErrTimeout          = errors.New("bulkhead: rejected: timeout")
	ErrAborted          = errors.New("bulkhead: rejected: aborted")
	ErrShutdown         = errors.New("bulkhead: rejected: shutdown")
	ErrBudgetLimit      = errors.New("bulkhead: rejected: budget_limit")
)

var sentinels = [...]error{
	ConcurrencyLimit: ErrConcurrencyLimit,
	QueueLimit:       ErrQueueLimit,
	Timeout:          ErrTimeout,
	Aborted:          ErrAborted,
	Shutdown:         ErrShutdown,
	BudgetLimit:      ErrBudgetLimit,
}

// Sentinel returns the sentinel error of reason r, or nil for NoReason.
func (r Reason) Sentinel() error {
	if r == NoReason || int(r) >= len(sentinels) {
		return nil
	}
	return sentinels[r]
}

// RejectedError is the error of a call the bulkhead did not admit.
//
// errors.Is(err, ErrRejected) matches every rejection, and the sentinel of
// its reason (ErrQueueLimit, ErrBudgetLimit...) matches it too. For an
// Aborted rejection, errors.Is also matches the context's error
// (context.Canceled, context.DeadlineExceeded, or the cancel cause).
type RejectedError struct {
	// Reason says why.
	Reason Reason

	// Detail is the capacity snapshot the decision was made on. Every
	// rejection on the admission path carries one; a dedup follower's own
	// wait ending carries none.
	Detail *RejectDetail

	// Tag is the caller's tag for the call.
	Tag string

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

// Is reports whether target is ErrRejected or the sentinel of e's reason.
func (e *RejectedError) Is(target error) bool {
	return target == ErrRejected || (target != nil && target == e.Reason.Sentinel())
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
}

// Error returns a one-line message.
func (e *BorrowedDeadlineError) Error() string {
	return fmt.Sprintf("bulkhead: borrowed-slot deadline %v expired (admission %s, class %q)", e.Deadline, e.AdmissionID, e.Class)
}

// Is reports whether target is ErrBorrowedDeadline.
func (e *BorrowedDeadlineError) Is(target error) bool { return target == ErrBorrowedDeadline }
