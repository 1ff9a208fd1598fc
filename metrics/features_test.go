package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmbulkhead/bulkhead"
	bhtest "github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/metrics"
)

// TestClasses checks the per-class families and that a rejection is
// labelled with its class.
func TestClasses(t *testing.T) {
	b, _ := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 2,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1000},
		Classes: &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{
			"a": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 100},
			"b": {MaxConcurrent: bulkhead.Ceiling(1), MaxInFlightTokens: bulkhead.Ceiling(int64(300))},
		}}})
	c := newCollector(t, b, metrics.Options{})
	reg := register(t, c)
	ctx := context.Background()

	pa, err := b.Acquire(ctx, anyRequest, reserve(50, 50))
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.Acquire(ctx, anyRequest, bulkhead.WithClass("b"), reserve(100, 100))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, anyRequest, bulkhead.WithClass("b"), reserve(1, 1))
	wantReject(t, err, bulkhead.ConcurrencyLimit)

	want := `
# HELP bulkhead_class_in_flight Slots a class uses.
# TYPE bulkhead_class_in_flight gauge
bulkhead_class_in_flight{class="a"} 1
bulkhead_class_in_flight{class="b"} 1
# HELP bulkhead_class_borrowed_in_flight Slots a class uses from the shared pool.
# TYPE bulkhead_class_borrowed_in_flight gauge
bulkhead_class_borrowed_in_flight{class="a"} 0
bulkhead_class_borrowed_in_flight{class="b"} 1
# HELP bulkhead_class_max_concurrent A class's concurrency ceiling, for a class that has one.
# TYPE bulkhead_class_max_concurrent gauge
bulkhead_class_max_concurrent{class="b"} 1
# HELP bulkhead_class_tokens_in_flight Tokens a class's admissions hold.
# TYPE bulkhead_class_tokens_in_flight gauge
bulkhead_class_tokens_in_flight{class="a"} 100
bulkhead_class_tokens_in_flight{class="b"} 200
# HELP bulkhead_class_borrowed_tokens_in_flight Tokens a class holds from the shared pool.
# TYPE bulkhead_class_borrowed_tokens_in_flight gauge
bulkhead_class_borrowed_tokens_in_flight{class="a"} 0
bulkhead_class_borrowed_tokens_in_flight{class="b"} 200
# HELP bulkhead_class_protected_tokens A class's token floor.
# TYPE bulkhead_class_protected_tokens gauge
bulkhead_class_protected_tokens{class="a"} 100
bulkhead_class_protected_tokens{class="b"} 0
# HELP bulkhead_class_max_tokens_in_flight A class's token ceiling, for a class that has one.
# TYPE bulkhead_class_max_tokens_in_flight gauge
bulkhead_class_max_tokens_in_flight{class="b"} 300
# HELP bulkhead_shared_max_concurrent Slots of the classes' shared pool: max_concurrent less the classes' floors.
# TYPE bulkhead_shared_max_concurrent gauge
bulkhead_shared_max_concurrent 1
# HELP bulkhead_shared_in_flight Shared-pool slots in use.
# TYPE bulkhead_shared_in_flight gauge
bulkhead_shared_in_flight 1
# HELP bulkhead_shared_token_budget Tokens of the classes' shared pool: token_budget less the classes' token floors.
# TYPE bulkhead_shared_token_budget gauge
bulkhead_shared_token_budget 900
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"bulkhead_class_in_flight", "bulkhead_class_borrowed_in_flight", "bulkhead_class_max_concurrent",
		"bulkhead_class_tokens_in_flight", "bulkhead_class_borrowed_tokens_in_flight",
		"bulkhead_class_protected_tokens", "bulkhead_class_max_tokens_in_flight",
		"bulkhead_shared_max_concurrent", "bulkhead_shared_in_flight", "bulkhead_shared_token_budget",
	); err != nil {
		t.Error(err)
	}

	got := scrape(t, reg)
	wantValues(t, got, map[string]float64{
		`bulkhead_rejected_total{class="b",reason="concurrency_limit"}`: 1,
		`bulkhead_rejected_total{class="a",reason="concurrency_limit"}`: 0,
		`bulkhead_rejected_total{class="a",reason="shutdown"}`:          0,
	})
	if _, ok := got[`bulkhead_rejected_total{class="",reason="concurrency_limit"}`]; ok {
		t.Error(`a class="" rejection series with classes, whose rejections all have a class`)
	}
	matchesStats(t, got, b.Stats(), "")

	if err := pa.Release(&bulkhead.Usage{Input: 50, Output: 10}); err != nil {
		t.Fatal(err)
	}
	if err := pb.Release(&bulkhead.Usage{Input: 100, Output: 100}); err != nil {
		t.Fatal(err)
	}
	got = scrape(t, reg)
	st := b.Stats()
	for _, name := range []string{"a", "b"} {
		cl := st.Classes.Classes[name]
		wantValues(t, got, labelled(`{class="`+name+`"}`, map[string]int64{
			"bulkhead_class_admitted_total":            cl.Admitted,
			"bulkhead_class_released_total":            cl.Released,
			"bulkhead_class_tokens_reserved_total":     cl.TotalReserved,
			"bulkhead_class_tokens_consumed_total":     cl.TotalConsumed,
			"bulkhead_class_tokens_refunded_total":     cl.TotalRefunded,
			"bulkhead_class_borrowed_admissions_total": cl.TotalBorrowedAdmissions,
		}))
	}
	if got[`bulkhead_class_tokens_refunded_total{class="a"}`].value != 40 {
		t.Errorf("class a refunded %v, want 40", got[`bulkhead_class_tokens_refunded_total{class="a"}`].value)
	}
}

// TestTwoBulkheadsOneRegistry registers the collectors of two bulkheads on
// one registry, told apart by Name, and checks that each reports its own.
func TestTwoBulkheadsOneRegistry(t *testing.T) {
	b1, _ := newBulkhead(t, bulkhead.Config{MaxConcurrent: 1})
	b2, _ := newBulkhead(t, bulkhead.Config{MaxConcurrent: 3})
	c1 := newCollector(t, b1, metrics.Options{Name: "gpt-4o"})
	c2 := newCollector(t, b2, metrics.Options{Name: "claude"})
	reg := register(t, c1, c2)

	p, err := b1.Acquire(context.Background(), anyRequest)
	if err != nil {
		t.Fatal(err)
	}
	got := scrape(t, reg)
	wantValues(t, got, map[string]float64{
		`bulkhead_admitted_total{bulkhead="gpt-4o"}`: 1,
		`bulkhead_admitted_total{bulkhead="claude"}`: 0,
		`bulkhead_max_concurrent{bulkhead="gpt-4o"}`: 1,
		`bulkhead_max_concurrent{bulkhead="claude"}`: 3,
	})
	if err := p.Release(nil); err != nil {
		t.Fatal(err)
	}

	// A second collector with a name already registered is refused.
	dup := newCollector(t, b2, metrics.Options{Name: "gpt-4o"})
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(dup); !errors.As(err, &are) {
		t.Errorf("Register of a duplicate name: %v, want an AlreadyRegisteredError", err)
	}
	// So is a second one without a name.
	reg2 := register(t, newCollector(t, b1, metrics.Options{}))
	if err := reg2.Register(newCollector(t, b2, metrics.Options{})); !errors.As(err, &are) {
		t.Errorf("Register of a second unnamed collector: %v, want an AlreadyRegisteredError", err)
	}
}

// TestCloseUnsubscribes checks that a closed collector's histograms stop
// while an open one's go on, and that its Stats metrics still follow.
func TestCloseUnsubscribes(t *testing.T) {
	b, _ := newBulkhead(t, bulkhead.Config{MaxConcurrent: 1})
	closed := newCollector(t, b, metrics.Options{Name: "closed"})
	open := newCollector(t, b, metrics.Options{Name: "open"})
	f := bhtest.NewFence(t, b)
	reg := register(t, closed, open)
	call := func() {
		t.Helper()
		p, err := b.Acquire(context.Background(), anyRequest)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
	count := func(name string) uint64 {
		return scrape(t, reg)[`bulkhead_decision_seconds{bulkhead="`+name+`",outcome="admitted"}`].count
	}

	call()
	f.Wait(t, 2)
	if c, o := count("closed"), count("open"); c != 1 || o != 1 {
		t.Fatalf("before Close: decisions counted %d and %d, want 1 and 1", c, o)
	}
	closed.Close()
	closed.Close() // idempotent
	call()
	f.Wait(t, 4)
	if c, o := count("closed"), count("open"); c != 1 || o != 2 {
		t.Errorf("after Close: decisions counted %d (closed) and %d (open), want 1 and 2", c, o)
	}
	if got := scrape(t, reg)[`bulkhead_admitted_total{bulkhead="closed"}`].value; got != 2 {
		t.Errorf("closed collector's admitted_total = %v, want 2: Stats metrics go on", got)
	}
}

// TestEveryFeature builds a bulkhead with every optional part, drives a
// rate rejection and an Observe-mode bypass, and lints the result.
func TestEveryFeature(t *testing.T) {
	b, _ := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1000},
		Classes: &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{
			"a": {}, "b": {ProtectedConcurrent: 1},
		}},
		RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst, OutputTokensPerMinute: 6000}},
		Dedup:      &bulkhead.DedupConfig{},
		RetryBudgets: &bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 0.1, MinRetries: 3},
			PerClass: map[string]bulkhead.RetryLimit{"b": {MinRetries: 2}}},
	})
	c := newCollector(t, b, metrics.Options{Name: "all", ConstLabels: prometheus.Labels{"region": "eu"}})
	reg := register(t, c)
	ctx := context.Background()

	p, err := b.Acquire(ctx, anyRequest, bulkhead.WithClass("b"), reserve(10, 10))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(&bulkhead.Usage{Input: 10, Output: 4}); err != nil { // 6 output tokens back to the output rate
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, anyRequest, bulkhead.WithClass("b"), reserve(10, 10))
	wantReject(t, err, bulkhead.RateLimit)

	// Class a has no floor and class b's floor takes the only slot: an
	// Observe-mode call of class a is bypassed.
	_, err = bulkhead.Run(ctx, b, anyRequest, func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		if rc.Bypass() == nil {
			t.Error("the call was admitted, want it bypassed")
		}
		if got := scrape(t, reg)[`bulkhead_bypassed_in_flight{bulkhead="all",region="eu"}`].value; got != 1 {
			t.Errorf("bypassed_in_flight = %v during the call, want 1", got)
		}
		return 0, rc.SetUsage(bulkhead.Usage{Input: 3, Output: 4})
	}, bulkhead.WithMode(bulkhead.Observe), reserve(10, 10))
	if err != nil {
		t.Fatal(err)
	}
	closeAndDrain(t, b)

	got := scrape(t, reg)
	st := b.Stats()
	wantValues(t, got, labelled(`{bulkhead="all",region="eu"}`, map[string]int64{
		"bulkhead_rate_checked_total":            st.Rate.Checked,
		"bulkhead_rate_paced_total":              st.Rate.Paced,
		"bulkhead_dedup_active":                  st.Dedup.Active,
		"bulkhead_dedup_hits_total":              st.Dedup.Hits,
		"bulkhead_bypassed_in_flight":            0,
		"bulkhead_bypassed_usage_reported_total": 1,
		"bulkhead_bypassed_input_tokens_total":   3,
		"bulkhead_bypassed_output_tokens_total":  4,
		"bulkhead_rate_refunds_total":            1,
		"bulkhead_rate_refunded_tokens_total":    6,
		"bulkhead_retries_admitted_total":        st.Retries.Admitted,
		"bulkhead_retry_budget_first_attempts":   st.Retries.Budget.FirstAttempts,
		"bulkhead_retry_budget_allowed":          3,
	}))
	if st.Rate.Checked == 0 {
		t.Error("no rate check counted")
	}
	wantValues(t, got, map[string]float64{
		`bulkhead_rejected_total{bulkhead="all",class="b",reason="rate_limit",region="eu"}`: 1,
		`bulkhead_bypassed_total{bulkhead="all",reason="concurrency_limit",region="eu"}`:    1,
		`bulkhead_bypassed_total{bulkhead="all",reason="budget_limit",region="eu"}`:         0,
		`bulkhead_rate_paced_seconds_total{bulkhead="all",region="eu"}`:                     0,
		`bulkhead_class_in_flight{bulkhead="all",class="b",region="eu"}`:                    0,
		`bulkhead_class_protected_concurrent{bulkhead="all",class="b",region="eu"}`:         1,
		`bulkhead_release_consumed_tokens{bulkhead="all",region="eu"}`:                      14, // the one release with usage
		`bulkhead_rate_wait_seconds{bulkhead="all",outcome="admitted",region="eu"}`:         0,
		`bulkhead_rate_wait_seconds{bulkhead="all",outcome="rejected",region="eu"}`:         0,
		`bulkhead_class_retry_budget_allowed{bulkhead="all",class="b",region="eu"}`:         2,
		`bulkhead_class_retry_budget_first_attempts{bulkhead="all",class="b",region="eu"}`:  1,
	})
	if _, ok := got[`bulkhead_class_retry_budget_allowed{bulkhead="all",class="a",region="eu"}`]; ok {
		t.Error("a class without a retry budget of its own has its families")
	}
	if n := got[`bulkhead_rate_wait_seconds{bulkhead="all",outcome="rejected",region="eu"}`].count; n != 1 {
		t.Errorf("rate_wait_seconds counted %d rejections, want 1", n)
	}
	matchesStats(t, got, st, `bulkhead="all",region="eu"`)

	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Every family is there but the fleet's seven and the two class
	// ceilings, which no class has.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); strings.HasPrefix(n, "bulkhead_fleet_") || strings.HasPrefix(n, "bulkhead_class_max_") {
			t.Errorf("family %s present", n)
		}
	}
	if len(mfs) != 73 {
		t.Errorf("%d families, want 73", len(mfs))
	}
}

func TestOptions(t *testing.T) {
	b, _ := newBulkhead(t, bulkhead.Config{MaxConcurrent: 1})
	for name, tc := range map[string]struct {
		b    *bulkhead.Bulkhead
		opts metrics.Options
		want string
	}{
		"nil bulkhead":        {nil, metrics.Options{}, "nil"},
		"equal buckets":       {b, metrics.Options{DurationBuckets: []float64{1, 1}}, "DurationBuckets"},
		"decreasing buckets":  {b, metrics.Options{TokenBuckets: []float64{2, 1}}, "TokenBuckets"},
		"own label":           {b, metrics.Options{ConstLabels: prometheus.Labels{"class": "x"}}, `"class"`},
		"name label":          {b, metrics.Options{ConstLabels: prometheus.Labels{"bulkhead": "x"}}, `"bulkhead"`},
		"invalid namespace":   {b, metrics.Options{Namespace: "bad-namespace"}, "bad-namespace"},
		"invalid label name":  {b, metrics.Options{ConstLabels: prometheus.Labels{"bad-label": "x"}}, "bad-label"},
		"invalid label value": {b, metrics.Options{Name: "\xff"}, "valid UTF-8"},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := metrics.New(tc.b, tc.opts)
			if err == nil {
				c.Close()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}

	// The defaults: the namespace and the buckets.
	c := newCollector(t, b, metrics.Options{})
	if n := testutil.CollectAndCount(c, "bulkhead_admitted_total"); n != 1 {
		t.Errorf("bulkhead_admitted_total: %d series, want 1", n)
	}
	reg := register(t, c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "bulkhead_queue_wait_seconds" {
			if n := len(mf.GetMetric()[0].GetHistogram().GetBucket()); n != len(metrics.DefaultDurationBuckets()) {
				t.Errorf("queue wait: %d buckets, want the %d default ones", n, len(metrics.DefaultDurationBuckets()))
			}
		}
		if mf.GetName() == "bulkhead_release_consumed_tokens" {
			if n := len(mf.GetMetric()[0].GetHistogram().GetBucket()); n != len(metrics.DefaultTokenBuckets()) {
				t.Errorf("consumed tokens: %d buckets, want the %d default ones", n, len(metrics.DefaultTokenBuckets()))
			}
		}
	}
	other := newCollector(t, b, metrics.Options{Namespace: "llm"})
	if n := testutil.CollectAndCount(other, "llm_admitted_total"); n != 1 {
		t.Errorf("llm_admitted_total: %d series, want 1", n)
	}
}
