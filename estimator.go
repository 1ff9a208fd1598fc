package bulkhead

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/llmbulkhead/bulkhead/internal/tokens"
)

// DefaultOutputCap is the output reservation of a request that does not set
// MaxTokens, unless the estimator is configured with another cap.
const DefaultOutputCap = 2048

// Estimator maps a request to a token reservation: Input is the estimated
// number of input tokens and MaxOutput the most output tokens the call may
// produce. Package estimate has configurable and learning estimators.
//
// Reserved may be left zero; when set it must equal Input + MaxOutput. The
// bulkhead validates whatever an Estimator returns: a negative field, an
// overflowing sum, an error or a panic refuses the call with an
// *EstimatorError (or the estimator's own *ConfigError) and takes nothing.
//
// An Estimator is called from many goroutines at once and must be safe for
// concurrent use. It should be fast and must not block: the bulkhead calls
// it on the admission path, once per admission attempt.
type Estimator interface {
	Estimate(req *Request) (Reservation, error)
}

// defaultEstimator is the estimator of a bulkhead whose token budget names
// none: characters per token by model from the built-in table (4 for a
// model the table does not know), no opaque-block surcharge, and an output
// cap for requests that set no MaxTokens. It gives the same reservations as
// package estimate's model-aware estimator with the same model and cap.
type defaultEstimator struct {
	model     string
	ratio     float64
	outputCap int64
}

func newDefaultEstimator(model string, outputCap int64) *defaultEstimator {
	if outputCap == 0 {
		outputCap = DefaultOutputCap
	}
	ratio, _ := tokens.BuiltinRatio(model)
	return &defaultEstimator{model: model, ratio: ratio, outputCap: outputCap}
}

func (d *defaultEstimator) Estimate(req *Request) (Reservation, error) {
	if err := req.Validate(); err != nil {
		return Reservation{}, err
	}
	ratio := d.ratio
	if req.Model != "" && req.Model != d.model {
		ratio, _ = tokens.BuiltinRatio(req.Model)
	}
	chars := req.TextLength()
	input, ok := tokens.CeilTokens(float64(chars) / ratio)
	if ok {
		input, ok = tokens.AddInt64(input, req.ExtraInputTokens)
	}
	if !ok {
		return Reservation{}, &EstimatorError{Problem: "input estimate overflows int64"}
	}
	out := req.MaxTokens
	if out == 0 {
		out = d.outputCap
	}
	sum, ok := tokens.AddInt64(input, out)
	if !ok {
		return Reservation{}, &EstimatorError{Problem: fmt.Sprintf("Input + MaxOutput overflows int64 (%d + %d)", input, out)}
	}
	return Reservation{Input: input, MaxOutput: out, Reserved: sum}, nil
}

// reserve computes the token reservation of one admission attempt. It is what the admission path, WouldAdmit and the bulkhead's
// Estimate call, so all three agree.
//
// It first validates req (see Request.Validate). Then:
//
//   - When override is non-nil it is used verbatim and est is not called.
//     Its fields must be non-negative, Input + MaxOutput must not overflow,
//     and Reserved, when non-zero, must equal Input + MaxOutput. A problem is
//     an *ConfigError naming "Reservation.Input" and so on.
//   - Otherwise est is called exactly once. An error it returns that already
//     matches ErrInvalid is returned as is; any other error, a
//     negative field, an overflowing sum, a Reserved that is neither zero nor
//     Input + MaxOutput, or a panic is returned as an *EstimatorError. A
//     panicking estimator is recovered: the panic is reported as an error
//     so that it cannot take the admission path down with it.
//
// The returned Reservation always has Reserved == Input + MaxOutput, every
// field non-negative, and round-trips: passing it back as override yields
// it unchanged. Every error matches ErrInvalid.
func reserve(est Estimator, req *Request, override *Reservation) (Reservation, error) {
	if err := req.Validate(); err != nil {
		return Reservation{}, err
	}
	if override != nil {
		return checkOverride(*override)
	}
	if est == nil {
		return Reservation{}, invalidf("Estimator", "must not be nil")
	}
	r, err := callEstimator(est, req)
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			return Reservation{}, err
		}
		return Reservation{}, &EstimatorError{Problem: "estimator failed: " + err.Error(), Err: err}
	}
	return checkEstimate(r)
}

// callEstimator runs est once, turning a panic into an *EstimatorError.
func callEstimator(est Estimator, req *Request) (r Reservation, err error) {
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
			r, err = Reservation{}, e
		}
	}()
	return est.Estimate(req)
}

// checkOverride validates a per-call reservation override and fills in
// Reserved.
func checkOverride(o Reservation) (Reservation, error) {
	if err := checkNonNegative("Reservation.Input", o.Input); err != nil {
		return Reservation{}, err
	}
	if err := checkNonNegative("Reservation.MaxOutput", o.MaxOutput); err != nil {
		return Reservation{}, err
	}
	if err := checkNonNegative("Reservation.Reserved", o.Reserved); err != nil {
		return Reservation{}, err
	}
	sum, ok := tokens.AddInt64(o.Input, o.MaxOutput)
	if !ok {
		return Reservation{}, invalidf("Reservation",
			"Input + MaxOutput overflows int64 (%d + %d)", o.Input, o.MaxOutput)
	}
	if o.Reserved != 0 && o.Reserved != sum {
		return Reservation{}, invalidf("Reservation.Reserved",
			"must be 0 or Input + MaxOutput = %d, got %d", sum, o.Reserved)
	}
	o.Reserved = sum
	return o, nil
}

// checkEstimate validates what an estimator returned and fills in Reserved.
func checkEstimate(r Reservation) (Reservation, error) {
	bad := func(problem string, args ...any) (Reservation, error) {
		return Reservation{}, &EstimatorError{Estimate: r, Problem: fmt.Sprintf(problem, args...)}
	}
	switch {
	case r.Input < 0:
		return bad("Input must be >= 0, got %d", r.Input)
	case r.MaxOutput < 0:
		return bad("MaxOutput must be >= 0, got %d", r.MaxOutput)
	case r.Reserved < 0:
		return bad("Reserved must be >= 0, got %d", r.Reserved)
	}
	sum, ok := tokens.AddInt64(r.Input, r.MaxOutput)
	if !ok {
		return bad("Input + MaxOutput overflows int64 (%d + %d)", r.Input, r.MaxOutput)
	}
	if r.Reserved != 0 && r.Reserved != sum {
		return bad("Reserved must be 0 or Input + MaxOutput = %d, got %d", sum, r.Reserved)
	}
	r.Reserved = sum
	return r, nil
}
