package otelbulkhead_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
)

func TestAdmissionRecordedOnTheCallersSpan(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 2,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1000},
		Classes: &bulkhead.Classes{Default: "batch", Limits: map[string]bulkhead.ClassLimits{
			"batch": {}, "chat": {ProtectedConcurrent: 1},
		}}}, clk)
	x := newTraced(t, b, otelbulkhead.Options{Name: "main", Clock: clk})
	ctx, parent := x.parent(context.Background())

	var id bulkhead.ID
	_, err := otelbulkhead.Run(ctx, x.tr, hi, func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		id = rc.ID()
		if !trace.SpanFromContext(ctx).SpanContext().Equal(parent.SpanContext()) {
			t.Error("fn's context does not carry the caller's span")
		}
		clk.Add(3 * time.Second)
		return 0, rc.SetUsage(bulkhead.Usage{Input: 30, Output: 20, CachedInput: 10, Reasoning: 5})
	}, reserve(50, 100), bulkhead.WithTag("t1"))
	if err != nil {
		t.Fatal(err)
	}
	x.wait(t, "admit", "release")
	parent.End()

	s := x.ended(t, "chat gpt-4o")
	want(t, "span", attrs(s.Attributes()), map[string]any{
		"bulkhead.name":                          "main",
		"bulkhead.outcome":                       "admitted",
		"bulkhead.admission.id":                  id.String(),
		"bulkhead.class":                         "batch",
		"bulkhead.priority":                      "normal",
		"bulkhead.tag":                           "t1",
		"bulkhead.limit_revision":                int64(0),
		"bulkhead.borrowed.slot":                 true,
		"bulkhead.borrowed.tokens":               int64(150),
		"bulkhead.reservation.input_tokens":      int64(50),
		"bulkhead.reservation.max_output_tokens": int64(100),
		"bulkhead.reservation.tokens":            int64(150),
		"bulkhead.wait.total":                    0.0,
		"bulkhead.wait.queue":                    0.0,
		"bulkhead.wait.rate":                     0.0,
		"gen_ai.request.model":                   "gpt-4o",
		"gen_ai.request.max_tokens":              int64(100),
		"gen_ai.usage.input_tokens":              int64(30),
		"gen_ai.usage.output_tokens":             int64(20),
		"gen_ai.usage.cache_read.input_tokens":   int64(10),
		"gen_ai.usage.reasoning.output_tokens":   int64(5),
	})
	admitted := event(t, s, "bulkhead.admitted")
	want(t, "admitted", attrs(admitted.Attributes), map[string]any{"bulkhead.admission.id": id.String()})
	released := event(t, s, "bulkhead.released")
	want(t, "released", attrs(released.Attributes), map[string]any{
		"bulkhead.release.held_tokens":     int64(150),
		"bulkhead.release.refunded_tokens": int64(100),
		"gen_ai.usage.input_tokens":        int64(30),
		"gen_ai.usage.output_tokens":       int64(20),
	})
	if d := released.Time.Sub(admitted.Time); d != 3*time.Second {
		t.Errorf("released %v after admitted, want 3s", d)
	}
	if n := len(x.rec.Ended()); n != 1 {
		t.Errorf("%d spans, want the caller's alone", n)
	}
}

func TestQueuedCallRecordsItsQueueWaitOnAChildSpan(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1, MaxQueue: 1}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	first, err := b.Acquire(context.Background(), hi)
	if err != nil {
		t.Fatal(err)
	}
	x.wait(t, "admit")
	ctx, parent := x.parent(context.Background())
	start := clk.Now()
	got := make(chan *bulkhead.Permit, 1)
	go func() {
		p, err := x.tr.Acquire(ctx, hi)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	testutil.WaitFor(t, "the call to queue", func() bool { return b.Stats().Gate.Pending == 1 })
	clk.Add(2 * time.Second)
	if err := first.Release(nil); err != nil {
		t.Fatal(err)
	}
	p := <-got
	x.wait(t, "release", "admit")
	if n := len(x.rec.Ended()); n != 0 {
		t.Fatalf("%d spans ended before the release", n)
	}
	clk.Add(5 * time.Second)
	if err := p.Release(&bulkhead.Usage{Input: 7, Output: 3}); err != nil {
		t.Fatal(err)
	}
	x.wait(t, "release")
	parent.End()

	s := x.ended(t, "bulkhead.admission")
	if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindInternal {
		t.Errorf("span's parent %v, kind %v; want the caller's span, internal", s.Parent().SpanID(), s.SpanKind())
	}
	if !s.StartTime().Equal(start) || !s.EndTime().Equal(start.Add(7*time.Second)) {
		t.Errorf("span from %v to %v, want from the call (%v) to its release 7s later", s.StartTime(), s.EndTime(), start)
	}
	want(t, "span", attrs(s.Attributes()), map[string]any{
		"bulkhead.outcome":           "admitted",
		"bulkhead.wait.queue":        2.0,
		"bulkhead.wait.total":        2.0,
		"bulkhead.wait.rate":         0.0,
		"gen_ai.usage.input_tokens":  int64(7),
		"gen_ai.usage.output_tokens": int64(3),
	})
	if at := event(t, s, "bulkhead.admitted").Time; !at.Equal(start.Add(2 * time.Second)) {
		t.Errorf("admitted at %v, want 2s after the call", at)
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v, want unset", s.Status())
	}
}

