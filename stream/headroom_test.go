package stream

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestHeadroomOf(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	openai := hdr(
		"X-Ratelimit-Limit-Requests", "10000",
		"X-Ratelimit-Limit-Tokens", "2000000",
		"X-Ratelimit-Remaining-Requests", "9999",
		"X-Ratelimit-Remaining-Tokens", "1999217",
		"X-Ratelimit-Reset-Requests", "6ms",
		"X-Ratelimit-Reset-Tokens", "23ms",
	)
	anthropic := hdr(
		"Date", now.Format(http.TimeFormat),
		"Anthropic-Ratelimit-Requests-Limit", "4000",
		"Anthropic-Ratelimit-Requests-Remaining", "3999",
		"Anthropic-Ratelimit-Requests-Reset", now.Add(15*time.Millisecond).Format(time.RFC3339Nano),
		"Anthropic-Ratelimit-Tokens-Limit", "400000",
		"Anthropic-Ratelimit-Tokens-Remaining", "398000",
		"Anthropic-Ratelimit-Tokens-Reset", now.Add(time.Second).Format(time.RFC3339),
		"Anthropic-Ratelimit-Input-Tokens-Remaining", "1",
	)
	for _, tt := range []struct {
		name string
		h    http.Header
		now  time.Time
		want *bulkhead.Headroom
	}{
		{"openai", openai, now, &bulkhead.Headroom{Tokens: 1999217, Requests: 9999, TokensLimit: 2000000, RequestsLimit: 10000,
			TokensReset: 23 * time.Millisecond, RequestsReset: 6 * time.Millisecond}},
		{"openai long resets", hdr("X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Limit-Tokens", "30000",
			"X-Ratelimit-Reset-Tokens", "1h2m3.5s", "X-Ratelimit-Remaining-Requests", "2", "X-Ratelimit-Reset-Requests", "6m0s"), now,
			&bulkhead.Headroom{Tokens: 0, Requests: 2, TokensLimit: 30000, TokensReset: time.Hour + 2*time.Minute + 3500*time.Millisecond, RequestsReset: 6 * time.Minute}},
		{"openai tokens only, reset in seconds", hdr("X-Ratelimit-Remaining-Tokens", "500", "X-Ratelimit-Reset-Tokens", "1.5"), now,
			&bulkhead.Headroom{Tokens: 500, Requests: -1, TokensReset: 1500 * time.Millisecond}},
		{"anthropic", anthropic, now.Add(time.Hour), &bulkhead.Headroom{Tokens: 398000, Requests: 3999, TokensLimit: 400000, RequestsLimit: 4000,
			TokensReset: time.Second, RequestsReset: 15 * time.Millisecond}},
		{"anthropic without Date", hdr("Anthropic-Ratelimit-Tokens-Remaining", "10", "Anthropic-Ratelimit-Tokens-Reset", now.Add(time.Minute).Format(time.RFC3339)), now,
			&bulkhead.Headroom{Tokens: 10, Requests: -1, TokensReset: time.Minute}},
		{"anthropic input tokens", hdr("Anthropic-Ratelimit-Input-Tokens-Limit", "80000", "Anthropic-Ratelimit-Input-Tokens-Remaining", "79000",
			"Anthropic-Ratelimit-Input-Tokens-Reset", now.Add(2*time.Second).Format(time.RFC3339)), now,
			&bulkhead.Headroom{Tokens: 79000, Requests: -1, TokensLimit: 80000, TokensReset: 2 * time.Second}},
		{"anthropic reset past", hdr("Anthropic-Ratelimit-Tokens-Remaining", "10", "Anthropic-Ratelimit-Tokens-Reset", now.Add(-time.Minute).Format(time.RFC3339)), now,
			&bulkhead.Headroom{Tokens: 10, Requests: -1}},
		{"remaining above limit", hdr("X-Ratelimit-Remaining-Tokens", "900", "X-Ratelimit-Limit-Tokens", "100"), now,
			&bulkhead.Headroom{Tokens: 100, Requests: -1, TokensLimit: 100}},
		{"garbage", hdr("X-Ratelimit-Remaining-Tokens", "lots", "X-Ratelimit-Limit-Tokens", "-5", "X-Ratelimit-Reset-Tokens", "soon",
			"X-Ratelimit-Remaining-Requests", "-1"), now, nil},
		{"huge reset", hdr("X-Ratelimit-Remaining-Tokens", "1", "X-Ratelimit-Reset-Tokens", "100000h"), now,
			&bulkhead.Headroom{Tokens: 1, Requests: -1, TokensReset: bulkhead.MaxRetryAfter}},
		{"none", hdr("Content-Type", "application/json"), now, nil},
		{"empty", nil, now, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := HeadroomOf(tt.h, tt.now)
			if (got == nil) != (tt.want == nil) || got != nil && *got != *tt.want {
				t.Fatalf("HeadroomOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzHeadroomOf checks that whatever the headers say, HeadroomOf returns
// nil or valid feedback, and never panics.
func FuzzHeadroomOf(f *testing.F) {
	for _, s := range [][4]string{
		{"1999217", "2000000", "23ms", "9999"},
		{"0", "30000", "1h2m3.5s", "6m0s"},
		{"-1", "-1", "-1s", "x"},
		{"900", "100", "1e300", "NaN"},
		{"9223372036854775807", "9223372036854775807", "2562047h47m16.854775807s", "Inf"},
		{"", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], "2026-12-01T12:00:01Z")
	}
	b, err := bulkhead.New(bulkhead.Config{Model: "m", MaxConcurrent: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(b.Close)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, remaining, limit, reset, other, at string) {
		for _, h := range []http.Header{
			hdr("X-Ratelimit-Remaining-Tokens", remaining, "X-Ratelimit-Limit-Tokens", limit, "X-Ratelimit-Reset-Tokens", reset,
				"X-Ratelimit-Remaining-Requests", other, "X-Ratelimit-Limit-Requests", limit, "X-Ratelimit-Reset-Requests", other),
			hdr("Anthropic-Ratelimit-Tokens-Remaining", remaining, "Anthropic-Ratelimit-Tokens-Limit", limit, "Anthropic-Ratelimit-Tokens-Reset", at,
				"Anthropic-Ratelimit-Requests-Remaining", other, "Anthropic-Ratelimit-Requests-Reset", reset, "Date", at),
		} {
			hr := HeadroomOf(h, now)
			if hr == nil {
				continue
			}
			if hr.Tokens < 0 && hr.Requests < 0 {
				t.Fatalf("HeadroomOf(%v) = %+v: says nothing, want nil", h, hr)
			}
			if err := b.Feedback(bulkhead.Feedback{Model: "fuzz", Outcome: bulkhead.OutcomeSuccess, Headroom: hr}); err != nil {
				t.Fatalf("HeadroomOf(%v) = %+v: invalid feedback: %v", h, hr, err)
			}
		}
	})
}

// headroomUpstream is a provider on loopback whose answers say, in
// OpenAI's headers, that 1,000 tokens of 60,000 are left, full again in a
// minute, and that of two requests (the window full again 10s later) the
// first answer leaves one and the next ones none.
func headroomUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Limit-Tokens", "60000")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "1000")
		w.Header().Set("X-Ratelimit-Reset-Tokens", "1m0s")
		w.Header().Set("X-Ratelimit-Remaining-Requests", strconv.FormatInt(max(0, 2-n), 10))
		w.Header().Set("X-Ratelimit-Reset-Requests", "10s")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestTransportHeadroom(t *testing.T) {
	for _, mode := range []bulkhead.CooldownMode{bulkhead.ShedCooldown, bulkhead.HoldCooldown} {
		t.Run(mode.String(), func(t *testing.T) {
			clk := clock.NewMock()
			b := cooldownBulkhead(t, clk, mode)
			srv, hits := headroomUpstream(t)
			tr := &Transport{Bulkhead: b, Base: srv.Client().Transport}
			// The first answer says one request is left: the second call
			// fits, its answer says none is, and the third call waits for
			// the requests' window to be full again, 10s after that answer.
			if resp, err := postTo(context.Background(), tr, srv.URL); err != nil || resp.StatusCode != 200 {
				t.Fatalf("first call: %v, %v", resp, err)
			}
			hr := b.Stats().Cooldown.Headroom["gpt-4o"]
			if hr.Requests != 1 || hr.Tokens != 1000 || hr.TokensLimit != 60000 {
				t.Fatalf("headroom after the first call: %+v", hr)
			}
			if resp, err := postTo(context.Background(), tr, srv.URL); err != nil || resp.StatusCode != 200 {
				t.Fatalf("second call: %v, %v", resp, err)
			}
			clk.Add(time.Second)
			if mode == bulkhead.ShedCooldown {
				_, err := postTo(context.Background(), tr, srv.URL)
				rej := testutil.WantReason(t, err, bulkhead.Cooldown)
				if d, ok := rej.RetryAfter(); !ok || d != 9*time.Second || !rej.Detail.Cooldown.Headroom {
					t.Fatalf("RetryAfter = %v, %v (%+v), want the 9s left of the requests' window", d, ok, rej.Detail.Cooldown)
				}
				if n := hits.Load(); n != 2 {
					t.Fatalf("%d upstream hits, want 2", n)
				}
				return
			}
			done := make(chan error, 1)
			go func() {
				_, err := postTo(context.Background(), tr, srv.URL)
				done <- err
			}()
			testutil.WaitFor(t, "the call to hold", func() bool { return b.Stats().Gate.Pending == 1 }) // held in the queue
			if n := hits.Load(); n != 2 {
				t.Fatalf("%d upstream hits while held, want 2", n)
			}
			clk.Add(9 * time.Second)
			if err := <-done; err != nil || hits.Load() != 3 {
				t.Fatalf("held call: %v, %d hits", err, hits.Load())
			}
		})
	}
}

// Reset values that are not plain numbers are ignored (they were read as a
// 24h window).
func TestHeadroomOfIgnoresNonNumericReset(t *testing.T) {
	for _, v := range []string{"inf", "Infinity", "1e400", "0x1p20"} {
		hdr := http.Header{}
		hdr.Set("X-Ratelimit-Remaining-Tokens", "10")
		hdr.Set("X-Ratelimit-Limit-Tokens", "100")
		hdr.Set("X-Ratelimit-Reset-Tokens", v)
		h := HeadroomOf(hdr, time.Now())
		if h != nil && h.TokensReset != 0 {
			t.Errorf("reset %q read as %v, want it ignored", v, h.TokensReset)
		}
	}
}

// TestHeadroomOfProviderHeaders reads headroom from OpenAI's and Anthropic's
// rate-limit headers as the providers send them (reset durations in their
// many forms, reset times against the response's Date), and none from
// garbage.
func TestHeadroomOfProviderHeaders(t *testing.T) {
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
	}{{"6m0s", 6 * time.Minute}, {"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond}, {"20ms", 20 * time.Millisecond}, {"7.66s", 7660 * time.Millisecond}, {"1", time.Second}} {
		hdr := http.Header{}
		hdr.Set("x-ratelimit-remaining-tokens", "149984")
		hdr.Set("x-ratelimit-limit-tokens", "150000")
		hdr.Set("x-ratelimit-reset-tokens", c.v)
		hdr.Set("x-ratelimit-remaining-requests", "59")
		hdr.Set("x-ratelimit-limit-requests", "60")
		hdr.Set("x-ratelimit-reset-requests", "1s")
		h := HeadroomOf(hdr, now)
		if h == nil || h.TokensReset != c.want || h.Tokens != 149984 || h.TokensLimit != 150000 || h.Requests != 59 || h.RequestsReset != time.Second {
			t.Errorf("%q: %+v", c.v, h)
		}
	}
	hdr := http.Header{}
	hdr.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
	hdr.Set("anthropic-ratelimit-tokens-remaining", "39000")
	hdr.Set("anthropic-ratelimit-tokens-limit", "40000")
	hdr.Set("anthropic-ratelimit-tokens-reset", "2024-01-01T00:00:30Z")
	hdr.Set("anthropic-ratelimit-requests-remaining", "49")
	hdr.Set("anthropic-ratelimit-requests-reset", "2024-01-01T00:00:01.5Z")
	h := HeadroomOf(hdr, now.Add(time.Hour))
	if h == nil || h.TokensReset != 30*time.Second || h.RequestsReset != 1500*time.Millisecond || h.RequestsLimit != 0 || h.Tokens != 39000 {
		t.Errorf("anthropic: %+v", h)
	}
	bad := http.Header{}
	bad.Set("x-ratelimit-remaining-tokens", "lots")
	bad.Set("x-ratelimit-remaining-requests", "-3")
	if h := HeadroomOf(bad, now); h != nil {
		t.Errorf("garbage read as %+v", h)
	}
}
