package stream

import (
	"net/http"
	"strconv"

	"github.com/llmbulkhead/bulkhead"
)

// DefaultAttemptHeader is the request header in which the official OpenAI
// and Anthropic SDKs (for Python, Node and Go, among others) say which
// attempt of a call a request is: 0 for the first, 1 for its first retry,
// and so on.
const DefaultAttemptHeader = "X-Stainless-Retry-Count"

// AttemptOf returns the attempt number that header name of h carries
// (DefaultAttemptHeader for ""): 0 when the header is absent or empty. A
// value that is not a whole number of decimal digits, or does not fit an
// int, is a *bulkhead.ConfigError naming the header (it matches
// bulkhead.ErrInvalid).
func AttemptOf(h http.Header, name string) (int, error) {
	if name == "" {
		name = DefaultAttemptHeader
	}
	v := h.Get(name)
	if v == "" {
		return 0, nil
	}
	return parseAttempt(name, v)
}

// parseAttempt parses v, the value of header name, as an attempt number.
func parseAttempt(name, v string) (int, error) {
	for i := range len(v) {
		if v[i] < '0' || v[i] > '9' {
			return 0, &bulkhead.ConfigError{Field: "header " + name, Problem: "want a whole number >= 0, got " + strconv.Quote(clip(v))}
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, &bulkhead.ConfigError{Field: "header " + name, Problem: "the attempt number " + strconv.Quote(clip(v)) + " is too large"}
	}
	return n, nil
}

// clip shortens a header value quoted in an error.
func clip(v string) string {
	if len(v) > 32 {
		return v[:32] + "..."
	}
	return v
}
