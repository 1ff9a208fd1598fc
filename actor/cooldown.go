package actor

import (
	"maps"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The cool-downs are state of the state machine: a provider's 429 with a
// Retry-After cools a model down until then. A call for a model cooling
// down, or that does not fit what is left of the provider's headroom
// (headroom.go), is held back or shed (the stage after validation and
// before the capacity checks).

// maxCooldowns bounds the models cooling down at once: beyond it, the
// cool-down that ends first makes room.
const maxCooldowns = 1024

// cooldownStage is the cool-downs, by model, and the provider's headroom.
type cooldownStage struct {
	shed bool // ShedCooldown: a call that finds its model cooling down is turned away at once

	until map[string]time.Time
	// first is no later than the earliest end in until, so a lookup purges
	// only once something may have ended.
	first time.Time
	// head is the provider's headroom reports.
	head headroomStage

	started, held int64
}

func newCooldownStage(shed bool) cooldownStage {
	return cooldownStage{shed: shed, until: map[string]time.Time{}, head: newHeadroomStage()}
}

// armed reports whether some cool-down may be running or some headroom
// report is in force: the one thing a call looks at when none is.
func (c *cooldownStage) armed() bool { return len(c.until) > 0 || c.head.armed() }

// start cools model down until end, or longer when it already is.
func (c *cooldownStage) start(model string, end, now time.Time) {
	c.started++
	if prev, ok := c.until[model]; ok {
		if end.After(prev) {
			c.until[model] = end
		}
		return
	}
	if len(c.until) >= maxCooldowns {
		c.purge(now)
	}
	if len(c.until) >= maxCooldowns {
		// Make room: the cool-down that ends first has the least to say.
		first := ""
		for m, u := range c.until {
			if first == "" || u.Before(c.until[first]) {
				first = m
			}
		}
		delete(c.until, first)
	}
	c.until[model] = end
	if len(c.until) == 1 || end.Before(c.first) {
		c.first = end
	}
}

// purge drops the cool-downs that have ended by now and the headroom
// reports whose windows are full again; it reads a whole table only once
// its earliest end has come.
func (c *cooldownStage) purge(now time.Time) {
	if len(c.until) > 0 && !now.Before(c.first) {
		c.first = time.Time{}
		for m, u := range c.until {
			switch {
			case !u.After(now):
				delete(c.until, m)
			case c.first.IsZero() || u.Before(c.first):
				c.first = u
			}
		}
	}
	c.head.purge(now)
}

// left returns the cool-down of a call of model reserving reserved tokens
// at now: when its model is cooling down, or the call does not fit what
// is left of the model's headroom, ok is set, with the end and the time
// left (head is set when the headroom decided). With book, a call that
// fits spends from the headroom, and gen is the report it spent from (0:
// none), for a rollback to give it back.
func (c *cooldownStage) left(model string, reserved int64, now time.Time, book bool) (d admission.CooldownDetail, gen uint64, ok bool) {
	c.purge(now)
	var until time.Time
	var left time.Duration
	if u, cooling := c.until[model]; cooling {
		until, left, ok = u, u.Sub(now), true
	}
	wait, gen := c.head.wait(model, reserved, now, !ok && book)
	if wait > left {
		return admission.CooldownDetail{Model: model, Until: now.Add(wait), RetryAfter: wait, Headroom: true}, 0, true
	}
	return admission.CooldownDetail{Model: model, Until: until, RetryAfter: left}, gen, ok
}

// stats returns the cool-downs' state at now.
func (c *cooldownStage) stats(now time.Time) admission.CooldownStats {
	st := admission.CooldownStats{Started: c.started, Held: c.held, HeadroomReports: c.head.reports}
	c.purge(now)
	if len(c.until) > 0 {
		st.Active = maps.Clone(c.until)
	}
	st.Headroom = c.head.stats(now)
	return st
}

// holdEnded looks again, once a hold's time has passed, at the calls the
// cool-downs hold back: the paced ones waiting before their turns, then
// the queue (where a retry may also have waited its aging).
func (s *state) holdEnded() {
	s.wakeCooling()
	s.pump()
}
