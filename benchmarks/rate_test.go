package benchmarks

import (
	"context"
	"testing"

	"github.com/llmbulkhead/bulkhead"
)

// BenchmarkRateCheck is the cost of rate limits on Acquire+Release, on the
// in-process store, against the same bulkhead without them in the same run
// (goal: under 150 ns added). The rates are never reached, so every call
// goes through the whole check: the provisional hold, the pacer decision
// (requests and tokens per minute in one composite) and the confirmation.
func BenchmarkRateCheck(b *testing.B) {
	b.Run("baseline", func(b *testing.B) {
		benchAcquireRelease(b, budgetConfig(1<<30))
	})
	b.Run("requests", func(b *testing.B) {
		cfg := budgetConfig(1 << 30)
		cfg.RateLimits = &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: bulkhead.MaxPerMinute, RequestBurst: 1e15}}
		benchAcquireRelease(b, cfg)
	})
	b.Run("requests+tokens", func(b *testing.B) {
		cfg := budgetConfig(1 << 30)
		cfg.RateLimits = &bulkhead.RateLimits{PerModel: bulkhead.Rate{
			RequestsPerMinute: bulkhead.MaxPerMinute, RequestBurst: 1e15,
			TokensPerMinute: bulkhead.MaxPerMinute, TokenBurst: 1e18,
		}}
		benchAcquireRelease(b, cfg)
	})
	// Anthropic's three rates, each release settling its usage: the unused
	// output (and some input) goes back to the buckets, against the same
	// release without rates.
	used := &bulkhead.Usage{Input: 3, Output: 10}
	b.Run("baseline/usage", func(b *testing.B) {
		benchAcquireReleaseUsage(b, budgetConfig(1<<30), used)
	})
	b.Run("requests+input+output/usage", func(b *testing.B) {
		cfg := budgetConfig(1 << 30)
		cfg.RateLimits = &bulkhead.RateLimits{PerModel: bulkhead.Rate{
			RequestsPerMinute: bulkhead.MaxPerMinute, RequestBurst: 1e15,
			InputTokensPerMinute: bulkhead.MaxPerMinute, InputTokenBurst: 1e18,
			OutputTokensPerMinute: bulkhead.MaxPerMinute, OutputTokenBurst: 1e18,
		}}
		benchAcquireReleaseUsage(b, cfg, used)
	})
}

// benchAcquireReleaseUsage is benchAcquireRelease with usage at release.
func benchAcquireReleaseUsage(b *testing.B, cfg bulkhead.Config, u *bulkhead.Usage) {
	bh := newBench(b, cfg)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := bh.Acquire(ctx, benchRequest)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(u); err != nil {
			b.Fatal(err)
		}
	}
}
