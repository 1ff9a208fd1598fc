package fleet

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

// benchPool starts a redis-server and returns it, a client and a pool on
// it without limits.
func benchPool(b *testing.B, poolSize int) (*redistest.Server, *redis.Client, *Pool) {
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: poolSize, ContextTimeoutEnabled: true})
	b.Cleanup(func() { client.Close() })
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget, cfg.LeaseTTL = -1, -1, time.Minute
	return srv, client, mustPool(b, cfg)
}

var benchSeq atomic.Int64

func nextID() ID { return idn(int(benchSeq.Add(1))) }

// BenchmarkReserve measures a reserve, a reserve followed by the release
// script, and a reserve that comes 2 ms after the pool's last write (and so
// checks which server it runs on), against a PING on the same client in
// the same loop: each iteration times one PING and one operation, and the
// benchmark reports the p50 and p99 of both in microseconds, their ratios,
// and the script's server time from INFO commandstats.
func BenchmarkReserve(b *testing.B) {
	srv, client, p := benchPool(b, 4)
	ops := []struct {
		name string
		run  func() error
	}{
		{"Reserve", func() error {
			_, err := p.Reserve(bg, nextID(), Hold{1, 1000}, false)
			return err
		}},
		{"ReserveRelease", func() error {
			id := nextID()
			if _, err := p.Reserve(bg, id, Hold{1, 1000}, false); err != nil {
				return err
			}
			p.forget(id) // released here, synchronously, instead of by the sender
			_, err := p.st.release(bg, 0, seen{}, []ID{id})
			return err
		}},
	}
	// A reserve that comes a millisecond or more after the pool's last write
	// checks which server it runs on: the scripts' time moves 2 ms per
	// reserve.
	cfg := testConfig(client)
	cfg.MaxConcurrent, cfg.TokenBudget, cfg.LeaseTTL = -1, -1, 24*time.Hour
	var now atomic.Int64
	now.Store(t0)
	createState(b, cfg, now.Load())
	gapped, err := newPool(cfg, func() int64 { return now.Add(2000) })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { gapped.Close(bg) })
	ops = append(ops, struct {
		name string
		run  func() error
	}{"ReserveAfterGap", func() error {
		_, err := gapped.Reserve(bg, nextID(), Hold{1, 1000}, false)
		return err
	}})
	for _, o := range ops {
		b.Run(o.name+"-vs-PING", func(b *testing.B) {
			redistest.BenchVsPing(b, srv, "op", "evalsha", func() error { return client.Ping(bg).Err() }, o.run)
		})
	}
}

// BenchmarkReserveParallel32 measures reserve + release throughput with 32
// goroutines on one pool (releases go through the background sender), and
// the reserves' p50 and p99.
func BenchmarkReserveParallel32(b *testing.B) {
	_, _, p := benchPool(b, 32)
	b.SetParallelism(max(1, 32/runtimeProcs()))
	lat := make(chan []time.Duration, 64)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var ds []time.Duration
		for pb.Next() {
			id := nextID()
			t0 := time.Now()
			if _, err := p.Reserve(bg, id, Hold{1, 1000}, false); err != nil {
				b.Error(err)
				return
			}
			ds = append(ds, time.Since(t0))
			p.Release(id)
		}
		lat <- ds
	})
	elapsed := time.Since(start)
	close(lat)
	var all []time.Duration
	for ds := range lat {
		all = append(all, ds...)
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(redistest.Micros(redistest.Percentile(all, 50)), "reserve-p50-µs")
	b.ReportMetric(redistest.Micros(redistest.Percentile(all, 99)), "reserve-p99-µs")
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
