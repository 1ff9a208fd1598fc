package benchmarks

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/llmbulkhead/bulkhead"
)

// benchRequest is the reference harness's request: one user message of 224
// characters and MaxTokens 256.
var benchRequest = &bulkhead.Request{
	Messages:  []bulkhead.Message{{Role: "user", Content: strings.Repeat("abcdefgh", 28)}},
	MaxTokens: 256,
}

func newBench(b *testing.B, cfg bulkhead.Config) *bulkhead.Bulkhead {
	b.Helper()
	bh, err := bulkhead.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		bh.Close()
		if _, err := bh.Drain(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return bh
}

func budgetConfig(maxConcurrent int) bulkhead.Config {
	cfg := bulkhead.Interactive("gpt-4o", maxConcurrent)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1 << 50}
	return cfg
}

func benchAcquireRelease(b *testing.B, cfg bulkhead.Config, opts ...bulkhead.Option) {
	bh := newBench(b, cfg)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tok, err := bh.Acquire(ctx, benchRequest, opts...)
		if err != nil {
			b.Fatal(err)
		}
		_ = tok.Release(nil)
	}
}

// twoClasses is a budget bulkhead with two classes with floors and the
// queue policy q.
func twoClasses(q bulkhead.QueuePolicy) bulkhead.Config {
	cfg := budgetConfig(1 << 30)
	cfg.Classes = &bulkhead.Classes{Default: "interactive", Limits: map[string]bulkhead.ClassLimits{
		"interactive": {ProtectedConcurrent: 1 << 20, ProtectedInFlightTokens: 1 << 40},
		"batch":       {ProtectedConcurrent: 1 << 20, MaxConcurrent: bulkhead.Ceiling(1 << 29)},
	}}
	cfg.Queue = q
	return cfg
}

// BenchmarkQueued is 16 goroutines, half in each of two classes, sharing 4
// slots, so most calls wait in the queue: first come, first served against
// the fair queue.
func BenchmarkQueued(b *testing.B) {
	for _, q := range []struct {
		name   string
		policy bulkhead.QueuePolicy
	}{
		{"fifo", bulkhead.QueuePolicy{}},
		{"fair", bulkhead.QueuePolicy{Fair: true}},
		{"fair-wait", bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true}},
	} {
		b.Run(q.name, func(b *testing.B) {
			cfg := twoClasses(q.policy)
			cfg.Classes.Limits = map[string]bulkhead.ClassLimits{"interactive": {}, "batch": {}}
			cfg.MaxConcurrent, cfg.MaxQueue = 4, 1<<20
			bh := newBench(b, cfg)
			ctx := context.Background()
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8) // 16 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				class := bulkhead.WithClass([]string{"interactive", "batch"}[n.Add(1)&1])
				for pb.Next() {
					tok, err := bh.Acquire(ctx, benchRequest, class)
					if err != nil {
						b.Error(err)
						return
					}
					_ = tok.Release(nil)
				}
			})
		})
	}
}

// BenchmarkMassCancel is 4,000 waiters whose shared context ends at once
// (a client gone, a common deadline), each withdrawn by its own cancel
// message: with waiting for capacity, only the waiter that held the others
// back makes the engine look at the queue again, so it stays linear.
func BenchmarkMassCancel(b *testing.B) {
	for _, q := range []struct {
		name   string
		policy bulkhead.QueuePolicy
	}{
		{"fifo", bulkhead.QueuePolicy{}},
		{"wait", bulkhead.QueuePolicy{WaitForCapacity: true}},
		{"fair-wait", bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true}},
	} {
		b.Run(q.name, func(b *testing.B) {
			const n = 4000
			cfg := twoClasses(q.policy)
			cfg.Classes.Limits = map[string]bulkhead.ClassLimits{"interactive": {}, "batch": {MaxConcurrent: bulkhead.Ceiling(1)}}
			cfg.MaxQueue = n
			if !q.policy.WaitForCapacity {
				cfg.MaxConcurrent = 1 // the same waiters, waiting for a slot
			}
			bh := newBench(b, cfg)
			class := bulkhead.WithClass("batch")
			holder, err := bh.Acquire(context.Background(), benchRequest, class)
			if err != nil {
				b.Fatal(err)
			}
			defer holder.Release(nil)
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithCancel(context.Background())
				fs := make([]*bulkhead.AcquireFuture, n)
				for i := range fs {
					fs[i] = bh.AcquireAsync(ctx, benchRequest, class)
				}
				cancel()
				for _, f := range fs {
					if _, err := f.Result(); err == nil {
						b.Fatal("a cancelled waiter was admitted")
					}
				}
			}
		})
	}
}

