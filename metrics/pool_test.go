package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/metrics"
)

// TestPoolCollector registers a bulkhead's collector and its fleet pool's
// on one registry, admits one call through the pool and checks both views.
func TestPoolCollector(t *testing.T) {
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "gpt", MaxConcurrent: 2, TokenBudget: -1,
		LeaseTTL: 2 * time.Second, CallTimeout: time.Second,
		RelearnWindow: -1}) // a new pool would admit nothing for its first window
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the bulkhead shuts down before the pool
	// closes.
	t.Cleanup(func() {
		if err := pool.Close(context.Background()); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	b, _ := newBulkhead(t, bulkhead.Config{MaxConcurrent: 4, Fleet: pool})
	bc := newCollector(t, b, metrics.Options{Name: "gpt"})
	pc, err := metrics.NewPoolCollector(pool, metrics.Options{Name: "gpt"})
	if err != nil {
		t.Fatal(err)
	}
	reg := register(t, bc, pc)

	p, err := b.Acquire(context.Background(), anyRequest)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(nil)
	got := scrape(t, reg)
	wantValues(t, got, map[string]float64{
		`bulkhead_fleet_reserve_total{bulkhead="gpt",outcome="admitted",pool="gpt"}`:         1,
		`bulkhead_fleet_reserve_total{bulkhead="gpt",outcome="rejected_slots",pool="gpt"}`:   0,
		`bulkhead_fleet_errors_total{bulkhead="gpt",kind="timeout",op="reserve",pool="gpt"}`: 0,
		`bulkhead_fleet_in_flight{bulkhead="gpt",pool="gpt"}`:                                1,
		`bulkhead_fleet_limit_slots{bulkhead="gpt",pool="gpt"}`:                              2,
		`bulkhead_fleet_limit_tokens{bulkhead="gpt",pool="gpt"}`:                             -1,
		`bulkhead_fleet_local_holds{bulkhead="gpt",pool="gpt"}`:                              1,
		`bulkhead_fleet_breaker_open{bulkhead="gpt",pool="gpt"}`:                             0,
		`bulkhead_fleet_lease_lapse_total{bulkhead="gpt",pool="gpt"}`:                        0,
		`bulkhead_fleet_checked_total{bulkhead="gpt"}`:                                       1,
		`bulkhead_fleet_admitted_total{bulkhead="gpt"}`:                                      1,
		`bulkhead_fleet_view_in_flight{bulkhead="gpt"}`:                                      1,
		`bulkhead_fleet_view_max_concurrent{bulkhead="gpt"}`:                                 2,
	})
	if n := testutil.CollectAndCount(pc, "bulkhead_fleet_errors_total"); n != 20 {
		t.Errorf("fleet_errors_total: %d series, want 5 operations x 4 kinds", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	if _, err := metrics.NewPoolCollector(nil, metrics.Options{}); err == nil {
		t.Error("NewPoolCollector(nil): no error")
	}
	if _, err := metrics.NewPoolCollector(pool, metrics.Options{ConstLabels: map[string]string{"pool": "x"}}); err == nil || !strings.Contains(err.Error(), `"pool"`) {
		t.Errorf("a pool const label: %v, want an error naming it", err)
	}
}
