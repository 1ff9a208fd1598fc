package admission

// EventKind is a kind of event.
type EventKind uint8

// The event kinds, one for each listener of bulkhead.Hooks.
const (
	EventAdmit EventKind = iota
	EventReject
	EventRelease
	EventReconfigure
	EventUsage
	EventAbandon
	EventBypass
	EventBypassUsage
	EventBypassRelease
	EventDedup
	NumEventKinds
)

// Event is the engine's record of one event, of any kind: a header that
// every event about a call carries (the call, its admission ID, the limits
// revision it was decided under, its priority, class, reservation and what
// it borrowed), then the fields of its kind, zero for the other kinds. The
// facade turns it into the public event of its kind, and derives what
// follows from these (a hold's delta, a report's output figures). The
// one-byte fields come first, so that the record stays small.
type Event struct {
	Kind     EventKind
	Priority Priority
	// Reason is why a call was rejected, or the rejection a bypassed call
	// was spared; Race says a bypassed call was refused only after it
	// queued (reject, bypass).
	Reason Reason
	Race   bool
	// Cause is why a borrowed slot was given back (abandon).
	Cause AbandonCause
	// HasUsage says a release has a final usage, in Usage.
	HasUsage bool

	Request     any
	ID          ID
	Revision    int64
	Class       string
	Reservation Reservation
	Resources   Resources

	// Detail is the decision's capacity snapshot (reject, bypass).
	Detail *RejectDetail
	// Timing is how long the decision took (admit, reject).
	Timing Timing
	// Held is the hold after a usage report, at an abandonment or at
	// release; PreviousHeld the hold before a usage report; Refunded what a
	// release gave back.
	Held, PreviousHeld, Refunded int64
	// Sequence is a usage report's sequence number, or the last one at
	// release.
	Sequence int64
	// Usage is a usage report's cumulative usage, or the final usage at
	// release (see HasUsage); Progressive is a usage report's progressive
	// request, nil for a plain one.
	Usage       Usage
	Progressive *Progressive
	// Scope is a deduplicated call's dedup scope (dedup).
	Scope string
	// Limits is the limits snapshot replaced and the one applied
	// (reconfigure).
	Limits *[2]Limits
}
