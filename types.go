package bulkhead

import (
	"strconv"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// ID identifies one admission. It is a random RFC 4122 version 4 UUID,
// minted when the call is admitted and carried by every artefact of that
// admission: its permit, run context, usage reports and events. A call
// that Observe mode bypasses gets an ID of its own too, a version 8 UUID
// that never equals an admission's.
type ID [16]byte

// String formats the ID as a UUID, such as
// "1b4e28ba-2fa1-41d2-883f-0016d3cca427"; a bypassed call's has the prefix
// "shadow-". The zero ID formats as "".
func (id ID) String() string { return admission.ID(id).String() }

// MarshalText encodes the ID as its UUID string.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// Resources says which shared capacity an admission took on loan. Without
// admission classes it is always the zero value.
type Resources struct {
	// BorrowedConcurrency is true when the admission's slot came from the
	// shared pool rather than its class's protected floor.
	BorrowedConcurrency bool
	// BorrowedTokens is how much of the reservation came from the shared
	// token pool.
	BorrowedTokens int64
}

// Timing is how long an admission decision took, from the clock.
type Timing struct {
	// DecisionDuration is the bulkhead's own work on the call, excluding
	// any time spent waiting in the queue.
	DecisionDuration time.Duration
	// QueueWait is the time spent waiting for a slot; zero for a call that
	// never queued.
	QueueWait time.Duration
	// RateWait is the time spent waiting for a rate-limit turn before
	// asking for a slot (RateLimits.Pace); zero for a call that did not.
	RateWait time.Duration
}

// AbandonCause says why a borrowed slot was given back early.
type AbandonCause uint8

// The abandonment causes.
const (
	// AbandonManual is a call to AbandonBorrowedConcurrency.
	AbandonManual AbandonCause = iota
	// AbandonDeadline is the expiry of a borrowed-slot deadline.
	AbandonDeadline
	numCauses
)

// The causes are the engine's, value for value: the facade converts them
// by a cast, and the engine names them.
var _ = [1]struct{}{}[int(numCauses)-admission.NumCauses]

// String returns "manual" or "deadline".
func (c AbandonCause) String() string { return admission.AbandonCause(c).String() }

// MarshalText encodes the cause as "manual" or "deadline".
func (c AbandonCause) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Decision is the answer of WouldAdmit.
type Decision struct {
	// Admit is true when the call would be admitted now or would queue.
	Admit bool
	// Reason is why not, when Admit is false.
	Reason Reason
	// Detail is the capacity snapshot, when asked for with WithDetail.
	Detail *RejectDetail
}

// DrainResult is the outcome of Drain.
type DrainResult struct {
	// Drained is true when nothing was in flight or queued, every admission
	// had been released, every bypassed call had ended, every deduplicated
	// leader had returned (so every follower had its outcome) and every
	// event had been delivered.
	Drained bool
	// InFlight is the number of admissions not yet released when Drain
	// gave up (or whose release was still booking its overrun on rates
	// kept in Redis).
	InFlight int
	// Pending is the number of queued calls when Drain gave up.
	Pending int
	// Bypassed is the number of bypassed calls (see WithMode) still
	// running when Drain gave up.
	Bypassed int
	// DedupActive is the number of deduplicated keys (see DedupConfig)
	// whose leader had not yet returned when Drain gave up: their
	// followers were still waiting.
	DedupActive int
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
