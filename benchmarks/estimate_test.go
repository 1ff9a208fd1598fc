package benchmarks

import (
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// estimateRequest is the reference benchmark's request: one user message of
// 224 characters and max_tokens 256.
func estimateRequest(model string) *bulkhead.Request {
	return &bulkhead.Request{
		Model:     model,
		Messages:  []bulkhead.Message{{Role: "user", Content: strings.Repeat("lorem ipsum dolor sit amet, ", 8)}},
		MaxTokens: 256,
	}
}

var sinkReservation bulkhead.Reservation

func benchEstimator(b *testing.B, est bulkhead.Estimator, req *bulkhead.Request) {
	b.Helper()
	if n := len(req.Messages[0].Content); n != 224 {
		b.Fatalf("content is %d characters, want 224", n)
	}
	b.ReportAllocs()
	for b.Loop() {
		r, err := est.Estimate(req)
		if err != nil {
			b.Fatal(err)
		}
		sinkReservation = r
	}
}

// BenchmarkEstimateModelAware is the default estimator on the reference
// request, for the bulkhead's own model (the common case).
func BenchmarkEstimateModelAware(b *testing.B) {
	est, err := estimate.NewModelAware(estimate.ModelAwareOptions{DefaultModel: "gpt-4o"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("default-model", func(b *testing.B) { benchEstimator(b, est, estimateRequest("")) })
	b.Run("request-model", func(b *testing.B) { benchEstimator(b, est, estimateRequest("claude-sonnet-4-5-20250929")) })
	b.Run("request-model-mixed-case", func(b *testing.B) { benchEstimator(b, est, estimateRequest("Claude-Sonnet-4-5-20250929")) })
}

func BenchmarkEstimateNaive(b *testing.B) {
	benchEstimator(b, estimate.Naive{}, estimateRequest(""))
}

func BenchmarkEstimateAdaptive(b *testing.B) {
	est, err := estimate.NewAdaptive(estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	if err != nil {
		b.Fatal(err)
	}
	req := estimateRequest("")
	if err := est.Observe(req, bulkhead.Usage{Input: 70, Output: 10}); err != nil {
		b.Fatal(err)
	}
	benchEstimator(b, est, req)
}

// BenchmarkEstimateAdaptiveParallel measures Estimate from every core while
// nothing observes, the bulkhead's steady state.
func BenchmarkEstimateAdaptiveParallel(b *testing.B) {
	est, err := estimate.NewAdaptive(estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	if err != nil {
		b.Fatal(err)
	}
	req := estimateRequest("")
	if err := est.Observe(req, bulkhead.Usage{Input: 70, Output: 10}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := est.Estimate(req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkAdaptiveObserve(b *testing.B) {
	est, err := estimate.NewAdaptive(estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}})
	if err != nil {
		b.Fatal(err)
	}
	req := estimateRequest("")
	b.ReportAllocs()
	for b.Loop() {
		if err := est.Observe(req, bulkhead.Usage{Input: 70, Output: 10}); err != nil {
			b.Fatal(err)
		}
	}
}

var sinkInt int

func BenchmarkUTF16Len(b *testing.B) {
	for _, tc := range []struct{ name, s string }{
		{"ascii-224", strings.Repeat("lorem ipsum dolor sit amet, ", 8)},
		{"latin-224", strings.Repeat("déjà vu, ", 25)},
		{"cjk-100", strings.Repeat("漢字テスト", 20)},
		{"emoji-50", strings.Repeat("😀", 50)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.s)))
			b.ReportAllocs()
			for b.Loop() {
				sinkInt = estimate.UTF16Len(tc.s)
			}
		})
	}
}
