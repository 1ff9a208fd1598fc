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

func TestNewValidation(t *testing.T) {
	ok := bulkhead.Interactive("gpt-4o", 1)
	tests := []struct {
		field string
		edit  func(*bulkhead.Config)
	}{
		{"Config.Model", func(c *bulkhead.Config) { c.Model, c.TokenBudget = "  ", &bulkhead.TokenBudget{Budget: 10} }},
		{"Config.MaxConcurrent", func(c *bulkhead.Config) { c.MaxConcurrent = -1 }},
		{"Config.MaxQueue", func(c *bulkhead.Config) { c.MaxQueue = -1 }},
		{"Config.QueueTimeout", func(c *bulkhead.Config) { c.QueueTimeout = -time.Second }},
		{"Config.InitialRevision", func(c *bulkhead.Config) { c.InitialRevision = -1 }},
		{"Config.TokenBudget.Budget", func(c *bulkhead.Config) { c.TokenBudget = &bulkhead.TokenBudget{Budget: -1} }},
		{"Config.TokenBudget.HighPriorityReserve", func(c *bulkhead.Config) {
			c.TokenBudget = &bulkhead.TokenBudget{Budget: 10, HighPriorityReserve: 11}
		}},
		{"Config.TokenBudget.OutputCap", func(c *bulkhead.Config) { c.TokenBudget = &bulkhead.TokenBudget{OutputCap: -1} }},
		{"Config.TokenBudget.OutputCap", func(c *bulkhead.Config) {
			c.TokenBudget = &bulkhead.TokenBudget{OutputCap: 5, Estimator: estimatorFunc(nil)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			b, err := bulkhead.New(cfg)
			if b != nil {
				t.Fatal("New returned a bulkhead for an invalid config")
			}
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field || !errors.Is(err, bulkhead.ErrInvalid) {
				t.Fatalf("err = %v, want a ConfigError for %s", err, tt.field)
			}
		})
	}
	// The model is needed only by the default estimator.
	newBulkhead(t, bulkhead.Config{MaxConcurrent: 1})
	newBulkhead(t, bulkhead.Config{MaxConcurrent: 1, TokenBudget: &bulkhead.TokenBudget{Estimator: estimatorFunc(nil)}})
	// Zero budget and zero concurrency are valid.
	cfg := ok
	cfg.MaxConcurrent = 0
	cfg.TokenBudget = &bulkhead.TokenBudget{}
	newBulkhead(t, cfg)
}

func TestProfiles(t *testing.T) {
	in := bulkhead.Interactive("m", 10)
	if in.MaxQueue != 0 || in.QueueTimeout != 0 || in.MaxConcurrent != 10 {
		t.Fatalf("Interactive = %+v", in)
	}
	batch := bulkhead.Batch("m", 4)
	if batch.MaxQueue != 20 || batch.QueueTimeout != 30*time.Second {
		t.Fatalf("Batch = %+v", batch)
	}
	// The default is fail fast: the 11th concurrent call is rejected at once.
	b := newBulkhead(t, in)
	var toks []*bulkhead.Permit
	for range 10 {
		toks = append(toks, mustAcquire(t, b, req("hi", 0)))
	}
	_, err := b.Acquire(context.Background(), req("hi", 0))
	rej := wantReason(t, err, bulkhead.ConcurrencyLimit)
	if rej.Detail == nil || rej.Detail.InFlight != 10 || rej.Detail.MaxConcurrent != 10 {
		t.Fatalf("detail = %+v", rej.Detail)
	}
	for _, tok := range toks {
		if err := tok.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
}

func TestQueueFIFOAndLimits(t *testing.T) {
	cfg := bulkhead.Interactive("m", 1)
	cfg.MaxQueue = 3
	b := newBulkhead(t, cfg)
	first := mustAcquire(t, b, req("a", 0))
	var waiters []<-chan result
	for i := range 3 {
		waiters = append(waiters, acquireAsync(context.Background(), b, req("w", 0)))
		testutil.WaitFor(t, "waiter to queue", func() bool { return b.Stats().Gate.Pending == i+1 })
	}
	_, err := b.Acquire(context.Background(), req("x", 0))
	wantReason(t, err, bulkhead.QueueLimit)

	// Releasing admits the waiters in arrival order, one per free slot.
	prev := first
	for i, w := range waiters {
		if err := prev.Release(nil); err != nil {
			t.Fatal(err)
		}
		r := <-w
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		for _, later := range waiters[i+1:] {
			select {
			case r := <-later:
				t.Fatalf("a later waiter was admitted first: %+v", r)
			default:
			}
		}
		prev = r.tok
	}
	if err := prev.Release(nil); err != nil {
		t.Fatal(err)
	}
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.Admitted != 4 || st.Calls.Released != 4 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestQueueTimeout(t *testing.T) {
	clk := clock.NewMock()
	cfg := bulkhead.Batch("m", 1)
	cfg.Clock = clk
	cfg.QueueTimeout = time.Second
	b := newBulkhead(t, cfg)
	tok := mustAcquire(t, b, req("a", 0))
	var waits []time.Duration
	unsub := b.Subscribe(bulkhead.Hooks{Reject: func(e bulkhead.RejectEvent) { waits = append(waits, e.QueueWait) }})
	defer unsub()

	w := acquireAsync(context.Background(), b, req("w", 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	clk.Add(999 * time.Millisecond)
	select {
	case r := <-w:
		t.Fatalf("waiter ended before its timeout: %v", r.err)
	default:
	}
	clk.Add(time.Millisecond)
	r := <-w
	wantReason(t, r.err, bulkhead.Timeout)

	// A per-call timeout overrides the configured one.
	w = acquireAsync(context.Background(), b, req("w", 0), bulkhead.WithQueueTimeout(10*time.Millisecond))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	clk.Add(10 * time.Millisecond)
	wantReason(t, (<-w).err, bulkhead.Timeout)

	if err := tok.Release(nil); err != nil {
		t.Fatal(err)
	}
	st := b.Stats()
	if st.Gate.TimedOut != 2 || st.Calls.RejectedByReason[bulkhead.Timeout] != 2 || st.Gate.InFlight != 0 {
		t.Fatalf("stats = %+v", st)
	}
	b.Close()
	if _, err := b.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(waits) != 2 || waits[0] != time.Second || waits[1] != 10*time.Millisecond {
		t.Fatalf("queue waits on reject events = %v", waits)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	b := newBulkhead(t, bulkhead.Batch("m", 1))
	tok := mustAcquire(t, b, req("a", 0))
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("caller went away")
	w := acquireAsync(ctx, b, req("w", 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	cancel(cause)
	r := <-w
	wantReason(t, r.err, bulkhead.Aborted)
	if !errors.Is(r.err, cause) {
		t.Fatalf("aborted error %v does not carry the cancel cause", r.err)
	}
	if st := b.Stats(); st.Gate.Pending != 0 || st.Gate.Aborted != 1 {
		t.Fatalf("stats after cancel = %+v", st.Gate)
	}
	// The cancelled waiter is never admitted later.
	if err := tok.Release(nil); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Calls.Admitted != 1 {
		t.Fatalf("stats after release = %+v", st)
	}
}

func TestDoneContextIsAbortedEvenWithAFreeSlot(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("m", 5))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Acquire(ctx, req("a", 0))
	wantReason(t, err, bulkhead.Aborted)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want it to match context.Canceled", err)
	}
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Calls.Admitted != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestKillSwitchAndFailClosedStart(t *testing.T) {
	cfg := bulkhead.Batch("m", 0)
	cfg.InitialRevision = 7
	b := newBulkhead(t, cfg)
	_, err := b.Acquire(context.Background(), req("a", 0))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	d, err := b.WouldAdmit(req("a", 0))
	if err != nil || d.Admit || d.Reason != bulkhead.ConcurrencyLimit {
		t.Fatalf("WouldAdmit = %+v, %v", d, err)
	}
	// An equal revision is stale.
	res, err := b.ApplyLimits(bulkhead.Limits{Revision: 7, MaxConcurrent: 1, MaxQueue: 5})
	if err != nil || res.Applied || res.Reason != bulkhead.StaleRevision {
		t.Fatalf("stale apply = %+v, %v", res, err)
	}
	// Open, fill, then flip the kill switch: a queued waiter stays queued.
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 8, MaxConcurrent: 1, MaxQueue: 5}); err != nil {
		t.Fatal(err)
	}
	tok := mustAcquire(t, b, req("a", 0))
	if tok.LimitRevision() != 8 {
		t.Fatalf("revision = %d", tok.LimitRevision())
	}
	w := acquireAsync(context.Background(), b, req("w", 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 9, MaxConcurrent: 0, MaxQueue: 5}); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(context.Background(), req("x", 0))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	if err := tok.Release(nil); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Gate.Pending != 1 || st.Gate.InFlight != 0 {
		t.Fatalf("the waiter did not stay queued under the kill switch: %+v", st.Gate)
	}
	// Reopening admits it under the reopening revision.
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 10, MaxConcurrent: 2, MaxQueue: 5}); err != nil {
		t.Fatal(err)
	}
	r := <-w
	if r.err != nil || r.tok.LimitRevision() != 10 {
		t.Fatalf("reopened waiter: %+v", r)
	}
	if err := r.tok.Release(nil); err != nil {
		t.Fatal(err)
	}
}

func TestShrinkByAttrition(t *testing.T) {
	b := newBulkhead(t, bulkhead.Batch("m", 3))
	var toks []*bulkhead.Permit
	for range 3 {
		toks = append(toks, mustAcquire(t, b, req("a", 0)))
	}
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 1, MaxConcurrent: 1, MaxQueue: 20}); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Gate.InFlight != 3 {
		t.Fatalf("a shrink revoked slots: %+v", st.Gate)
	}
	w := acquireAsync(context.Background(), b, req("w", 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	for _, tok := range toks[:2] {
		_ = tok.Release(nil)
	}
	if st := b.Stats(); st.Gate.InFlight != 1 || st.Gate.Pending != 1 {
		t.Fatalf("after two releases: %+v", st.Gate)
	}
	_ = toks[2].Release(nil)
	r := <-w
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.tok.Release(nil)
}

func TestApplyLimitsValidation(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("m", 1))
	cases := []struct {
		field string
		next  bulkhead.Limits
	}{
		{"Limits.Revision", bulkhead.Limits{Revision: -1}},
		{"Limits.MaxConcurrent", bulkhead.Limits{Revision: 1, MaxConcurrent: -1}},
		{"Limits.MaxQueue", bulkhead.Limits{Revision: 1, MaxQueue: -1}},
		{"Limits.TokenBudget", bulkhead.Limits{Revision: 1, TokenBudget: &bulkhead.BudgetLimits{Budget: 1}}},
	}
	for _, c := range cases {
		_, err := b.ApplyLimits(c.next)
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: err = %v", c.field, err)
		}
	}
	if l := b.Limits(); l.Revision != 0 || l.MaxConcurrent != 1 {
		t.Fatalf("an invalid apply changed the limits: %+v", l)
	}
	if _, err := b.SetBudget(10); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("SetBudget without a budget: %v", err)
	}
}

