package bulkhead_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// probedConfig is the reference's probed class setup: 3 slots, a
// foreground class with a floor of 1, a background class with a ceiling of
// 2, and a token budget.
func probedConfig() bulkhead.Config {
	cfg := bulkhead.Interactive("gpt-4o", 3)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	cfg.Classes = &bulkhead.Classes{
		Default: "fg",
		Limits: map[string]bulkhead.ClassLimits{
			"fg": {ProtectedConcurrent: 1},
			"bg": {MaxConcurrent: bulkhead.Ceiling(2)},
		},
	}
	return cfg
}

func TestClassesProbedScenario(t *testing.T) {
	b := newBulkhead(t, probedConfig())
	bg := bulkhead.WithClass("bg")
	b1 := mustAcquire(t, b, req("a", 0), override(10, 10), bg)
	b2 := mustAcquire(t, b, req("a", 0), override(10, 10), bg)
	for _, tok := range []*bulkhead.Permit{b1, b2} {
		if tok.Class() != "bg" || tok.Resources() != (bulkhead.Resources{BorrowedConcurrency: true, BorrowedTokens: 20}) {
			t.Fatalf("bg admission: class %q, resources %+v", tok.Class(), tok.Resources())
		}
	}
	_, err := b.Acquire(context.Background(), req("a", 0), override(10, 10), bg)
	rej := wantReason(t, err, bulkhead.ConcurrencyLimit)
	if rej.Detail.Constraint != bulkhead.ConstraintClass || rej.Detail.Class == nil || rej.Detail.Class.Name != "bg" {
		t.Fatalf("third bg detail = %+v", rej.Detail)
	}
	f1 := mustAcquire(t, b, req("a", 0), override(10, 10)) // default class
	if f1.Class() != "fg" || f1.Resources().BorrowedConcurrency {
		t.Fatalf("fg within its floor: class %q, resources %+v", f1.Class(), f1.Resources())
	}
	if f1.AbandonBorrowedConcurrency() {
		t.Fatal("a protected slot was abandoned")
	}
	_ = b1.Release(nil)
	// Now 2 slots are used (bg, fg) and one is free, but it is the shared
	// pool's (3 - 1 floor = 2 shared, 1 used by bg): a second fg borrows it.
	f2 := mustAcquire(t, b, req("a", 0), override(10, 10))
	if !f2.Resources().BorrowedConcurrency {
		t.Fatalf("second fg should borrow: %+v", f2.Resources())
	}
	_ = f2.Release(nil)
	// Shared pool exhausted by bg: a second fg is rejected by protection.
	b3 := mustAcquire(t, b, req("a", 0), override(10, 10), bg)
	_, err = b.Acquire(context.Background(), req("a", 0), override(10, 10))
	rej = wantReason(t, err, bulkhead.ConcurrencyLimit)
	if rej.Detail.Constraint != bulkhead.ConstraintClassProtection || rej.Detail.Shared == nil ||
		rej.Detail.Shared.MaxConcurrent != 2 || rej.Detail.Shared.InFlight != 2 {
		t.Fatalf("protection detail = %+v / %+v", rej.Detail, rej.Detail.Shared)
	}
	st := b.Stats()
	if st.Classes == nil || st.Classes.Default != "fg" || st.Classes.Classes["bg"].InFlight != 2 ||
		st.Classes.Classes["bg"].Rejected != 1 || st.Classes.Classes["fg"].Rejected != 1 ||
		st.Classes.Classes["bg"].TotalBorrowedAdmissions != 3 {
		t.Fatalf("class stats = %+v", st.Classes)
	}
	for _, tok := range []*bulkhead.Permit{b2, b3, f1} {
		_ = tok.Release(nil)
	}
}

