package otelbulkhead

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/family"
)

// Namespace starts the name of every instrument of a Metrics but the
// generative AI conventions' own.
const Namespace = "bulkhead"

// The conventions' recommended bucket bounds.
var (
	tokenUsageBuckets = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	durationBuckets   = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
)

// Metrics exports one bulkhead's statistics and timings as OpenTelemetry
// metrics, through a MeterProvider: the figures package metrics gives
// Prometheus, and the generative AI client metrics of the semantic
// conventions (gen_ai.client.token.usage, gen_ai.client.operation.duration).
//
// The counters and gauges are observable instruments read from
// Bulkhead.Stats at each collection, all from one snapshot, so they are
// exact and agree with one another. The histograms are fed from the
// bulkhead's events, from NewMetrics on, until Close.
//
// A Metrics is safe for concurrent use.
type Metrics struct {
	b     *bulkhead.Bulkhead
	clk   clock.Clock
	base  []attribute.KeyValue // bulkhead.name and Options.Attributes
	genAI []attribute.KeyValue // base, gen_ai.operation.name and gen_ai.provider.name
	model string

	// Parallel to family.All.
	observables []metric.Observable

	queue, decision, rate  metric.Float64Histogram
	consumed, refunded     metric.Int64Histogram
	tokenUsage             metric.Int64Histogram
	duration               metric.Float64Histogram
	admittedSet, rejectSet metric.MeasurementOption

	// arrived is when each admission or bypassed call in flight arrived,
	// by its ID. Only the event listeners, which run one at a time, use it.
	arrived map[bulkhead.ID]time.Time

	registration metric.Registration
	unsubscribe  func()
	closeOnce    sync.Once
}

// NewMetrics returns the Metrics of b, registered on the meter that
// Options.MeterProvider gives, and subscribes it to b's events. Of opts,
// MeterProvider, Name, Model, Provider, Operation, Attributes and Clock
// apply. A nil b is an error, and so is an attribute of Options.Attributes
// that uses a name the package sets.
//
// The instruments that depend on b's configuration (token budget,
// classes, deduplication, rate limits, fleet pool) report only when b has
// it. Its listeners make the bulkhead time each decision and emit its
// admit, reject and release events, a small cost on every call.
func NewMetrics(b *bulkhead.Bulkhead, opts Options) (*Metrics, error) {
	if b == nil {
		return nil, errors.New("otelbulkhead: nil *bulkhead.Bulkhead")
	}
	for _, kv := range opts.Attributes {
		if k := string(kv.Key); strings.HasPrefix(k, "bulkhead.") || strings.HasPrefix(k, "gen_ai.") || k == string(errorType) {
			return nil, fmt.Errorf("otelbulkhead: Options.Attributes: %q is a name the package sets", k)
		}
	}
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(instrumentation, metric.WithSchemaURL(schemaURL))
	m := &Metrics{b: b, clk: clock.OrReal(opts.Clock), model: opts.Model, arrived: map[bulkhead.ID]time.Time{}}
	if opts.Name != "" {
		m.base = append(m.base, keyName.String(opts.Name))
	}
	m.base = append(m.base, opts.Attributes...)
	op := opts.Operation
	if op == "" {
		op = defaultOperation
	}
	m.genAI = append(append(m.genAI, m.base...), genAIOperation.String(op))
	if opts.Provider != "" {
		m.genAI = append(m.genAI, genAIProvider.String(opts.Provider))
	}
	m.admittedSet = metric.WithAttributes(append(append([]attribute.KeyValue(nil), m.base...), keyOutcome.String(outcomeAdmitted))...)
	m.rejectSet = metric.WithAttributes(append(append([]attribute.KeyValue(nil), m.base...), keyOutcome.String(outcomeRejected))...)

	var errs []error
	for _, f := range family.All {
		o, err := observable(meter, f)
		errs = append(errs, err)
		m.observables = append(m.observables, o)
	}
	st := b.Stats()
	seconds := func(h family.Histogram) metric.Float64Histogram {
		x, err := meter.Float64Histogram(name(h.Name), metric.WithUnit(h.Unit), metric.WithDescription(h.Help),
			metric.WithExplicitBucketBoundaries(family.DurationBuckets()...))
		errs = append(errs, err)
		return x
	}
	tokens := func(h family.Histogram) metric.Int64Histogram {
		x, err := meter.Int64Histogram(name(h.Name), metric.WithUnit(h.Unit), metric.WithDescription(h.Help),
			metric.WithExplicitBucketBoundaries(family.TokenBuckets()...))
		errs = append(errs, err)
		return x
	}
	m.queue, m.decision = seconds(family.QueueWait), seconds(family.DecisionTime)
	if st.Rate != nil {
		m.rate = seconds(family.RateWait)
	}
	m.consumed = tokens(family.Consumed)
	if st.TokenBudget != nil {
		m.refunded = tokens(family.Refunded)
	}
	var err error
	m.tokenUsage, err = meter.Int64Histogram(genAITokenUsage, metric.WithUnit("{token}"),
		metric.WithDescription("Number of input and output tokens used."), metric.WithExplicitBucketBoundaries(tokenUsageBuckets...))
	errs = append(errs, err)
	m.duration, err = meter.Float64Histogram(genAIOperationDuration, metric.WithUnit("s"),
		metric.WithDescription("GenAI operation duration."), metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = append(errs, err)
	m.registration, err = meter.RegisterCallback(m.observe, m.observables...)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		if m.registration != nil {
			_ = m.registration.Unregister()
		}
		return nil, fmt.Errorf("otelbulkhead: %w", err)
	}
	m.unsubscribe = b.Subscribe(bulkhead.Hooks{
		Admit:         m.onAdmit,
		Reject:        m.onReject,
		Release:       m.onRelease,
		Bypass:        m.onBypass,
		BypassRelease: m.onBypassRelease,
	})
	return m, nil
}

