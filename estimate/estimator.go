package estimate

import (
	"errors"
	"fmt"
	"math"
	"runtime/debug"

	"github.com/llmbulkhead/bulkhead/admission"
)

// DefaultOutputCap is the output reservation of a request that does not set
// MaxTokens, unless an estimator is configured with another cap.
const DefaultOutputCap = 2048

// Estimator maps a request to a token reservation: Input is the estimated
// number of input tokens and MaxOutput the most output tokens the call may
// produce.
//
// Reserved may be left zero; when set it must equal Input + MaxOutput.
// [Reserve] validates whatever an Estimator returns and fills in Reserved.
//
// An Estimator is called from many goroutines at once and must be safe for
// concurrent use. It should be fast and must not block: the bulkhead calls
// it on the admission path, once per admission attempt.
type Estimator interface {
	Estimate(req *admission.Request) (admission.Reservation, error)
}

// Func adapts an ordinary function to the [Estimator] interface.
type Func func(req *admission.Request) (admission.Reservation, error)

// Estimate returns f(req).
func (f Func) Estimate(req *admission.Request) (admission.Reservation, error) {
	return f(req)
}

// Naive is the simplest estimator: one input token per four characters.
//
// Input is ceil(TextLength(req) / 4) + req.ExtraInputTokens. MaxOutput is
// req.MaxTokens, or [DefaultOutputCap] (2048) when MaxTokens is 0, which
// means "not set". Opaque blocks are not charged. The zero value is ready to
// use: estimate.Naive{}.
type Naive struct{}

// Estimate validates req (see [ValidateRequest]) and returns the naive
// reservation, Reserved included.
func (Naive) Estimate(req *admission.Request) (admission.Reservation, error) {
	if err := ValidateRequest(req); err != nil {
		return admission.Reservation{}, err
	}
	input := (int64(TextLength(req)) + 3) / 4
	return finish(input, 0, req, DefaultOutputCap)
}

// ValidateRequest checks the fields of req that every estimate depends on:
// req must not be nil, and MaxTokens and ExtraInputTokens must be
// non-negative. A problem is reported as an *admission.ConfigError naming
// the field ("Request.MaxTokens"...), so errors.Is(err, admission.ErrInvalid)
// holds.
//
// The bulkhead validates every request this way, with or without a token
// budget, and the built-in estimators do too.
func ValidateRequest(req *admission.Request) error {
	if req == nil {
		return admission.Invalidf("Request", "must not be nil")
	}
	if err := admission.CheckNonNegative("Request.MaxTokens", req.MaxTokens); err != nil {
		return err
	}
	return admission.CheckNonNegative("Request.ExtraInputTokens", req.ExtraInputTokens)
}

// Reserve computes the token reservation of one admission attempt (SPEC
// F10). It is what the admission path, WouldAdmit and the bulkhead's
// Estimate call, so all three agree.
//
// It first validates req (see [ValidateRequest]). Then:
//
//   - When override is non-nil it is used verbatim and est is not called.
//     Its fields must be non-negative, Input + MaxOutput must not overflow,
//     and Reserved, when non-zero, must equal Input + MaxOutput. A problem is
//     an *admission.ConfigError naming "Reservation.Input" and so on.
//   - Otherwise est is called exactly once. An error it returns that already
//     matches admission.ErrInvalid is returned as is; any other error, a
//     negative field, an overflowing sum, a Reserved that is neither zero nor
//     Input + MaxOutput, or a panic is returned as an *[EstimatorError]. A
//     panicking estimator is recovered: the panic is reported as an error
//     so that it cannot take the admission path down with it.
//
// The returned Reservation always has Reserved == Input + MaxOutput, every
// field non-negative, and round-trips: passing it back as override yields
// it unchanged. Every error matches admission.ErrInvalid.
func Reserve(est Estimator, req *admission.Request, override *admission.Reservation) (admission.Reservation, error) {
	if err := ValidateRequest(req); err != nil {
		return admission.Reservation{}, err
	}
	if override != nil {
		return checkOverride(*override)
	}
	if est == nil {
		return admission.Reservation{}, admission.Invalidf("Estimator", "must not be nil")
	}
	r, err := callEstimator(est, req)
	if err != nil {
		if errors.Is(err, admission.ErrInvalid) {
			return admission.Reservation{}, err
		}
		return admission.Reservation{}, &EstimatorError{Problem: "estimator failed: " + err.Error(), Err: err}
	}
	return checkEstimate(r)
}

// callEstimator runs est once, turning a panic into an *EstimatorError.
func callEstimator(est Estimator, req *admission.Request) (r admission.Reservation, err error) {
	defer func() {
		if p := recover(); p != nil {
			e := &EstimatorError{
				Problem: fmt.Sprintf("estimator panicked: %v", p),
				Panic:   p,
				Stack:   debug.Stack(),
			}
			if perr, ok := p.(error); ok {
				e.Err = perr
			}
			r, err = admission.Reservation{}, e
		}
	}()
	return est.Estimate(req)
}

