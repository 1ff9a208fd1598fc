package admission

// AdmitEvent is emitted when a call is admitted.
type AdmitEvent struct {
	Request        *Request
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	ReservedTokens int64
	Resources      Resources
	Timing
}

// RejectEvent is emitted when a call is rejected on the admission path.
type RejectEvent struct {
	Request       *Request
	Reason        Reason
	LimitRevision int64
	Detail        *RejectDetail
	Priority      Priority
	Class         string
	Timing
}

// ReleaseEvent is emitted once per admission, when it is released.
type ReleaseEvent struct {
	Request        *Request
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	ReservedTokens int64
	Resources      Resources
	// HeldTokens is what the admission held at release.
	HeldTokens int64
	// RefundedTokens is what the release gave back unused: HeldTokens less
	// the reported usage, when usage was reported and is smaller.
	RefundedTokens int64
	// UsageSequence is the last usage sequence number of the admission.
	UsageSequence int64
	// Usage is the final usage, nil when none was reported.
	Usage *Usage
}

// AbandonEvent is emitted when an admission gives its borrowed slot back
// early, by hand or because its borrowed-slot deadline expired.
type AbandonEvent struct {
	Request       *Request
	AdmissionID   ID
	LimitRevision int64
	Priority      Priority
	Class         string
	Resources     Resources
	Cause         AbandonCause
	// HeldTokens is what the admission still holds: abandoning keeps it
	// until release.
	HeldTokens int64
}

// ReconfigureEvent is emitted when a new limits snapshot is applied.
type ReconfigureEvent struct {
	Previous Limits
	Current  Limits
}

// Hooks is a set of event listeners; nil fields are not called. Subscribe a
// Hooks value with Bulkhead.Subscribe.
//
// Listeners run on the bulkhead's event goroutine, one event at a time, in
// the order the events happened, and never on the caller's goroutine. A slow
// listener delays only later events; a panicking one is recovered and
// counted, and admission goes on. A listener may call the bulkhead's
// methods, but not Drain after Close: Drain waits for event delivery. By the time a listener sees an event,
// Stats already reflects the change it reports.
type Hooks struct {
	// Admit is called for every admission.
	Admit func(AdmitEvent)
	// Reject is called for every rejection on the admission path.
	Reject func(RejectEvent)
	// Release is called once for every admission, when it is released.
	Release func(ReleaseEvent)
	// Reconfigure is called when a limits snapshot is applied.
	Reconfigure func(ReconfigureEvent)
	// Usage is called when a usage report changes an admission's usage or
	// hold, between its Admit and its Release.
	Usage func(UsageEvent)
	// Abandon is called when an admission gives its borrowed slot back
	// early, between its Admit and its Release.
	Abandon func(AbandonEvent)
}
