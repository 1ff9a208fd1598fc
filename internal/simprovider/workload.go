package simprovider

import (
	"errors"
	"math"
	"math/rand/v2"
)

// Workload describes the requests a client population sends: how big the
// prompts are and what max_tokens the callers ask for. How long the outputs
// turn out is the provider's side (Config.OutputMedian).
type Workload struct {
	// InputMedian is the median prompt size in tokens.
	InputMedian int64
	// InputSpread is the sigma of the lognormal prompt-size distribution.
	InputSpread float64
	// MinInput and MaxInput clamp the prompt size.
	MinInput, MaxInput int64
	// MaxTokens lists the max_tokens values callers use, and
	// MaxTokensWeights how often each is used (same length, not all zero).
	MaxTokens        []int64
	MaxTokensWeights []float64
}

// DefaultWorkload returns a chat-style mix: prompts of about 900 tokens
// (median; a long tail up to 12,000) and max_tokens of 256, 512, 1024 or
// 2048. With the default provider, requests cost about 2,300 tokens against
// the TPM limit on average and take about 5 s unloaded.
func DefaultWorkload() Workload {
	return Workload{
		InputMedian:      900,
		InputSpread:      1.0,
		MinInput:         20,
		MaxInput:         12_000,
		MaxTokens:        []int64{256, 512, 1024, 2048},
		MaxTokensWeights: []float64{0.2, 0.3, 0.35, 0.15},
	}
}

func (w *Workload) validate() error {
	if w.InputMedian <= 0 || w.MinInput < 0 || w.MaxInput < w.MinInput || !(w.InputSpread >= 0) || math.IsInf(w.InputSpread, 0) {
		return errors.New("simprovider: workload input sizes are invalid")
	}
	if len(w.MaxTokens) == 0 || len(w.MaxTokens) != len(w.MaxTokensWeights) {
		return errors.New("simprovider: workload needs as many MaxTokensWeights as MaxTokens")
	}
	total := 0.0
	for i, m := range w.MaxTokens {
		wt := w.MaxTokensWeights[i]
		if m <= 0 || !(wt >= 0) || math.IsInf(wt, 0) {
			return errors.New("simprovider: workload max_tokens must be > 0 with weights >= 0")
		}
		total += wt
	}
	if total == 0 {
		return errors.New("simprovider: workload weights are all zero")
	}
	return nil
}

// Generate draws n requests, with IDs 1..n, deterministically from seed.
// Their output lengths are left to the provider.
func (w Workload) Generate(seed uint64, n int) ([]Request, error) {
	if err := w.validate(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errors.New("simprovider: negative request count")
	}
	total := 0.0
	for _, wt := range w.MaxTokensWeights {
		total += wt
	}
	// A stream distinct from every per-request stream (those use the ID).
	rng := rand.New(rand.NewPCG(seed, math.MaxUint64))
	reqs := make([]Request, n)
	for i := range reqs {
		in := int64(math.Round(lognormal(rng, float64(w.InputMedian), w.InputSpread)))
		in = min(max(in, w.MinInput), w.MaxInput)
		pick := rng.Float64() * total
		mt := w.MaxTokens[len(w.MaxTokens)-1]
		for j, wt := range w.MaxTokensWeights {
			if pick < wt {
				mt = w.MaxTokens[j]
				break
			}
			pick -= wt
		}
		reqs[i] = Request{ID: uint64(i + 1), InputTokens: in, MaxTokens: mt}
	}
	return reqs, nil
}
