package stream

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// OutcomeOf says what a provider's answer to one call tells a bulkhead's
// adaptive limits (see bulkhead.Feedback): a 429 is OutcomeRateLimited, a
// 503 or 529 OutcomeOverloaded, a 408 or 504 and a send that failed with a
// timeout (context.DeadlineExceeded, or a net.Error that says so)
// OutcomeTimeout, a 2xx OutcomeSuccess, anything else OutcomeFailed. With a
// 429, 503 or 529 it also returns the provider's Retry-After: the
// retry-after-ms header (milliseconds), else retry-after (seconds, or an
// HTTP date, counted from the response's Date header when it has one),
// zero when neither is there or readable, at most bulkhead.MaxRetryAfter.
// ok is false when there is nothing to report: the caller's own context was
// cancelled.
func OutcomeOf(resp *http.Response, err error) (o bulkhead.Outcome, retryAfter time.Duration, ok bool) {
	if err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, context.Canceled):
			return 0, 0, false
		case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
			return bulkhead.OutcomeTimeout, 0, true
		}
		return bulkhead.OutcomeFailed, 0, true
	}
	switch s := resp.StatusCode; {
	case s == http.StatusTooManyRequests:
		return bulkhead.OutcomeRateLimited, RetryAfter(resp.Header), true
	case s == http.StatusServiceUnavailable || s == 529:
		return bulkhead.OutcomeOverloaded, RetryAfter(resp.Header), true
	case s == http.StatusRequestTimeout || s == http.StatusGatewayTimeout:
		return bulkhead.OutcomeTimeout, 0, true
	case s >= 200 && s < 300:
		return bulkhead.OutcomeSuccess, 0, true
	}
	return bulkhead.OutcomeFailed, 0, true
}

// RetryAfter reads a provider's retry time from h: retry-after-ms
// (milliseconds), else retry-after (seconds, or an HTTP date, counted from
// h's Date when it has one, else from now). It returns zero when neither is
// there or readable, and at most bulkhead.MaxRetryAfter.
func RetryAfter(h http.Header) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			return clampRetry(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		return clampRetry(s * float64(time.Second))
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	now := time.Now()
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		now = d // the server's own clock: no skew
	}
	return clampRetry(float64(at.Sub(now)))
}

func clampRetry(ns float64) time.Duration {
	if math.IsNaN(ns) || ns <= 0 {
		return 0
	}
	return time.Duration(min(ns, float64(bulkhead.MaxRetryAfter)))
}

// feedback reports what the provider answered permit's call, with the
// headroom its rate-limit headers say is left (see HeadroomOf).
func feedback(permit *bulkhead.Permit, resp *http.Response, err error) {
	if o, retry, ok := OutcomeOf(resp, err); ok {
		var h *bulkhead.Headroom
		if resp != nil {
			h = HeadroomOf(resp.Header, time.Now())
		}
		_ = permit.FeedbackHeadroom(o, retry, h) // valid by construction
	}
}
