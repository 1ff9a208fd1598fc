package bulkhead_test

import (
	"context"
	"errors"
	"testing"

	"github.com/llmbulkhead/bulkhead"
)

func TestRunReleasesWhateverFnDoes(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000}
	b := newBulkhead(t, cfg)

	v, err := bulkhead.Run(context.Background(), b, req("a", 0), func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
		if rc.ID() == (bulkhead.ID{}) || rc.Reservation().Reserved != 100 {
			t.Errorf("run context: %v %+v", rc.ID(), rc.Reservation())
		}
		if st := b.Stats(); st.Gate.InFlight != 1 {
			t.Errorf("fn ran without holding a slot: %+v", st.Gate)
		}
		return "ok", rc.SetUsage(bulkhead.Usage{Input: 20, Output: 30})
	}, override(20, 80))
	if err != nil || v != "ok" {
		t.Fatalf("Run = %q, %v", v, err)
	}
	st := b.Stats()
	if st.Gate.InFlight != 0 || st.TokenBudget.TotalConsumed != 50 || st.TokenBudget.TotalRefunded != 50 {
		t.Fatalf("after success: %+v %+v", st.Gate, st.TokenBudget)
	}

	boom := errors.New("provider failed")
	_, err = bulkhead.Run(context.Background(), b, req("a", 0), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
		_ = rc.SetUsage(bulkhead.Usage{Input: 1, Output: 1})
		return 0, boom
	}, override(20, 80))
	if !errors.Is(err, boom) {
		t.Fatalf("Run error = %v", err)
	}
	st = b.Stats()
	if st.Gate.InFlight != 0 || st.TokenBudget.TotalConsumed != 50 {
		t.Fatalf("a failed fn's SetUsage was settled: %+v", st.TokenBudget)
	}

	func() {
		defer func() {
			if p := recover(); p != "fn panicked" {
				t.Fatalf("recovered %v, want the fn's panic", p)
			}
		}()
		_, _ = bulkhead.Run(context.Background(), b, req("a", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
			panic("fn panicked")
		}, override(1, 1))
	}()
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Calls.Released != 3 || st.TokenBudget.InFlightTokens != 0 {
		t.Fatalf("a panicking fn leaked: %+v", st)
	}
}

func TestRunRejectionDoesNotCallFn(t *testing.T) {
	b := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	tok := mustAcquire(t, b, req("a", 0))
	called := false
	_, err := bulkhead.Run(context.Background(), b, req("a", 0), func(context.Context, *bulkhead.RunContext) (int, error) {
		called = true
		return 0, nil
	})
	wantReason(t, err, bulkhead.ConcurrencyLimit)
	if called {
		t.Fatal("fn ran after a rejection")
	}
	_ = tok.Release(nil)
	if _, err := bulkhead.Run[int](context.Background(), b, req("a", 0), nil); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("nil fn: %v", err)
	}
	var rc *bulkhead.RunContext
	_, _ = bulkhead.Run(context.Background(), b, req("a", 0), func(_ context.Context, c *bulkhead.RunContext) (int, error) {
		rc = c
		return 0, c.SetUsage(bulkhead.Usage{Input: -1})
	})
	if rc == nil {
		t.Fatal("fn not called")
	}
	if st := b.Stats(); st.Gate.InFlight != 0 {
		t.Fatalf("leak: %+v", st.Gate)
	}
}
