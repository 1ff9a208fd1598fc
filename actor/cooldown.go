package actor

import (
	"maps"
	"math/bits"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The cool-downs and the provider's headroom are state of the state
// machine: a provider's 429 with a Retry-After cools a model down until
// then, and its rate-limit headers say what is left of its windows. A call
// for a model cooling down, or that does not fit what is left, is held
// back or shed (the stage after validation and before the capacity
// checks); a call that fits spends from the headroom as its slot is
// granted, and gets it back when its admission is rolled back.

// maxCooldowns bounds the models cooling down at once, and maxHeadrooms
// the models with a headroom report kept: beyond either, the entry that
// ends first makes room.
const (
	maxCooldowns = 1024
	maxHeadrooms = 1024
)

// cooling is the cool-downs and headroom reports, by model.
type cooling struct {
	shed bool // ShedCooldown: a call that finds its model cooling down is turned away at once

	until map[string]time.Time
	// first is no later than the earliest end in until, so a lookup purges
	// only once something may have ended.
	first time.Time
	// head is the latest headroom report per model; headFirst is no later
	// than the earliest time one of them is forgotten; gen numbers the
	// reports.
	head      map[string]*headroom
	headFirst time.Time
	gen       uint64

	started, held, reports int64
}

func newCooling(shed bool) cooling {
	return cooling{shed: shed, until: map[string]time.Time{}, head: map[string]*headroom{}}
}

// armed reports whether some cool-down may be running or some headroom
// report is in force: the one thing a call looks at when none is.
func (c *cooling) armed() bool { return len(c.until) > 0 || len(c.head) > 0 }

// start cools model down until end, or longer when it already is.
func (c *cooling) start(model string, end, now time.Time) {
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
func (c *cooling) purge(now time.Time) {
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
	if len(c.head) > 0 && !now.Before(c.headFirst) {
		c.headFirst = time.Time{}
		for m, h := range c.head {
			switch {
			case !h.full.After(now):
				delete(c.head, m)
			case c.headFirst.IsZero() || h.full.Before(c.headFirst):
				c.headFirst = h.full
			}
		}
	}
}

// left returns the cool-down of a call of model reserving reserved tokens
// at now: when its model is cooling down, or the call does not fit what
// is left of the model's headroom, ok is set, with the end and the time
// left (head is set when the headroom decided). With book, a call that
// fits spends from the headroom, and gen is the report it spent from (0:
// none), for a rollback to give it back.
func (c *cooling) left(model string, reserved int64, now time.Time, book bool) (d admission.CooldownDetail, gen uint64, ok bool) {
	c.purge(now)
	var until time.Time
	var left time.Duration
	if u, cooling := c.until[model]; cooling {
		until, left, ok = u, u.Sub(now), true
	}
	wait, gen := c.headroomWait(model, reserved, now, !ok && book)
	if wait > left {
		return admission.CooldownDetail{Model: model, Until: now.Add(wait), RetryAfter: wait, Headroom: true}, 0, true
	}
	return admission.CooldownDetail{Model: model, Until: until, RetryAfter: left}, gen, ok
}

// stats returns the cool-downs' state at now.
func (c *cooling) stats(now time.Time) admission.CooldownStats {
	st := admission.CooldownStats{Started: c.started, Held: c.held, HeadroomReports: c.reports}
	c.purge(now)
	if len(c.until) > 0 {
		st.Active = maps.Clone(c.until)
	}
	if len(c.head) > 0 {
		st.Headroom = make(map[string]admission.HeadroomStats, len(c.head))
		for m, h := range c.head {
			el := now.Sub(h.at)
			st.Headroom[m] = admission.HeadroomStats{Tokens: h.tokens.remaining(el), Requests: h.reqs.remaining(el),
				TokensLimit: h.tokLim, RequestsLimit: h.reqLim, Reported: h.at, Full: h.full}
		}
	}
	return st
}

// hrWindow is one window of a headroom report: what was left, its limit
// (0: not said) and how long until full, at the report; what admissions
// spent since.
type hrWindow struct {
	on          bool
	left, limit int64
	reset       time.Duration
	spent       int64
}

func newWindow(left, limit int64, reset time.Duration) hrWindow {
	if left < 0 || reset <= 0 {
		return hrWindow{}
	}
	return hrWindow{on: true, left: left, limit: limit, reset: reset}
}

// avail returns what is left at elapsed since the report, before the
// spending: past the reset, the whole limit; ok false past the reset of a
// window whose limit was not said (nothing is known of it then).
func (w *hrWindow) avail(elapsed time.Duration) (int64, bool) {
	if elapsed >= w.reset {
		return w.limit, w.limit > 0
	}
	if w.limit == 0 || elapsed <= 0 {
		return w.left, true
	}
	// left + (limit-left) × elapsed / reset, without overflow: the
	// quotient is below limit-left, as elapsed < reset.
	hi, lo := bits.Mul64(uint64(w.limit-w.left), uint64(elapsed))
	q, _ := bits.Div64(hi, lo, uint64(w.reset))
	return w.left + int64(q), true
}

// wait returns how long after elapsed (since the report) until need fits
// what is left beside the spending, 0 when it fits now. The window is on
// and not yet full.
func (w *hrWindow) wait(elapsed time.Duration, need int64) time.Duration {
	a, _ := w.avail(elapsed)
	if !admission.Exceeds(w.spent, need, a) {
		return 0
	}
	if elapsed >= w.reset {
		return w.reset // full, and spent: another window's worth (the caller caps it)
	}
	toFull := w.reset - elapsed
	k, ok := admission.Add(w.spent, need)
	if w.limit == 0 || !ok || k > w.limit {
		return toFull // fits only once the window is full again, and forgotten
	}
	// The first elapsed e with (limit-left) × e / reset >= k - left.
	d := uint64(w.limit - w.left)
	hi, lo := bits.Mul64(uint64(k-w.left), uint64(w.reset))
	lo, c := bits.Add64(lo, d-1, 0)
	hi += c
	e, _ := bits.Div64(hi, lo, d) // < reset + 1, as k - left <= d
	return min(toFull, max(time.Duration(e)-elapsed, 1))
}

// tracked reports whether the window bounds admissions at elapsed: it was
// said, and it is before its reset or its limit is known (past its reset it
// is full, and what admissions spent still counts against its limit).
func (w *hrWindow) tracked(elapsed time.Duration) bool {
	return w.on && (elapsed < w.reset || w.limit > 0)
}

// remaining returns what is left at elapsed, for the stats: -1 when the
// window is off, or past its reset with no limit said (unknown).
func (w *hrWindow) remaining(elapsed time.Duration) int64 {
	if !w.on {
		return -1
	}
	a, ok := w.avail(elapsed)
	if !ok {
		return -1
	}
	return max(0, a-w.spent)
}

// headroom is one model's latest report.
type headroom struct {
	at             time.Time
	full           time.Time
	gen            uint64
	tokens, reqs   hrWindow
	tokLim, reqLim int64
}

// report records what the provider said was left for model, at now. A
// report that says nothing usable forgets the model's previous one: it is
// newer.
func (c *cooling) report(model string, r *admission.Headroom, now time.Time) {
	tok := newWindow(r.Tokens, r.TokensLimit, r.TokensReset)
	req := newWindow(r.Requests, r.RequestsLimit, r.RequestsReset)
	c.reports++
	if !tok.on && !req.on {
		delete(c.head, model)
		return
	}
	span := max(tok.reset, req.reset)
	c.gen++
	h := &headroom{at: now, full: now.Add(span), gen: c.gen, tokens: tok, reqs: req, tokLim: r.TokensLimit, reqLim: r.RequestsLimit}
	if _, ok := c.head[model]; !ok && len(c.head) >= maxHeadrooms {
		c.purge(now)
		if len(c.head) >= maxHeadrooms {
			first := ""
			for m, o := range c.head {
				if first == "" || o.full.Before(c.head[first].full) {
					first = m
				}
			}
			delete(c.head, first)
		}
	}
	c.head[model] = h
	if c.headFirst.IsZero() || h.full.Before(c.headFirst) {
		c.headFirst = h.full
	}
}

// headroomWait returns how long until a call of model reserving reserved
// tokens fits the model's headroom (0: it fits, or nothing is known), and
// books its spending when book is set and it fits, returning the report's
// generation (0 when nothing was booked).
func (c *cooling) headroomWait(model string, reserved int64, now time.Time, book bool) (time.Duration, uint64) {
	h, ok := c.head[model]
	if !ok {
		return 0, 0
	}
	if !now.Before(h.full) {
		delete(c.head, model)
		return 0, 0
	}
	el := now.Sub(h.at)
	var wait time.Duration
	if h.tokens.tracked(el) {
		wait = h.tokens.wait(el, max(reserved, 1))
	}
	if h.reqs.tracked(el) {
		wait = max(wait, h.reqs.wait(el, 1))
	}
	wait = min(wait, h.full.Sub(now)) // then the report is forgotten
	if wait > 0 || !book {
		return wait, 0
	}
	h.tokens.spent = admission.AddSat(h.tokens.spent, reserved)
	h.reqs.spent = admission.AddSat(h.reqs.spent, 1)
	return 0, h.gen
}

// refund gives back what a call booked against report generation gen of
// model, when that report is still the model's.
func (c *cooling) refund(model string, reserved int64, gen uint64) {
	if gen == 0 {
		return
	}
	if h, ok := c.head[model]; ok && h.gen == gen {
		h.tokens.spent = max(0, h.tokens.spent-reserved)
		h.reqs.spent = max(0, h.reqs.spent-1)
	}
}

// holdEnded looks again, once a hold's time has passed, at the calls the
// cool-downs hold back: the paced ones waiting before their turns, then
// the queue.
func (s *state) holdEnded() {
	s.wakeCooling()
	s.pump()
}