func TestCloseAndDrain(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Batch("m", 1))
	if err != nil {
		t.Fatal(err)
	}
	tok := mustAcquire(t, b, req("a", 0))
	w := acquireAsync(context.Background(), b, req("w", 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))

	// A drain that times out reports what is outstanding and cancels nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := b.Drain(ctx)
	if err == nil || res.Drained || res.InFlight != 1 || res.Pending != 1 {
		t.Fatalf("Drain with a done ctx = %+v, %v", res, err)
	}

	b.Close()
	b.Close() // idempotent
	wantReason(t, (<-w).err, bulkhead.Shutdown)
	_, err = b.Acquire(context.Background(), req("x", 0))
	wantReason(t, err, bulkhead.Shutdown)
	if d, err := b.WouldAdmit(req("x", 0)); err != nil || d.Reason != bulkhead.Shutdown {
		t.Fatalf("WouldAdmit after Close = %+v, %v", d, err)
	}
	// Invalid input is still an error, not a rejection, when closed.
	if _, err := b.WouldAdmit(&bulkhead.Request{MaxTokens: -1}); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("WouldAdmit with invalid input after Close: %v", err)
	}

	done := make(chan bulkhead.DrainResult, 1)
	go func() {
		res, _ := b.Drain(context.Background())
		done <- res
	}()
	select {
	case <-done:
		t.Fatal("Drain returned while a token was held")
	default:
	}
	if err := tok.Release(nil); err != nil {
		t.Fatal(err)
	}
	if res := <-done; !res.Drained {
		t.Fatalf("Drain = %+v", res)
	}
	// After a complete drain of a closed bulkhead, calls still answer.
	_, err = b.Acquire(context.Background(), req("x", 0))
	wantReason(t, err, bulkhead.Shutdown)
	if st := b.Stats(); !st.Gate.Closed || st.Calls.Admitted != 1 || st.Calls.Released != 1 {
		t.Fatalf("final stats = %+v", st)
	}
	if res, err := b.Drain(context.Background()); err != nil || !res.Drained {
		t.Fatalf("second Drain = %+v, %v", res, err)
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("m", 1))
	var releases int
	unsub := b.Subscribe(bulkhead.Hooks{Release: func(bulkhead.ReleaseEvent) { releases++ }})
	tok := mustAcquire(t, b, req("a", 0))
	for range 3 {
		if err := tok.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
	st := b.Stats()
	if st.Gate.DoubleReleases != 2 || st.Calls.Released != 1 || st.Gate.InFlight != 0 {
		t.Fatalf("stats = %+v", st)
	}
	b.Close()
	if _, err := b.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	unsub()
	if releases != 1 {
		t.Fatalf("release events = %d, want 1", releases)
	}
}

