package bulkhead_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
)

// Token sums at the edge of int64: an operation whose gauge (what is held
// now) would overflow is a *ConfigError naming the field and changes
// nothing; cumulative totals saturate at math.MaxInt64; nothing wraps.

const top = math.MaxInt64

// wantField checks that err is a *bulkhead.ConfigError for field.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) || ce.Field != field || !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("error = %v, want a *ConfigError for %s", err, field)
	}
}

// noDrift checks that the bulkhead's books balanced throughout.
func noDrift(t *testing.T, b *bulkhead.Bulkhead) {
	t.Helper()
	if d := b.Stats().LedgerDrift; d != 0 {
		t.Fatalf("LedgerDrift = %d", d)
	}
}

// TestHugeReservationBesideAnother: a reservation of math.MaxInt64 beside
// another admission does not fit a budget of math.MaxInt64; alone it is an
// exact fit.
func TestHugeReservationBesideAnother(t *testing.T) {
	b := budgetBulkhead(t, 4, top, 0)
	small := mustAcquire(t, b, req("a", 0), override(10, 0))
	huge := []struct {
		name string
		r    *bulkhead.Request
		opts []bulkhead.Option
	}{
		{"MaxTokens", &bulkhead.Request{MaxTokens: top}, nil},
		{"override", req("a", 0), []bulkhead.Option{override(0, top)}},
	}
	for _, h := range huge {
		if res, err := b.Estimate(h.r); h.opts == nil && (err != nil || res.Reserved != top) {
			t.Fatalf("%s: estimate = %+v, %v", h.name, res, err)
		}
		_, err := b.Acquire(context.Background(), h.r, h.opts...)
		rej := wantReason(t, err, bulkhead.BudgetLimit)
		if d := rej.Detail.TokenBudget; d.InFlightTokens != 10 || d.Available != top-10 || d.Reserved != top || d.Available < 0 {
			t.Fatalf("%s: detail %+v", h.name, d)
		}
		if d, err := b.WouldAdmit(h.r, h.opts...); err != nil || d.Admit || d.Reason != bulkhead.BudgetLimit {
			t.Fatalf("%s: WouldAdmit = %+v, %v", h.name, d, err)
		}
	}
	if st := b.Stats().TokenBudget; st.InFlightTokens != 10 || st.TotalReserved != 10 {
		t.Fatalf("after the rejections: %+v", st)
	}
	_ = small.Release(nil)
	alone := mustAcquire(t, b, &bulkhead.Request{MaxTokens: top})
	if st := b.Stats().TokenBudget; st.InFlightTokens != top || st.Available != 0 {
		t.Fatalf("exact fit: %+v", st)
	}
	_, err := b.Acquire(context.Background(), req("a", 0), override(0, 1))
	wantReason(t, err, bulkhead.BudgetLimit)
	_ = alone.Release(nil)
	if st := b.Stats().TokenBudget; st.InFlightTokens != 0 || st.TotalReserved != top {
		t.Fatalf("after release: %+v", st)
	}
	noDrift(t, b)
}

