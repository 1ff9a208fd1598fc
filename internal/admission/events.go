package admission

// AdmitEvent is emitted when a call is admitted.
type AdmitEvent struct {
	Request        any
	Tag            string
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
	Request       any
	Tag           string
	Reason        Reason
	LimitRevision int64
	Detail        *RejectDetail
	Priority      Priority
	Class         string
	Timing
}

// ReleaseEvent is emitted once per admission, when it is released.
type ReleaseEvent struct {
	Request        any
	Tag            string
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
	Request       any
	Tag           string
	AdmissionID   ID
	LimitRevision int64
	Priority      Priority
	Class         string
	Resources     Resources
	Reserved      int64
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
