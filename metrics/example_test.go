package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/metrics"
)

func ExampleNew() {
	b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 8))
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())

	// One collector per bulkhead, on the program's own registry.
	c, err := metrics.New(b, metrics.Options{Name: "gpt-4o"})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// A real program serves mux: http.ListenAndServe(":9090", mux).

	p, err := b.Acquire(context.Background(), &bulkhead.Request{MaxTokens: 64})
	if err != nil {
		panic(err)
	}
	defer p.Release(nil)

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	lines := bufio.NewScanner(rec.Body)
	for lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, "bulkhead_admitted_total") || strings.HasPrefix(line, "bulkhead_in_flight") {
			fmt.Println(line)
		}
	}
	// Output:
	// bulkhead_admitted_total{bulkhead="gpt-4o"} 1
	// bulkhead_in_flight{bulkhead="gpt-4o"} 1
}

// A fleet pool's own counters (renewals, Redis errors, reclaimed holds),
// exported beside its bulkhead's metrics.
func ExampleNewPoolCollector() {
	client := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "openai-prod", MaxConcurrent: 64, TokenBudget: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(context.Background())

	c, err := metrics.NewPoolCollector(pool, metrics.Options{}) // labelled pool="openai-prod"
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}
