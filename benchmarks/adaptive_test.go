package benchmarks

import (
	"context"
	"testing"

	"github.com/llmbulkhead/bulkhead"
)

// BenchmarkAdaptive is the cost of Config.Adaptive on Acquire+Release when
// no model is cooling down, against the same bulkhead without it in the
// same run (goal: under 10% added), on one goroutine and on 64; and the
// cost of one Permit.Feedback that moves nothing (a success that finds the
// limit idle) and of a Bulkhead.Feedback that moves the limit (AIMD's
// increase, an ApplyLimits each).
func BenchmarkAdaptive(b *testing.B) {
	adaptiveCfg := func() bulkhead.Config {
		cfg := budgetConfig(1 << 30)
		cfg.Adaptive = &bulkhead.Adaptive{MaxConcurrent: 1 << 30}
		return cfg
	}
	b.Run("baseline", func(b *testing.B) { benchAcquireRelease(b, budgetConfig(1<<30)) })
	b.Run("adaptive", func(b *testing.B) { benchAcquireRelease(b, adaptiveCfg()) })
	// A cool-down armed for another model: the cost of looking, for a call
	// whose own model is not cooling down.
	b.Run("cooldown-armed", func(b *testing.B) {
		bh := newBench(b, budgetConfig(1<<30))
		if err := bh.Feedback(bulkhead.Feedback{Model: "other", Outcome: bulkhead.OutcomeRateLimited, RetryAfter: bulkhead.MaxRetryAfter}); err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			p, err := bh.Acquire(ctx, benchRequest)
			if err != nil {
				b.Fatal(err)
			}
			_ = p.Release(nil)
		}
	})
	parallel := func(b *testing.B, cfg bulkhead.Config) {
		bh := newBench(b, cfg)
		b.ReportAllocs()
		b.SetParallelism(32) // 64 goroutines on 2 cores
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				p, err := bh.Acquire(ctx, benchRequest)
				if err != nil {
					b.Error(err)
					return
				}
				_ = p.Release(nil)
			}
		})
	}
	b.Run("baseline-64", func(b *testing.B) { parallel(b, budgetConfig(1<<30)) })
	b.Run("adaptive-64", func(b *testing.B) { parallel(b, adaptiveCfg()) })
	b.Run("permit-feedback-hold", func(b *testing.B) {
		bh := newBench(b, adaptiveCfg())
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			p, err := bh.Acquire(ctx, benchRequest)
			if err != nil {
				b.Fatal(err)
			}
			_ = p.Feedback(bulkhead.OutcomeSuccess, 0)
			_ = p.Release(nil)
		}
	})
	b.Run("feedback-increase", func(b *testing.B) {
		cfg := budgetConfig(1 << 30)
		cfg.MaxConcurrent = 1
		cfg.Adaptive = &bulkhead.Adaptive{MaxConcurrent: 1 << 30}
		bh := newBench(b, cfg)
		b.ReportAllocs()
		for b.Loop() {
			if err := bh.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
