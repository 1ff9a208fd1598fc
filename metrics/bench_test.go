package metrics_test

import (
	"context"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/metrics"
)

// BenchmarkAcquireRelease measures what a collector adds to an admission:
// its listeners make the bulkhead time each decision and emit its events
// (empty-listeners is that cost alone), and it observes three histograms.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, mode := range []string{"bare", "empty-listeners", "collector"} {
		b.Run(mode, func(b *testing.B) {
			bh, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 64})
			if err != nil {
				b.Fatal(err)
			}
			defer bh.Shutdown(context.Background())
			if mode == "empty-listeners" {
				defer bh.Subscribe(bulkhead.Hooks{
					Admit:   func(bulkhead.AdmitEvent) {},
					Reject:  func(bulkhead.RejectEvent) {},
					Release: func(bulkhead.ReleaseEvent) {},
				})()
			}
			if mode == "collector" {
				c, err := metrics.New(bh, metrics.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := bh.Acquire(ctx, anyRequest)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Release(nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
