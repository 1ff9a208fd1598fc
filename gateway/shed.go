package gateway

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// StatusClientClosedRequest is the status logged for a call whose client
// went away before it was admitted (nobody reads the answer).
const StatusClientClosedRequest = 499

// Rejection is what WriteError answers for an error: the status, the
// headers that tell a client when and whether to retry, and the body in the
// dialect of the API the client called.
type Rejection struct {
	// Status is the HTTP status: 429 for a rate limit, a model cooling
	// down after the provider's own 429, or a class's quota,
	// 503 (529 in the Anthropic dialect) when the bulkhead or the fleet is
	// full or cannot decide, or a retry is over its retry budget, 413 for
	// a call that can never fit, 400 for an invalid request, 502 when the
	// upstream could not be reached.
	Status int
	// RetryAfter is the honest time after which the call would go; zero
	// when there is none (then no retry-after header is sent).
	RetryAfter time.Duration
	// ShouldRetry is the x-should-retry header: false when a retry cannot
	// help (a call that never fits, an invalid request, a retry over its
	// retry budget), which the official SDKs obey whatever the status.
	ShouldRetry bool
	// Type and Code are the error's type and code in the dialect's body.
	Type, Code string
	// Message is the error's one-line message.
	Message string
	// Detail is the rejection as the body's "bulkhead" field: the
	// bulkhead's reason and the numbers that decided it. Nil for an error
	// that is not a rejection.
	Detail *Detail
}

// Detail is the JSON form of a rejection, carried in every shed response
// under the key "bulkhead" (inside "error" in the OpenAI and Gemini
// dialects, at the top level in the Anthropic one).
type Detail struct {
	Reason        string          `json:"reason"`
	Tag           string          `json:"tag,omitempty"`
	Constraint    string          `json:"constraint,omitempty"`
	NeverFits     bool            `json:"never_fits,omitempty"`
	RetryAfterMs  int64           `json:"retry_after_ms,omitempty"`
	LimitRevision int64           `json:"limit_revision"`
	InFlight      int             `json:"in_flight"`
	MaxConcurrent int             `json:"max_concurrent"`
	Pending       int             `json:"pending"`
	MaxQueue      int             `json:"max_queue"`
	Tokens        *TokenDetail    `json:"tokens,omitempty"`
	Class         *ClassDetail    `json:"class,omitempty"`
	Rate          *RateDetail     `json:"rate,omitempty"`
	Fleet         *FleetDetail    `json:"fleet,omitempty"`
	Cooldown      *CooldownDetail `json:"cooldown,omitempty"`
	RetryBudget   *RetryDetail    `json:"retry_budget,omitempty"`
}

// RetryDetail is the retry budget that refused a retry: the class whose
// own budget it is ("" for the bulkhead's), its ratio, floor and window,
// and the first attempts and retries it had admitted over the window, of
// the retries it allowed.
type RetryDetail struct {
	Class         string  `json:"class,omitempty"`
	Ratio         float64 `json:"ratio"`
	MinRetries    int     `json:"min_retries"`
	WindowMs      int64   `json:"window_ms"`
	FirstAttempts int64   `json:"first_attempts"`
	Retries       int64   `json:"retries"`
	Allowed       int64   `json:"allowed"`
}

// CooldownDetail is the cool-down that decided the call: its model was
// answered 429 with a Retry-After that has not passed.
type CooldownDetail struct {
	Model string    `json:"model"`
	Until time.Time `json:"until"`
}

// TokenDetail is the token budget when the call was decided.
type TokenDetail struct {
	Budget          int64 `json:"budget"`
	EffectiveBudget int64 `json:"effective_budget"`
	InFlight        int64 `json:"in_flight"`
	Available       int64 `json:"available"`
	Reserved        int64 `json:"reserved"`
}

// ClassDetail is the call's admission class when it was decided.
type ClassDetail struct {
	Name           string `json:"name"`
	InFlight       int    `json:"in_flight"`
	InFlightTokens int64  `json:"in_flight_tokens"`
}

