package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/metrics"
)

func wantReject(t *testing.T, err error, reason bulkhead.Reason) {
	t.Helper()
	var re *bulkhead.RejectedError
	if !errors.As(err, &re) || re.Reason != reason {
		t.Fatalf("got %v, want a %s rejection", err, reason)
	}
}

// TestScriptedSequence drives one bulkhead through admissions, a queue wait,
// a release with usage and a rejection of every reason a lone bulkhead can
// give, then checks the scrape value by value.
func TestScriptedSequence(t *testing.T) {
	cfg := bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1, MaxQueue: 1,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1000, HighPriorityReserve: 100}}
	b, mock := newBulkhead(t, cfg)
	c := newCollector(t, b, metrics.Options{
		Name:            "main",
		DurationBuckets: []float64{0.5, 1, 2},
		TokenBuckets:    []float64{100, 200},
	})
	reg := register(t, c)
	ctx := context.Background()

	// p1 holds the slot; a second call queues, a third finds the queue full.
	p1, err := b.Acquire(ctx, anyRequest, reserve(100, 100))
	if err != nil {
		t.Fatal(err)
	}
	queued := b.AcquireAsync(ctx, anyRequest, reserve(50, 150))
	if got := b.Stats().Gate.Pending; got != 1 {
		t.Fatalf("pending = %d, want 1", got)
	}
	_, err = b.Acquire(ctx, anyRequest, reserve(1, 1))
	wantReject(t, err, bulkhead.QueueLimit)

	// The queued call waits 2s, then gets the slot p1 releases with usage
	// 150 of its 200.
	mock.Add(2 * time.Second)
	if err := p1.Release(&bulkhead.Usage{Input: 100, Output: 50}); err != nil {
		t.Fatal(err)
	}
	p2, err := queued.Result()
	if err != nil {
		t.Fatal(err)
	}

	// Timeout after 1s in the queue; Aborted while queued and at once.
	timedOut := b.AcquireAsync(ctx, anyRequest, reserve(1, 1), bulkhead.WithQueueTimeout(time.Second))
	if got := b.Stats().Gate.Pending; got != 1 {
		t.Fatalf("pending = %d, want 1", got)
	}
	mock.Add(time.Second)
	_, err = timedOut.Result()
	wantReject(t, err, bulkhead.Timeout)
	cctx, cancel := context.WithCancel(ctx)
	aborted := b.AcquireAsync(cctx, anyRequest, reserve(1, 1))
	if got := b.Stats().Gate.Pending; got != 1 {
		t.Fatalf("pending = %d, want 1", got)
	}
	cancel()
	_, err = aborted.Result()
	wantReject(t, err, bulkhead.Aborted)
	_, err = b.Acquire(cctx, anyRequest, reserve(1, 1))
	wantReject(t, err, bulkhead.Aborted)

	// p2 releases without usage; a reservation above the budget is turned
	// away with a slot free.
	if err := p2.Release(nil); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, anyRequest, reserve(1000, 1000))
	wantReject(t, err, bulkhead.BudgetLimit)

	// Without a queue, a full slot is a concurrency rejection.
	lim := b.Limits()
	lim.Revision, lim.MaxQueue = lim.Revision+1, 0
	if _, err := b.ApplyLimits(lim); err != nil {
		t.Fatal(err)
	}
	p3, err := b.Acquire(ctx, anyRequest, reserve(5, 5))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, anyRequest, reserve(1, 1))
	wantReject(t, err, bulkhead.ConcurrencyLimit)

	// A panicking listener is counted.
	b.Subscribe(bulkhead.Hooks{Release: func(bulkhead.ReleaseEvent) { panic("listener") }})
	if err := p3.Release(&bulkhead.Usage{Input: 5, Output: 100}); err != nil {
		t.Fatal(err)
	}
	if err := p3.Release(nil); err != nil { // a double release
		t.Fatal(err)
	}

	b.Close()
	_, err = b.Acquire(ctx, anyRequest, reserve(1, 1))
	wantReject(t, err, bulkhead.Shutdown)
	closeAndDrain(t, b)

	want := `
# HELP bulkhead_admitted_total Calls admitted.
# TYPE bulkhead_admitted_total counter
bulkhead_admitted_total{bulkhead="main"} 3
# HELP bulkhead_released_total Admissions released.
# TYPE bulkhead_released_total counter
bulkhead_released_total{bulkhead="main"} 3
# HELP bulkhead_in_flight Admissions not yet released: admitted_total - released_total.
# TYPE bulkhead_in_flight gauge
bulkhead_in_flight{bulkhead="main"} 0
# HELP bulkhead_rejected_total Calls rejected, by reason and admission class ("" without classes).
# TYPE bulkhead_rejected_total counter
bulkhead_rejected_total{bulkhead="main",class="",reason="aborted"} 2
bulkhead_rejected_total{bulkhead="main",class="",reason="budget_limit"} 1
bulkhead_rejected_total{bulkhead="main",class="",reason="concurrency_limit"} 1
bulkhead_rejected_total{bulkhead="main",class="",reason="cooldown"} 0
bulkhead_rejected_total{bulkhead="main",class="",reason="fleet_unavailable"} 0
bulkhead_rejected_total{bulkhead="main",class="",reason="queue_limit"} 1
bulkhead_rejected_total{bulkhead="main",class="",reason="rate_limit"} 0
bulkhead_rejected_total{bulkhead="main",class="",reason="rate_unavailable"} 0
bulkhead_rejected_total{bulkhead="main",class="",reason="retry_budget"} 0
bulkhead_rejected_total{bulkhead="main",class="",reason="shutdown"} 1
bulkhead_rejected_total{bulkhead="main",class="",reason="timeout"} 1
bulkhead_rejected_total{bulkhead="main",class="",reason="unshareable_result"} 0
# HELP bulkhead_max_queue Current limit on waiting calls.
# TYPE bulkhead_max_queue gauge
bulkhead_max_queue{bulkhead="main"} 0
# HELP bulkhead_max_concurrent Current limit on concurrency slots.
# TYPE bulkhead_max_concurrent gauge
bulkhead_max_concurrent{bulkhead="main"} 1
# HELP bulkhead_closed 1 once the bulkhead is closed, else 0.
# TYPE bulkhead_closed gauge
bulkhead_closed{bulkhead="main"} 1
# HELP bulkhead_limit_revision Revision of the limits in effect.
# TYPE bulkhead_limit_revision gauge
bulkhead_limit_revision{bulkhead="main"} 1
# HELP bulkhead_double_releases_total Release calls on permits already released.
# TYPE bulkhead_double_releases_total counter
bulkhead_double_releases_total{bulkhead="main"} 1
# HELP bulkhead_token_budget Current token budget: the most tokens admitted calls may hold at once.
# TYPE bulkhead_token_budget gauge
bulkhead_token_budget{bulkhead="main"} 1000
# HELP bulkhead_token_high_priority_reserve Part of the token budget only high-priority calls may use.
# TYPE bulkhead_token_high_priority_reserve gauge
bulkhead_token_high_priority_reserve{bulkhead="main"} 100
# HELP bulkhead_tokens_available Token budget not held: token_budget - tokens_in_flight, at least 0.
# TYPE bulkhead_tokens_available gauge
bulkhead_tokens_available{bulkhead="main"} 1000
# HELP bulkhead_tokens_reserved_total Tokens reserved by admissions.
# TYPE bulkhead_tokens_reserved_total counter
bulkhead_tokens_reserved_total{bulkhead="main"} 410
# HELP bulkhead_tokens_consumed_total Tokens consumed, by the usage settled at release.
# TYPE bulkhead_tokens_consumed_total counter
bulkhead_tokens_consumed_total{bulkhead="main"} 255
# HELP bulkhead_tokens_refunded_total Reserved tokens given back unused, early and at release.
# TYPE bulkhead_tokens_refunded_total counter
bulkhead_tokens_refunded_total{bulkhead="main"} 50
# HELP bulkhead_listener_panics_total Event listener calls that panicked.
# TYPE bulkhead_listener_panics_total counter
bulkhead_listener_panics_total{bulkhead="main"} 1
# HELP bulkhead_ledger_drift_total Times the bulkhead found its books out of balance; 0 unless it has a bug.
# TYPE bulkhead_ledger_drift_total counter
bulkhead_ledger_drift_total{bulkhead="main"} 0
# HELP bulkhead_queue_wait_seconds Time calls waited in the queue for a slot, by outcome; 0 for a call that never queued.
# TYPE bulkhead_queue_wait_seconds histogram
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="admitted",le="0.5"} 2
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="admitted",le="1"} 2
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="admitted",le="2"} 3
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="admitted",le="+Inf"} 3
bulkhead_queue_wait_seconds_sum{bulkhead="main",outcome="admitted"} 2
bulkhead_queue_wait_seconds_count{bulkhead="main",outcome="admitted"} 3
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="rejected",le="0.5"} 6
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="rejected",le="1"} 7
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="rejected",le="2"} 7
bulkhead_queue_wait_seconds_bucket{bulkhead="main",outcome="rejected",le="+Inf"} 7
bulkhead_queue_wait_seconds_sum{bulkhead="main",outcome="rejected"} 1
bulkhead_queue_wait_seconds_count{bulkhead="main",outcome="rejected"} 7
# HELP bulkhead_release_consumed_tokens Tokens each released admission consumed, by its final usage; releases without usage are not observed.
# TYPE bulkhead_release_consumed_tokens histogram
bulkhead_release_consumed_tokens_bucket{bulkhead="main",le="100"} 0
bulkhead_release_consumed_tokens_bucket{bulkhead="main",le="200"} 2
bulkhead_release_consumed_tokens_bucket{bulkhead="main",le="+Inf"} 2
bulkhead_release_consumed_tokens_sum{bulkhead="main"} 255
bulkhead_release_consumed_tokens_count{bulkhead="main"} 2
# HELP bulkhead_release_refunded_tokens Tokens each release with a final usage gave back unused.
# TYPE bulkhead_release_refunded_tokens histogram
bulkhead_release_refunded_tokens_bucket{bulkhead="main",le="100"} 2
bulkhead_release_refunded_tokens_bucket{bulkhead="main",le="200"} 2
bulkhead_release_refunded_tokens_bucket{bulkhead="main",le="+Inf"} 2
bulkhead_release_refunded_tokens_sum{bulkhead="main"} 50
bulkhead_release_refunded_tokens_count{bulkhead="main"} 2
`
	names := []string{
		"bulkhead_admitted_total", "bulkhead_released_total", "bulkhead_in_flight", "bulkhead_rejected_total",
		"bulkhead_max_queue", "bulkhead_max_concurrent", "bulkhead_closed", "bulkhead_limit_revision",
		"bulkhead_double_releases_total", "bulkhead_token_budget", "bulkhead_token_high_priority_reserve",
		"bulkhead_tokens_available", "bulkhead_tokens_reserved_total", "bulkhead_tokens_consumed_total",
		"bulkhead_tokens_refunded_total", "bulkhead_listener_panics_total", "bulkhead_ledger_drift_total",
		"bulkhead_queue_wait_seconds", "bulkhead_release_consumed_tokens", "bulkhead_release_refunded_tokens",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// Every decision was timed: the decision histogram counts them all.
	got := scrape(t, reg)
	for outcome, n := range map[string]uint64{"admitted": 3, "rejected": 7} {
		k := fmt.Sprintf(`bulkhead_decision_seconds{bulkhead="main",outcome=%q}`, outcome)
		if got[k].count != n {
			t.Errorf("%s count = %d, want %d", k, got[k].count, n)
		}
	}
	// Families the bulkhead has no use for are absent.
	for _, name := range []string{"bulkhead_rate_wait_seconds", "bulkhead_dedup_active", "bulkhead_class_in_flight", "bulkhead_fleet_checked_total"} {
		if n, _ := testutil.GatherAndCount(reg, name); n != 0 {
			t.Errorf("%s: %d series, want none", name, n)
		}
	}
	matchesStats(t, got, b.Stats(), `bulkhead="main"`)
}

