package props_test

import (
	"fmt"
	"math"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
)

// Pace mode (RateLimits.Pace, SPEC P6, P7, X2): a call over the rate waits
// for its turn outside the queue, then takes its slot; while its model
// cools down it waits in the cooling line (HoldCooldown) before booking its
// turn, and the calls waiting for turns inside a cool-down that begins give
// them back and wait there too, to take new turns after it in the order
// they came (or, ShedCooldown, are turned away). The model keeps those
// calls in m.parked; the oracle books their turns, and gives turns back,
// as the engine does on its own store.

// parkKind is where a paced call waits outside the queue.
type parkKind int

const (
	notParked   parkKind = iota
	parkTurn             // for its turn, on its own timer
	parkCooling          // for the cool-down to end, on the hold timer
)

// paced reports whether the bulkhead paces its calls.
func (m *machine) paced() bool { return m.rate != nil && m.rate.cfg.Pace }

// maxWait is the longest turn w may book: what is left of its queue
// timeout (short of a microsecond, which the slot keeps), unbounded
// without one.
func maxWait(w *waiter) time.Duration {
	if w.left <= 0 {
		return time.Duration(math.MaxInt64)
	}
	return max(0, w.left-time.Microsecond)
}

// lateFor reports whether paced w may not wait the cool-down out: it
// outlasts what is left of its queue timeout.
func (m *machine) lateFor(w *waiter) bool { return m.late(w.left) }

// pacedCall makes paced call w (described by c): closed, a done context,
// the cool-down, then proceedPaced.
func (m *machine) pacedCall(t *rapid.T, w *waiter, c call) {
	w.left = c.timeout
	m.tokensFrozen = true
	var es []expect
	switch {
	case m.closed:
		es = []expect{m.reject(w, bulkhead.Shutdown, "", true)}
	case c.ctxDone:
		es = []expect{m.reject(w, bulkhead.Aborted, "", true)}
	default:
		es = m.proceedPaced(w)
	}
	if len(m.stepAdmits) > 0 {
		m.tokensFrozen = false
	}
	m.awaitAll(t, es)
	m.waitParked(t)
}

// proceedPaced runs paced w's stages from where it stands, as the engine
// does for a new call, at its turn and when its cool-down is over: the
// cool-down (held in the cooling line, or turned away), the capacity
// checks, the gate (MaxQueue is 0 with rates: a call that finds no slot is
// turned away), its turn, then its slot.
func (m *machine) proceedPaced(w *waiter) []expect {
	if m.coolingNow() {
		w.turned = false // a turn taken inside the cool-down is given up
		if !m.hold || m.lateFor(w) {
			m.seen["paced: shed for the cool-down"]++
			return []expect{m.reject(w, bulkhead.Cooldown, "", false)}
		}
		m.parkCooling(w)
		return nil
	}
	if why, cons := m.capacity(w.class, w.prio, w.res.Reserved); why != noReason {
		return []expect{m.reject(w, why, cons, false)}
	}
	if m.inFlight >= m.limits.MaxConcurrent {
		// No slot, and no queue (MaxQueue is 0 with rates): turned away
		// before it books a turn.
		return []expect{m.reject(w, bulkhead.ConcurrencyLimit, m.global(), true)}
	}
	if !w.turned {
		delay, rd := m.rate.turn(m, w.res, maxWait(w))
		if rd != nil {
			e := m.reject(w, bulkhead.RateLimit, "", false)
			e.reject.ev.Detail.Rate = rd
			return []expect{e}
		}
		w.turned = true
		if delay > 0 {
			m.parkTurn(w, delay)
			return nil
		}
	}
	m.gate.Admitted++
	m.seen["paced: admitted"]++
	return []expect{m.grant(w, false)}
}

// parkTurn makes w wait delay for its turn, on a timer of its own.
func (m *machine) parkTurn(w *waiter, delay time.Duration) {
	w.park, w.parkedAt, w.turnAt = parkTurn, m.clk.Now(), m.clk.Now().Add(delay)
	m.parked = append(m.parked, w)
	m.timers++
	m.seen["paced: waits for its turn"]++
}

// parkCooling makes w wait the cool-down out, on the hold timer.
func (m *machine) parkCooling(w *waiter) {
	m.holdCall(w)
	w.park, w.parkedAt = parkCooling, m.clk.Now()
	m.parked = append(m.parked, w)
	slices.SortFunc(m.parked, func(a, b *waiter) int { return a.id - b.id }) // in the order they came
	m.armHold()
	m.seen["paced: waits for the cool-down"]++
}

