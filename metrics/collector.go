package metrics

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/family"
)

// DefaultNamespace is the prefix of every metric name when Options.Namespace
// is empty.
const DefaultNamespace = "bulkhead"

// NameLabel is the label that Options.Name sets on every metric.
const NameLabel = "bulkhead"

// Options configures a Collector. The zero value is ready to use.
type Options struct {
	// Namespace prefixes every metric name, as in "bulkhead_in_flight".
	// Empty means DefaultNamespace.
	Namespace string

	// Name, when not empty, is set as the label bulkhead="<Name>" on every
	// metric, to tell the bulkheads of one program apart (one per model or
	// provider account, say). Collectors registered on one registry must
	// differ in Name or ConstLabels.
	Name string

	// ConstLabels are further labels set on every metric, such as the
	// service or region. They must not use the names of the metrics' own
	// labels (reason, class, cause, outcome) nor NameLabel.
	ConstLabels prometheus.Labels

	// DurationBuckets are the upper bounds, in seconds, of the buckets of
	// the queue wait, decision time and rate wait histograms, in increasing
	// order. Empty means DefaultDurationBuckets().
	DurationBuckets []float64

	// TokenBuckets are the upper bounds, in tokens, of the buckets of the
	// per-release usage histograms, in increasing order. Empty means
	// DefaultTokenBuckets().
	TokenBuckets []float64
}

// DefaultDurationBuckets returns the default buckets of the time
// histograms: from 1 microsecond, where admission decisions fall, to 60
// seconds, the longest queue waits.
func DefaultDurationBuckets() []float64 { return family.DurationBuckets() }

// DefaultTokenBuckets returns the default buckets of the per-release usage
// histograms: from 10 to 1,000,000 tokens.
func DefaultTokenBuckets() []float64 { return family.TokenBuckets() }

// Collector exports one bulkhead's statistics and event timings as
// Prometheus metrics. Register it on the program's registry with
// prometheus.Registerer.Register; it registers nothing by itself.
//
// Counters and gauges are read from Bulkhead.Stats at each scrape, so they
// are exact and agree with one another. Histograms are fed from the
// bulkhead's events, from New on, until Close. Events reach listeners on
// the bulkhead's event goroutine, a moment after Stats shows their change,
// so a histogram's count may trail the matching counter for that moment.
//
// A Collector is safe for concurrent use.
type Collector struct {
	b *bulkhead.Bulkhead
	// descs describes family.All, index for index.
	descs []*prometheus.Desc

	// admitted and rejected observe the timings of each outcome; rate is
	// nil without rate limits.
	admitted, rejected timing
	consumed, refunded prometheus.Histogram
	hists              []prometheus.Collector

	unsubscribe func()
	closeOnce   sync.Once
}

// timing is the series of one outcome of the time histograms.
type timing struct{ queue, decision, rate prometheus.Observer }

func (t timing) observe(e bulkhead.Timing) {
	t.queue.Observe(e.QueueWait.Seconds())
	t.decision.Observe(e.DecisionDuration.Seconds())
	if t.rate != nil {
		t.rate.Observe(e.RateWait.Seconds())
	}
}

// New returns a Collector of b's metrics and subscribes it to b's events.
// The families that depend on b's configuration (token budget, classes,
// deduplication, rate limits, fleet pool) are present only when b has it.
// An invalid Options is an error; so is a nil b.
//
// Its listeners make the bulkhead time each decision and emit its admit,
// reject and release events, a small cost on every call (about 1.5
// microseconds and 4 allocations per admission on a 2-core machine). Close
// the Collector when it is no longer scraped, to unsubscribe it.
func New(b *bulkhead.Bulkhead, opts Options) (*Collector, error) {
	if b == nil {
		return nil, errors.New("metrics: nil *bulkhead.Bulkhead")
	}
	ns, labels, err := names(opts, "reason", "class", "cause", "outcome")
	if err != nil {
		return nil, err
	}
	durations, err := buckets("DurationBuckets", opts.DurationBuckets, DefaultDurationBuckets)
	if err != nil {
		return nil, err
	}
	tokens, err := buckets("TokenBuckets", opts.TokenBuckets, DefaultTokenBuckets)
	if err != nil {
		return nil, err
	}

	st := b.Stats()
	c := &Collector{b: b}
	for _, f := range family.All {
		c.descs = append(c.descs, prometheus.NewDesc(prometheus.BuildFQName(ns, "", f.Name), f.Help, f.Labels, labels))
	}

	hopts := func(h family.Histogram, bs []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: ns, Name: h.Name, Help: h.Help, ConstLabels: labels, Buckets: bs}
	}
	hist := func(h family.Histogram, bs []float64) prometheus.Histogram {
		x := prometheus.NewHistogram(hopts(h, bs))
		c.hists = append(c.hists, x)
		return x
	}
	// byOutcome makes a histogram labelled by outcome, with both series
	// there from the start, so that rates over them never miss one.
	byOutcome := func(h family.Histogram) (admitted, rejected prometheus.Observer) {
		v := prometheus.NewHistogramVec(hopts(h, durations), []string{family.Outcome})
		c.hists = append(c.hists, v)
		return v.WithLabelValues("admitted"), v.WithLabelValues("rejected")
	}
	c.admitted.queue, c.rejected.queue = byOutcome(family.QueueWait)
	c.admitted.decision, c.rejected.decision = byOutcome(family.DecisionTime)
	if st.Rate != nil {
		c.admitted.rate, c.rejected.rate = byOutcome(family.RateWait)
	}
	c.consumed = hist(family.Consumed, tokens)
	if st.TokenBudget != nil {
		c.refunded = hist(family.Refunded, tokens)
	}

	// Registering on a throwaway registry reports every invalid name or
	// label now, rather than at the caller's registration.
	if err := prometheus.NewRegistry().Register(c); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	c.unsubscribe = b.Subscribe(bulkhead.Hooks{
		Admit:   c.onAdmit,
		Reject:  c.onReject,
		Release: c.onRelease,
	})
	return c, nil
}

