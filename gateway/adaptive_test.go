package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/stream"
)

// The gateway feeds its bulkhead: the upstream's 429 with retry-after
// cools the model down, and the next call is answered 429 by the gateway
// itself, with the time left, without reaching the upstream.
func TestHandlerCooldownFromUpstream429(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After-Ms", "4000")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
	}))
	defer up.Close()
	clk := clock.NewMock()
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, Clock: clk,
		Adaptive: &bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	u, _ := url.Parse(up.URL)
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b})
	if err != nil {
		t.Fatal(err)
	}
	call := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := call(); rec.Code != 429 || rec.Header().Get("X-Bulkhead-Reason") != "" {
		t.Fatalf("first call: %d %v, want the upstream's own 429", rec.Code, rec.Header())
	}
	clk.Add(time.Second)
	rec := call()
	if rec.Code != 429 || rec.Header().Get("X-Bulkhead-Reason") != "cooldown" || rec.Header().Get("Retry-After-Ms") != "3000" || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("second call: %d %v", rec.Code, rec.Header())
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("%d upstream hits, want 1", n)
	}
	if st := b.Stats(); st.Adaptive.Decreases != 1 || st.Calls.RejectedByReason[bulkhead.Cooldown] != 1 {
		t.Fatalf("stats: %+v %v", st.Adaptive, st.Calls.RejectedByReason)
	}
}
