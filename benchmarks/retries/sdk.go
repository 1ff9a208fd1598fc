package main

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sdk is a client that sends chat completions and retries them as the
// official Go SDKs do (openai-go v3 and anthropic-sdk-go, in
// internal/requestconfig: Execute, shouldRetry, retryDelay,
// parseRetryAfterHeader):
//
//   - up to MaxRetries (2) retries, each request numbered in
//     X-Stainless-Retry-Count (0 for the first);
//   - a retry when there is no response (a connection error), or when the
//     response's x-should-retry says "true"; none when it says "false";
//     otherwise for 408, 409, 429 and any status from 500;
//   - the wait before retry n (from 0): retry-after-ms, else retry-after
//     (seconds, or an HTTP date), when the response has one (openai-go
//     gives up on a wait over 2 minutes); else 0.5 s * 2^n, at most 8 s,
//     less a random jitter of up to a quarter;
//   - the caller's context bounds it all: the wait, and the request in
//     flight.
type sdk struct {
	url    string
	client *http.Client
	mu     sync.Mutex
	rng    *rand.Rand
}

// The SDKs' defaults.
const (
	maxRetries         = 2
	maxRetryDelay      = 8 * time.Second // openai-go's DefaultMaxServerDelay
	maxRetryAfterDelay = 2 * time.Minute // openai-go's defaultMaxRetryAfterDelay
)

const body = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":16}`

func newSDK(url string, seed uint64) *sdk {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 0, 4096
	return &sdk{url: url + "/v1/chat/completions", client: &http.Client{Transport: t}, rng: rand.New(rand.NewPCG(seed, 0x5d4))}
}

func (s *sdk) close() { s.client.CloseIdleConnections() }

// outcome is how a call ended.
type outcome int

const (
	outcomeOK     outcome = iota // answered 200
	outcomeGaveUp                // its context ended first: its user gave up
	outcomeFailed                // answered otherwise, after its last attempt
)

// call makes one call, with its retries, within ctx. measured marks its
// requests for the counts.
func (s *sdk) call(ctx context.Context, measured bool) outcome {
	for n := 0; ; n++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Stainless-Retry-Count", strconv.Itoa(n))
		if measured {
			req.Header.Set(measuredHeader, "1")
		}
		res, err := s.client.Do(req)
		if res != nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		switch {
		case ctx.Err() != nil:
			return outcomeGaveUp
		case err == nil && res.StatusCode == http.StatusOK:
			return outcomeOK
		case !shouldRetry(res, err) || n >= maxRetries:
			return outcomeFailed
		}
		delay, ok := s.retryDelay(res, n)
		if !ok {
			return outcomeFailed
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return outcomeGaveUp
		case <-t.C:
		}
	}
}

// shouldRetry is the SDKs' rule: no response (a connection error) is
// retried; x-should-retry decides when the response has it; otherwise
// 408, 409, 429 and 5xx are retried.
func shouldRetry(res *http.Response, err error) bool {
	if err != nil || res == nil {
		return true
	}
	switch res.Header.Get("X-Should-Retry") {
	case "true":
		return true
	case "false":
		return false
	}
	c := res.StatusCode
	return c == http.StatusRequestTimeout || c == http.StatusConflict || c == http.StatusTooManyRequests || c >= http.StatusInternalServerError
}

// retryDelay is the wait before retry n+1 after res (n counts from 0), and
// false when the SDK gives up instead (a server delay over two minutes).
func (s *sdk) retryDelay(res *http.Response, n int) (time.Duration, bool) {
	if d, ok, tooLong := retryAfter(res); ok {
		return d, !tooLong
	}
	backoff := 0.5 * float64(time.Second) * math.Pow(2, float64(n))
	delay := maxRetryDelay
	if backoff < float64(maxRetryDelay) {
		delay = time.Duration(backoff)
	}
	if j := int64(delay / 4); j > 0 {
		s.mu.Lock()
		delay -= time.Duration(s.rng.Int64N(j))
		s.mu.Unlock()
	}
	return delay, true
}

// retryAfter reads the server's delay: retry-after-ms, else retry-after
// (seconds, or an HTTP date); tooLong when it is over two minutes.
func retryAfter(res *http.Response) (d time.Duration, ok, tooLong bool) {
	if res == nil {
		return 0, false, false
	}
	for _, h := range []struct {
		name string
		unit time.Duration
	}{{"Retry-After-Ms", time.Millisecond}, {"Retry-After", time.Second}} {
		v := res.Header.Get(h.name)
		if v == "" {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && !math.IsInf(f, 0) {
			d := time.Duration(f * float64(h.unit))
			return d, true, d > maxRetryAfterDelay
		}
		if h.unit == time.Second {
			if t, err := http.ParseTime(v); err == nil {
				d := time.Until(t)
				return d, true, d > maxRetryAfterDelay
			}
		}
	}
	return 0, false, false
}
