package admission

// Progressive is the engine's form of bulkhead.Progressive; the facade
// converts it, and the root type documents the fields.
type Progressive struct {
	RemainingOutput int64
	SafetyMargin    int64
}

// UsageReport is the engine's form of bulkhead.UsageReport; the facade
// converts it, and the root type documents the fields.
type UsageReport struct {
	AdmissionID     ID
	LimitRevision   int64
	Class           string
	Sequence        int64
	Reserved        int64
	Held            int64
	Consumed        int64
	OutputCap       *int64
	OutputRemaining *int64
	OverReservation int64
}

// UsageEvent is the engine's form of bulkhead.UsageEvent; the facade
// converts it, and the root type documents the fields.
type UsageEvent struct {
	Request         any
	AdmissionID     ID
	LimitRevision   int64
	Priority        Priority
	Class           string
	Sequence        int64
	ReservedTokens  int64
	Resources       Resources
	PreviousHeld    int64
	Held            int64
	Delta           int64
	Usage           Usage
	OutputCap       *int64
	OutputRemaining *int64
	OverReservation int64
	Progressive     *Progressive
}
