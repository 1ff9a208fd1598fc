package bulkhead

import (
	"time"
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
