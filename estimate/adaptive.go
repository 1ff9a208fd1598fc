package estimate

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/tokens"
)

// Defaults of [AdaptiveOptions].
const (
	DefaultSmoothing     = 0.2
	DefaultMinSamples    = 5
	DefaultMinCorrection = 0.5
	DefaultMaxCorrection = 2.0
	DefaultMaxModels     = 64
)

// AdaptiveOptions configures [NewAdaptive]. Every zero value means the
// default, so the zero value is valid.
type AdaptiveOptions struct {
	// Base configures the model-aware estimator whose input estimates are
	// corrected.
	Base ModelAwareOptions

	// Smoothing is the weight of a new observation in the moving average
	// of actual/estimated input, in (0, 1]. Zero means 0.2. 1 keeps only
	// the last observation.
	Smoothing float64

	// MinSamples is how many observations of a model are needed before its
	// correction applies. Zero means 5; negative is invalid.
	MinSamples int

	// MinCorrection and MaxCorrection clamp the applied correction factor.
	// Zero means 0.5 and 2. MinCorrection must be finite and > 0 and
	// MaxCorrection finite and >= MinCorrection.
	MinCorrection float64
	MaxCorrection float64

	// MaxModels is the most models tracked at once; a new model beyond it
	// evicts the model that was inserted first (observing a model again
	// does not refresh its place). Zero means 64; negative is invalid.
	MaxModels int
}

// Correction is the learned correction of one model, as [Adaptive.Corrections]
// reports it.
type Correction struct {
	// Model is the lower-cased model name ("" for requests without a model
	// and no default model).
	Model string

	// Samples is the number of observations.
	Samples int

	// Factor is the raw moving average of actual/estimated input tokens.
	Factor float64

	// Applied is the factor Estimate multiplies the input estimate by: 1
	// before MinSamples observations, then Factor clamped to
	// [MinCorrection, MaxCorrection].
	Applied float64
}

// Adaptive is a [ModelAware] estimator that learns, per model, how far its
// input estimates are from the input tokens providers report, and corrects
// them.
//
// For each model (lower-cased) it keeps an exponentially weighted moving
// average of actual/estimated input over the observations fed to
// [Adaptive.Observe]. Once a model has MinSamples observations, Estimate
// returns Input = ceil(base Input × applied), where applied is the average
// clamped to [MinCorrection, MaxCorrection]. MaxOutput is never corrected.
// Observations always compare with the uncorrected estimate, so corrections
// do not compound.
//
// Wire Observe to the bulkhead's release events, which carry the request and
// its final usage.
//
// Create one with [NewAdaptive]; the zero value is not ready for use. An
// Adaptive is safe for concurrent use: Estimate takes no lock (it reads an
// immutable snapshot of the tracked models and one atomic factor), and
// Observe, Reset and Corrections serialize on a mutex.
type Adaptive struct {
	base *ModelAware

	smoothing  float64
	minSamples int
	minCorr    float64
	maxCorr    float64
	maxModels  int

	// tracked maps a lower-cased model to its state. The map is never
	// mutated once published: inserting, evicting or resetting a model
	// publishes a copy. Estimate only loads it.
	tracked atomic.Pointer[map[string]*modelState]

	mu    sync.Mutex    // serializes writers: Observe, Reset, ResetAll
	order []*modelState // tracked models in insertion order; guarded by mu
}

// modelState is the learned state of one model.
type modelState struct {
	model   string
	samples int     // guarded by Adaptive.mu
	factor  float64 // guarded by Adaptive.mu
	applied atomic.Uint64
}

func (s *modelState) appliedFactor() float64 { return math.Float64frombits(s.applied.Load()) }

