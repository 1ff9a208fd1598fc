package bulkhead_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// TestRejectionMessages: each rejection's one-line message carries the
// numbers that decided it, and the tag.
func TestRejectionMessages(t *testing.T) {
	bg := context.Background()
	t.Run("budget", func(t *testing.T) {
		b := budgetBulkhead(t, 4, 8000, 0)
		held := mustAcquire(t, b, req("a", 0), override(6000, 800))
		defer held.Release(nil)
		_, err := b.Acquire(bg, req("a", 0), override(4000, 1000), bulkhead.WithTag("req-7"))
		rej := wantReason(t, err, bulkhead.BudgetLimit)
		want := `bulkhead: rejected: budget_limit: 5000 tokens requested, 1200 of 8000 available (tag "req-7")`
		if err.Error() != want || rej.Tag != "req-7" || rej.NeverFits() {
			t.Fatalf("message = %q, NeverFits %v; want %q", err, rej.NeverFits(), want)
		}
	})
	t.Run("never fits", func(t *testing.T) {
		b := budgetBulkhead(t, 4, 8000, 1000)
		_, err := b.Acquire(bg, req("a", 0), override(7000, 500))
		rej := wantReason(t, err, bulkhead.BudgetLimit)
		want := "bulkhead: rejected: budget_limit: 7500 tokens requested, 7000 of 7000 available (never fits)"
		if err.Error() != want || !rej.NeverFits() || !rej.Detail.NeverFits {
			t.Fatalf("message = %q; want %q", err, want)
		}
		// A High call may use the reserve: the same reservation fits.
		mustAcquire(t, b, req("a", 0), override(7000, 500), bulkhead.WithPriority(bulkhead.High)).Release(nil)
	})
	t.Run("concurrency and queue", func(t *testing.T) {
		b := newBulkhead(t, bulkhead.Interactive("", 1))
		held := mustAcquire(t, b, req("a", 0))
		_, err := b.Acquire(bg, req("a", 0))
		if want := "bulkhead: rejected: concurrency_limit: 1 of 1 in flight, no queue"; err.Error() != want {
			t.Fatalf("message = %q, want %q", err, want)
		}
		_ = held.Release(nil)
		cfg := bulkhead.Batch("", 1)
		cfg.MaxQueue = 1
		q := newBulkhead(t, cfg)
		held = mustAcquire(t, q, req("a", 0))
		w := acquireAsync(bg, q, req("w", 0))
		testutil.WaitFor(t, "the waiter to queue", pending(q))
		_, err = q.Acquire(bg, req("a", 0))
		if want := "bulkhead: rejected: queue_limit: 1 of 1 in flight, 1 of 1 queued"; err.Error() != want {
			t.Fatalf("message = %q, want %q", err, want)
		}
		_ = held.Release(nil)
		_ = (<-w).tok.Release(nil)
	})
	t.Run("kill switch", func(t *testing.T) {
		b := newBulkhead(t, bulkhead.Interactive("", 0))
		_, err := b.Acquire(bg, req("a", 0))
		rej := wantReason(t, err, bulkhead.ConcurrencyLimit)
		if want := "bulkhead: rejected: concurrency_limit: MaxConcurrent is 0: closed to new calls"; err.Error() != want || rej.NeverFits() {
			t.Fatalf("message = %q, want %q", err, want)
		}
	})
	t.Run("class ceiling and protection", func(t *testing.T) {
		cfg := probedConfig()
		cfg.Classes.Limits["off"] = bulkhead.ClassLimits{MaxConcurrent: bulkhead.Ceiling(0)}
		b := newBulkhead(t, cfg)
		_, err := b.Acquire(bg, req("a", 0), bulkhead.WithClass("off"))
		rej := wantReason(t, err, bulkhead.ConcurrencyLimit)
		if want := `bulkhead: rejected: concurrency_limit: class "off": 0 of 0 in flight under the class ceiling (never fits)`; err.Error() != want || !rej.NeverFits() {
			t.Fatalf("message = %q, want %q", err, want)
		}
		b1 := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithClass("bg"))
		b2 := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithClass("bg"))
		_, err = b.Acquire(bg, req("a", 0), override(10, 10), bulkhead.WithClass("bg"))
		if want := `bulkhead: rejected: concurrency_limit: class "bg": 2 of 2 in flight under the class ceiling`; err.Error() != want {
			t.Fatalf("message = %q, want %q", err, want)
		}
		f1 := mustAcquire(t, b, req("a", 0), override(10, 10))
		_, err = b.Acquire(bg, req("a", 0), override(10, 10))
		if want := `bulkhead: rejected: concurrency_limit: class "fg": would borrow a shared slot, 2 of 2 in use`; err.Error() != want {
			t.Fatalf("message = %q, want %q", err, want)
		}
		for _, p := range []*bulkhead.Permit{b1, b2, f1} {
			_ = p.Release(nil)
		}
	})
	t.Run("timeout aborted shutdown", func(t *testing.T) {
		clk := clock.NewMock()
		cfg := bulkhead.Batch("", 1)
		cfg.Clock = clk
		b := newBulkhead(t, cfg)
		held := mustAcquire(t, b, req("a", 0))
		w := acquireAsync(bg, b, req("w", 0), bulkhead.WithQueueTimeout(time.Second))
		testutil.WaitFor(t, "the waiter to queue", pending(b))
		clk.Add(time.Second)
		if err, want := (<-w).err, "bulkhead: rejected: timeout: queue timeout expired, 1 of 1 in flight, 0 of 20 queued"; err == nil || err.Error() != want {
			t.Fatalf("message = %v, want %q", err, want)
		}
		done, cancel := context.WithCancel(bg)
		cancel()
		if _, err := b.Acquire(done, req("a", 0)); err == nil || err.Error() != "bulkhead: rejected: aborted: the context ended before admission: context canceled" {
			t.Fatalf("aborted message = %v", err)
		}
		_ = held.Release(nil)
		b.Close()
		if _, err := b.Acquire(bg, req("a", 0)); err == nil || err.Error() != "bulkhead: rejected: shutdown: the bulkhead is closed" {
			t.Fatalf("shutdown message = %v", err)
		}
	})
}

