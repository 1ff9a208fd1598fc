package admission

// Progressive asks ReportUsage to hold only what a live stream may still
// produce, freeing processed input and generated output as the stream goes.
type Progressive struct {
	// RemainingOutput is the most output the stream may still produce. It
	// must not exceed the reservation's MaxOutput.
	RemainingOutput int64
	// SafetyMargin is held on top of RemainingOutput.
	SafetyMargin int64
}

// UsageReport is the state of an admission's token hold after ReportUsage.
type UsageReport struct {
	AdmissionID   ID
	LimitRevision int64
	Class         string
	// Sequence counts the reports that changed the usage or the hold: 1 for
	// the first, 2 for the next... A stale or duplicate report leaves it.
	Sequence int64
	// Reserved is the admission's reservation.
	Reserved int64
	// Held is what the admission holds now; 0 after release or without a
	// budget.
	Held int64
	// Consumed is the reported usage's total (after clamping).
	Consumed int64
	// OutputCap is the reservation's MaxOutput; nil without a budget.
	OutputCap *int64
	// OutputRemaining is max(0, OutputCap - output); nil without a budget.
	OutputRemaining *int64
	// OverReservation is max(0, Consumed - Reserved) with a budget, 0
	// without one (nothing is reserved).
	OverReservation int64
}

// UsageEvent is emitted when a usage report changes an admission's usage or
// hold.
type UsageEvent struct {
	Request        any
	Tag            string
	AdmissionID    ID
	LimitRevision  int64
	Priority       Priority
	Class          string
	Sequence       int64
	ReservedTokens int64
	Resources      Resources
	// PreviousHeld and Held are the hold before and after; Delta is
	// Held - PreviousHeld (positive for an overrun, negative for a refund).
	PreviousHeld int64
	Held         int64
	Delta        int64
	// Usage is the cumulative usage after clamping.
	Usage           Usage
	OutputCap       *int64
	OutputRemaining *int64
	OverReservation int64
	// Progressive is the report's progressive request, nil for a plain one.
	Progressive *Progressive
}
