package main

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSDKRetryRules: the load generator retries what the official Go SDKs
// retry, and waits what they wait.
func TestSDKRetryRules(t *testing.T) {
	resp := func(status int, h ...string) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}}
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Set(h[i], h[i+1])
		}
		return r
	}
	for _, tc := range []struct {
		res   *http.Response
		err   error
		retry bool
	}{
		{nil, errors.New("connection refused"), true},
		{resp(408), nil, true},
		{resp(409), nil, true},
		{resp(429), nil, true},
		{resp(500), nil, true},
		{resp(503), nil, true},
		{resp(529), nil, true},
		{resp(400), nil, false},
		{resp(413), nil, false},
		{resp(503, "X-Should-Retry", "false"), nil, false},
		{resp(400, "X-Should-Retry", "true"), nil, true},
	} {
		if got := shouldRetry(tc.res, tc.err); got != tc.retry {
			t.Errorf("shouldRetry(%v, %v) = %v", tc.res, tc.err, got)
		}
	}
	s := newSDK("http://127.0.0.1:1", 1)
	defer s.close()
	for n, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		for range 50 {
			d, ok := s.retryDelay(resp(503), n)
			if !ok || d > want || d <= want*3/4 {
				t.Fatalf("retry %d: waits %v, want within (%v, %v]", n, d, want*3/4, want)
			}
		}
	}
	for _, tc := range []struct {
		h    []string
		want time.Duration
		ok   bool
	}{
		{[]string{"Retry-After-Ms", "1730", "Retry-After", "9"}, 1730 * time.Millisecond, true},
		{[]string{"Retry-After", "2"}, 2 * time.Second, true},
		{[]string{"Retry-After", "0.5"}, 500 * time.Millisecond, true},
		{[]string{"Retry-After", "121"}, 121 * time.Second, false}, // over two minutes: openai-go gives up
	} {
		d, ok := s.retryDelay(resp(429, tc.h...), 0)
		if d != tc.want || ok != tc.ok {
			t.Errorf("%v: %v %v, want %v %v", tc.h, d, ok, tc.want, tc.ok)
		}
	}
}
