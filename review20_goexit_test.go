package bulkhead_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// A Redis hook that calls runtime.Goexit (t.FailNow in a test's hook, say)
// during an admission's remote check: the facade used to give everything
// back then (its deferred rollback ran on the way out). The worker
// goroutine recovered panics only: on Goexit it ended without sending its
// verdict, so the admission stayed provisional for good, holding its slot,
// its caller was never answered and Drain never completed.
func TestReviewRemoteCheckGoexit(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	b := newBulkhead(t, cfg)
	exit := func() { runtime.Goexit() }
	once.Store(&exit)
	res := acquireAsync(t.Context(), b, req("a", 10))
	select {
	case r := <-res:
		if r.err == nil {
			_ = r.tok.Release(nil)
			t.Fatal("admitted though its rate check never answered")
		}
	case <-time.After(testutil.Settle):
		t.Fatalf("never answered (drain: %+v)", drainNow(b))
	}
	if st := b.Stats(); st.Gate.InFlight != 0 {
		t.Fatalf("%d slots held after the call was turned away", st.Gate.InFlight)
	}
}
