package admission

// BypassEvent is the engine's form of bulkhead.BypassEvent; the facade
// converts it, and the root type documents the fields.
type BypassEvent struct {
	Request        any
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	ReservedTokens int64
	Reason         Reason
	Race           bool
	Detail         *RejectDetail
}

// BypassUsageEvent is the engine's form of bulkhead.BypassUsageEvent; the
// facade converts it, and the root type documents the fields.
type BypassUsageEvent struct {
	Request         any
	AdmissionID     ID
	LimitRevision   int64
	Priority        Priority
	Class           string
	ReservedTokens  int64
	Reason          Reason
	Sequence        int64
	Usage           Usage
	OutputCap       *int64
	OutputRemaining *int64
	OverReservation int64
	Progressive     *Progressive
}

// BypassReleaseEvent is the engine's form of bulkhead.BypassReleaseEvent;
// the facade converts it, and the root type documents the fields.
type BypassReleaseEvent struct {
	Request        any
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	ReservedTokens int64
	Reason         Reason
	UsageSequence  int64
	Usage          *Usage
}

// ObserveStats is the engine's form of bulkhead.ObserveStats; the facade
// converts it, and the root type documents the fields.
type ObserveStats struct {
	Bypassed         int64
	RaceBypassed     int64
	BypassedByReason map[Reason]int64
	InFlight         int64
	UsageReported    int64
	InputTokens      int64
	OutputTokens     int64
}
