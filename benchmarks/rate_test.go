package benchmarks

import (
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
}
