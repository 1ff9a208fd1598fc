package bulkhead_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// TestStaleTimersAndCancelsOnReusedRequests hammers the moments when a
// queue timeout fires, or a context ends, just as the waiter is answered:
// the engine then still holds a timer or cancel message for a pooled request
// the facade may already be reusing. Under -race this caught a data race on
// the request's generation; the checks catch a stale message acting on the
// request's next use.
func TestStaleTimersAndCancelsOnReusedRequests(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 2)
	cfg.MaxQueue = 4
	cfg.QueueTimeout = 200 * time.Microsecond
	b := newBulkhead(t, cfg)
	r := req("hi", 10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%3 == 0 {
					// Cancel at about the time the call would be admitted.
					time.AfterFunc(100*time.Microsecond, cancel)
				}
				_, _ = bulkhead.Run(ctx, b, r, func(context.Context, *bulkhead.RunContext) (int, error) {
					for t0 := time.Now(); time.Since(t0) < 150*time.Microsecond; {
					}
					return 0, nil
				})
				cancel()
			}
		}()
	}
	wg.Wait()
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.Admitted != st.Calls.Released {
		t.Fatalf("leak after the storm: %+v %+v", st.Gate, st.Calls)
	}
	total := st.Calls.Admitted + st.Calls.Rejected
	if total != 8*300 {
		t.Fatalf("%d calls ended, want %d (one outcome each)", total, 8*300)
	}
}