func TestPacedCallRecordsItsRateWait(t *testing.T) {
	clk := newArmedClock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4,
		RateLimits: &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	p, err := b.Acquire(context.Background(), hi)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Release(nil)
	x.wait(t, "admit", "release")
	done := make(chan error, 1)
	go func() {
		_, err := otelbulkhead.Run(context.Background(), x.tr, hi, func(context.Context, *bulkhead.RunContext) (int, error) { return 0, nil })
		done <- err
	}()
	if d := <-clk.armed; d != time.Second {
		t.Fatalf("paced for %v, want 1s", d)
	}
	clk.Add(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	x.wait(t, "admit", "release")
	s := x.ended(t, "bulkhead.admission")
	want(t, "span", attrs(s.Attributes()), map[string]any{
		"bulkhead.outcome":    "admitted",
		"bulkhead.wait.rate":  1.0,
		"bulkhead.wait.queue": 0.0,
		"bulkhead.wait.total": 1.0,
	})
}

func TestCooldownHoldIsRecordedAsQueueWait(t *testing.T) {
	clk := newArmedClock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, MaxQueue: 4}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := otelbulkhead.Run(context.Background(), x.tr, hi, func(context.Context, *bulkhead.RunContext) (int, error) { return 0, nil })
		done <- err
	}()
	if d := <-clk.armed; d != 2*time.Second {
		t.Fatalf("held for %v, want 2s", d)
	}
	clk.Add(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	x.wait(t, "admit", "release")
	want(t, "span", attrs(x.ended(t, "bulkhead.admission").Attributes()), map[string]any{
		"bulkhead.outcome":    "admitted",
		"bulkhead.wait.queue": 2.0,
		"bulkhead.wait.total": 2.0,
	})
}