// TestReportUsageOverflow: a report whose hold does not fit an int64, or
// whose cumulative usage does not, is an error and changes nothing.
func TestReportUsageOverflow(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: top}
	cfg.UsageCeiling = top // the engine's own arithmetic, unclamped
	b := newBulkhead(t, cfg)
	var events int
	b.Subscribe(bulkhead.Hooks{Usage: func(bulkhead.UsageEvent) { events++ }})
	p := mustAcquire(t, b, req("a", 0), override(10, 20))
	before := b.Stats().TokenBudget

	_, err := p.ReportUsage(bulkhead.Usage{Input: top}, nil)
	wantField(t, err, "Usage.Input") // top + the 20 output held
	_, err = p.ReportUsage(bulkhead.Usage{Output: 5}, &bulkhead.Progressive{RemainingOutput: 5, SafetyMargin: top})
	wantField(t, err, "Progressive.SafetyMargin")
	_, err = p.ReportUsage(bulkhead.Usage{Output: 30}, &bulkhead.Progressive{SafetyMargin: top - 5})
	wantField(t, err, "Progressive.SafetyMargin") // margin + 10 beyond the reservation

	if st := b.Stats().TokenBudget; *st != *before {
		t.Fatalf("a failed report changed the ledger: %+v, was %+v", st, before)
	}
	rep, err := p.ReportUsage(bulkhead.Usage{Input: 10, Output: 5}, nil)
	if err != nil || rep.Sequence != 1 || rep.Held != 30 {
		t.Fatalf("the next valid report = %+v, %v", rep, err)
	}

	// Usage is cumulative, each field the largest reported: two valid
	// reports may add up to more than an int64.
	q := mustAcquire(t, b, req("a", 0), override(0, 0))
	if _, err := q.ReportUsage(bulkhead.Usage{Input: top - 100}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = q.ReportUsage(bulkhead.Usage{Output: 200}, nil)
	wantField(t, err, "Usage")
	// That hold of top - 100 leaves room for 70 more: 30 are held by p.
	_, err = p.ReportUsage(bulkhead.Usage{Input: 100, Output: 5}, nil)
	wantField(t, err, "Usage")
	st := b.Stats().TokenBudget
	if st.InFlightTokens != top-70 {
		t.Fatalf("in flight = %d, want %d", st.InFlightTokens, top-70)
	}
	_ = q.Release(nil)
	_ = p.Release(nil)
	closeAndDrain(t, b)
	if events != 2 {
		t.Fatalf("%d usage events, want 2 (failed reports emit none)", events)
	}
	st = b.Stats().TokenBudget
	if st.InFlightTokens != 0 || st.TotalConsumed != 15+top-100 || st.TotalRefunded != 15 ||
		st.TotalReserved+st.TotalOverrun != 30+top-100 { // no early refunds: reserved + overrun == holds at release
		t.Fatalf("ledger = %+v", st)
	}
	noDrift(t, b)
}

// TestTotalsSaturate: cumulative totals stop at math.MaxInt64, through
// Release, SetUsage and overrun, globally and per class.
func TestTotalsSaturate(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: top}
	cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {MaxInFlightTokens: bulkhead.Ceiling[int64](top)}}}
	cfg.UsageCeiling = top // the engine's own arithmetic, unclamped
	b := newBulkhead(t, cfg)

	// An invalid final usage releases everything and counts nothing.
	p := mustAcquire(t, b, req("a", 0), override(0, 0))
	wantField(t, p.Release(&bulkhead.Usage{Input: top, Output: top}), "Usage")
	if st := b.Stats().TokenBudget; st.TotalConsumed != 0 || st.InFlightTokens != 0 {
		t.Fatalf("after an invalid release: %+v", st)
	}
	for range 2 {
		p := mustAcquire(t, b, req("a", 0), override(0, 0))
		if _, err := p.ReportUsage(bulkhead.Usage{Input: top}, nil); err != nil { // an overrun of top
			t.Fatal(err)
		}
		if err := p.Release(&bulkhead.Usage{Input: top}); err != nil {
			t.Fatal(err)
		}
		_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
			wantField(t, rc.SetUsage(bulkhead.Usage{Input: top, Output: 1}), "Usage")
			return 0, rc.SetUsage(bulkhead.Usage{Output: top})
		}, override(top, 0))
		if err != nil {
			t.Fatal(err)
		}
	}
	st := b.Stats()
	g, c := st.TokenBudget, st.Classes.Classes["a"]
	if g.TotalReserved != top || g.TotalConsumed != top || g.TotalOverrun != top || g.TotalRefunded != 0 || g.InFlightTokens != 0 {
		t.Fatalf("global totals: %+v", g)
	}
	if c.TotalReserved != top || c.TotalConsumed != top || c.TotalOverrun != top || c.TotalBorrowedTokensReserved != top || c.InFlightTokens != 0 || c.Released != 5 {
		t.Fatalf("class totals: %+v", c)
	}
	noDrift(t, b)
}