// TestTagOnEveryArtefact: a call's tag is on its permit, on each of its
// events and on its rejection.
func TestTagOnEveryArtefact(t *testing.T) {
	cfg := probedConfig()
	b := newBulkhead(t, cfg)
	var mu sync.Mutex
	tags := map[string]string{}
	note := func(kind, tag string) { mu.Lock(); tags[kind] = tag; mu.Unlock() }
	b.Subscribe(bulkhead.Hooks{
		Admit:   func(e bulkhead.AdmitEvent) { note("admit", e.Tag) },
		Reject:  func(e bulkhead.RejectEvent) { note("reject", e.Tag) },
		Release: func(e bulkhead.ReleaseEvent) { note("release", e.Tag) },
		Usage:   func(e bulkhead.UsageEvent) { note("usage", e.Tag) },
		Abandon: func(e bulkhead.AbandonEvent) { note("abandon", e.Tag) },
	})
	p := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithClass("bg"), bulkhead.WithTag("tenant-a"))
	if p.Tag() != "tenant-a" {
		t.Fatalf("Permit.Tag = %q", p.Tag())
	}
	if _, err := p.ReportUsage(bulkhead.Usage{Input: 10, Output: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if !p.AbandonBorrowedConcurrency() {
		t.Fatal("abandon")
	}
	_ = p.Release(nil)
	_, err := b.Acquire(context.Background(), req("a", 0), override(1e6, 0), bulkhead.WithTag("tenant-b"))
	if rej := wantReason(t, err, bulkhead.BudgetLimit); rej.Tag != "tenant-b" {
		t.Fatalf("RejectedError.Tag = %q", rej.Tag)
	}
	closeAndDrain(t, b)
	want := map[string]string{"admit": "tenant-a", "usage": "tenant-a", "abandon": "tenant-a", "release": "tenant-a", "reject": "tenant-b"}
	if fmt.Sprint(tags) != fmt.Sprint(want) {
		t.Fatalf("tags = %v, want %v", tags, want)
	}
	if _, err := b.Acquire(context.Background(), req("a", 0), bulkhead.WithTag(strings.Repeat("x", bulkhead.MaxTagLen+1))); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("an oversized tag = %v", err)
	}
	if _, err := b.WouldAdmit(req("a", 0), bulkhead.WithTag("t")); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("WithTag on WouldAdmit, which has nothing to carry it = %v", err)
	}
}

