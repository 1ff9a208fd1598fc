package bulkhead_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// closeAndDrain closes b and waits until every event has been delivered.
func closeAndDrain(t *testing.T, b *bulkhead.Bulkhead) {
	t.Helper()
	b.Close()
	if res, err := b.Drain(context.Background()); err != nil || !res.Drained {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
}

func TestEventsInCausalOrder(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000}
	b := newBulkhead(t, cfg)
	var log []string
	var admits []bulkhead.AdmitEvent
	var releases []bulkhead.ReleaseEvent
	b.Subscribe(bulkhead.Hooks{
		Admit: func(e bulkhead.AdmitEvent) {
			log = append(log, "admit")
			admits = append(admits, e)
		},
		Reject:  func(e bulkhead.RejectEvent) { log = append(log, "reject:"+e.Reason.String()) },
		Release: func(e bulkhead.ReleaseEvent) { log = append(log, "release"); releases = append(releases, e) },
		Reconfigure: func(e bulkhead.ReconfigureEvent) {
			log = append(log, "reconfigure")
		},
	})
	r := req("a", 0)
	tok := mustAcquire(t, b, r, override(10, 90))
	w := acquireAsync(context.Background(), b, req("w", 0), override(1, 1))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	if _, err := b.ApplyLimits(bulkhead.Limits{Revision: 1, MaxConcurrent: 1, MaxQueue: 0, TokenBudget: &bulkhead.BudgetLimits{Budget: 1000}}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(context.Background(), req("x", 0), override(1, 1))
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	if err := tok.Release(&bulkhead.Usage{Input: 10, Output: 40}); err != nil {
		t.Fatal(err)
	}
	second := (<-w).tok
	_ = second.Release(nil)
	closeAndDrain(t, b)

	want := []string{"admit", "reconfigure", "reject:concurrency_limit", "release", "admit", "release"}
	if len(log) != len(want) {
		t.Fatalf("events = %v, want %v", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("events = %v, want %v", log, want)
		}
	}
	a, rel := admits[0], releases[0]
	if a.Request != r || a.ID != tok.ID() || a.Reserved != 100 || a.LimitRevision != 0 {
		t.Fatalf("admit event = %+v", a)
	}
	if rel.ID != tok.ID() || rel.Held != 100 || rel.Refunded != 50 ||
		rel.Usage == nil || *rel.Usage != (bulkhead.Usage{Input: 10, Output: 40}) || rel.Reserved != 100 {
		t.Fatalf("release event = %+v", rel)
	}
	if releases[1].Usage != nil || admits[1].LimitRevision != 1 {
		t.Fatalf("second admission events: %+v %+v", admits[1], releases[1])
	}
}

func TestStatsReflectChangeWhenEventSeen(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 5)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000}
	b := newBulkhead(t, cfg)
	var mu sync.Mutex
	var seen []bulkhead.Stats
	b.Subscribe(bulkhead.Hooks{
		Admit: func(bulkhead.AdmitEvent) {
			st := b.Stats()
			mu.Lock()
			seen = append(seen, st)
			mu.Unlock()
		},
		Release: func(bulkhead.ReleaseEvent) {
			st := b.Stats()
			mu.Lock()
			seen = append(seen, st)
			mu.Unlock()
		},
	})
	tok := mustAcquire(t, b, req("a", 0), override(10, 10))
	_ = tok.Release(nil)
	closeAndDrain(t, b)
	if len(seen) != 2 {
		t.Fatalf("saw %d events", len(seen))
	}
	if seen[0].Calls.Admitted != 1 || seen[0].TokenBudget.TotalReserved != 20 {
		t.Fatalf("admit listener saw stale stats: %+v", seen[0])
	}
	if seen[1].Calls.Released != 1 || seen[1].TokenBudget.InFlightTokens != 0 {
		t.Fatalf("release listener saw stale stats: %+v", seen[1])
	}
}

func TestRevisionProvenanceWithReconfiguringListener(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 5))
	applied := make(chan bulkhead.ApplyResult, 1)
	b.Subscribe(bulkhead.Hooks{Admit: func(bulkhead.AdmitEvent) {
		res, err := b.ApplyLimits(bulkhead.Limits{Revision: 5, MaxConcurrent: 5})
		if err != nil {
			t.Error(err)
		}
		applied <- res
	}})
	tok := mustAcquire(t, b, req("a", 0))
	if res := <-applied; !res.Applied {
		t.Fatalf("listener's apply: %+v", res)
	}
	if tok.LimitRevision() != 0 || b.Limits().Revision != 5 {
		t.Fatalf("token revision %d, limits revision %d", tok.LimitRevision(), b.Limits().Revision)
	}
	_ = tok.Release(nil)
}

