package admission

// AdmitEvent is the engine's form of bulkhead.AdmitEvent; the facade
// converts it, and the root type documents the fields.
type AdmitEvent struct {
	Request        any
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	ReservedTokens int64
	Resources      Resources
	Timing
}

// RejectEvent is the engine's form of bulkhead.RejectEvent; the facade
// converts it, and the root type documents the fields.
type RejectEvent struct {
	Request       any
	Reason        Reason
	LimitRevision int64
	Detail        *RejectDetail
	Priority      Priority
	Class         string
	Timing
}

// ReleaseEvent is the engine's form of bulkhead.ReleaseEvent; the facade
// converts it, and the root type documents the fields.
type ReleaseEvent struct {
	Request        any
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	ReservedTokens int64
	Resources      Resources
	HeldTokens     int64
	RefundedTokens int64
	UsageSequence  int64
	Usage          *Usage
}

// AbandonEvent is the engine's form of bulkhead.AbandonEvent; the facade
// converts it, and the root type documents the fields.
type AbandonEvent struct {
	Request       any
	AdmissionID   ID
	LimitRevision int64
	Priority      Priority
	Class         string
	Resources     Resources
	Reserved      int64
	Cause         AbandonCause
	HeldTokens    int64
}

// ReconfigureEvent is the engine's form of bulkhead.ReconfigureEvent; the facade
// converts it, and the root type documents the fields.
type ReconfigureEvent struct {
	Previous Limits
	Current  Limits
}

// DedupEvent is the engine's form of bulkhead.DedupEvent; the facade
// converts it, and the root type documents the fields.
type DedupEvent struct {
	Request any
	Class   string
	Scope   string
}
