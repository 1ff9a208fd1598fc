package otelbulkhead_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/metrics"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
)

// point is one collected series: a sum's or a gauge's value, or a
// histogram's count and sum.
type point struct {
	value float64
	count uint64
	hist  bool
}

// newMetrics makes the Metrics of b on a ManualReader.
func newMetrics(t *testing.T, b *bulkhead.Bulkhead, opts otelbulkhead.Options) (*otelbulkhead.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	opts.MeterProvider = mp
	m, err := otelbulkhead.NewMetrics(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, reader
}

// collect reads every series, indexed as `name{k="v",...}` with the
// attributes sorted.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/llmbulkhead/bulkhead/otelbulkhead" {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[seriesKey(m.Name, p.Attributes.ToSlice())] = point{value: float64(p.Value)}
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					out[seriesKey(m.Name, p.Attributes.ToSlice())] = point{value: p.Value}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[seriesKey(m.Name, p.Attributes.ToSlice())] = point{value: float64(p.Value)}
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					out[seriesKey(m.Name, p.Attributes.ToSlice())] = point{value: float64(p.Sum), count: p.Count, hist: true}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[seriesKey(m.Name, p.Attributes.ToSlice())] = point{value: p.Sum, count: p.Count, hist: true}
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

func seriesKey(name string, kvs []attribute.KeyValue) string {
	var parts []string
	for _, kv := range kvs {
		parts = append(parts, string(kv.Key)+`="`+kv.Value.Emit()+`"`)
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// TestMetricsOfferThePrometheusCollectorsFigures runs calls through a
// bulkhead with every feature that needs no Redis, then checks that each
// series the Prometheus collector serves has its OpenTelemetry twin, with
// the same value: the name with a dot after the namespace and no _total,
// and each label as an attribute bulkhead.<label>.
func TestMetricsOfferThePrometheusCollectorsFigures(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1000},
		Classes: &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{
			"a": {}, "b": {ProtectedConcurrent: 1, MaxInFlightTokens: ptr(int64(500))},
		}},
		RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}},
		Dedup:      &bulkhead.DedupConfig{},
	}, clk)
	c, err := metrics.New(b, metrics.Options{Name: "all", ConstLabels: prometheus.Labels{"region": "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	_, reader := newMetrics(t, b, otelbulkhead.Options{Name: "all", Attributes: []attribute.KeyValue{attribute.String("region", "eu")}, Clock: clk})

	ctx := context.Background()
	p, err := b.Acquire(ctx, hi, bulkhead.WithClass("b"), reserve(10, 10))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(&bulkhead.Usage{Input: 5, Output: 3}); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, hi, bulkhead.WithClass("b"), reserve(10, 10))
	testutil.WantReason(t, err, bulkhead.RateLimit)
	_, err = bulkhead.Run(ctx, b, hi, func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		return 0, rc.SetUsage(bulkhead.Usage{Input: 3, Output: 4})
	}, bulkhead.WithMode(bulkhead.Observe), reserve(10, 10))
	if err != nil {
		t.Fatal(err)
	}
	shutdown(t, b)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	n := 0
	for _, mf := range mfs {
		name := "bulkhead." + strings.TrimSuffix(strings.TrimPrefix(mf.GetName(), "bulkhead_"), "_total")
		for _, m := range mf.GetMetric() {
			var kvs []attribute.KeyValue
			for _, l := range m.GetLabel() {
				k := l.GetName()
				switch k {
				case "bulkhead":
					k = "bulkhead.name"
				case "region":
				default:
					k = "bulkhead." + k
				}
				kvs = append(kvs, attribute.String(k, l.GetValue()))
			}
			key := seriesKey(name, kvs)
			o, ok := got[key]
			if !ok {
				t.Errorf("%s has no twin %s", mf.GetName(), key)
				continue
			}
			n++
			var want point
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				want.value = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				want.value = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				want = point{value: m.GetHistogram().GetSampleSum(), count: m.GetHistogram().GetSampleCount(), hist: true}
			}
			if o != want {
				t.Errorf("%s = %+v, its Prometheus twin %+v", key, o, want)
			}
		}
	}
	if n < 80 {
		t.Errorf("only %d series compared", n)
	}
}

func TestGenAIClientMetrics(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1, MaxQueue: 0}, clk)
	_, reader := newMetrics(t, b, otelbulkhead.Options{Provider: "openai", Model: "gpt-4o", Clock: clk})
	f := testutil.NewFence(t, b)
	ctx := context.Background()
	p, err := b.Acquire(ctx, hi)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, &bulkhead.Request{Model: "gpt-4o-mini"})
	testutil.WantReason(t, err, bulkhead.ConcurrencyLimit)
	f.Wait(t, 2) // the admit and the reject are recorded
	clk.Add(1500 * time.Millisecond)
	if err := p.Release(&bulkhead.Usage{Input: 120, Output: 30}); err != nil {
		t.Fatal(err)
	}
	f.Wait(t, 3)
	got := collect(t, reader)
	const common = `gen_ai.operation.name="chat",gen_ai.provider.name="openai"`
	for key, want := range map[string]point{
		`gen_ai.client.token.usage{` + common + `,gen_ai.request.model="gpt-4o",gen_ai.token.type="input"}`:                  {value: 120, count: 1, hist: true},
		`gen_ai.client.token.usage{` + common + `,gen_ai.request.model="gpt-4o",gen_ai.token.type="output"}`:                 {value: 30, count: 1, hist: true},
		`gen_ai.client.operation.duration{` + common + `,gen_ai.request.model="gpt-4o"}`:                                     {value: 1.5, count: 1, hist: true},
		`gen_ai.client.operation.duration{error.type="concurrency_limit",` + common + `,gen_ai.request.model="gpt-4o-mini"}`: {value: 0, count: 1, hist: true},
	} {
		if got[key] != want {
			t.Errorf("%s = %+v, want %+v", key, got[key], want)
		}
	}
}

func TestMetricsOptions(t *testing.T) {
	b := newBulkhead(t, bulkhead.Config{MaxConcurrent: 1}, clock.NewMock())
	if _, err := otelbulkhead.NewMetrics(b, otelbulkhead.Options{Attributes: []attribute.KeyValue{attribute.String("bulkhead.reason", "x")}}); err == nil {
		t.Error("an attribute in the package's namespace was accepted")
	}
	m, reader := newMetrics(t, b, otelbulkhead.Options{})
	if got := collect(t, reader)[`bulkhead.max_concurrent{}`]; got.value != 1 {
		t.Errorf("max_concurrent = %+v, want 1", got)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, reader); len(got) != 0 {
		t.Errorf("%d series after Close, want none", len(got))
	}
}

func ptr[T any](v T) *T { return &v }
