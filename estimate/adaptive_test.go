package estimate_test

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

func mustAdaptive(t testing.TB, opts estimate.AdaptiveOptions) *estimate.Adaptive {
	t.Helper()
	a, err := estimate.NewAdaptive(opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// req37 is a gpt-4o request whose base input is 10 tokens (37 chars / 3.7).
func req37(model string) *bulkhead.Request {
	return userReq(model, strings.Repeat("a", 37), 100)
}

func observe(t testing.TB, a *estimate.Adaptive, req *bulkhead.Request, input int64, times int) {
	t.Helper()
	for range times {
		if err := a.Observe(req, bulkhead.Usage{Input: input, Output: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

func estimateInput(t testing.TB, est bulkhead.Estimator, req *bulkhead.Request) bulkhead.Reservation {
	t.Helper()
	r, err := est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Reserved != r.Input+r.MaxOutput {
		t.Fatalf("Reserved %d != %d + %d", r.Reserved, r.Input, r.MaxOutput)
	}
	return r
}

func TestAdaptiveWarmUp(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}})
	req := req37("")
	if got := estimateInput(t, a, req); got != res(10, 100) {
		t.Fatalf("no observations: %+v", got)
	}
	for i := 1; i <= 5; i++ {
		observe(t, a, req, 15, 1) // actual/base = 1.5
		got := estimateInput(t, a, req)
		want := int64(10)
		if i >= estimate.DefaultMinSamples {
			want = 15
		}
		if got.Input != want || got.MaxOutput != 100 {
			t.Errorf("after %d observations: %+v, want input %d", i, got, want)
		}
		c := a.Corrections()
		if len(c) != 1 || c[0].Samples != i || c[0].Factor != 1.5 {
			t.Errorf("after %d observations: %+v", i, c)
		}
		wantApplied := 1.0
		if i >= 5 {
			wantApplied = 1.5
		}
		if c[0].Applied != wantApplied {
			t.Errorf("after %d: applied %v, want %v", i, c[0].Applied, wantApplied)
		}
	}
}

func TestAdaptiveEWMA(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	req := req37("")
	observe(t, a, req, 15, 1) // first sample sets the factor: 1.5
	observe(t, a, req, 20, 1) // 1.5 + 0.2*(2-1.5) = 1.6
	c := a.Corrections()[0]
	if math.Abs(c.Factor-1.6) > 1e-12 || c.Samples != 2 {
		t.Fatalf("correction %+v, want factor 1.6 after 2 samples", c)
	}
	if got := estimateInput(t, a, req); got.Input != 16 {
		t.Errorf("input %d, want 16", got.Input)
	}

	// Smoothing 1 keeps only the last observation.
	a = mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1, Smoothing: 1})
	observe(t, a, req, 15, 1)
	observe(t, a, req, 12, 1)
	if got := a.Corrections()[0].Factor; got != 1.2 {
		t.Errorf("smoothing 1: factor %v, want 1.2", got)
	}
}

func TestAdaptiveClamp(t *testing.T) {
	tests := []struct {
		name    string
		opts    estimate.AdaptiveOptions
		actual  int64
		factor  float64
		applied float64
		input   int64
	}{
		{"above max", estimate.AdaptiveOptions{MinSamples: 1}, 100, 10, 2, 20},
		{"below min", estimate.AdaptiveOptions{MinSamples: 1}, 1, 0.1, 0.5, 5},
		{"zero usage", estimate.AdaptiveOptions{MinSamples: 1}, 0, 0, 0.5, 5},
		{"custom bounds high", estimate.AdaptiveOptions{MinSamples: 1, MinCorrection: 0.9, MaxCorrection: 1.1}, 100, 10, 1.1, 11},
		{"custom bounds low", estimate.AdaptiveOptions{MinSamples: 1, MinCorrection: 0.9, MaxCorrection: 1.1}, 1, 0.1, 0.9, 9},
		{"within bounds", estimate.AdaptiveOptions{MinSamples: 1}, 13, 1.3, 1.3, 13},
		{"equal bounds", estimate.AdaptiveOptions{MinSamples: 1, MinCorrection: 1.25, MaxCorrection: 1.25}, 10, 1, 1.25, 13},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Base.DefaultModel = "gpt-4o"
			a := mustAdaptive(t, tt.opts)
			req := req37("")
			observe(t, a, req, tt.actual, 1)
			c := a.Corrections()[0]
			if c.Factor != tt.factor || c.Applied != tt.applied {
				t.Errorf("correction %+v, want factor %v applied %v", c, tt.factor, tt.applied)
			}
			if got := estimateInput(t, a, req); got.Input != tt.input || got.MaxOutput != 100 {
				t.Errorf("estimate %+v, want input %d", got, tt.input)
			}
		})
	}
}

