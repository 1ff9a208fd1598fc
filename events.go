package bulkhead

// Admission identifies one call on each of its events: what it asked for and,
// once admitted, what it was given.
type Admission struct {
	// ID is the admission's ID, or a bypassed call's own; zero on a
	// RejectEvent.
	ID ID
	// Request is the call's request, as the caller passed it.
	Request *Request
	// Tag is the caller's tag for the call (see WithTag), "" for none.
	Tag string
	// Attempt is the call's attempt number (see WithAttempt): 0 for a
	// first attempt, 1 for the first retry, and so on.
	Attempt int
	// Priority is the call's priority.
	Priority Priority
	// Class is the call's admission class, "" without classes.
	Class string
	// LimitRevision is the revision of the limits the call was admitted (or
	// rejected) under. It never changes for an admission.
	LimitRevision int64
	// Reserved is the call's reservation: what it asked to hold against
	// the token budget, 0 without a budget.
	Reserved int64
	// Resources is what the admission borrowed; zero on a RejectEvent.
	Resources Resources
}

// AdmitEvent is emitted when a call is admitted.
type AdmitEvent struct {
	Admission
	Timing
}

// RejectEvent is emitted when a call is rejected on the admission path.
type RejectEvent struct {
	Admission
	// Reason is why.
	Reason Reason
	// Detail is the capacity snapshot the decision was made on.
	Detail *RejectDetail
	Timing
}

// ReleaseEvent is emitted once per admission, when it is released.
type ReleaseEvent struct {
	Admission
	// Held is what the admission held at release.
	Held int64
	// Refunded is what the release gave back unused: Held less the
	// reported usage, when usage was reported and is smaller.
	Refunded int64
	// UsageSequence is the admission's last usage sequence number.
	UsageSequence int64
	// Usage is the final usage, nil when none was reported.
	Usage *Usage
}

// UsageEvent is emitted when a usage report changes an admission's usage or
// hold.
type UsageEvent struct {
	Admission
	// Sequence is the report's sequence number: 1, 2, 3... per admission.
	Sequence int64
	// PreviousHeld and Held are the hold before and after; Delta is
	// Held - PreviousHeld (positive for an overrun, negative for a refund).
	PreviousHeld int64
	Held         int64
	Delta        int64
	// Usage is the cumulative usage after clamping.
	Usage Usage
	// OutputCap and OutputRemaining are those of the UsageReport; nil
	// without a budget.
	OutputCap       *int64
	OutputRemaining *int64
	// OverReservation is how far the usage exceeds Reserved.
	OverReservation int64
	// Progressive is the report's progressive request, nil for a plain one.
	Progressive *Progressive
}

// AbandonEvent is emitted when an admission gives its borrowed slot back
// early, by hand or because its borrowed-slot deadline expired.
type AbandonEvent struct {
	Admission
	// Cause says why.
	Cause AbandonCause
	// Held is what the admission still holds: abandoning keeps it until
	// release.
	Held int64
}

// BypassEvent is emitted when Observe mode runs a call without admitting
// it (see WithMode). Its Admission has the bypass's own ID, the
// reservation the call asked for in Reserved, and zero Resources: a
// bypassed call holds nothing.
type BypassEvent struct {
	Admission
	Bypass
}

// BypassUsageEvent is emitted when a usage report changes a bypassed
// call's usage. Nothing is held, so it carries no hold.
type BypassUsageEvent struct {
	Admission
	// Reason is the rejection the call was spared.
	Reason Reason
	// Sequence is the report's sequence number: 1, 2, 3... per call.
	Sequence int64
	// Usage is the cumulative usage after clamping.
	Usage Usage
	// OutputCap and OutputRemaining are those of the UsageReport; nil
	// without a budget.
	OutputCap       *int64
	OutputRemaining *int64
	// OverReservation is how far the usage exceeds Reserved.
	OverReservation int64
	// Progressive is the report's progressive request, nil for a plain one.
	Progressive *Progressive
}

// BypassReleaseEvent is emitted once per bypassed call, when its callback
// ends.
type BypassReleaseEvent struct {
	Admission
	// Reason is the rejection the call was spared.
	Reason Reason
	// UsageSequence is the call's last usage sequence number.
	UsageSequence int64
	// Usage is the final usage, nil when none was recorded: what the
	// callback set with RunContext.SetUsage, else its last report.
	Usage *Usage
}

// ReconfigureEvent is emitted when a new limits snapshot is applied.
type ReconfigureEvent struct {
	// Previous is the snapshot that was current before.
	Previous Limits
	// Current is the snapshot applied.
	Current Limits
}

// Hooks is a set of event listeners; nil fields are not called. Subscribe a
// Hooks value with Bulkhead.Subscribe.
//
// Listeners run on the bulkhead's event goroutine, one event at a time, in
// the order the events happened, and never on the caller's goroutine. A slow
// listener delays only later events (Stats shows the backlog); a panicking
// one is recovered and counted, and admission goes on. A listener may call
// the bulkhead's methods, but not Drain or Shutdown: they wait for event
// delivery, which waits for the listener. By the time a listener sees an
// event, Stats already reflects the change it reports.
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
	// Bypass is called when Observe mode runs a call without admitting it.
	// A race bypass's Reject comes first.
	Bypass func(BypassEvent)
	// BypassUsage is called when a usage report changes a bypassed call's
	// usage, between its Bypass and its BypassRelease.
	BypassUsage func(BypassUsageEvent)
	// BypassRelease is called once for every bypassed call, when its
	// callback ends.
	BypassRelease func(BypassReleaseEvent)
	// Dedup is called when a Run joins an identical call in flight, to
	// share its result (see Config.Dedup).
	Dedup func(DedupEvent)
}

// String formats the identity with its request followed, not its address.
func (a Admission) String() string { return format(a) }

// String formats the event with its pointers followed.
func (e AdmitEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e RejectEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e ReleaseEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e UsageEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e AbandonEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e BypassEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e BypassUsageEvent) String() string { return format(e) }

// String formats the event with its pointers followed.
func (e BypassReleaseEvent) String() string { return format(e) }

// String formats the event with its request followed.
func (e DedupEvent) String() string { return format(e) }
