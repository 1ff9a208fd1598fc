package admission

// Progressive is the engine's form of bulkhead.Progressive; the facade
// converts it with a type conversion, and the root type documents the
// fields.
type Progressive struct{ RemainingOutput, SafetyMargin int64 }

// UsageResult is what a usage report left an admission with: its
// cumulative usage after clamping, the report's sequence number (the last
// one, for a report that changed nothing) and the hold. The facade makes
// the public report of it, with the admission's own fields.
type UsageResult struct {
	Usage          Usage
	Sequence, Held int64
}