func TestAdaptiveNoCompounding(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	req := req37("")
	// The provider keeps reporting 20 input tokens for a base estimate of
	// 10: the factor must settle at 2, not drift towards 1 as it would if
	// observations compared with the corrected estimate (20).
	for range 50 {
		observe(t, a, req, 20, 1)
		if got := estimateInput(t, a, req); got.Input != 20 {
			t.Fatalf("input %d, want 20", got.Input)
		}
	}
	if c := a.Corrections()[0]; c.Factor != 2 || c.Applied != 2 || c.Samples != 50 {
		t.Errorf("correction %+v", c)
	}
}

func TestAdaptiveIgnoresZeroBase(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	if err := a.Observe(&bulkhead.Request{MaxTokens: 5}, bulkhead.Usage{Input: 100}); err != nil {
		t.Fatal(err)
	}
	if c := a.Corrections(); len(c) != 0 {
		t.Errorf("zero base input was observed: %+v", c)
	}
	// ExtraInputTokens alone makes a non-zero base.
	if err := a.Observe(&bulkhead.Request{ExtraInputTokens: 10}, bulkhead.Usage{Input: 15}); err != nil {
		t.Fatal(err)
	}
	if c := a.Corrections(); len(c) != 1 || c[0].Factor != 1.5 {
		t.Errorf("corrections %+v", c)
	}
	// A zero base stays zero when corrected.
	if got := estimateInput(t, a, &bulkhead.Request{}); got != res(0, 2048) {
		t.Errorf("empty request: %+v", got)
	}
}

func TestAdaptiveOutputNeverCorrected(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o", OutputCap: 500}, MinSamples: 1})
	req := req37("")
	if err := a.Observe(req, bulkhead.Usage{Input: 20, Output: 100000}); err != nil {
		t.Fatal(err)
	}
	if got := estimateInput(t, a, req); got != res(20, 100) {
		t.Errorf("got %+v", got)
	}
	req.MaxTokens = 0
	if got := estimateInput(t, a, req); got != res(20, 500) {
		t.Errorf("got %+v", got)
	}
}

func TestAdaptiveRobustCeil(t *testing.T) {
	// 111 chars at 3.7 is a base of 30; actual 33 makes the factor 1.1, and
	// 30 * 1.1 must give 33, not 34.
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	req := userReq("", strings.Repeat("a", 111), 1)
	observe(t, a, req, 33, 1)
	if got := estimateInput(t, a, req); got.Input != 33 {
		t.Errorf("input %d, want 33", got.Input)
	}
	// A fractional result still rounds up: 37 chars at 3.7 is 10; 10 * 1.1 = 11.
	if got := estimateInput(t, a, req37("")); got.Input != 11 {
		t.Errorf("input %d, want 11", got.Input)
	}
	// 38 chars: base 11; 11 * 1.1 = 12.1 -> 13.
	if got := estimateInput(t, a, userReq("", strings.Repeat("a", 38), 1)); got.Input != 13 {
		t.Errorf("input %d, want 13", got.Input)
	}
}

