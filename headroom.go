package bulkhead

import (
	"math/bits"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Headroom is what the provider said is left of its rate limits with one
// answer (its rate-limit response headers: stream.HeadroomOf reads them).
//
// Reported with Feedback.Headroom or Permit.FeedbackHeadroom, it lets the
// bulkhead stop sending calls for a model before the provider's window is
// exhausted, instead of learning of it from a 429. Per model, the bulkhead
// keeps the latest report, stamped with the time it arrived on the
// bulkhead's clock, and each admission for that model then spends from it
// its reservation (Reservation.Reserved; nothing without a token budget)
// from the tokens left and one from the requests left.
//
// A window refills from its report: with its limit and its reset known,
// linearly, what is left at time t being min(limit, left + (limit-left) ×
// (t-reported)/reset) minus what admissions spent since the report (past
// its reset a window is full: its limit, less that spending); with no
// limit, all at once, at the reset, after which nothing is known of it.
// Once every window it said is full again, the report is forgotten; a window whose reset is not said is not
// tracked (nothing says when it refills). A newer report replaces the
// state, and what was spent against it.
//
// A call that does not fit what is left now is treated as if its model
// were cooling down (see Adaptive.Cooldown): it is held, or shed with
// reason Cooldown, its retry-after the time until it would fit, and its
// CooldownDetail.Headroom set. A call fits when its reservation is at most
// the tokens left and, for a token window said, at least one token is
// left (an exhausted window turns away even a call reserving nothing, as
// the call will still cost something), and at least one request is left.
// The check is made before the call asks for a slot and again as the
// engine grants it one, where the spending is booked; a call then turned
// down by a rate limit, or rolled back, gives its spend back. It applies
// with or without Config.Adaptive.
type Headroom struct {
	// Tokens and Requests are what is left of the provider's windows;
	// negative when not said.
	Tokens, Requests int64
	// TokensLimit and RequestsLimit are the windows' sizes; zero when not
	// said.
	TokensLimit, RequestsLimit int64
	// TokensReset and RequestsReset are how long until each window is
	// full again; zero when not said. At most MaxRetryAfter.
	TokensReset, RequestsReset time.Duration
}

// validate checks h: limits and resets non-negative, resets at most
// MaxRetryAfter, what is left at most its limit when both are said.
func (h *Headroom) validate() error {
	const f = "Feedback.Headroom."
	for _, w := range [...]struct {
		name        string
		left, limit int64
		reset       time.Duration
	}{{"Tokens", h.Tokens, h.TokensLimit, h.TokensReset}, {"Requests", h.Requests, h.RequestsLimit, h.RequestsReset}} {
		switch {
		case w.limit < 0:
			return invalidf(f+w.name+"Limit", "must be >= 0 (zero: not said), got %d", w.limit)
		case w.reset < 0 || w.reset > MaxRetryAfter:
			return invalidf(f+w.name+"Reset", "must be in [0, %v] (zero: not said), got %v", MaxRetryAfter, w.reset)
		case w.limit > 0 && w.left > w.limit:
			return invalidf(f+w.name, "must not exceed %sLimit (%d), got %d", w.name, w.limit, w.left)
		}
	}
	return nil
}

// HeadroomStats is what is known of one model's provider headroom now.
type HeadroomStats struct {
	// Tokens and Requests are what is left now, after the refill since the
	// report and the admissions' spending; negative when not said (or
	// when that window, of a limit not said, is past its reset).
	Tokens, Requests int64
	// TokensLimit and RequestsLimit are the windows' sizes as reported;
	// zero when not said.
	TokensLimit, RequestsLimit int64
	// Reported is when the report arrived, and Full when every window it
	// said is full again (and it is forgotten), on the bulkhead's clock.
	Reported, Full time.Time
}

// maxHeadrooms bounds the models with a headroom report kept at once:
// beyond it, the report whose windows are full first makes room.
const maxHeadrooms = 1024

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

// report records what the provider said was left for model, at now. c.mu
// is not held.
func (c *cooldowns) report(model string, r *Headroom) {
	tok := newWindow(r.Tokens, r.TokensLimit, r.TokensReset)
	req := newWindow(r.Requests, r.RequestsLimit, r.RequestsReset)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reports.Add(1)
	now := c.clk.Now()
	if !tok.on && !req.on {
		delete(c.head, model) // says nothing we can use, and is newer
		c.rearm()
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
	c.armed.Store(true)
}

// rearm sets armed from the tables. c.mu is held.
func (c *cooldowns) rearm() { c.armed.Store(len(c.until) > 0 || len(c.head) > 0) }

// headroomWait returns how long until a call of model reserving reserved
// tokens fits the model's headroom (0: it fits, or nothing is known), and
// books its spending when book is set and it fits, returning the report's
// generation (0 when nothing was booked). c.mu is held.
func (c *cooldowns) headroomWait(model string, reserved int64, now time.Time, book bool) (time.Duration, uint64) {
	h, ok := c.head[model]
	if !ok {
		return 0, 0
	}
	if !now.Before(h.full) {
		delete(c.head, model)
		c.rearm()
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
// model, when that report is still the model's. c.mu is not held.
func (c *cooldowns) refund(model string, reserved int64, gen uint64) {
	if gen == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.head[model]; ok && h.gen == gen {
		h.tokens.spent = max(0, h.tokens.spent-reserved)
		h.reqs.spent = max(0, h.reqs.spent-1)
	}
}

// headroomStats returns the headroom known per model. c.mu is held and
// the tables are purged.
func (c *cooldowns) headroomStats(now time.Time) map[string]HeadroomStats {
	if len(c.head) == 0 {
		return nil
	}
	out := make(map[string]HeadroomStats, len(c.head))
	for m, h := range c.head {
		el := now.Sub(h.at)
		out[m] = HeadroomStats{Tokens: h.tokens.remaining(el), Requests: h.reqs.remaining(el),
			TokensLimit: h.tokLim, RequestsLimit: h.reqLim, Reported: h.at, Full: h.full}
	}
	return out
}