// TestRejectionRecordsItsReasonAndNumbers refuses a call for each kind of
// reason and checks the span: the reason, the error's message and the
// numbers of its detail, as the log has them.
func TestRejectionRecordsItsReasonAndNumbers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    bulkhead.Config
		setup  func(t *testing.T, b *bulkhead.Bulkhead, clk *armedClock) context.Context
		call   []bulkhead.Option
		reason bulkhead.Reason
		// attrs are more attributes of the span, and numbers attributes
		// of its bulkhead.rejected event.
		attrs, numbers map[string]any
		// noEvent says the bulkhead emits no event for the rejection.
		noEvent bool
	}{{
		name: "concurrency", cfg: bulkhead.Config{MaxConcurrent: 1},
		setup: holdOne, reason: bulkhead.ConcurrencyLimit,
		numbers: map[string]any{"bulkhead.rejection.detail.in_flight": int64(1), "bulkhead.rejection.detail.max_concurrent": int64(1)},
	}, {
		name: "queue", cfg: bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1},
		setup: func(t *testing.T, b *bulkhead.Bulkhead, clk *armedClock) context.Context {
			queued := make(chan struct{})
			t.Cleanup(func() { <-queued }) // after the slot's release
			holdOne(t, b, clk)
			go func() {
				defer close(queued)
				if p, err := b.Acquire(context.Background(), hi); err == nil {
					_ = p.Release(nil)
				}
			}()
			testutil.WaitFor(t, "a call to queue", func() bool { return b.Stats().Gate.Pending == 1 })
			return context.Background()
		},
		reason:  bulkhead.QueueLimit,
		numbers: map[string]any{"bulkhead.rejection.detail.pending": int64(1), "bulkhead.rejection.detail.max_queue": int64(1)},
	}, {
		name: "timeout", cfg: bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Second},
		setup: func(t *testing.T, b *bulkhead.Bulkhead, clk *armedClock) context.Context {
			holdOne(t, b, clk)
			go func() {
				<-clk.armed
				clk.Add(time.Second)
			}()
			return context.Background()
		},
		reason: bulkhead.Timeout,
		attrs:  map[string]any{"bulkhead.wait.queue": 1.0, "bulkhead.wait.total": 1.0},
	}, {
		name: "budget", cfg: bulkhead.Config{MaxConcurrent: 1, TokenBudget: &bulkhead.TokenBudget{Budget: 100}},
		call: []bulkhead.Option{reserve(80, 80)}, reason: bulkhead.BudgetLimit,
		numbers: map[string]any{"bulkhead.rejection.detail.token_budget.reserved": int64(160),
			"bulkhead.rejection.detail.token_budget.budget": int64(100), "bulkhead.rejection.detail.never_fits": true},
	}, {
		name: "rate", cfg: bulkhead.Config{MaxConcurrent: 1, RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}},
		setup: func(t *testing.T, b *bulkhead.Bulkhead, _ *armedClock) context.Context {
			p, err := b.Acquire(context.Background(), hi)
			if err != nil {
				t.Fatal(err)
			}
			_ = p.Release(nil)
			return context.Background()
		},
		reason: bulkhead.RateLimit,
		attrs:  map[string]any{"bulkhead.retry_after": 1.0},
		numbers: map[string]any{"bulkhead.rejection.detail.rate.retry_after": 1.0, "bulkhead.rejection.detail.rate.per_minute": 60.0,
			"bulkhead.rejection.detail.rate.scope": "model", "bulkhead.rejection.detail.rate.key": "gpt-4o"},
	}, {
		name: "cooldown", cfg: bulkhead.Config{MaxConcurrent: 1},
		setup: func(t *testing.T, b *bulkhead.Bulkhead, _ *armedClock) context.Context {
			if err := b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 5 * time.Second}); err != nil {
				t.Fatal(err)
			}
			return context.Background()
		},
		reason:  bulkhead.Cooldown,
		attrs:   map[string]any{"bulkhead.retry_after": 5.0},
		numbers: map[string]any{"bulkhead.rejection.detail.cooldown.model": "gpt-4o", "bulkhead.rejection.detail.cooldown.retry_after": 5.0},
	}, {
		name: "aborted", cfg: bulkhead.Config{MaxConcurrent: 1},
		setup: func(*testing.T, *bulkhead.Bulkhead, *armedClock) context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		},
		reason:  bulkhead.Aborted,
		numbers: map[string]any{"bulkhead.rejection.cause": "context canceled"},
	}, {
		name: "shutdown", cfg: bulkhead.Config{MaxConcurrent: 1},
		setup: func(t *testing.T, b *bulkhead.Bulkhead, _ *armedClock) context.Context {
			shutdown(t, b)
			return context.Background()
		},
		reason: bulkhead.Shutdown, noEvent: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newArmedClock()
			tc.cfg.Model = "gpt-4o"
			b := newBulkhead(t, tc.cfg, clk)
			x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
			ctx := context.Background()
			if tc.setup != nil {
				ctx = tc.setup(t, b, clk)
			}
			ctx, parent := x.parent(ctx)
			_, err := x.tr.Acquire(ctx, hi, tc.call...)
			rej := testutil.WantReason(t, err, tc.reason)
			if !tc.noEvent {
				x.until(t, "reject")
			}
			parent.End()
			s := x.ended(t, "bulkhead.admission")
			w := map[string]any{"bulkhead.outcome": "rejected", "bulkhead.reason": tc.reason.String(), "error.type": tc.reason.String()}
			for k, v := range tc.attrs {
				w[k] = v
			}
			want(t, "span", attrs(s.Attributes()), w)
			if s.Status().Code != codes.Error || s.Status().Description != rej.Error() {
				t.Errorf("status %+v, want an error with the rejection's message", s.Status())
			}
			e := event(t, s, "bulkhead.rejected")
			n := map[string]any{"bulkhead.rejection.reason": tc.reason.String(), "bulkhead.rejection.msg": rej.Error()}
			for k, v := range tc.numbers {
				n[k] = v
			}
			want(t, "bulkhead.rejected", attrs(e.Attributes), n)
			if tc.reason != bulkhead.Timeout {
				if _, ok := attrs(s.Attributes())["bulkhead.wait.queue"]; !ok && !tc.noEvent {
					t.Error("no bulkhead.wait.queue: the reject event's timing was not recorded")
				}
			}
		})
	}
}

// holdOne takes b's only slot until the test ends.
func holdOne(t *testing.T, b *bulkhead.Bulkhead, _ *armedClock) context.Context {
	t.Helper()
	p, err := b.Acquire(context.Background(), hi)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release(nil) })
	return context.Background()
}

