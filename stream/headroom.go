package stream

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// HeadroomOf reads what a provider's answer says is left of its rate
// limits from its response headers h, for bulkhead.Permit.FeedbackHeadroom
// (a Transport does it for every call it sends). It reads both header
// families in use:
//
//   - x-ratelimit-limit-requests, x-ratelimit-limit-tokens,
//     x-ratelimit-remaining-requests, x-ratelimit-remaining-tokens,
//     x-ratelimit-reset-requests and x-ratelimit-reset-tokens, the resets
//     as durations ("1s", "6m0s", "20ms", "1h2m3.5s") or seconds;
//   - anthropic-ratelimit-requests-limit, -remaining and -reset, and
//     anthropic-ratelimit-tokens-limit, -remaining and -reset (else the
//     anthropic-ratelimit-input-tokens-* ones), the resets as RFC 3339
//     times, counted from h's Date when it has one, else from now.
//
// A value that is missing or unreadable is not said (a remaining of -1, a
// limit or reset of 0); a remaining above its limit is taken as the limit;
// a reset already past is not said; a reset is at most
// bulkhead.MaxRetryAfter. It returns nil when h says nothing of what is
// left, so the result is always valid feedback.
func HeadroomOf(h http.Header, now time.Time) *bulkhead.Headroom {
	if len(h) == 0 {
		return nil
	}
	out := bulkhead.Headroom{Tokens: -1, Requests: -1}
	said := false
	if h.Get("X-Ratelimit-Remaining-Tokens") != "" || h.Get("X-Ratelimit-Remaining-Requests") != "" {
		out.Tokens = headerCount(h.Get("X-Ratelimit-Remaining-Tokens"))
		out.TokensLimit = max(0, headerCount(h.Get("X-Ratelimit-Limit-Tokens")))
		out.TokensReset = headerDuration(h.Get("X-Ratelimit-Reset-Tokens"))
		out.Requests = headerCount(h.Get("X-Ratelimit-Remaining-Requests"))
		out.RequestsLimit = max(0, headerCount(h.Get("X-Ratelimit-Limit-Requests")))
		out.RequestsReset = headerDuration(h.Get("X-Ratelimit-Reset-Requests"))
		said = true
	} else if h.Get("Anthropic-Ratelimit-Tokens-Remaining") != "" || h.Get("Anthropic-Ratelimit-Requests-Remaining") != "" ||
		h.Get("Anthropic-Ratelimit-Input-Tokens-Remaining") != "" {
		if d, err := http.ParseTime(h.Get("Date")); err == nil {
			now = d // the server's own clock: no skew
		}
		tok := "Anthropic-Ratelimit-Tokens-"
		if h.Get(tok+"Remaining") == "" {
			tok = "Anthropic-Ratelimit-Input-Tokens-"
		}
		out.Tokens = headerCount(h.Get(tok + "Remaining"))
		out.TokensLimit = max(0, headerCount(h.Get(tok+"Limit")))
		out.TokensReset = headerTime(h.Get(tok+"Reset"), now)
		const req = "Anthropic-Ratelimit-Requests-"
		out.Requests = headerCount(h.Get(req + "Remaining"))
		out.RequestsLimit = max(0, headerCount(h.Get(req+"Limit")))
		out.RequestsReset = headerTime(h.Get(req+"Reset"), now)
		said = true
	}
	if !said || out.Tokens < 0 && out.Requests < 0 {
		return nil
	}
	if out.TokensLimit > 0 && out.Tokens > out.TokensLimit {
		out.Tokens = out.TokensLimit
	}
	if out.RequestsLimit > 0 && out.Requests > out.RequestsLimit {
		out.Requests = out.RequestsLimit
	}
	return &out
}

// headerCount reads a non-negative integer header value, -1 when it is not one.
func headerCount(v string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// headerDuration reads a reset given as a duration ("6m0s") or as seconds
// ("1.5"), 0 when it is neither or not positive.
func headerDuration(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil {
		return clampRetry(float64(d))
	}
	if !plainNumber(v) {
		return 0 // not a count of seconds: "inf", "NaN", "0x1p20"
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		return clampRetry(s * float64(time.Second))
	}
	return 0
}

// plainNumber reports whether v is a plain decimal number: digits, at most
// one point, an optional exponent.
func plainNumber(v string) bool {
	digits, point, exp := false, false, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= '0' && c <= '9':
			digits = true
		case c == '.' && !point && !exp:
			point = true
		case (c == 'e' || c == 'E') && digits && !exp:
			exp = true
			if i+1 < len(v) && (v[i+1] == '+' || v[i+1] == '-') {
				i++
			}
		default:
			return false
		}
	}
	return digits
}

// headerTime reads a reset given as an RFC 3339 time, as the time from now to
// it, 0 when it is unreadable or past.
func headerTime(v string, now time.Time) time.Duration {
	at, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
	if err != nil {
		return 0
	}
	d := at.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(d, bulkhead.MaxRetryAfter)
}