// TestLogValuesAndFormatting: errors and details log their numbers through
// slog, and %v prints values where the structs hold pointers.
func TestLogValuesAndFormatting(t *testing.T) {
	b := budgetBulkhead(t, 4, 100, 0)
	_, err := b.Acquire(context.Background(), req("a", 0), override(100, 1), bulkhead.WithTag("t1"))
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("shed", "err", err)
	for _, want := range []string{`"reason":"budget_limit"`, `"tag":"t1"`, `"reserved":101`, `"effective_budget":100`, `"never_fits":true`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log %s lacks %s", buf.String(), want)
		}
	}
	var rej *bulkhead.RejectedError
	errors.As(err, &rej)
	for _, s := range []string{fmt.Sprintf("%v", rej.Detail), fmt.Sprintf("%+v", *rej.Detail), fmt.Sprint(b.Stats()), fmt.Sprint(b.Limits())} {
		if strings.Contains(s, "0x") {
			t.Errorf("%%v prints a pointer: %s", s)
		}
	}
	if s := fmt.Sprint(rej.Detail); !strings.Contains(s, "TokenBudget:{Budget:100 EffectiveBudget:100 InFlightTokens:0 Available:100 Reserved:101}") {
		t.Errorf("detail = %s", s)
	}
	buf.Reset()
	ce := &bulkhead.ConfigError{Field: "Config.MaxQueue", Problem: "must be >= 0, got -1"}
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("bad", "err", ce)
	if !strings.Contains(buf.String(), `"field":"Config.MaxQueue"`) {
		t.Errorf("ConfigError log = %s", buf.String())
	}
}

// TestShutdown closes and drains in one call.
func TestShutdown(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Interactive("", 2))
	if err != nil {
		t.Fatal(err)
	}
	p := mustAcquire(t, b, req("a", 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := b.Shutdown(ctx); res.Drained || res.InFlight != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with work in flight and an ended ctx = %+v, %v", res, err)
	}
	if _, err := b.Acquire(context.Background(), req("a", 0)); !errors.Is(err, bulkhead.ErrShutdown) {
		t.Fatalf("after Shutdown: %v", err)
	}
	_ = p.Release(nil)
	if res, err := b.Shutdown(context.Background()); !res.Drained || err != nil {
		t.Fatalf("Shutdown = %+v, %v", res, err)
	}
	//lint:ignore SA1012 a nil context is the input under test
	if _, err := b.Shutdown(nil); !errors.Is(err, bulkhead.ErrInvalid) { //nolint:staticcheck
		t.Fatalf("Shutdown(nil) = %v", err)
	}
}

// TestNilPermit: the methods of a nil permit, as a rejection returns it, do
// nothing harmful.
func TestNilPermit(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("", 0))
	p, err := b.Acquire(context.Background(), req("a", 0))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	if p != nil {
		t.Fatal("a rejection returned a permit")
	}
	if err := p.Release(nil); err != nil {
		t.Fatalf("Release on nil = %v", err)
	}
	if _, err := p.ReportUsage(bulkhead.Usage{}, nil); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("ReportUsage on nil = %v", err)
	}
	if p.ID() != (bulkhead.ID{}) || p.Reservation() != nil || p.Class() != "" || p.Tag() != "" || p.AbandonBorrowedConcurrency() || p.LimitRevision() != 0 {
		t.Fatal("nil permit accessors")
	}
	if st := b.Stats(); st.Gate.DoubleReleases != 0 {
		t.Fatalf("a nil release counted: %+v", st.Gate)
	}
}

// TestRunGoexit: runtime.Goexit in fn exits Run's goroutine too (as it
// would without a bulkhead), after the release; Run does not report
// success. With a borrowed-slot deadline fn runs on its own goroutine, and
// the Goexit is carried over to Run's.
func TestRunGoexit(t *testing.T) {
	for _, deadline := range []bool{false, true} {
		t.Run(fmt.Sprint("deadline=", deadline), func(t *testing.T) {
			b := newBulkhead(t, probedConfig())
			opts := []bulkhead.Option{bulkhead.WithClass("bg"), override(1, 1)}
			if deadline {
				opts = append(opts, bulkhead.WithBorrowedDeadline(time.Hour))
			}
			returned := make(chan error, 1)
			exited := make(chan struct{})
			go func() {
				defer close(exited)
				_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
					runtime.Goexit()
					return 1, nil
				}, opts...)
				returned <- err
			}()
			<-exited
			select {
			case err := <-returned:
				t.Fatalf("Run returned %v after fn called Goexit", err)
			default:
			}
			testutil.WaitFor(t, "the release", func() bool { return b.Stats().Calls.Released == 1 })
		})
	}
}

// recordingHandler is a slog handler that hands records to a channel.
type recordingHandler struct{ records chan slog.Record }

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordingHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.records <- r:
	default:
	}
	return nil
}
func (h recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordingHandler) WithGroup(string) slog.Handler      { return h }