func TestAdaptiveModelKeys(t *testing.T) {
	var unknown []string
	a := mustAdaptive(t, estimate.AdaptiveOptions{
		Base: estimate.ModelAwareOptions{
			DefaultModel:   "GPT-4o",
			OnUnknownModel: func(m string) { unknown = append(unknown, m) },
		},
		MinSamples: 1,
	})
	observe(t, a, req37(""), 20, 1)       // the default model, lower-cased
	observe(t, a, req37("gpt-4O"), 20, 1) // the same model
	observe(t, a, req37("llama"), 5, 1)   // unknown: ratio 4, base 10
	c := a.Corrections()
	if len(c) != 2 || c[0].Model != "gpt-4o" || c[0].Samples != 2 || c[1].Model != "llama" {
		t.Fatalf("corrections %+v", c)
	}
	if len(unknown) != 1 || unknown[0] != "llama" {
		t.Errorf("OnUnknownModel saw %q, want [llama] (Observe runs the base estimate)", unknown)
	}
	for _, model := range []string{"", "gpt-4o", "GPT-4O", "Gpt-4o"} {
		if got := estimateInput(t, a, req37(model)); got.Input != 20 {
			t.Errorf("model %q: input %d, want 20", model, got.Input)
		}
	}
	if got := estimateInput(t, a, req37("LLAMA")); got.Input != 5 {
		t.Errorf("LLAMA: input %d, want 5", got.Input)
	}
	if got := estimateInput(t, a, req37("gpt-4o-mini")); got.Input != 10 {
		t.Errorf("another model is uncorrected: input %d", got.Input)
	}

	// Without any default model, requests without a model share the key "".
	b := mustAdaptive(t, estimate.AdaptiveOptions{MinSamples: 1})
	observe(t, b, userReq("", strings.Repeat("a", 40), 1), 20, 1)
	if c := b.Corrections(); len(c) != 1 || c[0].Model != "" || c[0].Applied != 2 {
		t.Errorf("empty model: %+v", c)
	}
	// Non-ASCII and long names are keyed lower-case too.
	long := strings.Repeat("M", 100)
	for _, model := range []string{"MODÈLE", long} {
		observe(t, b, userReq(model, strings.Repeat("a", 40), 1), 30, 1)
		if got := estimateInput(t, b, userReq(strings.ToLower(model), strings.Repeat("a", 40), 1)); got.Input != 20 {
			t.Errorf("%s: input %d, want 20 (clamped 3 -> 2)", model, got.Input)
		}
	}
}

func TestAdaptiveEviction(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{MaxModels: 3, MinSamples: 1})
	obs := func(model string) { observe(t, a, req37(model), 20, 1) }
	models := func() string {
		var names []string
		for _, c := range a.Corrections() {
			names = append(names, c.Model)
		}
		return strings.Join(names, ",")
	}
	obs("a")
	obs("b")
	obs("c")
	obs("a") // an update does not refresh the insertion order
	if got := models(); got != "a,b,c" {
		t.Fatalf("models %s", got)
	}
	obs("d") // evicts a, the oldest inserted
	if got := models(); got != "b,c,d" {
		t.Fatalf("after d: %s", got)
	}
	if got := estimateInput(t, a, req37("a")); got.Input != 10 {
		t.Errorf("evicted model still corrected: %d", got.Input)
	}
	obs("a") // a comes back as new, evicting b
	if got := models(); got != "c,d,a" {
		t.Fatalf("after a again: %s", got)
	}
	if c := a.Corrections()[2]; c.Samples != 1 {
		t.Errorf("re-inserted model kept old samples: %+v", c)
	}
	// Default MaxModels is 64.
	b := mustAdaptive(t, estimate.AdaptiveOptions{MinSamples: 1})
	for i := range 100 {
		observe(t, b, req37(fmt.Sprintf("m%d", i)), 20, 1)
	}
	c := b.Corrections()
	if len(c) != estimate.DefaultMaxModels || c[0].Model != "m36" || c[63].Model != "m99" {
		t.Errorf("got %d models from %s to %s", len(c), c[0].Model, c[len(c)-1].Model)
	}
}

