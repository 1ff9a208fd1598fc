package metrics

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmbulkhead/bulkhead"
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
func DefaultDurationBuckets() []float64 {
	return []float64{
		0.000001, 0.000005, 0.00001, 0.00005, 0.0001, 0.0005,
		0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60,
	}
}

// DefaultTokenBuckets returns the default buckets of the per-release usage
// histograms: from 10 to 1,000,000 tokens.
func DefaultTokenBuckets() []float64 {
	return []float64{
		10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
		10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
	}
}

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
	b       *bulkhead.Bulkhead
	d       descs
	reasons []bulkhead.Reason

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
	c := &Collector{b: b, reasons: knownReasons()}
	c.d.init(ns, labels)

	hopts := func(name, help string, bs []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, ConstLabels: labels, Buckets: bs}
	}
	hist := func(name, help string, bs []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(hopts(name, help, bs))
		c.hists = append(c.hists, h)
		return h
	}
	// byOutcome makes a histogram labelled by outcome, with both series
	// there from the start, so that rates over them never miss one.
	byOutcome := func(name, help string) (admitted, rejected prometheus.Observer) {
		v := prometheus.NewHistogramVec(hopts(name, help, durations), []string{"outcome"})
		c.hists = append(c.hists, v)
		return v.WithLabelValues("admitted"), v.WithLabelValues("rejected")
	}
	c.admitted.queue, c.rejected.queue = byOutcome("queue_wait_seconds",
		"Time calls waited in the queue for a slot, by outcome; 0 for a call that never queued.")
	c.admitted.decision, c.rejected.decision = byOutcome("decision_seconds",
		"Time the bulkhead spent deciding calls, queue wait excluded, by outcome.")
	if st.Rate != nil {
		c.admitted.rate, c.rejected.rate = byOutcome("rate_wait_seconds",
			"Time calls waited for a rate-limit turn before asking for a slot, by outcome; 0 for a call that did not wait.")
	}
	c.consumed = hist("release_consumed_tokens",
		"Tokens each released admission consumed, by its final usage; releases without usage are not observed.", tokens)
	if st.TokenBudget != nil {
		c.refunded = hist("release_refunded_tokens",
			"Tokens each release with a final usage gave back unused.", tokens)
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
	for _, d := range c.d.all {
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
	s := sink(ch)
	d := &c.d

	s.gauge(d.inFlight, st.Calls.InFlight)
	s.counter(d.admitted, st.Calls.Admitted)
	s.counter(d.released, st.Calls.Released)
	c.collectRejected(s, st)
	for _, cause := range []bulkhead.AbandonCause{bulkhead.AbandonManual, bulkhead.AbandonDeadline} {
		s.counter(d.abandoned, st.Calls.AbandonedByCause[cause], cause.String())
	}

	s.gauge(d.slotsInUse, int64(st.Gate.InFlight))
	s.gauge(d.pending, int64(st.Gate.Pending))
	s.gauge(d.maxConcurrent, int64(st.Gate.MaxConcurrent))
	s.gauge(d.maxQueue, int64(st.Gate.MaxQueue))
	s.gauge(d.closed, boolValue(st.Gate.Closed))
	s.gauge(d.limitRevision, st.Limits.Revision)
	s.counter(d.doubleReleases, st.Gate.DoubleReleases)

	if tb := st.TokenBudget; tb != nil {
		s.gauge(d.tokenBudget, tb.Budget)
		s.gauge(d.highPriorityReserve, tb.HighPriorityReserve)
		s.gauge(d.tokensInFlight, tb.InFlightTokens)
		s.gauge(d.tokensAvailable, tb.Available)
		s.counter(d.tokensReserved, tb.TotalReserved)
		s.counter(d.tokensConsumed, tb.TotalConsumed)
		s.counter(d.tokensRefunded, tb.TotalRefunded)
		s.counter(d.tokensOverrun, tb.TotalOverrun)
	}

	if cs := st.Classes; cs != nil {
		c.collectClasses(s, cs, st.TokenBudget != nil)
	}

	o := st.Observe
	for _, r := range reasonsOf(o.BypassedByReason, shadowable) {
		s.counter(d.bypassed, o.BypassedByReason[r], r.String())
	}
	s.counter(d.raceBypassed, o.RaceBypassed)
	s.gauge(d.bypassedInFlight, o.InFlight)
	s.counter(d.bypassedUsage, o.UsageReported)
	s.counter(d.bypassedInput, o.InputTokens)
	s.counter(d.bypassedOutput, o.OutputTokens)

	if dd := st.Dedup; dd != nil {
		s.gauge(d.dedupActive, dd.Active)
		s.counter(d.dedupHits, dd.Hits)
	}

	if r := st.Rate; r != nil {
		s.counter(d.rateChecked, r.Checked)
		s.counter(d.ratePaced, r.Paced)
		s <- prometheus.MustNewConstMetric(d.ratePacedSeconds, prometheus.CounterValue, r.PacedTime.Seconds())
		s.counter(d.rateFallbacks, r.Fallbacks)
		s.counter(d.rateOverruns, r.Overruns)
		s.counter(d.rateOverrunTokens, r.OverrunTokens)
		s.counter(d.rateOverrunErrors, r.OverrunErrors)
		s.counter(d.rateOverrunDropped, r.OverrunDropped)
		s.counter(d.rateRefunds, r.Refunds)
		s.counter(d.rateRefundedTokens, r.RefundedTokens)
	}

	if f := st.Fleet; f != nil {
		s.counter(d.fleetChecked, f.Checked)
		s.counter(d.fleetAdmitted, f.Admitted)
		s.counter(d.fleetPolicyAdmitted, f.PolicyAdmitted)
		s.gauge(d.fleetInFlight, f.InFlight)
		s.gauge(d.fleetTokensInFlight, f.InFlightTokens)
		s.gauge(d.fleetMaxConcurrent, f.MaxConcurrent)
		s.gauge(d.fleetTokenBudget, f.TokenBudget)
	}

	s.gauge(d.eventBacklog, st.Events.Backlog)
	s.counter(d.listenerPanics, st.Events.ListenerPanics)
	s.counter(d.ledgerDrift, st.LedgerDrift)
	s.counter(d.suspectUsage, st.Calls.SuspectUsage)
	s.counter(d.suspectTokens, st.Calls.SuspectTokens)

	for _, h := range c.hists {
		h.Collect(ch)
	}
}

// collectRejected sends bulkhead_rejected_total: per class and reason with
// classes, with class "" without. Every known reason is sent, zeros
// included, so that a rate over a reason never misses its series. Should
// the classes' counts fall short of the bulkhead's, the rest is sent with
// class "", so that the series always add up to every rejection.
func (c *Collector) collectRejected(s sink, st bulkhead.Stats) {
	total := st.Calls.RejectedByReason
	reasons := reasonsOf(total, c.reasons)
	if st.Classes == nil {
		for _, r := range reasons {
			s.counter(c.d.rejected, total[r], r.String(), "")
		}
		return
	}
	rest := make(map[bulkhead.Reason]int64, len(total))
	for r, n := range total {
		rest[r] = n
	}
	for _, name := range classNames(st.Classes) {
		byReason := st.Classes.Classes[name].RejectedByReason
		for _, r := range reasonsOf(byReason, reasons) {
			s.counter(c.d.rejected, byReason[r], r.String(), name)
			rest[r] -= byReason[r]
		}
	}
	for _, r := range reasonsOf(rest, nil) {
		if rest[r] > 0 {
			s.counter(c.d.rejected, rest[r], r.String(), "")
		}
	}
}

func (c *Collector) collectClasses(s sink, cs *bulkhead.ClassesStats, budget bool) {
	d := &c.d
	s.gauge(d.sharedMaxConcurrent, int64(cs.Shared.MaxConcurrent))
	s.gauge(d.sharedInFlight, int64(cs.Shared.InFlight))
	if tb := cs.Shared.TokenBudget; tb != nil {
		s.gauge(d.sharedTokenBudget, tb.Budget)
		s.gauge(d.sharedTokensInFlight, tb.InFlightTokens)
	}
	for _, name := range classNames(cs) {
		cl := cs.Classes[name]
		s.gauge(d.classInFlight, int64(cl.InFlight), name)
		s.gauge(d.classPending, int64(cl.Pending), name)
		s.gauge(d.classBorrowedInFlight, int64(cl.BorrowedConcurrent), name)
		s.gauge(d.classProtectedConcurrent, int64(cl.Limits.ProtectedConcurrent), name)
		if m := cl.Limits.MaxConcurrent; m != nil {
			s.gauge(d.classMaxConcurrent, int64(*m), name)
		}
		s.counter(d.classAdmitted, cl.Admitted, name)
		s.counter(d.classReleased, cl.Released, name)
		s.counter(d.classBorrowedAdmissions, cl.TotalBorrowedAdmissions, name)
		if !budget {
			continue
		}
		s.gauge(d.classTokensInFlight, cl.InFlightTokens, name)
		s.gauge(d.classBorrowedTokensInFlight, cl.BorrowedInFlightTokens, name)
		s.gauge(d.classProtectedTokens, cl.Limits.ProtectedInFlightTokens, name)
		if m := cl.Limits.MaxInFlightTokens; m != nil {
			s.gauge(d.classMaxTokens, *m, name)
		}
		s.counter(d.classTokensReserved, cl.TotalReserved, name)
		s.counter(d.classTokensConsumed, cl.TotalConsumed, name)
		s.counter(d.classTokensRefunded, cl.TotalRefunded, name)
	}
}

// sink sends constant metrics.
type sink chan<- prometheus.Metric

func (s sink) counter(d *prometheus.Desc, v int64, labels ...string) {
	s <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func (s sink) gauge(d *prometheus.Desc, v int64, labels ...string) {
	s <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
}

func boolValue(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// shadowable is the reasons Observe mode may bypass.
var shadowable = []bulkhead.Reason{
	bulkhead.ConcurrencyLimit, bulkhead.QueueLimit, bulkhead.Timeout, bulkhead.BudgetLimit,
}

// knownReasons returns every rejection reason the bulkhead names, in order.
func knownReasons() []bulkhead.Reason {
	var rs []bulkhead.Reason
	for r := bulkhead.Reason(1); r != 0; r++ {
		if strings.HasPrefix(r.String(), "reason(") {
			break
		}
		rs = append(rs, r)
	}
	return rs
}

// reasonsOf returns base followed by the other keys of m, in order.
func reasonsOf(m map[bulkhead.Reason]int64, base []bulkhead.Reason) []bulkhead.Reason {
	var more []bulkhead.Reason
	for r := range m {
		if !slices.Contains(base, r) {
			more = append(more, r)
		}
	}
	slices.Sort(more)
	return append(slices.Clone(base), more...)
}

func classNames(cs *bulkhead.ClassesStats) []string {
	return slices.Sorted(maps.Keys(cs.Classes))
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
