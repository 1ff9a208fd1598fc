package benchmarks

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

func dedupBenchConfig(keyFunc func(*bulkhead.Request) string) bulkhead.Config {
	cfg := budgetConfig(1 << 30)
	cfg.Dedup = &bulkhead.DedupConfig{KeyFunc: keyFunc}
	return cfg
}

// BenchmarkRunDedup is Run with deduplication on, beside plain Run in the
// same run.
//
// leader-*: one goroutine, every call with a key of its own, so each leads
// (registers, runs, settles) and none follows: the cost deduplication adds
// to every Run it does not share. "leader-default-key" builds the default
// key (the request's 224 characters and its other fields), "leader-keyfunc"
// takes a short key from KeyFunc, so the difference is the default key's
// cost. "nodedup" is the same bulkhead with NoDedup.
//
// followers-16: a batch of 16 identical Runs from 16 goroutines, one
// leading and 15 following (the leader's fn waits until all have joined);
// ns/run is per Run. "plain-16" is 16 Runs of the same shape without
// deduplication, each running fn. (The default key alone is
// BenchmarkDedupKey, in the root package.)
func BenchmarkRunDedup(b *testing.B) {
	ctx := context.Background()
	b.Run("plain", func(b *testing.B) {
		bh := newBench(b, budgetConfig(1<<30))
		benchRunLoop(b, ctx, bh, nil)
	})
	b.Run("leader-default-key", func(b *testing.B) {
		bh := newBench(b, dedupBenchConfig(nil))
		benchRunLoop(b, ctx, bh, func(r *bulkhead.Request, i int64) { r.ExtraInputTokens = i })
	})
	b.Run("leader-keyfunc", func(b *testing.B) {
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = "k" + string(rune('a'+i%26)) + string(rune(i))
		}
		bh := newBench(b, dedupBenchConfig(func(r *bulkhead.Request) string { return keys[r.ExtraInputTokens%int64(len(keys))] }))
		benchRunLoop(b, ctx, bh, func(r *bulkhead.Request, i int64) { r.ExtraInputTokens = i })
	})
	b.Run("nodedup", func(b *testing.B) {
		bh := newBench(b, dedupBenchConfig(nil))
		benchRunLoop(b, ctx, bh, nil, bulkhead.NoDedup())
	})
	b.Run("interleaved", func(b *testing.B) {
		// Plain Run and a leader's Run alternately, each timed, so that both
		// see the same machine: on a shared machine the figures of
		// separate runs move by 2x.
		plain := newBench(b, budgetConfig(1<<30))
		dd := newBench(b, dedupBenchConfig(nil))
		r := *benchRequest
		var tPlain, tLeader time.Duration
		b.ReportAllocs()
		for b.Loop() {
			r.ExtraInputTokens++
			t0 := time.Now()
			if _, err := bulkhead.Run(ctx, plain, &r, runCall); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := bulkhead.Run(ctx, dd, &r, runCall); err != nil {
				b.Fatal(err)
			}
			tLeader += time.Since(t1)
			tPlain += t1.Sub(t0)
		}
		n := float64(b.N)
		b.ReportMetric(float64(tPlain.Nanoseconds())/n, "plain-ns/run")
		b.ReportMetric(float64(tLeader.Nanoseconds())/n, "leader-ns/run")
		b.ReportMetric(float64((tLeader-tPlain).Nanoseconds())/n, "added-ns/run")
	})
	b.Run("followers-16", func(b *testing.B) { benchBatch(b, newBench(b, dedupBenchConfig(nil)), true) })
	b.Run("plain-16", func(b *testing.B) { benchBatch(b, newBench(b, budgetConfig(1<<30)), false) })
}

// benchRunLoop runs Run on one goroutine, editing a copy of benchRequest
// before each call with edit, when set.
func benchRunLoop(b *testing.B, ctx context.Context, bh *bulkhead.Bulkhead, edit func(*bulkhead.Request, int64), opts ...bulkhead.Option) {
	r := *benchRequest
	b.ReportAllocs()
	var i int64
	for b.Loop() {
		if edit != nil {
			i++
			edit(&r, i)
		}
		if _, err := bulkhead.Run(ctx, bh, &r, runCall, opts...); err != nil {
			b.Fatal(err)
		}
	}
}

// benchBatch runs batches of 16 identical Runs on 16 worker goroutines.
// With shared, the leader's fn waits until the other 15 have joined.
func benchBatch(b *testing.B, bh *bulkhead.Bulkhead, shared bool) {
	const n = 16
	ctx := context.Background()
	start := make(chan chan struct{}, n)
	done := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for release := range start {
				_, err := bulkhead.Run(ctx, bh, benchRequest, func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
					if shared {
						<-release
					}
					return 42, nil
				})
				done <- err
			}
		}()
	}
	defer func() { close(start); wg.Wait() }()
	// The Dedup hook tells when a batch's followers have all joined.
	var joined atomic.Int64
	all := make(chan struct{}, 1)
	defer bh.Subscribe(bulkhead.Hooks{Dedup: func(bulkhead.DedupEvent) {
		if joined.Add(1) == n-1 {
			joined.Store(0)
			all <- struct{}{}
		}
	}})()
	b.ReportAllocs()
	for b.Loop() {
		release := make(chan struct{})
		for range n {
			start <- release
		}
		if shared {
			<-all
			close(release)
		}
		for range n {
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/run")
}
