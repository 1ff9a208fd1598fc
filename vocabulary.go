package bulkhead

import (
	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/admission"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// The vocabulary of requests and usage.
type (
	// Request is the part of an LLM call that admission reads.
	Request = admission.Request
	// Message is one turn of a conversation.
	Message = admission.Message
	// Block is one block of structured content.
	Block = admission.Block
	// Usage is what a call consumed, as the provider reports it.
	Usage = admission.Usage
	// Reservation is what an admission holds against the token budget.
	Reservation = admission.Reservation
	// Estimator turns a request into a reservation.
	Estimator = estimate.Estimator
	// Priority is a call's claim on the high-priority reserve.
	Priority = admission.Priority
	// ID is an admission ID, a random UUID.
	ID = admission.ID
	// Resources says what shared capacity an admission borrowed.
	Resources = admission.Resources
	// Progressive makes a usage report hold only what a stream may still
	// produce.
	Progressive = admission.Progressive
	// UsageReport is the state of a hold after a usage report.
	UsageReport = admission.UsageReport
)

// The priorities.
const (
	Normal = admission.Normal
	High   = admission.High
)

// The vocabulary of limits and decisions.
type (
	// Limits is the runtime-adjustable configuration, one versioned snapshot.
	Limits = admission.Limits
	// BudgetLimits is the adjustable part of a token budget.
	BudgetLimits = admission.BudgetLimits
	// ApplyResult is the outcome of ApplyLimits and SetBudget.
	ApplyResult = admission.ApplyResult
	// Decision is the answer of WouldAdmit.
	Decision = admission.Decision
	// DrainResult is the outcome of Drain.
	DrainResult = admission.DrainResult
	// Reason says why a call was not admitted.
	Reason = admission.Reason
	// Constraint names the limit a capacity rejection hit (with classes).
	Constraint = admission.Constraint
	// RejectDetail is the capacity snapshot a decision was made on.
	RejectDetail = admission.RejectDetail
	// BudgetDetail is the token side of a RejectDetail.
	BudgetDetail = admission.BudgetDetail
	// AbandonCause says why a borrowed slot was given back early.
	AbandonCause = admission.AbandonCause
	// Timing is how long an admission decision took.
	Timing = admission.Timing
)

// StaleRevision is ApplyResult.Reason when a snapshot's revision was not
// above the current one.
const StaleRevision = admission.StaleRevision

// The rejection reasons.
const (
	ConcurrencyLimit  = admission.ConcurrencyLimit
	QueueLimit        = admission.QueueLimit
	Timeout           = admission.Timeout
	Aborted           = admission.Aborted
	Shutdown          = admission.Shutdown
	BudgetLimit       = admission.BudgetLimit
	UnshareableResult = admission.UnshareableResult
	RateLimit         = admission.RateLimit
)

// The vocabulary of admission classes.
type (
	// Classes is an admission class table.
	Classes = admission.Classes
	// ClassLimits is one class's floors and ceilings.
	ClassLimits = admission.ClassLimits
	// SharedCapacityDetail is the shared pool in a RejectDetail.
	SharedCapacityDetail = admission.SharedCapacityDetail
	// SharedConcurrencyDetail is the shared slots in a RejectDetail.
	SharedConcurrencyDetail = admission.SharedConcurrencyDetail
	// SharedBudgetDetail is the shared tokens in a RejectDetail.
	SharedBudgetDetail = admission.SharedBudgetDetail
	// ClassBudgetDetail is the class's tokens in a RejectDetail.
	ClassBudgetDetail = admission.ClassBudgetDetail
	// DeadlineStats counts a class's borrowed-slot deadlines.
	DeadlineStats = admission.DeadlineStats
	// SharedStats is the shared pool in Stats.
	SharedStats = admission.SharedStats
	// SharedBudgetStats is the shared tokens in Stats.
	SharedBudgetStats = admission.SharedBudgetStats
	// ClassDetail is the deciding call's class in a RejectDetail.
	ClassDetail = admission.ClassDetail
	// ClassesStats is the classes block of Stats.
	ClassesStats = admission.ClassesStats
	// ClassStats is one class in Stats.
	ClassStats = admission.ClassStats
)

// Ceiling returns a pointer to n, for the optional ceilings of ClassLimits:
// ClassLimits{MaxConcurrent: bulkhead.Ceiling(2)}.
func Ceiling[T int | int64](n T) *T { return &n }

// The constraints a capacity rejection can name, with classes.
const (
	ConstraintGlobal          = admission.ConstraintGlobal
	ConstraintClass           = admission.ConstraintClass
	ConstraintClassProtection = admission.ConstraintClassProtection
)

// The causes of an abandoned borrowed slot.
const (
	AbandonManual   = admission.AbandonManual
	AbandonDeadline = admission.AbandonDeadline
)

// The vocabulary of errors.
type (
	// BorrowedDeadlineError is the error of a Run that held a borrowed
	// slot past its borrowed-slot deadline.
	BorrowedDeadlineError = admission.BorrowedDeadlineError
	// RejectedError is the error of a call the bulkhead did not admit.
	RejectedError = admission.RejectedError
	// ConfigError reports an invalid field of a configuration, request,
	// option or usage report.
	ConfigError = admission.ConfigError
)

// ErrRejected matches every rejection. Each reason also has its own
// sentinel, so errors.Is(err, ErrBudgetLimit) picks out budget rejections.
var (
	ErrRejected          = admission.ErrRejected
	ErrConcurrencyLimit  = admission.ErrConcurrencyLimit
	ErrQueueLimit        = admission.ErrQueueLimit
	ErrTimeout           = admission.ErrTimeout
	ErrAborted           = admission.ErrAborted
	ErrShutdown          = admission.ErrShutdown
	ErrBudgetLimit       = admission.ErrBudgetLimit
	ErrUnshareableResult = admission.ErrUnshareableResult
	ErrRateLimit         = admission.ErrRateLimit
)

// ErrBorrowedDeadline matches every *BorrowedDeadlineError.
var ErrBorrowedDeadline = admission.ErrBorrowedDeadline

// ErrInternal matches the error of a call during which the engine itself
// failed (a recovered panic); the engine keeps its state and goes on.
var ErrInternal = actor.ErrInternal

// ErrInvalid matches every *ConfigError.
var ErrInvalid = admission.ErrInvalid

// The vocabulary of events and statistics.
type (
	// Hooks is a set of event listeners, subscribed with Subscribe.
	Hooks = admission.Hooks
	// AdmitEvent is emitted when a call is admitted.
	AdmitEvent = admission.AdmitEvent
	// RejectEvent is emitted when a call is rejected.
	RejectEvent = admission.RejectEvent
	// ReleaseEvent is emitted once per admission, at release.
	ReleaseEvent = admission.ReleaseEvent
	// ReconfigureEvent is emitted when limits are applied.
	ReconfigureEvent = admission.ReconfigureEvent
	// UsageEvent is emitted when a usage report changes a hold.
	UsageEvent = admission.UsageEvent
	// AbandonEvent is emitted when a borrowed slot is given back early.
	AbandonEvent = admission.AbandonEvent
	// Stats is a copy of the bulkhead's counters.
	Stats = admission.Stats
	// GateStats counts what happened at the concurrency gate.
	GateStats = admission.GateStats
	// CallStats counts admissions.
	CallStats = admission.CallStats
	// BudgetStats is the token budget and its ledger.
	BudgetStats = admission.BudgetStats
)