func TestAdaptiveReset(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{MinSamples: 2})
	for _, m := range []string{"", "gpt-4o", "claude-opus-4"} {
		observe(t, a, req37(m), 40, 2)
	}
	if got := len(a.Corrections()); got != 3 {
		t.Fatalf("%d models", got)
	}
	a.Reset("GPT-4O") // lower-cased
	c := a.Corrections()
	if len(c) != 2 || c[0].Model != "" || c[1].Model != "claude-opus-4" {
		t.Fatalf("after Reset: %+v", c)
	}
	if got := estimateInput(t, a, req37("gpt-4o")); got.Input != 10 {
		t.Errorf("reset model still corrected: %d", got.Input)
	}
	// Warm-up starts over.
	observe(t, a, req37("gpt-4o"), 40, 1)
	if got := estimateInput(t, a, req37("gpt-4o")); got.Input != 10 {
		t.Errorf("corrected before MinSamples: %d", got.Input)
	}
	a.Reset("unknown") // no-op
	a.Reset("")        // only the empty model
	c = a.Corrections()
	if len(c) != 2 || c[0].Model != "claude-opus-4" || c[1].Model != "gpt-4o" {
		t.Fatalf("after Reset(\"\"): %+v", c)
	}
	a.ResetAll()
	if c := a.Corrections(); len(c) != 0 {
		t.Fatalf("after ResetAll: %+v", c)
	}
	if got := estimateInput(t, a, req37("claude-opus-4")); got.Input != 10 {
		t.Errorf("after ResetAll: %d", got.Input)
	}
	observe(t, a, req37("x"), 20, 2)
	if got := estimateInput(t, a, req37("x")); got.Input != 20 {
		t.Errorf("learning after ResetAll: %d", got.Input)
	}
}

func TestAdaptiveObserveValidation(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{})
	tests := []struct {
		name  string
		req   *bulkhead.Request
		usage bulkhead.Usage
		field string
	}{
		{"nil request", nil, bulkhead.Usage{Input: 1}, "Request"},
		{"negative max tokens", &bulkhead.Request{MaxTokens: -1}, bulkhead.Usage{}, "Request.MaxTokens"},
		{"negative input usage", req37(""), bulkhead.Usage{Input: -1}, "Usage.Input"},
		{"negative output usage", req37(""), bulkhead.Usage{Output: -1}, "Usage.Output"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantConfigError(t, a.Observe(tt.req, tt.usage), tt.field)
		})
	}
	if c := a.Corrections(); len(c) != 0 {
		t.Errorf("invalid observations recorded: %+v", c)
	}
}

func TestAdaptiveOptionsValidation(t *testing.T) {
	tests := []struct {
		name  string
		opts  estimate.AdaptiveOptions
		field string
	}{
		{"negative smoothing", estimate.AdaptiveOptions{Smoothing: -0.1}, "AdaptiveOptions.Smoothing"},
		{"smoothing above 1", estimate.AdaptiveOptions{Smoothing: 1.01}, "AdaptiveOptions.Smoothing"},
		{"NaN smoothing", estimate.AdaptiveOptions{Smoothing: math.NaN()}, "AdaptiveOptions.Smoothing"},
		{"negative min samples", estimate.AdaptiveOptions{MinSamples: -1}, "AdaptiveOptions.MinSamples"},
		{"negative min correction", estimate.AdaptiveOptions{MinCorrection: -1}, "AdaptiveOptions.MinCorrection"},
		{"NaN min correction", estimate.AdaptiveOptions{MinCorrection: math.NaN()}, "AdaptiveOptions.MinCorrection"},
		{"infinite min correction", estimate.AdaptiveOptions{MinCorrection: math.Inf(1)}, "AdaptiveOptions.MinCorrection"},
		{"max below min", estimate.AdaptiveOptions{MinCorrection: 1, MaxCorrection: 0.9}, "AdaptiveOptions.MaxCorrection"},
		{"max below default min", estimate.AdaptiveOptions{MaxCorrection: 0.4}, "AdaptiveOptions.MaxCorrection"},
		{"min above default max", estimate.AdaptiveOptions{MinCorrection: 3}, "AdaptiveOptions.MaxCorrection"},
		{"infinite max", estimate.AdaptiveOptions{MaxCorrection: math.Inf(1)}, "AdaptiveOptions.MaxCorrection"},
		{"NaN max", estimate.AdaptiveOptions{MaxCorrection: math.NaN()}, "AdaptiveOptions.MaxCorrection"},
		{"negative max models", estimate.AdaptiveOptions{MaxModels: -1}, "AdaptiveOptions.MaxModels"},
		{"bad base", estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{OutputCap: -1}}, "ModelAwareOptions.OutputCap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := estimate.NewAdaptive(tt.opts)
			if a != nil {
				t.Error("estimator returned with an error")
			}
			wantConfigError(t, err, tt.field)
		})
	}
	for _, opts := range []estimate.AdaptiveOptions{
		{},
		{Smoothing: 1, MinSamples: 1, MinCorrection: 1, MaxCorrection: 1, MaxModels: 1},
		{Smoothing: 1e-9, MinCorrection: 1e-9, MaxCorrection: 1e9},
	} {
		if _, err := estimate.NewAdaptive(opts); err != nil {
			t.Errorf("%+v: %v", opts, err)
		}
	}
}