// TestRunPanicAfterDeadline: a callback that panics after Run has returned
// on its borrowed-slot deadline has nobody to reach; the panic is logged,
// the process lives on and the tokens are settled.
func TestRunPanicAfterDeadline(t *testing.T) {
	clk := clock.NewMock()
	cfg := probedConfig()
	cfg.Clock = clk
	records := make(chan slog.Record, 16)
	cfg.Logger = slog.New(recordingHandler{records})
	b := newBulkhead(t, cfg)
	started := make(chan struct{})
	out := make(chan error, 1)
	go func() {
		_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(ctx context.Context, _ *bulkhead.RunContext) (int, error) {
			close(started)
			<-ctx.Done()
			panic("late failure")
		}, bulkhead.WithClass("bg"), override(5, 5), bulkhead.WithBorrowedDeadline(time.Millisecond))
		out <- err
	}()
	<-started
	clk.Add(time.Millisecond)
	if err := <-out; !errors.Is(err, bulkhead.ErrBorrowedDeadline) {
		t.Fatalf("Run = %v", err)
	}
	for r := range records {
		if strings.Contains(r.Message, "panicked after its borrowed-slot deadline") {
			break
		}
	}
	testutil.WaitFor(t, "the late release", func() bool { return b.Stats().TokenBudget.InFlightTokens == 0 })
}

// panickyHandler is a slog handler that panics on every record.
type panickyHandler struct{}

func (panickyHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (panickyHandler) Handle(context.Context, slog.Record) error { panic("broken logger") }
func (h panickyHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panickyHandler) WithGroup(string) slog.Handler           { return h }

// TestPanickingLogger: a logger whose handler panics loses its records,
// nothing else: New works, and a panicking listener (whose warning the
// logger would write) does not end event delivery.
func TestPanickingLogger(t *testing.T) {
	cfg := bulkhead.Interactive("", 2)
	cfg.Logger = slog.New(panickyHandler{})
	b := newBulkhead(t, cfg)
	var mu sync.Mutex
	seen := 0
	b.Subscribe(bulkhead.Hooks{Admit: func(bulkhead.AdmitEvent) {
		mu.Lock()
		seen++
		mu.Unlock()
		panic("listener")
	}})
	for range 3 {
		mustAcquire(t, b, req("a", 0)).Release(nil)
	}
	testutil.WaitFor(t, "every admit delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen == 3
	})
	if st := b.Stats(); st.Events.ListenerPanics != 3 {
		t.Fatalf("ListenerPanics = %d", st.Events.ListenerPanics)
	}
}

// TestEventBacklog: a blocked listener's undelivered events show in Stats.
func TestEventBacklog(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("", 2))
	block := make(chan struct{})
	b.Subscribe(bulkhead.Hooks{Release: func(bulkhead.ReleaseEvent) { <-block }})
	for range 3 {
		mustAcquire(t, b, req("a", 0)).Release(nil)
	}
	testutil.WaitFor(t, "the backlog", func() bool { return b.Stats().Events.Backlog == 3 })
	close(block)
	testutil.WaitFor(t, "the backlog to clear", func() bool { return b.Stats().Events.Backlog == 0 })
}

// TestModelOnlyForTheDefaultEstimator: the default estimator reads
// Config.Model; a request's own Model still wins.
func TestModelOnlyForTheDefaultEstimator(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1 << 20}
	b := newBulkhead(t, cfg)
	r := &bulkhead.Request{Messages: []bulkhead.Message{{Content: strings.Repeat("a", 37)}}, MaxTokens: 100}
	if got, err := b.Estimate(r); err != nil || *got != (bulkhead.Reservation{Input: 10, MaxOutput: 100, Reserved: 110}) {
		t.Fatalf("Estimate = %+v, %v", got, err)
	}
	r.Model = "mystery"
	if got, _ := b.Estimate(r); got.Input != 10 { // ceil(37/4)
		t.Fatalf("unknown model estimate = %+v", got)
	}
}

// TestReasonsAndSentinels: each reason has its own wire name and sentinel,
// matched by its rejections and by no other reason's.
func TestReasonsAndSentinels(t *testing.T) {
	seen := map[string]bool{}
	for why, s := range sentinel {
		name := why.String()
		if name == "" || seen[name] || !strings.HasSuffix(s.Error(), name) {
			t.Fatalf("reason %d: name %q, sentinel %v", why, name, s)
		}
		seen[name] = true
		err := fmt.Errorf("wrapped: %w", &bulkhead.RejectedError{Reason: why})
		if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, s) {
			t.Fatalf("%v does not match its sentinels", err)
		}
		for other, os := range sentinel {
			if other != why && errors.Is(err, os) {
				t.Fatalf("%v matches the sentinel of %v", err, other)
			}
		}
		if b, _ := why.MarshalText(); string(b) != name {
			t.Fatalf("MarshalText = %q", b)
		}
	}
	if len(seen) != 12 || bulkhead.Reason(0).String() != "" || bulkhead.Reason(200).String() != "reason(200)" {
		t.Fatalf("reason table: %v", seen)
	}
	bde := fmt.Errorf("wrapped: %w", &bulkhead.BorrowedDeadlineError{Class: "bg"})
	if !errors.Is(bde, bulkhead.ErrBorrowedDeadline) || errors.Is(bde, bulkhead.ErrRejected) {
		t.Fatal("BorrowedDeadlineError sentinels")
	}
}