// TestOverReservationWithoutBudget: without a budget nothing is reserved,
// so nothing is over the reservation.
func TestOverReservationWithoutBudget(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 1)
	cfg.UsageCeiling = top
	b := newBulkhead(t, cfg)
	var events []bulkhead.UsageEvent
	b.Subscribe(bulkhead.Hooks{Usage: func(e bulkhead.UsageEvent) { events = append(events, e) }})
	p := mustAcquire(t, b, req("a", 0))
	rep, err := p.ReportUsage(bulkhead.Usage{Input: 5, Output: top - 5}, nil)
	if err != nil || rep.Consumed != top || rep.OverReservation != 0 || rep.Held != 0 {
		t.Fatalf("report = %+v, %v", rep, err)
	}
	_ = p.Release(nil)
	closeAndDrain(t, b)
	if len(events) != 1 || events[0].OverReservation != 0 {
		t.Fatalf("usage events = %+v", events)
	}
}

// hostileCtx is a context whose Err, and so context.Cause, panics once
// armed. Its Done is a plain channel, closed by end.
type hostileCtx struct {
	done  chan struct{}
	armed atomic.Bool
}

func newHostileCtx() *hostileCtx { return &hostileCtx{done: make(chan struct{})} }

func (c *hostileCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *hostileCtx) Done() <-chan struct{}       { return c.done }
func (c *hostileCtx) Value(any) any               { return nil }
func (c *hostileCtx) end()                        { close(c.done) }

func (c *hostileCtx) Err() error {
	if c.armed.Load() {
		panic("a hostile context")
	}
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

// wantPanicCause checks that err is an Aborted rejection whose cause
// describes the context's panic.
func wantPanicCause(t *testing.T, err error) {
	t.Helper()
	rej := wantReason(t, err, bulkhead.Aborted)
	if rej.Cause == nil || !strings.Contains(rej.Cause.Error(), "a hostile context") {
		t.Fatalf("cause = %v, want one describing the panic", rej.Cause)
	}
}

// TestHostileContext: the engine never calls a waiter's context while it
// decides, so a context whose Err panics once its call is queued cannot
// leave a waiter unanswered or a slot idle beside the queue. Such a
// context that ends is rejected Aborted with a cause describing the panic,
// and the queue keeps moving.
func TestHostileContext(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "Acquire", true: "AcquireAsync"}[async], func(t *testing.T) {
			cfg := bulkhead.Batch("gpt-4o", 1)
			cfg.MaxQueue = 2
			b := newBulkhead(t, cfg)
			held := mustAcquire(t, b, req("held", 0))
			start := func(ctx context.Context) <-chan result {
				if !async {
					return acquireAsync(ctx, b, req("w", 0))
				}
				ch := make(chan result, 1)
				f := b.AcquireAsync(ctx, req("w", 0))
				go func() {
					tok, err := f.Result()
					ch <- result{tok, err}
				}()
				return ch
			}
			c1, c2 := newHostileCtx(), newHostileCtx()
			w1 := start(c1)
			testutil.WaitFor(t, "the first waiter to queue", func() bool { return b.Stats().Gate.Pending == 1 })
			w2 := start(c2)
			testutil.WaitFor(t, "the second waiter to queue", func() bool { return b.Stats().Gate.Pending == 2 })
			c1.armed.Store(true)
			c2.armed.Store(true)

			c1.end()
			wantPanicCause(t, (<-w1).err)
			_ = held.Release(nil)
			r2 := <-w2 // admitted: nobody called its Err
			if r2.err != nil {
				t.Fatalf("second waiter: %v", r2.err)
			}
			if st := b.Stats(); st.Gate.InFlight != 1 || st.Gate.Pending != 0 {
				t.Fatalf("with the second waiter admitted: %+v", st.Gate)
			}
			_ = r2.tok.Release(nil)

			// Ended before the call: rejected before anything is taken.
			_, err := b.Acquire(c1, req("late", 0))
			wantPanicCause(t, err)
			if async {
				_, err = b.AcquireAsync(c1, req("late", 0)).Result()
				wantPanicCause(t, err)
			}
			st := b.Stats()
			if st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.InFlight != 0 || st.Gate.Aborted != map[bool]int64{false: 2, true: 3}[async] {
				t.Fatalf("after cleanup: %+v %+v", st.Gate, st.Calls)
			}
		})
	}
}