// checkOverride validates a per-call reservation override and fills in
// Reserved.
func checkOverride(o admission.Reservation) (admission.Reservation, error) {
	if err := admission.CheckNonNegative("Reservation.Input", o.Input); err != nil {
		return admission.Reservation{}, err
	}
	if err := admission.CheckNonNegative("Reservation.MaxOutput", o.MaxOutput); err != nil {
		return admission.Reservation{}, err
	}
	if err := admission.CheckNonNegative("Reservation.Reserved", o.Reserved); err != nil {
		return admission.Reservation{}, err
	}
	sum, ok := addInt64(o.Input, o.MaxOutput)
	if !ok {
		return admission.Reservation{}, admission.Invalidf("Reservation",
			"Input + MaxOutput overflows int64 (%d + %d)", o.Input, o.MaxOutput)
	}
	if o.Reserved != 0 && o.Reserved != sum {
		return admission.Reservation{}, admission.Invalidf("Reservation.Reserved",
			"must be 0 or Input + MaxOutput = %d, got %d", sum, o.Reserved)
	}
	o.Reserved = sum
	return o, nil
}

// checkEstimate validates what an estimator returned and fills in Reserved.
func checkEstimate(r admission.Reservation) (admission.Reservation, error) {
	bad := func(problem string, args ...any) (admission.Reservation, error) {
		return admission.Reservation{}, &EstimatorError{Estimate: r, Problem: fmt.Sprintf(problem, args...)}
	}
	switch {
	case r.Input < 0:
		return bad("Input must be >= 0, got %d", r.Input)
	case r.MaxOutput < 0:
		return bad("MaxOutput must be >= 0, got %d", r.MaxOutput)
	case r.Reserved < 0:
		return bad("Reserved must be >= 0, got %d", r.Reserved)
	}
	sum, ok := addInt64(r.Input, r.MaxOutput)
	if !ok {
		return bad("Input + MaxOutput overflows int64 (%d + %d)", r.Input, r.MaxOutput)
	}
	if r.Reserved != 0 && r.Reserved != sum {
		return bad("Reserved must be 0 or Input + MaxOutput = %d, got %d", sum, r.Reserved)
	}
	r.Reserved = sum
	return r, nil
}

// EstimatorError reports an estimator that failed: it returned an invalid
// reservation, returned an error that is not itself about invalid input, or
// panicked. errors.Is(err, admission.ErrInvalid) is true for it, so the
// bulkhead treats it like any invalid input: nothing is admitted and nothing
// leaks.
type EstimatorError struct {
	// Estimate is what the estimator returned, when the problem is the
	// returned value.
	Estimate admission.Reservation

	// Problem says what went wrong.
	Problem string

	// Err is the error the estimator returned, or the panic value when it
	// was an error. Unwrap returns it.
	Err error

	// Panic is the recovered panic value when the estimator panicked, and
	// Stack the goroutine's stack at that point.
	Panic any
	Stack []byte
}

// Error returns "bulkhead: invalid estimate: <Problem>".
func (e *EstimatorError) Error() string { return "bulkhead: invalid estimate: " + e.Problem }

// Is reports whether target is admission.ErrInvalid.
func (e *EstimatorError) Is(target error) bool { return target == admission.ErrInvalid }

// Unwrap returns Err.
func (e *EstimatorError) Unwrap() error { return e.Err }

// errInputOverflow is returned by the built-in estimators when an input
// estimate does not fit an int64.
func errInputOverflow() error {
	return &EstimatorError{Problem: "input estimate overflows int64"}
}

// finish completes a built-in estimate from the input derived from text
// (already rounded up), the opaque-block surcharge and the request: it adds
// ExtraInputTokens, picks the output cap and sets Reserved, checking every
// sum for overflow. req must have been validated.
func finish(textInput, surcharge int64, req *admission.Request, outputCap int64) (admission.Reservation, error) {
	input, ok := addInt64(textInput, surcharge)
	if ok {
		input, ok = addInt64(input, req.ExtraInputTokens)
	}
	if !ok {
		return admission.Reservation{}, errInputOverflow()
	}
	out := req.MaxTokens
	if out == 0 {
		out = outputCap
	}
	sum, ok := addInt64(input, out)
	if !ok {
		return admission.Reservation{}, &EstimatorError{Problem: fmt.Sprintf(
			"Input + MaxOutput overflows int64 (%d + %d)", input, out)}
	}
	return admission.Reservation{Input: input, MaxOutput: out, Reserved: sum}, nil
}

// addInt64 returns a + b for non-negative a and b, and false on overflow.
func addInt64(a, b int64) (int64, bool) {
	s := a + b
	return s, s >= a
}

// ceilTolerance is the relative distance to an integer under which a
// floating-point result is taken to be that integer.
const ceilTolerance = 1e-12

// ceilTokens rounds a non-negative token count up to an integer, robustly:
// a value within a relative 1e-12 of an integer is that integer, so that
// floating-point noise such as 21/0.7 = 30.000000000000004 or 30*1.1 =
// 33.00000000000001 does not reserve an extra token. It reports false when
// the result does not fit an int64.
//
// One division or multiplication of float64 values is off by a few parts
// in 1e16, far below the tolerance; a genuinely fractional count is only
// mistaken for an integer when it is above about 1e10 tokens.
func ceilTokens(x float64) (int64, bool) {
	if !(x >= 0) { // NaN or negative: cannot happen with validated inputs
		return 0, false
	}
	c := math.Round(x)
	if math.Abs(x-c) > c*ceilTolerance {
		c = math.Ceil(x)
	}
	if c >= 0x1p63 {
		return 0, false
	}
	return int64(c), true
}