// name returns the instrument name of a family named n in Prometheus
// form: "bulkhead." followed by n without its "_total".
func name(n string) string { return Namespace + "." + strings.TrimSuffix(n, "_total") }

// observable makes the instrument of family f.
func observable(meter metric.Meter, f family.Family) (metric.Observable, error) {
	n, unit, desc := name(f.Name), metric.WithUnit(f.Unit), metric.WithDescription(f.Help)
	switch {
	case f.Float && f.Kind == family.Counter:
		return meter.Float64ObservableCounter(n, unit, desc)
	case f.Float && f.Kind == family.UpDown:
		return meter.Float64ObservableUpDownCounter(n, unit, desc)
	case f.Float:
		return meter.Float64ObservableGauge(n, unit, desc)
	case f.Kind == family.Counter:
		return meter.Int64ObservableCounter(n, unit, desc)
	case f.Kind == family.UpDown:
		return meter.Int64ObservableUpDownCounter(n, unit, desc)
	}
	return meter.Int64ObservableGauge(n, unit, desc)
}

// observe reads the bulkhead's Stats once and observes every family.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	st := m.b.Stats()
	for k, f := range family.All {
		inst := m.observables[k]
		f.Read(&st, func(v float64, labelValues ...string) {
			attrs := m.base
			if len(labelValues) > 0 {
				attrs = append(append(make([]attribute.KeyValue, 0, len(m.base)+len(labelValues)), m.base...), labels(f.Labels, labelValues)...)
			}
			set := metric.WithAttributes(attrs...)
			switch x := inst.(type) {
			case metric.Float64Observable:
				o.ObserveFloat64(x, v, set)
			case metric.Int64Observable:
				o.ObserveInt64(x, int64(v), set)
			}
		})
	}
	return nil
}

// labels returns the attributes of a family's labels: bulkhead.<label>.
func labels(names, values []string) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(names))
	for k, n := range names {
		out[k] = attribute.String(Namespace+"."+n, values[k])
	}
	return out
}

// Close unregisters the observable instruments, which stop reporting, and
// unsubscribes the Metrics from the bulkhead's events: its histograms stop
// changing. It is idempotent.
func (m *Metrics) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.unsubscribe()
		err = m.registration.Unregister()
	})
	return err
}

// timing observes the time histograms of a decision.
func (m *Metrics) timing(t bulkhead.Timing, set metric.MeasurementOption) {
	ctx := context.Background()
	m.queue.Record(ctx, t.QueueWait.Seconds(), set)
	m.decision.Record(ctx, t.DecisionDuration.Seconds(), set)
	if m.rate != nil {
		m.rate.Record(ctx, t.RateWait.Seconds(), set)
	}
}

// genAIAttributes returns the generative AI attributes of a call of req,
// with more.
func (m *Metrics) genAIAttributes(req *bulkhead.Request, more ...attribute.KeyValue) []attribute.KeyValue {
	attrs := append(make([]attribute.KeyValue, 0, len(m.genAI)+2+len(more)), m.genAI...)
	model := m.model
	if req != nil && req.Model != "" {
		model = req.Model
	}
	if model != "" {
		attrs = append(attrs, genAIRequestModel.String(model))
	}
	return append(attrs, more...)
}

func (m *Metrics) onAdmit(e bulkhead.AdmitEvent) {
	m.timing(e.Timing, m.admittedSet)
	m.arrived[e.ID] = m.clk.Now().Add(-(e.QueueWait + e.RateWait + e.DecisionDuration))
}

func (m *Metrics) onReject(e bulkhead.RejectEvent) {
	m.timing(e.Timing, m.rejectSet)
	d := e.QueueWait + e.RateWait + e.DecisionDuration
	m.duration.Record(context.Background(), d.Seconds(),
		metric.WithAttributes(m.genAIAttributes(e.Request, errorType.String(e.Reason.String()))...))
}

func (m *Metrics) onRelease(e bulkhead.ReleaseEvent) {
	ctx := context.Background()
	if e.Usage != nil {
		m.consumed.Record(ctx, e.Usage.Total(), metric.WithAttributes(m.base...))
		if m.refunded != nil {
			m.refunded.Record(ctx, e.Refunded, metric.WithAttributes(m.base...))
		}
	}
	m.ended(e.ID, e.Request, e.Usage)
}

func (m *Metrics) onBypass(e bulkhead.BypassEvent) { m.arrived[e.ID] = m.clk.Now() }

func (m *Metrics) onBypassRelease(e bulkhead.BypassReleaseEvent) { m.ended(e.ID, e.Request, e.Usage) }

// ended records the generative AI metrics of the call id, of req, which
// ended now with usage u (nil for none).
func (m *Metrics) ended(id bulkhead.ID, req *bulkhead.Request, u *bulkhead.Usage) {
	ctx := context.Background()
	if at, ok := m.arrived[id]; ok {
		delete(m.arrived, id)
		m.duration.Record(ctx, m.clk.Now().Sub(at).Seconds(), metric.WithAttributes(m.genAIAttributes(req)...))
	}
	if u != nil {
		m.tokenUsage.Record(ctx, u.Input, metric.WithAttributes(m.genAIAttributes(req, genAITokenType.String(tokenTypeInput))...))
		m.tokenUsage.Record(ctx, u.Output, metric.WithAttributes(m.genAIAttributes(req, genAITokenType.String(tokenTypeOutput))...))
	}
}
