package metrics_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/metrics"
)

// newBulkhead builds a bulkhead on a mock clock and shuts it down when the
// test ends, failing the test if it does not drain.
func newBulkhead(t *testing.T, cfg bulkhead.Config) (*bulkhead.Bulkhead, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	cfg.Clock = mock
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatalf("bulkhead.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
			t.Errorf("Shutdown at cleanup: %+v, %v", res, err)
		}
	})
	return b, mock
}

// newCollector builds a collector for b and closes it when the test ends.
func newCollector(t *testing.T, b *bulkhead.Bulkhead, opts metrics.Options) *metrics.Collector {
	t.Helper()
	c, err := metrics.New(b, opts)
	if err != nil {
		t.Fatalf("metrics.New: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// register registers collectors on a new pedantic registry, which checks
// every scrape against the descriptions.
func register(t *testing.T, cs ...prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatalf("Register: %v", err)
		}
	}
	return reg
}

// closeAndDrain closes b and drains it: every event has been delivered to
// the listeners once it returns.
func closeAndDrain(t *testing.T, b *bulkhead.Bulkhead) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
		t.Fatalf("Shutdown: %+v, %v", res, err)
	}
}

// sample is one scraped series.
type sample struct {
	typ   dto.MetricType
	value float64
	count uint64
}

// scrape gathers reg and indexes every series by its name and labels, as
// `name{k="v",...}` with the labels sorted.
func scrape(t *testing.T, reg prometheus.Gatherer) map[string]sample {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]sample{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := sample{typ: mf.GetType()}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				s.value = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s.value = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				s.value = m.GetHistogram().GetSampleSum()
				s.count = m.GetHistogram().GetSampleCount()
			}
			out[key(mf.GetName(), m.GetLabel())] = s
		}
	}
	return out
}

// wantValues checks that each series of want was scraped, with its value.
func wantValues(t *testing.T, got map[string]sample, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if s, ok := got[k]; !ok || s.value != v {
			t.Errorf("%s = %v (present %v), want %v", k, s.value, ok, v)
		}
	}
}

// labelled returns want with labels, such as `{class="a"}`, after each
// metric name, for wantValues.
func labelled(labels string, want map[string]int64) map[string]float64 {
	out := make(map[string]float64, len(want))
	for name, v := range want {
		out[name+labels] = float64(v)
	}
	return out
}

func key(name string, labels []*dto.LabelPair) string {
	var parts []string
	for _, l := range labels {
		parts = append(parts, l.GetName()+"="+`"`+l.GetValue()+`"`)
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// reserve is a per-call reservation of input+output tokens.
func reserve(input, output int64) bulkhead.Option {
	return bulkhead.WithReservation(bulkhead.Reservation{Input: input, MaxOutput: output})
}

var anyRequest = &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}, MaxTokens: 16}