func TestAdaptiveEstimateDoesNotAllocate(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	observe(t, a, req37(""), 20, 1)
	observe(t, a, req37("claude-opus-4"), 5, 1)
	for _, req := range []*bulkhead.Request{req37(""), req37("GPT-4o"), req37("Claude-Opus-4"), req37("untracked")} {
		if n := testing.AllocsPerRun(100, func() { a.Estimate(req) }); n != 0 {
			t.Errorf("model %q: Estimate allocates %v times", req.Model, n)
		}
	}
}

// TestAdaptiveConcurrent runs estimates, observations, resets and reads at
// once; run it with -race.
func TestAdaptiveConcurrent(t *testing.T) {
	const maxModels = 8
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 2, MaxModels: maxModels})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 400 {
				model := fmt.Sprintf("Model-%d", (g*7+i)%12)
				req := req37(model)
				switch i % 10 {
				case 0:
					if err := a.Observe(req, bulkhead.Usage{Input: int64(1 + i%40)}); err != nil {
						t.Error(err)
						return
					}
				case 1:
					for _, c := range a.Corrections() {
						if c.Applied != 1 && (c.Applied < 0.5 || c.Applied > 2) {
							t.Errorf("applied %v outside the clamp", c.Applied)
						}
					}
					if n := len(a.Corrections()); n > maxModels {
						t.Errorf("%d models tracked, max %d", n, maxModels)
					}
				case 2:
					if g == 0 && i%100 == 2 {
						a.ResetAll()
					} else if i%50 == 2 {
						a.Reset(model)
					}
				default:
					r, err := a.Estimate(req)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Input < 5 || r.Input > 20 || r.Reserved != r.Input+r.MaxOutput {
						t.Errorf("estimate %+v outside [5, 20] input", r)
					}
				}
			}
		}()
	}
	wg.Wait()
}

func TestAdaptiveOverflow(t *testing.T) {
	a := mustAdaptive(t, estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	if a.Base() == nil {
		t.Fatal("Base() is nil")
	}
	observe(t, a, req37(""), 15, 1) // applied 1.5

	// The corrected input does not fit an int64.
	huge := req37("")
	huge.ExtraInputTokens = 7e18 // × 1.5 > MaxInt64
	if _, err := a.Base().Estimate(huge); err != nil {
		t.Fatalf("base estimate: %v", err)
	}
	_, err := a.Estimate(huge)
	wantEstimatorError(t, err, "overflows")

	// The corrected input fits, but not with the output.
	big := req37("")
	big.ExtraInputTokens = 1<<62 - 10 // base input 2^62
	big.MaxTokens = 3 << 60           // base sum 7×2^60 fits, corrected 9×2^60 does not
	if _, err := a.Base().Estimate(big); err != nil {
		t.Fatalf("base estimate: %v", err)
	}
	_, err = a.Estimate(big)
	wantEstimatorError(t, err, "overflows")
}