// RateDetail is the rate limit that decided the call. Remaining is what
// the limit had room for at the decision (bulkhead.RateDetail.Remaining),
// absent when the store could not decide.
type RateDetail struct {
	Scope     string   `json:"scope,omitempty"`
	Key       string   `json:"key,omitempty"`
	Limit     string   `json:"limit,omitempty"`
	PerMinute float64  `json:"per_minute,omitempty"`
	Burst     float64  `json:"burst,omitempty"`
	Weight    float64  `json:"weight,omitempty"`
	Remaining *float64 `json:"remaining,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// FleetDetail is the fleet pool that decided the call.
type FleetDetail struct {
	Pool           string `json:"pool"`
	InFlight       int64  `json:"in_flight"`
	InFlightTokens int64  `json:"in_flight_tokens"`
	MaxConcurrent  int64  `json:"max_concurrent"`
	TokenBudget    int64  `json:"token_budget"`
	Error          string `json:"error,omitempty"`
}

// maxRetryAfter is the longest retry-after a shed response advertises in
// whole seconds: some SDKs ignore longer values and retry sooner, others
// stop retrying. retry-after-ms always carries the exact time.
const maxRetryAfter = 60 * time.Second

// RejectionOf says how to answer err, the error of admitting or forwarding
// a call, in the dialect of format.
func RejectionOf(format stream.Format, err error) Rejection {
	var rej *bulkhead.RejectedError
	var body *stream.BodyError
	var tooLarge *stream.TooLargeError
	switch {
	case errors.As(err, &rej):
		return rejection(format, rej)
	case errors.As(err, &tooLarge):
		return Rejection{Status: http.StatusRequestEntityTooLarge, Type: invalidType(format), Code: "request_too_large", Message: err.Error()}
	case errors.As(err, &body), errors.Is(err, bulkhead.ErrInvalid):
		return Rejection{Status: http.StatusBadRequest, Type: invalidType(format), Code: "invalid_request", Message: err.Error()}
	case errors.Is(err, errShutdownCut):
		r := Rejection{Status: http.StatusServiceUnavailable, ShouldRetry: true, Type: overloadType(format), Code: "server_is_overloaded", Message: err.Error()}
		if format == stream.AnthropicMessages {
			r.Status = 529
		}
		return r
	case errors.Is(err, context.Canceled):
		return Rejection{Status: StatusClientClosedRequest, Type: "client_closed_request", Message: err.Error()}
	}
	return Rejection{Status: http.StatusBadGateway, ShouldRetry: true, Type: serverType(format), Code: "upstream_unavailable", Message: err.Error()}
}

func rejection(format stream.Format, rej *bulkhead.RejectedError) Rejection {
	r := Rejection{Message: rej.Error(), Detail: detailOf(rej), ShouldRetry: true}
	d := rej.Detail
	switch {
	case rej.Reason == bulkhead.RetryBudget:
		// A retry over its budget: shed as overload, but the client must
		// not try again (the SDKs obey x-should-retry over the status),
		// and no time is promised.
		r.Status, r.ShouldRetry = http.StatusServiceUnavailable, false
		if format == stream.AnthropicMessages {
			r.Status = 529
		}
		r.Type, r.Code = overloadType(format), "retry_budget_exceeded"
	case rej.Reason == bulkhead.RateLimit, rej.Reason == bulkhead.Cooldown:
		// Cooldown: the provider itself said when it takes calls again.
		r.Status = http.StatusTooManyRequests
		r.RetryAfter, _ = rej.RetryAfter()
		r.Type, r.Code = rateType(format, d), "rate_limit_exceeded"
	case rej.NeverFits():
		r.Status, r.ShouldRetry = http.StatusRequestEntityTooLarge, false
		r.Type, r.Code = invalidType(format), "request_too_large"
	case d != nil && (d.Constraint == bulkhead.ConstraintClass || d.Constraint == bulkhead.ConstraintClassProtection):
		// A tenant's own quota: the others are not overloaded.
		r.Status = http.StatusTooManyRequests
		r.Type, r.Code = rateType(format, d), "rate_limit_exceeded"
	case rej.Reason == bulkhead.Aborted:
		r.Status, r.ShouldRetry = StatusClientClosedRequest, false
		r.Type, r.Code = "client_closed_request", ""
	default:
		// Shared overload, a closing gateway, or a store that cannot
		// decide: retry, here or at another replica.
		r.Status = http.StatusServiceUnavailable
		if format == stream.AnthropicMessages {
			r.Status = 529
		}
		r.Type, r.Code = overloadType(format), "server_is_overloaded"
	}
	if r.Detail != nil && r.RetryAfter > 0 {
		r.Detail.RetryAfterMs = ceilMs(r.RetryAfter)
	}
	return r
}

// WriteError answers err, the error of admitting or forwarding a call, in
// the dialect of format (see RejectionOf), and returns the status written.
// Nothing must have been written to w before.
func WriteError(w http.ResponseWriter, format stream.Format, err error) int {
	r := RejectionOf(format, err)
	write(w, format, r)
	return r.Status
}

// write answers r in format's dialect.
func write(w http.ResponseWriter, format stream.Format, r Rejection) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if r.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(min(r.RetryAfter, maxRetryAfter).Seconds())), 10))
		h.Set("Retry-After-Ms", strconv.FormatInt(ceilMs(r.RetryAfter), 10))
	}
	h.Set("X-Should-Retry", strconv.FormatBool(r.ShouldRetry))
	if r.Detail != nil {
		h.Set("X-Bulkhead-Reason", r.Detail.Reason)
	}
	if r.Detail != nil && r.Detail.Rate != nil && r.Detail.Rate.Limit != "" && format != stream.AnthropicMessages && format != stream.Gemini {
		// OpenAI-style rate headers, with only the numbers that are real:
		// the limit that decided, when it frees up, and the whole requests
		// or tokens it had room for at the decision.
		rd := r.Detail.Rate
		limit := strings.ReplaceAll(rd.Limit, "_", "-") // input_tokens: x-ratelimit-limit-input-tokens
		h.Set("X-Ratelimit-Limit-"+limit, strconv.FormatFloat(rd.PerMinute, 'f', -1, 64))
		if rd.Remaining != nil {
			h.Set("X-Ratelimit-Remaining-"+limit, strconv.FormatFloat(math.Floor(*rd.Remaining), 'f', -1, 64))
		}
		h.Set("X-Ratelimit-Reset-"+limit, r.RetryAfter.String())
	}
	w.WriteHeader(r.Status)
	b := getBuffer()
	*b = r.appendBody(*b, format)
	_, _ = w.Write(*b)
	putBuffer(b)
}

// appendBody appends the response body in format's dialect, and a newline
// (what encoding/json's Encoder writes for the same document).
func (r Rejection) appendBody(b []byte, format stream.Format) []byte {
	w := jsonWriter{b: b}
	w.open()
	switch format {
	case stream.AnthropicMessages:
		w.str("type", "error")
		w.object("error")
		w.str("type", r.Type)
		w.str("message", r.Message)
		w.end()
		r.Detail.write(&w)
	case stream.Gemini:
		w.object("error")
		w.int("code", int64(r.Status))
		w.str("message", r.Message)
		w.str("status", r.Type)
		r.Detail.write(&w)
		w.end()
	default:
		w.object("error")
		w.str("message", r.Message)
		w.str("type", r.Type)
		w.null("param")
		if r.Code == "" {
			w.null("code")
		} else {
			w.str("code", r.Code)
		}
		r.Detail.write(&w)
		w.end()
	}
	w.end()
	return append(w.b, '\n')
}

// write writes d as the member "bulkhead", as its JSON tags say; nothing
// for a nil d.
func (d *Detail) write(w *jsonWriter) {
	if d == nil {
		return
	}
	w.object("bulkhead")
	w.str("reason", d.Reason)
	if d.Tag != "" {
		w.str("tag", d.Tag)
	}
	if d.Constraint != "" {
		w.str("constraint", d.Constraint)
	}
	if d.NeverFits {
		w.boolean("never_fits", true)
	}
	if d.RetryAfterMs != 0 {
		w.int("retry_after_ms", d.RetryAfterMs)
	}
	w.int("limit_revision", d.LimitRevision)
	w.int("in_flight", int64(d.InFlight))
	w.int("max_concurrent", int64(d.MaxConcurrent))
	w.int("pending", int64(d.Pending))
	w.int("max_queue", int64(d.MaxQueue))
	if t := d.Tokens; t != nil {
		w.object("tokens")
		w.int("budget", t.Budget)
		w.int("effective_budget", t.EffectiveBudget)
		w.int("in_flight", t.InFlight)
		w.int("available", t.Available)
		w.int("reserved", t.Reserved)
		w.end()
	}
	if c := d.Class; c != nil {
		w.object("class")
		w.str("name", c.Name)
		w.int("in_flight", int64(c.InFlight))
		w.int("in_flight_tokens", c.InFlightTokens)
		w.end()
	}
	if r := d.Rate; r != nil {
		w.object("rate")
		for _, m := range [...]struct{ k, v string }{{"scope", r.Scope}, {"key", r.Key}, {"limit", r.Limit}} {
			if m.v != "" {
				w.str(m.k, m.v)
			}
		}
		for _, m := range [...]struct {
			k string
			v float64
		}{{"per_minute", r.PerMinute}, {"burst", r.Burst}, {"weight", r.Weight}} {
			if m.v != 0 {
				w.float(m.k, m.v)
			}
		}
		if r.Remaining != nil {
			w.float("remaining", *r.Remaining)
		}
		if r.Error != "" {
			w.str("error", r.Error)
		}
		w.end()
	}
	if f := d.Fleet; f != nil {
		w.object("fleet")
		w.str("pool", f.Pool)
		w.int("in_flight", f.InFlight)
		w.int("in_flight_tokens", f.InFlightTokens)
		w.int("max_concurrent", f.MaxConcurrent)
		w.int("token_budget", f.TokenBudget)
		if f.Error != "" {
			w.str("error", f.Error)
		}
		w.end()
	}
	if c := d.Cooldown; c != nil {
		w.object("cooldown")
		w.str("model", c.Model)
		w.time("until", c.Until)
		w.end()
	}
	if r := d.RetryBudget; r != nil {
		w.object("retry_budget")
		if r.Class != "" {
			w.str("class", r.Class)
		}
		w.float("ratio", r.Ratio)
		w.int("min_retries", int64(r.MinRetries))
		w.int("window_ms", r.WindowMs)
		w.int("first_attempts", r.FirstAttempts)
		w.int("retries", r.Retries)
		w.int("allowed", r.Allowed)
		w.end()
	}
	w.end()
}

// rateType is the error type of a per-tenant or rate rejection.
func rateType(format stream.Format, d *bulkhead.RejectDetail) string {
	switch format {
	case stream.AnthropicMessages:
		return "rate_limit_error"
	case stream.Gemini:
		return "RESOURCE_EXHAUSTED"
	}
	switch {
	case d != nil && d.Rate != nil:
		if strings.HasSuffix(d.Rate.Limit, "_tokens") {
			return "tokens" // OpenAI's 429s say requests or tokens
		}
		return d.Rate.Limit
	case d != nil && d.TokenBudget != nil && d.Class != nil && d.Class.Limits.MaxInFlightTokens != nil &&
		d.Class.InFlightTokens+d.TokenBudget.Reserved > *d.Class.Limits.MaxInFlightTokens:
		return "tokens"
	}
	return "requests"
}

// errorType is one kind of error's type in each dialect.
type errorType struct{ openai, anthropic, gemini string }

func (e errorType) in(format stream.Format) string {
	switch format {
	case stream.AnthropicMessages:
		return e.anthropic
	case stream.Gemini:
		return e.gemini
	}
	return e.openai
}

var (
	overloaded = errorType{"service_unavailable_error", "overloaded_error", "UNAVAILABLE"}
	invalid    = errorType{"invalid_request_error", "invalid_request_error", "INVALID_ARGUMENT"}
	server     = errorType{"server_error", "api_error", "UNAVAILABLE"}
)

func overloadType(format stream.Format) string { return overloaded.in(format) }
func invalidType(format stream.Format) string  { return invalid.in(format) }
func serverType(format stream.Format) string   { return server.in(format) }

func ceilMs(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// detailOf is the JSON form of rej.
func detailOf(rej *bulkhead.RejectedError) *Detail {
	out := &Detail{Reason: rej.Reason.String(), Tag: rej.Tag, NeverFits: rej.NeverFits()}
	d := rej.Detail
	if d == nil {
		return out
	}
	out.Constraint = string(d.Constraint)
	out.LimitRevision, out.InFlight, out.MaxConcurrent, out.Pending, out.MaxQueue = d.LimitRevision, d.InFlight, d.MaxConcurrent, d.Pending, d.MaxQueue
	if b := d.TokenBudget; b != nil {
		out.Tokens = &TokenDetail{Budget: b.Budget, EffectiveBudget: b.EffectiveBudget, InFlight: b.InFlightTokens, Available: b.Available, Reserved: b.Reserved}
	}
	if c := d.Class; c != nil {
		out.Class = &ClassDetail{Name: c.Name, InFlight: c.InFlight, InFlightTokens: c.InFlightTokens}
	}
	if r := d.Rate; r != nil {
		out.Rate = &RateDetail{Scope: r.Scope, Key: r.Key, Limit: r.Limit, PerMinute: r.PerMinute, Burst: r.Burst, Weight: r.Weight, Error: errText(r.Fallback)}
		if r.Limit != "" {
			rem := r.Remaining
			out.Rate.Remaining = &rem
		}
	}
	if c := d.Cooldown; c != nil {
		out.Cooldown = &CooldownDetail{Model: c.Model, Until: c.Until}
	}
	if r := d.RetryBudget; r != nil {
		out.RetryBudget = &RetryDetail{Class: r.Class, Ratio: r.Ratio, MinRetries: r.MinRetries, WindowMs: r.Window.Milliseconds(),
			FirstAttempts: r.FirstAttempts, Retries: r.Retries, Allowed: r.Allowed}
	}
	if f := d.Fleet; f != nil {
		out.Fleet = &FleetDetail{Pool: f.Pool, InFlight: f.InFlight, InFlightTokens: f.InFlightTokens,
			MaxConcurrent: f.MaxConcurrent, TokenBudget: f.TokenBudget, Error: errText(f.Fallback)}
	}
	return out
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
