package bulkhead_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// A *pacer.Table given as RateLimits.Store is taken for an in-process
// store the engine asks itself, but the engine set the time only of the
// table it makes for a nil Store: the caller's table decided every call at
// the Unix epoch, so its buckets never drained and, once the burst was
// spent, every call was turned away, however long the caller waited.
func TestReviewRateStoreTableNeverDrains(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: pacer.NewTable(), PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
	a := mustAcquire(t, b, req("a", 10))
	_ = a.Release(nil)
	_, err := b.Acquire(context.Background(), req("b", 10))
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
	clk.Add(time.Hour)
	p, err := b.Acquire(context.Background(), req("c", 10))
	if err != nil {
		t.Fatalf("an hour later, at 60 requests a minute: %v", err)
	}
	_ = p.Release(nil)
}
