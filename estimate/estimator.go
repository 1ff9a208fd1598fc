package estimate

import (
	"fmt"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/tokens"
)

// Func adapts an ordinary function to the bulkhead.Estimator interface.
type Func func(req *bulkhead.Request) (bulkhead.Reservation, error)

// Estimate returns f(req).
func (f Func) Estimate(req *bulkhead.Request) (bulkhead.Reservation, error) {
	return f(req)
}

// Naive is the simplest estimator: one input token per four characters.
//
// Input is ceil(req.TextLength() / 4) + req.ExtraInputTokens. MaxOutput is
// req.MaxTokens, or [bulkhead.DefaultOutputCap] (2048) when MaxTokens is 0, which
// means "not set". Opaque blocks are not charged. The zero value is ready to
// use: estimate.Naive{}.
type Naive struct{}

// Estimate validates req (see [ValidateRequest]) and returns the naive
// reservation, Reserved included.
func (Naive) Estimate(req *bulkhead.Request) (bulkhead.Reservation, error) {
	if err := req.Validate(); err != nil {
		return bulkhead.Reservation{}, err
	}
	input := (int64(req.TextLength()) + 3) / 4
	return finish(input, 0, req, bulkhead.DefaultOutputCap)
}

// errInputOverflow is returned by the built-in estimators when an input
// estimate does not fit an int64.
func errInputOverflow() error {
	return &bulkhead.EstimatorError{Problem: "input estimate overflows int64"}
}

// finish completes a built-in estimate from the input derived from text
// (already rounded up), the opaque-block surcharge and the request: it adds
// ExtraInputTokens, picks the output cap and sets Reserved, checking every
// sum for overflow. req must have been validated.
func finish(textInput, surcharge int64, req *bulkhead.Request, outputCap int64) (bulkhead.Reservation, error) {
	input, ok := tokens.AddInt64(textInput, surcharge)
	if ok {
		input, ok = tokens.AddInt64(input, req.ExtraInputTokens)
	}
	if !ok {
		return bulkhead.Reservation{}, errInputOverflow()
	}
	out := req.MaxTokens
	if out == 0 {
		out = outputCap
	}
	sum, ok := tokens.AddInt64(input, out)
	if !ok {
		return bulkhead.Reservation{}, &bulkhead.EstimatorError{Problem: fmt.Sprintf(
			"Input + MaxOutput overflows int64 (%d + %d)", input, out)}
	}
	return bulkhead.Reservation{Input: input, MaxOutput: out, Reserved: sum}, nil
}

func invalidf(field, format string, args ...any) *bulkhead.ConfigError {
	return &bulkhead.ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

func checkNonNegative(field string, v int64) error {
	if v < 0 {
		return invalidf(field, "must be >= 0, got %d", v)
	}
	return nil
}
