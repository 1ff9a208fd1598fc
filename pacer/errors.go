package pacer

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// ErrUnavailable matches every error about a backend that could not decide:
// Redis unreachable, timed out, or answering with an error. The error wraps
// the client's own error too, so errors.As can reach it.
//
// Under the FailOpen and FailClosed policies (RedisOptions.OnFailure) the
// calls that the policy decides return no error; the backend's error is in
// Outcome.Fallback instead.
var ErrUnavailable = errors.New("pacer: backend unavailable")

// ErrTooLong matches the error of a Pace or PaceWait call whose delay is
// longer than it may wait: longer than Options.MaxDelay (or the three-year
// horizon), or, for PaceWait, longer than the time left before the
// context's deadline. Nothing was recorded, and the Outcome returned with the
// error says how long the call would have had to wait. The PaceWait case
// also matches context.DeadlineExceeded.
var ErrTooLong = errors.New("pacer: delay too long")

// unavailable wraps a backend error so that it matches ErrUnavailable.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// ConfigError reports an invalid option, key or weight. It matches
// bulkhead.ErrInvalid, like the bulkhead's own configuration errors. Invalid
// input is caught before the backend is called, so it never writes state.
type ConfigError struct {
	// Field names the bad field, such as "Options.QPS" or "key".
	Field string
	// Problem says what is wrong with it.
	Problem string
}

// Error returns "pacer: invalid <Field>: <Problem>".
func (e *ConfigError) Error() string { return "pacer: invalid " + e.Field + ": " + e.Problem }

// Is reports whether target is bulkhead.ErrInvalid.
func (e *ConfigError) Is(target error) bool { return target == admission.ErrInvalid }

func invalidf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

func checkName(field, v string) error {
	if strings.IndexByte(v, '{') >= 0 || strings.IndexByte(v, '}') >= 0 {
		return invalidf(field, "must not contain '{' or '}', got %q", v)
	}
	return nil
}

func checkKey(key string) error {
	if key == "" {
		return invalidf("key", "must not be empty")
	}
	return checkName("key", key)
}

// checkDelta is checkWeight, except that with signed a negative w (weight
// given back) is valid too, when finite and within the horizon.
func checkDelta(field string, w, qps float64, signed bool) error {
	if signed && w < 0 {
		if math.IsInf(w, -1) || !intervalOK(-w, qps) {
			return invalidf(field, "must be finite and give back at most %v s of the rate, got %v", horizonUs/1e6, w)
		}
		return nil
	}
	return checkWeight(field, w, qps)
}

func checkWeight(field string, w, qps float64) error {
	if !(w >= 0) || math.IsInf(w, 1) {
		return invalidf(field, "must be >= 0 and finite, got %v", w)
	}
	if !intervalOK(w, qps) {
		return invalidf(field, "books %v s at %v qps, more than the limit of %v s", w/qps, qps, horizonUs/1e6)
	}
	if intervalTooSmall(w, qps) {
		return invalidf(field, "books %v µs at %v qps, less than the microsecond that pacer time is counted in", w*1e6/qps, qps)
	}
	return nil
}