// NewAdaptive validates opts and returns an adaptive estimator with no
// observations. An invalid option is an *bulkhead.ConfigError naming it.
func NewAdaptive(opts AdaptiveOptions) (*Adaptive, error) {
	base, err := NewModelAware(opts.Base)
	if err != nil {
		return nil, err
	}
	a := &Adaptive{
		base:       base,
		smoothing:  orDefault(opts.Smoothing, DefaultSmoothing),
		minSamples: orDefault(opts.MinSamples, DefaultMinSamples),
		minCorr:    orDefault(opts.MinCorrection, DefaultMinCorrection),
		maxCorr:    orDefault(opts.MaxCorrection, DefaultMaxCorrection),
		maxModels:  orDefault(opts.MaxModels, DefaultMaxModels),
	}
	switch {
	case !(a.smoothing > 0 && a.smoothing <= 1):
		return nil, invalidf("AdaptiveOptions.Smoothing", "must be in (0, 1], got %v", opts.Smoothing)
	case a.minSamples < 0:
		return nil, invalidf("AdaptiveOptions.MinSamples", "must be >= 0, got %d", opts.MinSamples)
	case !(a.minCorr > 0) || math.IsInf(a.minCorr, 0):
		return nil, invalidf("AdaptiveOptions.MinCorrection", "must be finite and > 0, got %v", opts.MinCorrection)
	case !(a.maxCorr >= a.minCorr) || math.IsInf(a.maxCorr, 0):
		return nil, invalidf("AdaptiveOptions.MaxCorrection",
			"must be finite and >= MinCorrection (%v), got %v", a.minCorr, a.maxCorr)
	case a.maxModels < 0:
		return nil, invalidf("AdaptiveOptions.MaxModels", "must be >= 0, got %d", opts.MaxModels)
	}
	empty := map[string]*modelState{}
	a.tracked.Store(&empty)
	return a, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Base returns the uncorrected model-aware estimator.
func (a *Adaptive) Base() *ModelAware { return a.base }

// Estimate returns the base model-aware reservation of req with its input
// corrected by the model's applied factor, when that is not 1.
func (a *Adaptive) Estimate(req *bulkhead.Request) (bulkhead.Reservation, error) {
	r, err := a.base.Estimate(req)
	if err != nil {
		return r, err
	}
	applied := a.applied(a.base.Model(req))
	if applied == 1 {
		return r, nil
	}
	input, ok := tokens.CeilTokens(float64(r.Input) * applied)
	if !ok {
		return bulkhead.Reservation{}, errInputOverflow()
	}
	sum, ok := tokens.AddInt64(input, r.MaxOutput)
	if !ok {
		return bulkhead.Reservation{}, &bulkhead.EstimatorError{Problem: "Input + MaxOutput overflows int64"}
	}
	return bulkhead.Reservation{Input: input, MaxOutput: r.MaxOutput, Reserved: sum}, nil
}

// applied returns the applied factor of model, 1 when it is not tracked.
func (a *Adaptive) applied(model string) float64 {
	m := *a.tracked.Load()
	if len(m) == 0 {
		return 1
	}
	s, ok := m[model]
	if !ok {
		s, ok = tokens.LookupLower(m, model)
	}
	if !ok {
		return 1
	}
	return s.appliedFactor()
}

// Observe records that req consumed usage.Input input tokens. It computes
// the uncorrected base estimate of req (which calls OnUnknownModel for an
// unknown model) and, unless its input is 0, folds usage.Input / base input
// into the model's moving average. usage.Input is all the input, cached
// reads and cache writes included, as the estimate is. usage.Output is
// validated but not used: output is never corrected. The breakdown fields
// (CachedInput, CacheCreation, Reasoning) are not used.
//
// An invalid request or usage is an *bulkhead.ConfigError naming the field.
func (a *Adaptive) Observe(req *bulkhead.Request, usage bulkhead.Usage) error {
	if err := checkNonNegative("Usage.Input", usage.Input); err != nil {
		return err
	}
	if err := checkNonNegative("Usage.Output", usage.Output); err != nil {
		return err
	}
	base, err := a.base.Estimate(req)
	if err != nil {
		return err
	}
	if base.Input == 0 {
		return nil
	}
	observed := float64(usage.Input) / float64(base.Input)
	key := strings.ToLower(a.base.Model(req))

	a.mu.Lock()
	defer a.mu.Unlock()
	s := (*a.tracked.Load())[key]
	if s == nil {
		s = a.insertLocked(key)
		s.factor = observed
	} else {
		s.factor += a.smoothing * (observed - s.factor)
	}
	s.samples++
	s.applied.Store(math.Float64bits(a.appliedOf(s)))
	return nil
}

// appliedOf returns the factor to apply for s. Call with a.mu held.
func (a *Adaptive) appliedOf(s *modelState) float64 {
	if s.samples < a.minSamples {
		return 1
	}
	return min(max(s.factor, a.minCorr), a.maxCorr)
}

// insertLocked starts tracking key, evicting the oldest-inserted models
// beyond MaxModels, and publishes the new map. Call with a.mu held.
func (a *Adaptive) insertLocked(key string) *modelState {
	s := &modelState{model: key}
	s.applied.Store(math.Float64bits(1))
	for len(a.order) >= a.maxModels {
		a.order[0] = nil
		a.order = a.order[1:]
	}
	a.order = append(a.order, s)
	a.publishLocked()
	return s
}

// publishLocked publishes a fresh map of a.order. Call with a.mu held.
func (a *Adaptive) publishLocked() {
	m := make(map[string]*modelState, len(a.order))
	for _, s := range a.order {
		m[s.model] = s
	}
	a.tracked.Store(&m)
}

// Corrections returns the learned state of every tracked model, in
// insertion order: the order in which the models were first observed (a
// model evicted or reset and then observed again counts as new).
func (a *Adaptive) Corrections() []Correction {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Correction, len(a.order))
	for i, s := range a.order {
		out[i] = Correction{Model: s.model, Samples: s.samples, Factor: s.factor, Applied: s.appliedFactor()}
	}
	return out
}

// Reset forgets what was learned about model (compared lower-cased), so its
// estimates are uncorrected again until it has MinSamples new observations.
// Reset("") forgets the empty model only; see [Adaptive.ResetAll].
func (a *Adaptive) Reset(model string) {
	key := strings.ToLower(model)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.order {
		if s.model == key {
			a.order = slices.Delete(a.order, i, i+1)
			a.publishLocked()
			return
		}
	}
}

// ResetAll forgets every model.
func (a *Adaptive) ResetAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.order = nil
	empty := map[string]*modelState{}
	a.tracked.Store(&empty)
}