func TestClassOptionValidation(t *testing.T) {
	b := newBulkhead(t, probedConfig())
	if _, err := b.Acquire(context.Background(), req("a", 0), bulkhead.WithClass("nope")); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("unknown class: %v", err)
	}
	plain := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	if _, err := plain.Acquire(context.Background(), req("a", 0), bulkhead.WithClass("fg")); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("class without a class table: %v", err)
	}
	if _, err := b.Acquire(context.Background(), req("a", 0), bulkhead.WithBorrowedDeadline(time.Second)); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("WithBorrowedDeadline on Acquire: %v", err)
	}
	for _, d := range []time.Duration{0, time.Microsecond, bulkhead.MaxBorrowedDeadline + time.Millisecond} {
		_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
			t.Fatal("fn ran with an invalid deadline")
			return 0, nil
		}, bulkhead.WithBorrowedDeadline(d))
		if !errors.Is(err, bulkhead.ErrInvalid) {
			t.Fatalf("deadline %v: %v", d, err)
		}
	}
	cfg := probedConfig()
	cfg.Classes.Default = "missing"
	if _, err := bulkhead.New(cfg); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("bad class table: %v", err)
	}
	if st := b.Stats(); st.Calls.Admitted != 0 || st.Calls.Rejected != 0 {
		t.Fatalf("invalid input counted: %+v", st.Calls)
	}
}

func TestAbandonBorrowedConcurrency(t *testing.T) {
	// Without floors every admission borrows, and calls can queue.
	cfg := bulkhead.Batch("gpt-4o", 2)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	cfg.Classes = &bulkhead.Classes{Default: "fg", Limits: map[string]bulkhead.ClassLimits{"fg": {}, "bg": {}}}
	b := newBulkhead(t, cfg)
	var abandons []bulkhead.AbandonEvent
	b.Subscribe(bulkhead.Hooks{Abandon: func(e bulkhead.AbandonEvent) { abandons = append(abandons, e) }})
	fg := mustAcquire(t, b, req("a", 0), override(10, 10))
	bg := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithClass("bg"))
	w := acquireAsync(context.Background(), b, req("w", 0), override(1, 1), bulkhead.WithClass("bg"))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	if !bg.AbandonBorrowedConcurrency() {
		t.Fatal("first abandon of a borrowed slot failed")
	}
	if bg.AbandonBorrowedConcurrency() {
		t.Fatal("second abandon was effective")
	}
	// The slot went to the waiter; the abandoned admission keeps its tokens.
	r := <-w
	if r.err != nil {
		t.Fatal(r.err)
	}
	st := b.Stats()
	if st.Gate.InFlight != 2 || st.Calls.InFlight != 3 || st.TokenBudget.InFlightTokens != 42 ||
		st.Calls.AbandonedByCause[bulkhead.AbandonManual] != 1 || st.Classes.Classes["bg"].Abandoned != 1 ||
		st.Classes.Classes["bg"].InFlight != 1 {
		t.Fatalf("after abandon: gate %+v calls %+v tokens %+v classes %+v", st.Gate, st.Calls, st.TokenBudget, st.Classes)
	}
	// Drain waits for the abandoned admission too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = fg.Release(nil)
	_ = r.tok.Release(nil)
	if res, _ := b.Drain(ctx); res.Drained || res.InFlight != 1 {
		t.Fatalf("Drain with an abandoned admission outstanding = %+v", res)
	}
	_ = bg.Release(nil)
	if bg.AbandonBorrowedConcurrency() {
		t.Fatal("abandon after release was effective")
	}
	closeAndDrain(t, b)
	if len(abandons) != 1 || abandons[0].Cause != bulkhead.AbandonManual || abandons[0].Held != 20 || abandons[0].Class != "bg" {
		t.Fatalf("abandon events = %+v", abandons)
	}
	if st := b.Stats(); st.Gate.InFlight != 0 || st.TokenBudget.InFlightTokens != 0 || st.Classes.Classes["bg"].InFlight != 0 || st.Calls.InFlight != 0 {
		t.Fatalf("leak: %+v", st)
	}
}