func TestPanickingAndSlowListenersDoNotStallAdmission(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 2))
	gate := make(chan struct{})
	var calls int
	b.Subscribe(bulkhead.Hooks{Admit: func(bulkhead.AdmitEvent) { panic("listener bug") }})
	b.Subscribe(bulkhead.Hooks{Release: func(bulkhead.ReleaseEvent) {
		<-gate // a listener stuck until the test lets it go
		calls++
	}})
	for range 100 {
		tok := mustAcquire(t, b, req("a", 0))
		if err := tok.Release(nil); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats(); st.Calls.Admitted != 100 || st.Calls.Released != 100 {
		t.Fatalf("admission stalled behind a listener: %+v", st.Calls)
	}
	close(gate)
	closeAndDrain(t, b)
	st := b.Stats()
	if calls != 100 || st.Events.ListenerPanics != 100 {
		t.Fatalf("slow listener calls = %d, listener panics = %d", calls, st.Events.ListenerPanics)
	}
}

func TestUnsubscribe(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 2))
	var n int
	unsub := b.Subscribe(bulkhead.Hooks{Admit: func(bulkhead.AdmitEvent) { n++ }})
	mustAcquire(t, b, req("a", 0)).Release(nil)
	unsub()
	unsub() // idempotent
	mustAcquire(t, b, req("a", 0)).Release(nil)
	closeAndDrain(t, b)
	if n > 1 {
		t.Fatalf("listener called %d times, at most once", n)
	}
}

func TestDecisionTiming(t *testing.T) {
	clk := clock.NewMock()
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.Clock = clk
	b := newBulkhead(t, cfg)
	var admits []bulkhead.AdmitEvent
	var rejects []bulkhead.RejectEvent
	b.Subscribe(bulkhead.Hooks{
		Admit:  func(e bulkhead.AdmitEvent) { admits = append(admits, e) },
		Reject: func(e bulkhead.RejectEvent) { rejects = append(rejects, e) },
	})
	tok := mustAcquire(t, b, req("a", 0))
	w := acquireAsync(context.Background(), b, req("w", 0))
	testutil.WaitFor(t, "waiter to queue", pending(b))
	clk.Add(3 * time.Second)
	_ = tok.Release(nil)
	second := (<-w).tok
	// A waiter that times out after 2 s in the queue.
	to := acquireAsync(context.Background(), b, req("t", 0), bulkhead.WithQueueTimeout(2*time.Second))
	testutil.WaitFor(t, "the second waiter to queue", pending(b))
	clk.Add(2 * time.Second)
	wantReason(t, (<-to).err, bulkhead.Timeout)
	// A call rejected before it waits: its context is already done.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Acquire(done, req("x", 0))
	wantReason(t, err, bulkhead.Aborted)
	_ = second.Release(nil)
	closeAndDrain(t, b)
	if len(admits) != 2 || admits[0].QueueWait != 0 || admits[1].QueueWait != 3*time.Second {
		t.Fatalf("admit timings = %+v", admits)
	}
	if admits[0].DecisionDuration < 0 || admits[1].DecisionDuration < 0 {
		t.Fatalf("negative decision durations: %+v", admits)
	}
	if len(rejects) != 2 {
		t.Fatalf("reject events = %+v", rejects)
	}
	if r := rejects[0]; r.Reason != bulkhead.Timeout || r.QueueWait != 2*time.Second || r.DecisionDuration < 0 {
		t.Fatalf("timeout reject timing = %+v", r.Timing)
	}
	if r := rejects[1]; r.Reason != bulkhead.Aborted || r.QueueWait != 0 || r.DecisionDuration < 0 {
		t.Fatalf("aborted reject timing = %+v", r.Timing)
	}
}

func TestRejectedErrorShape(t *testing.T) {
	err := error(&bulkhead.RejectedError{Reason: bulkhead.QueueLimit})
	if err.Error() != "bulkhead: rejected: queue_limit" {
		t.Fatalf("message = %q", err.Error())
	}
	if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, bulkhead.ErrQueueLimit) || errors.Is(err, bulkhead.ErrTimeout) {
		t.Fatal("errors.Is mismatch")
	}
	ce := error(&bulkhead.ConfigError{Field: "Config.Model", Problem: "must not be blank"})
	if ce.Error() != "bulkhead: invalid Config.Model: must not be blank" || !errors.Is(ce, bulkhead.ErrInvalid) || errors.Is(ce, bulkhead.ErrRejected) {
		t.Fatalf("ConfigError = %v", ce)
	}
}
