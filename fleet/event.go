package fleet

import "strconv"

// Event is a change in a pool's state that an operator should know of. A
// Pool logs each one to Config.Logger (at Warn level, or Info for a return
// to normal) and passes it to Config.OnEvent.
type Event struct {
	// Pool is the pool's name (Config.Pool).
	Pool string
	// Kind says what happened.
	Kind EventKind
}

// EventKind is what an Event reports.
type EventKind uint8

// The kinds of events.
const (
	// StateLost: a reply showed that the pool's state in Redis starts a
	// new generation (Redis lost it, came back with an older one, or
	// leases ran out while nobody renewed them); this replica registers
	// its live holds again. Counted in Stats.StateLosses.
	StateLost EventKind = iota + 1
	// BreakerOpened: Redis failed three times in a row; reserves apply
	// the failure policy without calling Redis until a probe succeeds.
	BreakerOpened
	// BreakerClosed: Redis answers again.
	BreakerClosed
	// LeasesLapsed: the lease of one of this replica's live holds ran out
	// unrenewed (the process was paused, or cut off from Redis, for longer
	// than LeaseTTL); reserves are refused until the live holds are
	// registered again. Counted in Stats.Lapses.
	LeasesLapsed
	// LeasesRestored: the live holds whose leases had run out are
	// registered again; reserves go to Redis as before.
	LeasesRestored
	// HoldReinstated: a renewal found that Redis no longer had one of
	// this replica's live holds (it was reclaimed, its lease having run
	// out) and registered it again.
	HoldReinstated
	numEventKinds
)

var eventKindNames = [...]string{
	StateLost:      "state_lost",
	BreakerOpened:  "breaker_opened",
	BreakerClosed:  "breaker_closed",
	LeasesLapsed:   "leases_lapsed",
	LeasesRestored: "leases_restored",
	HoldReinstated: "hold_reinstated",
}

// EventKinds lists every kind of event, in the order of their values.
func EventKinds() []EventKind {
	kinds := make([]EventKind, 0, numEventKinds-1)
	for k := StateLost; k < numEventKinds; k++ {
		kinds = append(kinds, k)
	}
	return kinds
}

// String returns the kind's name: "state_lost", "breaker_opened",
// "breaker_closed", "leases_lapsed", "leases_restored" or
// "hold_reinstated".
func (k EventKind) String() string {
	if k > 0 && k < numEventKinds {
		return eventKindNames[k]
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// notify passes an event of kind k to Config.OnEvent. mu is held.
func (p *Pool) notify(k EventKind) {
	if p.s.OnEvent != nil {
		p.s.OnEvent(Event{Pool: p.s.Pool, Kind: k})
	}
}
