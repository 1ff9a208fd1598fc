package actor

import (
	"context"
	"errors"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/admission"
)

func startEngine(t *testing.T, limits admission.Limits) *Engine {
	t.Helper()
	e, err := Start(Config{Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		if res := e.Drain(context.Background()); !res.Drained {
			t.Errorf("Drain = %+v", res)
		}
	})
	return e
}

func acquire(t *testing.T, e *Engine) *Lease {
	t.Helper()
	r := e.NewRequest()
	defer e.PutRequest(r)
	r.Ctx, r.Request, r.Lease = context.Background(), "request", &Lease{}
	if err := e.Acquire(r); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return r.Lease
}

// TestPanicInHandlerKeepsState makes a handler panic and checks that the
// caller gets ErrInternal while the actor keeps its state and goes on:
// protoactor never restarts it empty.
func TestPanicInHandlerKeepsState(t *testing.T) {
	e := startEngine(t, admission.Limits{MaxConcurrent: 2})
	held := acquire(t, e)

	// A usage report for no lease panics inside the handler.
	_, err := e.ReportUsage(nil, admission.Usage{}, nil)
	if !errors.Is(err, ErrInternal) {
		t.Fatalf("ReportUsage(nil) = %v, want ErrInternal", err)
	}
	st := e.Stats()
	if st.Calls.Admitted != 1 || st.Gate.InFlight != 1 {
		t.Fatalf("state after the panic: %+v", st)
	}
	// The actor still decides: one more slot, then full.
	second := acquire(t, e)
	r := e.NewRequest()
	r.Ctx, r.Request, r.Lease = context.Background(), "request", &Lease{}
	if err := e.Acquire(r); !errors.Is(err, admission.ErrConcurrencyLimit) {
		t.Fatalf("third Acquire = %v", err)
	}
	e.PutRequest(r)
	held.Release(nil)
	second.Release(nil)
	if st := e.Stats(); st.Gate.InFlight != 0 || st.Calls.Released != 2 {
		t.Fatalf("final stats: %+v", st)
	}
}