// endPark takes w off its wait now: the wait comes off its queue timeout,
// and a wait for its turn counts in the rate statistics (the call once).
func (m *machine) endPark(w *waiter) {
	waited := m.clk.Now().Sub(w.parkedAt)
	if w.park == parkTurn {
		if !w.pacedOnce {
			w.pacedOnce = true
			m.rateStats.Paced++
		}
		m.rateStats.PacedTime += waited
	}
	if w.left > 0 {
		w.left = max(time.Microsecond, w.left-waited)
	}
	w.park = notParked
	m.parked = slices.DeleteFunc(m.parked, func(x *waiter) bool { return x == w })
}

// turnStep moves the clock to the next paced timer: the next turn, or the
// end of the cool-down the cooling line waits for (see advance).
func (m *machine) turnStep(t *rapid.T) {
	if len(m.parked) == 0 {
		t.Skip("no paced call waits")
	}
	m.toPacedTimer = true
	defer func() { m.toPacedTimer = false }()
	m.advance(t)
}

// nextTurn is the waiter whose turn comes first, nil for none.
func (m *machine) nextTurn() *waiter {
	var next *waiter
	for _, w := range m.parked {
		if w.park == parkTurn && (next == nil || w.turnAt.Before(next.turnAt)) {
			next = w
		}
	}
	return next
}

// turnComes is w's turn: it goes on.
func (m *machine) turnComes(w *waiter) []expect {
	m.endPark(w)
	m.seen["paced: turn came"]++
	return m.proceedPaced(w)
}

// wakeCooling is the hold timer firing for the cooling line: the calls
// whose cool-down is over go on in the order they came; for the others
// the hold timer is armed again.
func (m *machine) wakeCooling() []expect {
	var es []expect
	for _, w := range slices.Clone(m.parked) {
		if w.park != parkCooling {
			continue
		}
		if m.coolingNow() {
			m.armHold()
			continue
		}
		m.endPark(w)
		m.seen["paced: cool-down over"]++
		es = append(es, m.proceedPaced(w)...)
	}
	return es
}

// coolTurns is a cool-down beginning (or growing) while paced calls wait
// for turns inside it: with HoldCooldown every call waiting for its turn
// gives it back and waits in the cooling line (or, when it may not wait
// that long, is turned away Cooldown); with ShedCooldown those whose turns
// fall inside it are turned away. The turns given back go back to each
// rate they booked weight in, unless a turn kept there comes after them.
func (m *machine) coolTurns() []expect {
	now := m.clk.Now()
	inside := slices.ContainsFunc(m.parked, func(w *waiter) bool {
		return w.park == parkTurn && w.turnAt.After(now) && w.turnAt.Before(m.coolUntil)
	})
	if !inside {
		return nil
	}
	var give []*waiter
	for _, w := range m.parked {
		if w.park == parkTurn && w.turnAt.After(now) && (m.hold || w.turnAt.Before(m.coolUntil)) {
			give = append(give, w)
		}
	}
	var kept []*waiter
	for _, w := range m.parked {
		if w.park == parkTurn && !slices.Contains(give, w) {
			kept = append(kept, w)
		}
	}
	m.rate.giveBack(m, give, kept)
	var es []expect
	for _, w := range give {
		m.endPark(w)
		w.turned = false
		if !m.hold || m.lateFor(w) {
			m.seen[fmt.Sprintf("paced: turn inside a cool-down, shed=%v", !m.hold)]++
			es = append(es, m.reject(w, bulkhead.Cooldown, "", false))
			continue
		}
		m.seen["paced: turn given back for a cool-down"]++
		m.parkCooling(w)
	}
	return es
}

// cancelParked ends parked w's wait: its context ended.
func (m *machine) cancelParked(w *waiter) expect {
	m.endPark(w)
	m.seen["paced: cancelled while parked"]++
	return m.reject(w, bulkhead.Aborted, "", true)
}

// closeParked ends every parked call's wait: Close turns them away.
func (m *machine) closeParked() []expect {
	var es []expect
	for _, kind := range []parkKind{parkCooling, parkTurn} {
		for _, w := range slices.Clone(m.parked) {
			if w.park == kind {
				m.endPark(w)
				es = append(es, m.reject(w, bulkhead.Shutdown, "", true))
			}
		}
	}
	return es
}

// waitParked waits until the engine has every parked call the model has
// (its turns booked, on Redis by a worker) and their timers.
func (m *machine) waitParked(t *rapid.T) {
	t.Helper()
	if !m.paced() {
		return
	}
	err := spinUntil("the paced calls to wait", func() (bool, error) {
		for _, w := range m.parked {
			if o, ok := m.poll(w); ok {
				w.failAdmitted(o)
				return false, fmt.Errorf("%v ended (admitted %v, err %v), want it waiting (%v)", w, o.err == nil, o.err, w.park)
			}
		}
		return m.b.Stats().Rate.Waiting == len(m.parked), nil
	})
	if err != nil {
		t.Fatalf("%v (%s)", err, m.descr)
	}
	m.waitTimers(t)
}