func TestBorrowedDeadline(t *testing.T) {
	clk := clock.NewMock()
	cfg := probedConfig()
	cfg.Clock = clk
	b := newBulkhead(t, cfg)

	started, finish := make(chan struct{}), make(chan struct{})
	var fnCause error
	fnDone := make(chan struct{})
	out := make(chan error, 1)
	go func() {
		_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
			defer close(fnDone)
			close(started)
			<-ctx.Done()
			fnCause = context.Cause(ctx)
			<-finish
			return 1, rc.SetUsage(bulkhead.Usage{Input: 5, Output: 5})
		}, bulkhead.WithClass("bg"), override(10, 10), bulkhead.WithBorrowedDeadline(20*time.Millisecond))
		out <- err
	}()
	<-started
	clk.Add(20 * time.Millisecond)
	err := <-out
	var de *bulkhead.BorrowedDeadlineError
	if !errors.As(err, &de) || !errors.Is(err, bulkhead.ErrBorrowedDeadline) || de.Deadline != 20*time.Millisecond || de.Class != "bg" || !de.Resources.BorrowedConcurrency {
		t.Fatalf("Run error = %v", err)
	}
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.Calls.InFlight != 1 || st.TokenBudget.InFlightTokens != 20 || st.Calls.AbandonedByCause[bulkhead.AbandonDeadline] != 1 {
		t.Fatalf("after expiry: %+v %+v %+v", st.Gate, st.Calls, st.TokenBudget)
	}
	close(finish)
	<-fnDone
	if !errors.Is(fnCause, bulkhead.ErrBorrowedDeadline) {
		t.Fatalf("fn's context cause = %v", fnCause)
	}
	testutil.WaitFor(t, "the late fn to settle", func() bool { return b.Stats().Calls.Released == 1 })
	if st := b.Stats(); st.TokenBudget.InFlightTokens != 0 || st.TokenBudget.TotalConsumed != 10 {
		t.Fatalf("the late fn's settlement: %+v", st.TokenBudget)
	}

	// A protected (not borrowed) slot ignores the deadline.
	v, err := bulkhead.Run(context.Background(), b, req("a", 0), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		if _, expired := ctx.Deadline(); expired {
			t.Error("a protected slot got a deadline")
		}
		return 7, nil
	}, override(10, 10), bulkhead.WithBorrowedDeadline(time.Millisecond))
	if err != nil || v != 7 {
		t.Fatalf("protected run = %d, %v", v, err)
	}
	// Work that finishes first clears its deadline.
	v, err = bulkhead.Run(context.Background(), b, req("a", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
		return 8, nil
	}, bulkhead.WithClass("bg"), override(10, 10), bulkhead.WithBorrowedDeadline(time.Second))
	if err != nil || v != 8 {
		t.Fatalf("fast borrowed run = %d, %v", v, err)
	}
	clk.Add(2 * time.Second)
	st = b.Stats()
	if st.Calls.Abandoned != 1 {
		t.Fatalf("a settled run's deadline fired: %+v", st.Calls)
	}
	// The class actor's telemetry: one deadline expired, one ended first.
	want := bulkhead.DeadlineStats{Started: 2, Expired: 1, Ended: 1}
	if got := st.Classes.Classes["bg"].Deadlines; got != want {
		t.Fatalf("bg deadlines = %+v, want %+v", got, want)
	}
}

func TestApplyLimitsWithClasses(t *testing.T) {
	b := newBulkhead(t, probedConfig())
	cur := b.Limits()
	if cur.Classes == nil || len(cur.Classes.Limits) != 2 {
		t.Fatalf("Limits().Classes = %+v", cur.Classes)
	}
	tok := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithClass("bg"))
	tok2 := mustAcquire(t, b, req("a", 0), override(10, 10), bulkhead.WithClass("bg"))

	next := cur
	next.Revision = 1
	next.Classes = &bulkhead.Classes{Limits: map[string]bulkhead.ClassLimits{"fg": {ProtectedConcurrent: 1}}}
	if _, err := b.ApplyLimits(next); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("missing class: %v", err)
	}
	next.Classes = nil
	if _, err := b.ApplyLimits(next); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("no class table: %v", err)
	}
	// Raise fg's floor to 2 and shrink bg's ceiling to 1: nothing is revoked.
	next.Classes = &bulkhead.Classes{Limits: map[string]bulkhead.ClassLimits{
		"fg": {ProtectedConcurrent: 2},
		"bg": {MaxConcurrent: bulkhead.Ceiling(1)},
	}}
	res, err := b.ApplyLimits(next)
	if err != nil || !res.Applied || res.Current.Classes.Limits["fg"].ProtectedConcurrent != 2 {
		t.Fatalf("apply = %+v, %v", res, err)
	}
	if st := b.Stats(); st.Classes.Classes["bg"].InFlight != 2 {
		t.Fatalf("a shrink revoked bg slots: %+v", st.Classes.Classes["bg"])
	}
	_, err = b.Acquire(context.Background(), req("a", 0), override(1, 1), bulkhead.WithClass("bg"))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	_ = tok.Release(nil)
	_ = tok2.Release(nil)
	if l := b.Limits(); *l.Classes.Limits["bg"].MaxConcurrent != 1 || l.Revision != 1 {
		t.Fatalf("limits after apply = %+v", l)
	}
}