func TestAdmissionIDs(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("m", 100))
	seen := map[bulkhead.ID]bool{}
	for range 100 {
		tok := mustAcquire(t, b, req("a", 0))
		id := tok.ID()
		s := id.String()
		if len(s) != 36 || s[14] != '4' || (s[19] != '8' && s[19] != '9' && s[19] != 'a' && s[19] != 'b') {
			t.Fatalf("ID %q is not a version 4 UUID", s)
		}
		if seen[id] {
			t.Fatalf("duplicate ID %s", s)
		}
		seen[id] = true
		_ = tok.Release(nil)
	}
}

func TestNilContextAndRequest(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("m", 1))
	//lint:ignore SA1012 testing the nil check
	if _, err := b.Acquire(nil, req("a", 0)); !errors.Is(err, bulkhead.ErrInvalid) { //nolint:staticcheck
		t.Fatalf("nil ctx: %v", err)
	}
	if _, err := b.Acquire(context.Background(), nil); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("nil request: %v", err)
	}
	if _, err := b.Acquire(context.Background(), req("a", -1)); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative MaxTokens: %v", err)
	}
	if _, err := b.Acquire(context.Background(), req("a", 0), bulkhead.WithDetail()); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("WithDetail on Acquire: %v", err)
	}
	if _, err := b.Acquire(context.Background(), req("a", 0), bulkhead.WithQueueTimeout(-1)); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative queue timeout: %v", err)
	}
	// Without a budget an override is ignored, but still validated.
	neg := bulkhead.WithReservation(bulkhead.Reservation{Input: -1})
	if _, err := b.Acquire(context.Background(), req("a", 0), neg); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("negative override without a budget: %v", err)
	}
	if st := b.Stats(); st.Calls.Admitted != 0 || st.Calls.Rejected != 0 {
		t.Fatalf("invalid input was counted: %+v", st.Calls)
	}
}