// BenchmarkAcquireRelease is one goroutine acquiring and releasing.
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("concurrency", func(b *testing.B) {
		benchAcquireRelease(b, bulkhead.Interactive("gpt-4o", 1<<30))
	})
	b.Run("budget", func(b *testing.B) {
		benchAcquireRelease(b, budgetConfig(1<<30))
	})
	b.Run("budget-override", func(b *testing.B) {
		benchAcquireRelease(b, budgetConfig(1<<30),
			bulkhead.WithReservation(bulkhead.Reservation{Input: 61, MaxOutput: 256}))
	})
	for _, q := range []struct {
		name   string
		policy bulkhead.QueuePolicy
	}{
		{"budget-classes", bulkhead.QueuePolicy{}},
		{"budget-classes-fair", bulkhead.QueuePolicy{Fair: true}},
		{"budget-classes-fair-wait", bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true}},
	} {
		b.Run(q.name, func(b *testing.B) {
			// Two classes with floors, one call in each alternately.
			cfg := twoClasses(q.policy)
			bh := newBench(b, cfg)
			ctx := context.Background()
			classes := []bulkhead.Option{bulkhead.WithClass("interactive"), bulkhead.WithClass("batch")}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tok, err := bh.Acquire(ctx, benchRequest, classes[i&1])
				if err != nil {
					b.Fatal(err)
				}
				_ = tok.Release(nil)
				i++
			}
		})
	}
	b.Run("mutex", func(b *testing.B) {
		var mu sync.Mutex
		inUse, limit := 0, 1<<30
		b.ReportAllocs()
		for b.Loop() {
			mu.Lock()
			if inUse >= limit {
				b.Fatal("full")
			}
			inUse++
			mu.Unlock()
			mu.Lock()
			inUse--
			mu.Unlock()
		}
	})
	b.Run("semaphore", func(b *testing.B) {
		sem := semaphore.NewWeighted(1 << 30)
		b.ReportAllocs()
		for b.Loop() {
			if !sem.TryAcquire(1) {
				b.Fatal("full")
			}
			sem.Release(1)
		}
	})
}

func runCall(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
	return 1, rc.SetUsage(bulkhead.Usage{Input: 50, Output: 100})
}

// BenchmarkRun measures Run with a token budget and usage, from one
// goroutine and from 64; calls/s is b.N over wall time.
func BenchmarkRun(b *testing.B) {
	for _, par := range []int{1, 64} {
		b.Run(map[int]string{1: "g1", 64: "g64"}[par], func(b *testing.B) {
			bh := newBench(b, budgetConfig(1<<30))
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(max(1, par/2))
			b.ResetTimer()
			if par == 1 {
				for b.Loop() {
					if _, err := bulkhead.Run(ctx, bh, benchRequest, runCall); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := bulkhead.Run(ctx, bh, benchRequest, runCall); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
	b.Run("mutex-g64", func(b *testing.B) {
		var mu sync.Mutex
		inUse := 0
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				mu.Lock()
				inUse++
				mu.Unlock()
				mu.Lock()
				inUse--
				mu.Unlock()
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	})
	b.Run("semaphore-g64", func(b *testing.B) {
		sem := semaphore.NewWeighted(1 << 30)
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if sem.TryAcquire(1) {
					sem.Release(1)
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	})
}

// BenchmarkRunObserve measures Run in observe mode with a token budget and
// usage: admitted (room for every call: the cost against BenchmarkRun), and
// bypassed (MaxConcurrent 0: every call is refused and runs without
// admission).
func BenchmarkRunObserve(b *testing.B) {
	observe := []bulkhead.Option{bulkhead.WithMode(bulkhead.Observe)}
	for _, tc := range []struct {
		name          string
		maxConcurrent int
		par           int
	}{
		{"admitted-g1", 1 << 30, 1},
		{"admitted-g64", 1 << 30, 64},
		{"bypassed-g1", 0, 1},
		{"bypassed-g64", 0, 64},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bh := newBench(b, budgetConfig(tc.maxConcurrent))
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(max(1, tc.par/2))
			b.ResetTimer()
			if tc.par == 1 {
				for b.Loop() {
					if _, err := bulkhead.Run(ctx, bh, benchRequest, runCall, observe...); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := bulkhead.Run(ctx, bh, benchRequest, runCall, observe...); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			if st := bh.Stats(); (st.Observe.Bypassed > 0) != (tc.maxConcurrent == 0) {
				b.Fatalf("bypassed %d calls", st.Observe.Bypassed)
			}
		})
	}
}

// BenchmarkWouldAdmit measures the advisory check with a token budget.
func BenchmarkWouldAdmit(b *testing.B) {
	bh := newBench(b, budgetConfig(1<<30))
	b.ReportAllocs()
	for b.Loop() {
		if d, err := bh.WouldAdmit(benchRequest); err != nil || !d.Admit {
			b.Fatal(d, err)
		}
	}
}

// BenchmarkEstimate measures Bulkhead.Estimate: validation plus the default
// model-aware estimator, through the facade.
func BenchmarkEstimate(b *testing.B) {
	bh := newBench(b, budgetConfig(1))
	b.ReportAllocs()
	for b.Loop() {
		if r, err := bh.Estimate(benchRequest); err != nil || r.Reserved != 317 {
			b.Fatal(r, err)
		}
	}
}