// matchesStats checks the scraped counters against st, field by field.
func matchesStats(t *testing.T, got map[string]sample, st bulkhead.Stats, labels string) {
	t.Helper()
	want := map[string]int64{
		"bulkhead_admitted_total":             st.Calls.Admitted,
		"bulkhead_released_total":             st.Calls.Released,
		"bulkhead_in_flight":                  st.Calls.InFlight,
		"bulkhead_slots_in_use":               int64(st.Gate.InFlight),
		"bulkhead_pending":                    int64(st.Gate.Pending),
		"bulkhead_double_releases_total":      st.Gate.DoubleReleases,
		"bulkhead_event_backlog":              st.Events.Backlog,
		"bulkhead_listener_panics_total":      st.Events.ListenerPanics,
		"bulkhead_ledger_drift_total":         st.LedgerDrift,
		"bulkhead_usage_suspect_total":        st.Calls.SuspectUsage,
		"bulkhead_usage_suspect_tokens_total": st.Calls.SuspectTokens,
	}
	if tb := st.TokenBudget; tb != nil {
		want["bulkhead_tokens_in_flight"] = tb.InFlightTokens
		want["bulkhead_tokens_available"] = tb.Available
		want["bulkhead_tokens_reserved_total"] = tb.TotalReserved
		want["bulkhead_tokens_consumed_total"] = tb.TotalConsumed
		want["bulkhead_tokens_refunded_total"] = tb.TotalRefunded
		want["bulkhead_tokens_overrun_total"] = tb.TotalOverrun
	}
	wantValues(t, got, labelled("{"+labels+"}", want))
	// The rejection series add up to every rejection, reason by reason.
	byReason := map[string]float64{}
	var sum float64
	for k, s := range got {
		if strings.HasPrefix(k, "bulkhead_rejected_total{") && hasLabels(k, labels) {
			i := strings.Index(k, `reason="`) + len(`reason="`)
			byReason[k[i:i+strings.IndexByte(k[i:], '"')]] += s.value
			sum += s.value
		}
	}
	if sum != float64(st.Calls.Rejected) {
		t.Errorf("rejected_total sums to %v, want %d (Stats)", sum, st.Calls.Rejected)
	}
	for r, n := range st.Calls.RejectedByReason {
		if byReason[r.String()] != float64(n) {
			t.Errorf("rejected_total{reason=%q} = %v, want %d (Stats)", r, byReason[r.String()], n)
		}
	}
}

// hasLabels reports whether the series key k has every label of labels, a
// comma-separated list.
func hasLabels(k, labels string) bool {
	for _, l := range strings.Split(labels, ",") {
		if !strings.Contains(k, l) {
			return false
		}
	}
	return true
}

func TestScrapeAfterShutdown(t *testing.T) {
	b, _ := newBulkhead(t, bulkhead.Config{MaxConcurrent: 1, Dedup: &bulkhead.DedupConfig{}})
	c := newCollector(t, b, metrics.Options{})
	reg := register(t, c)
	if _, err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := scrape(t, reg)
	if got["bulkhead_closed{}"].value != 1 {
		t.Errorf("bulkhead_closed = %v after Shutdown, want 1", got["bulkhead_closed{}"].value)
	}
	matchesStats(t, got, b.Stats(), "")
}

var _ prometheus.Collector = (*metrics.Collector)(nil)
