package fleet

import (
	"strconv"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// ID identifies one admission, and so its hold: the 16 bytes of a UUID. In
// Redis it is written as the canonical 36-character UUID string, such as
// "1b4e28ba-2fa1-41d2-883f-0016d3cca427". Every operation is idempotent per
// ID, so retries never count a hold twice.
type ID [16]byte

// String formats the ID as a canonical UUID string.
func (id ID) String() string { return admission.ID(id).UUID() }

// Hold is what one admission holds of the fleet's capacity: Slots is 1 for
// a call that counts against MaxConcurrent and 0 for one that does not (or
// no longer does, see Pool.Adjust); Tokens counts against TokenBudget.
type Hold struct {
	Slots, Tokens int64
}

// Reason says why a reserve was not admitted.
type Reason uint8

// The reasons. The zero value, NoReason, goes with an admission.
const (
	// NoReason: admitted (or a duplicate of a hold that was).
	NoReason Reason = iota
	// Slots: the fleet-wide concurrency limit is reached.
	Slots
	// Tokens: the hold does not fit the fleet-wide token budget.
	Tokens
	// Relearning: the holders of running calls are registering them
	// again; retry shortly. Either the pool's state in Redis is new (the
	// pool's first use; Redis lost the state or came back with an older
	// one; another Redis server serves it, after a restart or a failover;
	// leases ran out while nobody could renew them) and inside its
	// relearn window, or this replica's own leases ran out unrenewed and
	// it has not registered its live holds again yet (then Redis was not
	// asked, and Result.View is zero).
	Relearning
	// Released: the ID was released already; a late retry of its reserve
	// must not bring the hold back.
	Released
	// Unavailable: Redis failed (or the circuit breaker is open) and the
	// policy is FailClosed.
	Unavailable
	numReasons
)

var reasonNames = [...]string{
	NoReason:    "",
	Slots:       "slots",
	Tokens:      "tokens",
	Relearning:  "relearning",
	Released:    "released",
	Unavailable: "unavailable",
}

// String returns the reason's name: "", "slots", "tokens", "relearning",
// "released" or "unavailable".
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// View is the fleet-wide state of the pool as the last script saw it, after
// its own change.
type View struct {
	// Slots and Tokens are the sums over every hold in the pool.
	Slots, Tokens int64
	// MaxConcurrent and TokenBudget are the limits the decision used (-1:
	// not enforced). For a normal-priority reserve the token limit applied
	// was TokenBudget minus HighPriorityReserve.
	MaxConcurrent, TokenBudget int64
	// Gen is the pool's generation: it changes when Redis loses the
	// pool's state or comes back with an older one, when another Redis
	// server serves it (a restart, a failover), and when leases ran out
	// while no replica could renew them.
	Gen string
	// Reclaimed counts the expired holds this script reclaimed.
	Reclaimed int
}

// Result is the outcome of a Reserve.
type Result struct {
	// Admitted reports whether the admission may go ahead.
	Admitted bool
	// Duplicate reports that the ID held already: an earlier reserve of it
	// won, and this one admits the same hold without counting it again.
	Duplicate bool
	// Reason says why the reserve was not admitted.
	Reason Reason
	// View is the fleet-wide state the decision saw; zero when Redis did
	// not answer, or was not asked.
	View View
	// Fallback is non-nil when Redis failed and the failure policy decided
	// (FailOpen and FailLocalShare admit, FailClosed rejects with Reason
	// Unavailable). It matches ErrUnavailable and wraps the client's error.
	Fallback error
	// Unaccounted reports an admission by FailOpen or FailLocalShare that
	// has no hold in Redis yet. The pool registers it with Redis as soon as
	// Redis answers again.
	Unaccounted bool
}

// Stats are a pool's counters and gauges.
type Stats struct {
	// Reserves counts the outcomes of Reserve.
	Reserves ReserveStats
	// Errors counts failed Redis calls by operation.
	Errors ErrorStats
	// PolicyAdmissions and PolicyRejections count the reserves the failure
	// policy decided.
	PolicyAdmissions, PolicyRejections uint64
	// Renews counts the outcomes of lease renewals, one per hold.
	Renews RenewStats
	// Reclaimed counts expired holds (of any replica) this pool's scripts
	// reclaimed.
	Reclaimed uint64
	// StateLosses counts the times this pool saw the pool's generation
	// change: Redis lost the pool's state or came back with an older one,
	// another Redis server serves it (a restart, a failover), or leases
	// ran out while no replica could renew them.
	StateLosses uint64
	// Lapses counts the times this pool found the lease of one of its live
	// holds run out, unrenewed: the process was paused, or cut off from
	// Redis, for longer than LeaseTTL. Reserves are refused (Reason
	// Relearning) until the live holds are registered again.
	Lapses uint64
	// Unaccounted is the number of live holds admitted by the failure
	// policy and not yet registered with Redis.
	Unaccounted int64
	// ReleaseBacklog is the number of releases waiting to be sent.
	ReleaseBacklog int64
	// Adjusts counts the outcomes of usage adjustments.
	Adjusts AdjustStats
	// BreakerOpen reports whether the circuit breaker is open: reserves
	// apply the failure policy without calling Redis.
	BreakerOpen bool
	// LastView is the fleet-wide state the last script reply showed.
	LastView View
	// LocalHolds and LocalTokens are this pool's live holds and the tokens
	// they hold.
	LocalHolds, LocalTokens int64
}

// ReserveStats counts reserves by outcome.
type ReserveStats struct {
	// Admitted counts new holds; Duplicate, reserves of an ID that held
	// already.
	Admitted, Duplicate uint64
	// RejectedSlots and RejectedTokens count rejections by the fleet's
	// concurrency limit and token budget.
	RejectedSlots, RejectedTokens uint64
	// Relearning counts reserves refused after a state loss; Released,
	// late reserves of released IDs.
	Relearning, Released uint64
	// Error counts reserves that Redis failed (or the open breaker
	// skipped); the failure policy decided them.
	Error uint64
}

// ErrorStats counts failed Redis calls by operation.
type ErrorStats struct {
	// Reserve, Release, Adjust and Renew count the failures of each
	// script; Gen, of the generation checks.
	Reserve, Release, Adjust, Renew, Gen ErrorKinds
}

// ErrorKinds counts failed Redis calls by kind: a timeout (CallTimeout or a
// client timeout), a connection error, a script missing from the server's
// cache, or any other error. A missing script (on the first call to a new
// or restarted server, or after SCRIPT FLUSH) is sent in full at once: it
// is counted, but the operation does not fail.
type ErrorKinds struct {
	// Timeout, Conn, NoScript and Other count the errors of each kind.
	Timeout, Conn, NoScript, Other uint64
}

// RenewStats counts lease renewals by outcome, one per hold: renewed;
// reinstated (Redis no longer had the hold, so it was added back);
// released (the ID was tombstoned meanwhile; the hold is dropped); lost
// (Redis no longer had it and it was not added back).
type RenewStats struct {
	// Renewed, Reinstated, Released and Lost count the outcomes.
	Renewed, Reinstated, Released, Lost uint64
}

// AdjustStats counts usage adjustments: applied in Redis; stale (Redis had
// a newer sequence); lost (Redis had no such hold; the next renewal
// registers it again); coalesced (superseded by a later adjustment before
// being sent).
type AdjustStats struct {
	// Applied, Stale, Lost and Coalesced count the outcomes.
	Applied, Stale, Lost, Coalesced uint64
}
