package actor

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// recordHandler keeps the messages of the records it is handed.
type recordHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		msg += " " + a.String()
		return true
	})
	h.msgs = append(h.msgs, msg)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

// TestLedgerDriftIsCountedAndLogged corrupts a lease's hold, as only a bug
// in the engine could, and checks that its release is counted as drift and
// logged, globally and for the class, instead of being silently clamped.
func TestLedgerDriftIsCountedAndLogged(t *testing.T) {
	h := &recordHandler{}
	limits := admission.Limits{MaxConcurrent: 2, TokenBudget: &admission.BudgetLimits{Budget: 100}, Classes: &admission.Classes{
		Default: "a", Limits: map[string]admission.ClassLimits{"a": {}},
	}}
	e, err := Start(Config{Limits: limits, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		e.Drain(context.Background())
	})
	r := e.NewRequest()
	r.Ctx, r.Lease = context.Background(), &Lease{}
	r.Class, _ = e.LookupClass("")
	r.Reservation = admission.Reservation{Input: 10, Reserved: 10}
	if err := e.Acquire(r); err != nil {
		t.Fatal(err)
	}
	l := r.Lease
	e.PutRequest(r)
	if st := e.Stats(); st.LedgerDrift != 0 {
		t.Fatalf("drift before the corruption: %d", st.LedgerDrift)
	}
	l.held = 25 // the books say 10
	l.Release(nil)
	st := e.Stats()
	if st.LedgerDrift != 2 || st.Tokens != 0 || st.Classes.Classes[0].InFlightTokens != 0 {
		t.Fatalf("after the drift: drift %d, tokens %d, class %+v", st.LedgerDrift, st.Tokens, st.Classes.Classes[0])
	}
	var msgs []string
	for _, m := range h.messages() {
		if strings.Contains(m, "bulkhead:") {
			msgs = append(msgs, m) // not the actor system's own
		}
	}
	if len(msgs) != 2 {
		t.Fatalf("logged %q, want two drift records", msgs)
	}
	for _, m := range msgs {
		if !strings.Contains(m, "ledger drift") || !strings.Contains(m, "quantity=in-flight tokens value=-15") {
			t.Fatalf("record %q", m)
		}
	}
	if strings.Contains(msgs[0], "class=") || !strings.Contains(msgs[1], "class=a") {
		t.Fatalf("want the global record, then the class's: %q", msgs)
	}
}