// TestTagOnAsyncRejection: AcquireAsync's rejection carries the tag too.
func TestTagOnAsyncRejection(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("", 0))
	f := b.AcquireAsync(context.Background(), req("a", 0), bulkhead.WithTag("async-1"))
	<-f.Done()
	_, err := f.Result()
	if rej := wantReason(t, err, bulkhead.ConcurrencyLimit); rej.Tag != "async-1" {
		t.Fatalf("tag = %q", rej.Tag)
	}
}

// TestNoSharedMemory: a usage report and each listener's events have
// memory of their own: editing one changes no other.
func TestNoSharedMemory(t *testing.T) {
	b := budgetBulkhead(t, 4, 10_000, 0)
	type seen struct{ cap, rem, margin, input int64 }
	got := make(chan seen, 4)
	mutated := make(chan struct{})
	b.Subscribe(bulkhead.Hooks{
		Usage: func(e bulkhead.UsageEvent) {
			<-mutated
			*e.OutputCap, *e.OutputRemaining, e.Progressive.SafetyMargin = -7, -7, -7
		},
		Release: func(e bulkhead.ReleaseEvent) { e.Usage.Input = -7 },
	})
	b.Subscribe(bulkhead.Hooks{
		Usage: func(e bulkhead.UsageEvent) {
			got <- seen{*e.OutputCap, *e.OutputRemaining, e.Progressive.SafetyMargin, 0}
		},
		Release: func(e bulkhead.ReleaseEvent) { got <- seen{input: e.Usage.Input} },
	})
	p := mustAcquire(t, b, req("a", 0), override(10, 100))
	rep, err := p.ReportUsage(bulkhead.Usage{Input: 10, Output: 5}, &bulkhead.Progressive{RemainingOutput: 50, SafetyMargin: 3})
	if err != nil {
		t.Fatal(err)
	}
	*rep.OutputCap, *rep.OutputRemaining = -1, -1
	close(mutated)
	_ = p.Release(&bulkhead.Usage{Input: 10, Output: 20})
	if u, r := <-got, <-got; u != (seen{100, 95, 3, 0}) || r.input != 10 {
		t.Fatalf("the second listener saw %+v and %+v", u, r)
	}
	for _, s := range []string{fmt.Sprint(rep), fmt.Sprint(bulkhead.ReleaseEvent{Usage: &bulkhead.Usage{Input: 1}}), fmt.Sprint(bulkhead.UsageEvent{OutputCap: rep.OutputCap})} {
		if strings.Contains(s, "0x") {
			t.Errorf("%%v prints a pointer: %s", s)
		}
	}
	if msg := (&bulkhead.RejectedError{}).Error(); msg != "bulkhead: rejected" {
		t.Errorf("zero RejectedError = %q", msg)
	}
}

// TestNeverFitsThroughTheSharedPool: a call whose class has no floor can
// never borrow more than the shared pool holds.
func TestNeverFitsThroughTheSharedPool(t *testing.T) {
	cfg := bulkhead.Interactive("", 2)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000, Estimator: estimatorFunc(nil)}
	cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{
		"a": {}, "b": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 600},
	}}
	b := newBulkhead(t, cfg)
	_, err := b.Acquire(context.Background(), req("x", 0), override(0, 700))
	if rej := wantReason(t, err, bulkhead.BudgetLimit); !rej.NeverFits() {
		t.Fatalf("700 tokens against a shared pool of 400 = %v, NeverFits false", err)
	}
	p, err := b.Acquire(context.Background(), req("x", 0), override(0, 300))
	if err != nil {
		t.Fatalf("300 tokens fit the shared pool: %v", err)
	}
	_ = p.Release(nil)
	cfg.Classes.Limits["b"] = bulkhead.ClassLimits{ProtectedConcurrent: 2}
	cfg.TokenBudget.Budget = 10
	b2 := newBulkhead(t, cfg)
	_, err = b2.Acquire(context.Background(), req("x", 0), override(0, 1))
	if rej := wantReason(t, err, bulkhead.ConcurrencyLimit); !rej.NeverFits() {
		t.Fatalf("no floor and no shared slot = %v, NeverFits false", err)
	}
}