func TestBypassedCallRecordsWhatItWasSpared(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 0}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	_, err := otelbulkhead.Run(context.Background(), x.tr, hi, func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
		if rc.Bypass() == nil {
			t.Error("admitted, want bypassed")
		}
		return 0, rc.SetUsage(bulkhead.Usage{Input: 4, Output: 2})
	}, bulkhead.WithMode(bulkhead.Observe))
	if err != nil {
		t.Fatal(err)
	}
	x.wait(t, "bypass_release")
	s := x.ended(t, "bulkhead.admission")
	want(t, "span", attrs(s.Attributes()), map[string]any{
		"bulkhead.outcome":           "bypassed",
		"bulkhead.reason":            "concurrency_limit",
		"gen_ai.usage.input_tokens":  int64(4),
		"gen_ai.usage.output_tokens": int64(2),
	})
	want(t, "bypassed", attrs(event(t, s, "bulkhead.bypassed").Attributes), map[string]any{
		"bulkhead.reason": "concurrency_limit", "bulkhead.bypass.race": false,
		"bulkhead.bypass.detail.max_concurrent": int64(0),
	})
}

func TestAbandonedSlotIsRecorded(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 2,
		Classes: &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}}}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	p, err := x.tr.Acquire(context.Background(), hi)
	if err != nil {
		t.Fatal(err)
	}
	if !p.AbandonBorrowedConcurrency() {
		t.Fatal("the slot was not borrowed")
	}
	_ = p.Release(nil)
	x.wait(t, "admit", "release")
	e := event(t, x.ended(t, "bulkhead.admission"), "bulkhead.abandoned")
	want(t, "abandoned", attrs(e.Attributes), map[string]any{"bulkhead.abandon.cause": "manual"})
}

func TestUntracedCallsAreNotRecorded(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1}, clk)
	x := newTraced(t, b, otelbulkhead.Options{Clock: clk})
	// No span in the context: the caller's span does not record.
	p, err := x.tr.Acquire(context.Background(), hi)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Release(nil)
	// A child span the sampler drops.
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = never.Shutdown(context.Background()) })
	child, err := otelbulkhead.NewTracer(b, otelbulkhead.Options{TracerProvider: never, ChildSpan: true})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Close()
	if _, err := otelbulkhead.Run(context.Background(), child, hi, func(context.Context, *bulkhead.RunContext) (int, error) { return 0, nil }); err != nil {
		t.Fatal(err)
	}
	x.wait(t, "admit", "release", "admit", "release")
	if n := len(x.rec.Ended()); n != 0 {
		t.Errorf("%d spans recorded, want none", n)
	}
}

func TestInvalidCallIsRecordedAsAnError(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	_, err := x.tr.Acquire(context.Background(), &bulkhead.Request{MaxTokens: -1})
	if !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("err %v, want ErrInvalid", err)
	}
	s := x.ended(t, "bulkhead.admission")
	want(t, "span", attrs(s.Attributes()), map[string]any{"bulkhead.outcome": "error", "bulkhead.error": err.Error()})
	if s.Status().Code != codes.Error {
		t.Errorf("status %v, want error", s.Status())
	}
}

func TestCloseEndsTheSpansStillOpen(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1}, clk)
	x := newTraced(t, b, otelbulkhead.Options{ChildSpan: true, Clock: clk})
	p, err := x.tr.Acquire(context.Background(), hi)
	if err != nil {
		t.Fatal(err)
	}
	x.wait(t, "admit")
	if n := len(x.rec.Ended()); n != 0 {
		t.Fatalf("%d spans ended while the admission is held", n)
	}
	x.tr.Close()
	x.tr.Close()
	want(t, "span", attrs(x.ended(t, "bulkhead.admission").Attributes()), map[string]any{"bulkhead.outcome": "admitted"})
	_ = p.Release(nil)
	// After Close, calls go straight to the bulkhead.
	ctx, parent := x.parent(context.Background())
	if p, err = x.tr.Acquire(ctx, hi); err != nil {
		t.Fatal(err)
	}
	_ = p.Release(nil)
	parent.End()
	if n := len(x.rec.Ended()); n != 2 {
		t.Errorf("%d spans, want the admission's and the caller's", n)
	}
}

func TestNewTracerRefusesANilBulkhead(t *testing.T) {
	if _, err := otelbulkhead.NewTracer(nil, otelbulkhead.Options{}); err == nil {
		t.Error("no error")
	}
	if _, err := otelbulkhead.NewMetrics(nil, otelbulkhead.Options{}); err == nil {
		t.Error("no error")
	}
}
