package benchmarks

import (
	"context"
	"testing"

	"github.com/llmbulkhead/bulkhead"
)

// BenchmarkStats measures Stats on a bulkhead with a token budget and two
// classes, with calls of both classes admitted and rejected before.
func BenchmarkStats(b *testing.B) {
	cfg := twoClasses(bulkhead.QueuePolicy{})
	bh := newBench(b, cfg)
	ctx := context.Background()
	for _, class := range []string{"interactive", "batch"} {
		p, err := bh.Acquire(ctx, benchRequest, bulkhead.WithClass(class))
		if err != nil {
			b.Fatal(err)
		}
		_ = p.Release(&bulkhead.Usage{Input: 50, Output: 100})
	}
	b.ReportAllocs()
	for b.Loop() {
		if st := bh.Stats(); st.Calls.Admitted != 2 {
			b.Fatalf("admitted %d", st.Calls.Admitted)
		}
	}
}

// BenchmarkEvents measures an admission with a listener for every kind of
// event: each acquire, usage report and release builds its event, and the
// events actor hands it to the listener.
func BenchmarkEvents(b *testing.B) {
	bh := newBench(b, budgetConfig(1<<30))
	unsubscribe := bh.Subscribe(bulkhead.Hooks{
		Admit:   func(bulkhead.AdmitEvent) {},
		Reject:  func(bulkhead.RejectEvent) {},
		Release: func(bulkhead.ReleaseEvent) {},
		Usage:   func(bulkhead.UsageEvent) {},
	})
	defer unsubscribe()
	ctx := context.Background()
	u := bulkhead.Usage{Input: 50, Output: 100}
	b.ReportAllocs()
	for b.Loop() {
		p, err := bh.Acquire(ctx, benchRequest)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.ReportUsage(u, nil); err != nil {
			b.Fatal(err)
		}
		_ = p.Release(&u)
	}
}
