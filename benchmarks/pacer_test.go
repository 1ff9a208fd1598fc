package benchmarks

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// BenchmarkPacerLocal measures one in-process pacer decision.
func BenchmarkPacerLocal(b *testing.B) {
	ctx := context.Background()
	store := pacer.NewLocal(pacer.LocalOptions{})
	// A high rate and a deep bucket: every call is admitted and recorded,
	// the common case.
	p, err := pacer.New(store, pacer.Options{Name: "bench", QPS: pacer.MaxQPS, MaxBurst: 1e12})
	if err != nil {
		b.Fatal(err)
	}
	tokens, err := pacer.New(store, pacer.Options{Name: "bench-tokens", QPS: pacer.MaxQPS, MaxBurst: 1e15})
	if err != nil {
		b.Fatal(err)
	}
	comp, err := pacer.NewComposite(p, tokens)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}

	b.Run("RateLimit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.RateLimit(ctx, "k", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Pace", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Pace(ctx, "k", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RateLimit/parallel-1024-keys", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, err := p.RateLimit(ctx, keys[i%len(keys)], 1); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
	b.Run("RateLimit/parallel-1-key", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.RateLimit(ctx, "k", 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Composite/RateLimit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := comp.RateLimit(ctx, "k", 1, 500); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPacerRedis measures one pacer decision on a local redis-server
// (started by the benchmark) against a plain PING round trip on the same
// client, measured in the same loop: each iteration times one PING and one
// decision, alternately, and the benchmark reports the p50 and p99 of both
// in microseconds, and their ratios (the target: a decision costs at most
// 1.3 PINGs).
func BenchmarkPacerRedis(b *testing.B) {
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 4})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	store, err := pacer.NewRedis(client, pacer.RedisOptions{Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	p, err := pacer.New(store, pacer.Options{Name: "bench", QPS: pacer.MaxQPS, MaxBurst: 1e12})
	if err != nil {
		b.Fatal(err)
	}
	tokens, err := pacer.New(store, pacer.Options{Name: "bench-tokens", QPS: pacer.MaxQPS, MaxBurst: 1e15})
	if err != nil {
		b.Fatal(err)
	}
	comp, err := pacer.NewComposite(p, tokens)
	if err != nil {
		b.Fatal(err)
	}

	decisions := map[string]func() error{
		"RateLimit": func() error { _, err := p.RateLimit(ctx, "k", 1); return err },
		"Pace":      func() error { _, err := p.Pace(ctx, "k", 1); return err },
		"Composite": func() error { _, err := comp.RateLimit(ctx, "k", 1, 500); return err },
	}
	for _, name := range []string{"RateLimit", "Pace", "Composite"} {
		decide := decisions[name]
		b.Run(name+"-vs-PING", func(b *testing.B) {
			b.ReportAllocs()
			redistest.BenchVsPing(b, srv, "decision", "evalsha", func() error { return client.Ping(ctx).Err() }, decide)
		})
	}
}
