package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func TestRetryAfter(t *testing.T) {
	date := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		h    http.Header
		want time.Duration
	}{
		{http.Header{"Retry-After-Ms": {"1500"}, "Retry-After": {"9"}}, 1500 * time.Millisecond},
		{http.Header{"Retry-After": {"2"}}, 2 * time.Second},
		{http.Header{"Retry-After": {"0.5"}}, 500 * time.Millisecond},
		{http.Header{"Retry-After": {date.Add(30 * time.Second).Format(http.TimeFormat)}, "Date": {date.Format(http.TimeFormat)}}, 30 * time.Second},
		{http.Header{"Retry-After": {date.Format(http.TimeFormat)}, "Date": {date.Add(time.Minute).Format(http.TimeFormat)}}, 0},
		{http.Header{"Retry-After": {"soon"}}, 0},
		{http.Header{"Retry-After": {"-3"}}, 0},
		{http.Header{"Retry-After": {"NaN"}}, 0},
		{http.Header{"Retry-After-Ms": {"x"}, "Retry-After": {"1"}}, time.Second},
		{http.Header{"Retry-After": {"1e30"}}, bulkhead.MaxRetryAfter},
		{http.Header{}, 0},
	} {
		if got := RetryAfter(tt.h); got != tt.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", tt.h, got, tt.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestOutcomeOf(t *testing.T) {
	status := func(s int, h ...string) *http.Response {
		r := &http.Response{StatusCode: s, Header: http.Header{}}
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Set(h[i], h[i+1])
		}
		return r
	}
	for _, tt := range []struct {
		resp  *http.Response
		err   error
		o     bulkhead.Outcome
		retry time.Duration
		ok    bool
	}{
		{status(200), nil, bulkhead.OutcomeSuccess, 0, true},
		{status(429, "Retry-After", "3"), nil, bulkhead.OutcomeRateLimited, 3 * time.Second, true},
		{status(529, "Retry-After-Ms", "250"), nil, bulkhead.OutcomeOverloaded, 250 * time.Millisecond, true},
		{status(503), nil, bulkhead.OutcomeOverloaded, 0, true},
		{status(504), nil, bulkhead.OutcomeTimeout, 0, true},
		{status(400, "Retry-After", "3"), nil, bulkhead.OutcomeFailed, 0, true},
		{nil, fmt.Errorf("send: %w", context.DeadlineExceeded), bulkhead.OutcomeTimeout, 0, true},
		{nil, timeoutErr{}, bulkhead.OutcomeTimeout, 0, true},
		{nil, errors.New("connection refused"), bulkhead.OutcomeFailed, 0, true},
		{nil, context.Canceled, 0, 0, false},
	} {
		o, retry, ok := OutcomeOf(tt.resp, tt.err)
		if o != tt.o || retry != tt.retry || ok != tt.ok {
			t.Errorf("OutcomeOf(%v, %v) = %v, %v, %v; want %v, %v, %v", tt.resp, tt.err, o, retry, ok, tt.o, tt.retry, tt.ok)
		}
	}
}

// limitedUpstream is a provider on loopback that answers its first call
// 429 with retry-after 3 seconds, and every later one 200.
func limitedUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if hits.Add(1) == 1 {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func cooldownBulkhead(t *testing.T, clk clock.Clock, mode bulkhead.CooldownMode) *bulkhead.Bulkhead {
	cfg := bulkhead.Interactive("gpt-4o", 8)
	cfg.MaxQueue = 4 // held calls wait in the queue
	cfg.Clock = clk
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100_000}
	cfg.Adaptive = &bulkhead.Adaptive{Cooldown: mode}
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Settle)
		defer cancel()
		if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
			t.Errorf("Shutdown: %+v, %v", res, err)
		}
	})
	return b
}

func postTo(ctx context.Context, rt http.RoundTripper, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		return nil, err
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

func TestTransportCooldownShed(t *testing.T) {
	clk := clock.NewMock()
	b := cooldownBulkhead(t, clk, bulkhead.ShedCooldown)
	srv, hits := limitedUpstream(t)
	tr := &Transport{Bulkhead: b, Base: srv.Client().Transport}
	resp, err := postTo(context.Background(), tr, srv.URL)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("first call: %v, %v", resp, err)
	}
	clk.Add(time.Second)
	_, err = postTo(context.Background(), tr, srv.URL)
	rej := testutil.WantReason(t, err, bulkhead.Cooldown)
	if d, ok := rej.RetryAfter(); !ok || d != 2*time.Second {
		t.Fatalf("RetryAfter = %v, %v, want the 2s left", d, ok)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("%d upstream hits during the cool-down, want only the first", n)
	}
	clk.Add(2 * time.Second)
	if resp, err := postTo(context.Background(), tr, srv.URL); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the cool-down: %v, %v", resp, err)
	}
	st := b.Stats()
	if hits.Load() != 2 || st.Adaptive.Samples != 2 || st.Adaptive.Decreases != 1 || st.Limits.MaxConcurrent != 6 {
		t.Fatalf("%d hits, adaptive %+v, limits %v", hits.Load(), st.Adaptive, st.Limits)
	}
}

func TestTransportCooldownHold(t *testing.T) {
	clk := clock.NewMock()
	b := cooldownBulkhead(t, clk, bulkhead.HoldCooldown)
	srv, hits := limitedUpstream(t)
	tr := &Transport{Bulkhead: b, Base: srv.Client().Transport}
	if resp, err := postTo(context.Background(), tr, srv.URL); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("first call: %v, %v", resp, err)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := postTo(context.Background(), tr, srv.URL)
		done <- answer{resp, err}
	}()
	testutil.WaitFor(t, "the call to hold", func() bool { return b.Stats().Gate.Pending == 1 }) // held in the queue
	clk.Add(2 * time.Second)
	if n := hits.Load(); n != 1 {
		t.Fatalf("%d upstream hits during the cool-down, want only the first", n)
	}
	clk.Add(time.Second)
	a := <-done
	if a.err != nil || a.resp.StatusCode != 200 || hits.Load() != 2 {
		t.Fatalf("held call: %v, %v, %d hits", a.resp, a.err, hits.Load())
	}
}