// Close unsubscribes the Collector from the bulkhead's events: its
// histograms stop changing, while its counters and gauges still follow
// Stats. It is idempotent.
func (c *Collector) Close() {
	c.closeOnce.Do(func() { c.unsubscribe() })
}

func (c *Collector) onAdmit(e bulkhead.AdmitEvent) { c.admitted.observe(e.Timing) }

func (c *Collector) onReject(e bulkhead.RejectEvent) { c.rejected.observe(e.Timing) }

func (c *Collector) onRelease(e bulkhead.ReleaseEvent) {
	if e.Usage == nil {
		return
	}
	c.consumed.Observe(float64(e.Usage.Total()))
	if c.refunded != nil {
		c.refunded.Observe(float64(e.Refunded))
	}
}

// Describe sends the descriptions of every metric the Collector may
// collect. It implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	for _, h := range c.hists {
		h.Describe(ch)
	}
}

// Collect reads the bulkhead's Stats once and sends every metric. It
// implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Stats()
	for k, f := range family.All {
		d, typ := c.descs[k], valueType(f.Kind)
		f.Read(&st, func(v float64, labelValues ...string) {
			ch <- prometheus.MustNewConstMetric(d, typ, v, labelValues...)
		})
	}
	for _, h := range c.hists {
		h.Collect(ch)
	}
}

func valueType(k family.Kind) prometheus.ValueType {
	if k == family.Counter {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}

// sink sends constant metrics.
type sink chan<- prometheus.Metric

func (s sink) gauge(d *prometheus.Desc, v int64, labels ...string) {
	s <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
}

func boolValue(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// names returns the namespace and the constant labels of opts, checking
// that the labels use none of the names in own, nor NameLabel.
func names(opts Options, own ...string) (string, prometheus.Labels, error) {
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	if !validName(ns, true) {
		return "", nil, fmt.Errorf("metrics: Options.Namespace %q: want letters, digits and underscores, not starting with a digit", ns)
	}
	labels := prometheus.Labels{}
	for k, v := range opts.ConstLabels {
		if !validName(k, false) || strings.HasPrefix(k, "__") {
			return "", nil, fmt.Errorf("metrics: Options.ConstLabels: label name %q: want letters, digits and underscores, not starting with a digit or __", k)
		}
		if k == NameLabel || slices.Contains(own, k) {
			return "", nil, fmt.Errorf("metrics: Options.ConstLabels: label %q is the collector's own", k)
		}
		labels[k] = v
	}
	if opts.Name != "" {
		labels[NameLabel] = opts.Name
	}
	return ns, labels, nil
}

// validName reports whether s is a metric name (colons allowed) or a label
// name that every Prometheus version accepts.
func validName(s string, colons bool) bool {
	for i, r := range s {
		ok := r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9' || colons && r == ':'
		if !ok {
			return false
		}
	}
	return s != ""
}

func buckets(field string, bs []float64, def func() []float64) ([]float64, error) {
	if len(bs) == 0 {
		return def(), nil
	}
	for i := 1; i < len(bs); i++ {
		if !(bs[i] > bs[i-1]) {
			return nil, fmt.Errorf("metrics: Options.%s must be in increasing order, got %v", field, bs)
		}
	}
	return append([]float64(nil), bs...), nil
}
