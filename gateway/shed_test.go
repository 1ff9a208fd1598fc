package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/stream"
)

// rejectionOf makes a real rejection of reason why from a bulkhead.
func rejections(t *testing.T) map[string]error {
	t.Helper()
	newB := func(cfg bulkhead.Config) *bulkhead.Bulkhead {
		b, err := bulkhead.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = b.Shutdown(context.Background()) })
		return b
	}
	req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}, MaxTokens: 100}
	out := map[string]error{}

	full := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1})
	p, _ := full.Acquire(context.Background(), req)
	t.Cleanup(func() { _ = p.Release(nil) })
	_, out["concurrency"] = full.Acquire(context.Background(), req, bulkhead.WithTag("t1"))

	budget := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, TokenBudget: &bulkhead.TokenBudget{Budget: 50}})
	_, out["never fits"] = budget.Acquire(context.Background(), req)

	rate := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, Clock: clock.NewMock(),
		TokenBudget: &bulkhead.TokenBudget{Budget: 1 << 30},
		RateLimits:  &bulkhead.RateLimits{PerModel: bulkhead.Rate{TokensPerMinute: 6000, TokenBurst: bulkhead.NoBurst}}})
	p2, _ := rate.Acquire(context.Background(), req)
	t.Cleanup(func() { _ = p2.Release(nil) })
	_, out["rate"] = rate.Acquire(context.Background(), req)

	output := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, Clock: clock.NewMock(),
		TokenBudget: &bulkhead.TokenBudget{Budget: 1 << 30},
		RateLimits:  &bulkhead.RateLimits{PerModel: bulkhead.Rate{OutputTokensPerMinute: 6000, OutputTokenBurst: bulkhead.NoBurst}}})
	p4, _ := output.Acquire(context.Background(), req)
	t.Cleanup(func() { _ = p4.Release(nil) })
	_, out["output rate"] = output.Acquire(context.Background(), req)

	cls := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, Classes: &bulkhead.Classes{Default: "a",
		Limits: map[string]bulkhead.ClassLimits{"a": {MaxConcurrent: bulkhead.Ceiling(1)}}}})
	p3, _ := cls.Acquire(context.Background(), req)
	t.Cleanup(func() { _ = p3.Release(nil) })
	_, out["class"] = cls.Acquire(context.Background(), req)

	cool := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, Clock: clock.NewMock(),
		Adaptive: &bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}})
	_ = cool.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: 2500 * time.Millisecond})
	_, out["cooldown"] = cool.Acquire(context.Background(), req)

	closed := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4})
	closed.Close()
	_, out["shutdown"] = closed.Acquire(context.Background(), req)

	retries := newB(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, Clock: clock.NewMock(),
		RetryBudgets: &bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 0.1, MinRetries: 0}}})
	_, out["retry budget"] = retries.Acquire(context.Background(), req, bulkhead.WithAttempt(1))
	return out
}

// TestRetryOverBudgetIsToldNotToRetry: a retry its budget refuses is
// answered as overload in each dialect (503, 529 for Anthropic), with
// x-should-retry: false, which the official SDKs obey whatever the status,
// no retry-after, and the budget's numbers in the detail.
func TestRetryOverBudgetIsToldNotToRetry(t *testing.T) {
	err := rejections(t)["retry budget"]
	for _, tc := range []struct {
		format              stream.Format
		status              int
		typ, typePath, code string
	}{
		{stream.OpenAIChat, 503, "service_unavailable_error", "error.type", "retry_budget_exceeded"},
		{stream.OpenAIResponses, 503, "service_unavailable_error", "error.type", "retry_budget_exceeded"},
		{stream.AnthropicMessages, 529, "overloaded_error", "error.type", ""},
		{stream.Gemini, 503, "UNAVAILABLE", "error.status", ""},
	} {
		s := write(t, tc.format, err)
		if s.status != tc.status || s.shouldRetry != "false" || s.retryAfter != "" || s.retryAfterMs != "" {
			t.Errorf("%v: status %d, x-should-retry %q, retry-after %q/%q", tc.format, s.status, s.shouldRetry, s.retryAfter, s.retryAfterMs)
		}
		if field(s.body, tc.typePath) != tc.typ || tc.code != "" && field(s.body, "error.code") != tc.code {
			t.Errorf("%v: body %v", tc.format, s.body)
		}
		detail := "error.bulkhead."
		if tc.format == stream.AnthropicMessages {
			detail = "bulkhead."
		}
		if field(s.body, detail+"reason") != "retry_budget" || field(s.body, detail+"retry_budget.ratio") != 0.1 ||
			field(s.body, detail+"retry_budget.window_ms") != 10000.0 || field(s.body, detail+"retry_budget.allowed") != 0.0 ||
			field(s.body, detail+"retry_budget.first_attempts") != 0.0 || field(s.body, detail+"retry_budget.retries") != 0.0 {
			t.Errorf("%v: detail %v", tc.format, field(s.body, strings.TrimSuffix(detail, ".")))
		}
	}
}

type shed struct {
	status       int
	retryAfter   string
	retryAfterMs string
	shouldRetry  string
	body         map[string]any
}

func write(t *testing.T, f stream.Format, err error) shed {
	t.Helper()
	rec := httptest.NewRecorder()
	status := gateway.WriteError(rec, f, err)
	if status != rec.Code {
		t.Fatalf("WriteError returned %d, wrote %d", status, rec.Code)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	return shed{rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("Retry-After-Ms"), rec.Header().Get("X-Should-Retry"), body}
}

// field reads a dotted path of a JSON body.
func field(body map[string]any, path string) any {
	var v any = body
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func TestWriteErrorOpenAI(t *testing.T) {
	errs := rejections(t)
	for _, tc := range []struct {
		name, typ, code string
		status          int
		retry           bool
		retryAfter      string
	}{
		{"concurrency", "service_unavailable_error", "server_is_overloaded", 503, true, ""},
		{"shutdown", "service_unavailable_error", "server_is_overloaded", 503, true, ""},
		{"never fits", "invalid_request_error", "request_too_large", 413, false, ""},
		{"rate", "tokens", "rate_limit_exceeded", 429, true, "2"}, // 1.01 s, rounded up
		{"class", "requests", "rate_limit_exceeded", 429, true, ""},
		{"cooldown", "requests", "rate_limit_exceeded", 429, true, "3"}, // 2.5 s, rounded up
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := write(t, stream.OpenAIChat, errs[tc.name])
			if s.status != tc.status || s.shouldRetry != fmt.Sprint(tc.retry) || s.retryAfter != tc.retryAfter {
				t.Fatalf("status %d, x-should-retry %q, retry-after %q; want %d, %v, %q", s.status, s.shouldRetry, s.retryAfter, tc.status, tc.retry, tc.retryAfter)
			}
			if field(s.body, "error.type") != tc.typ || field(s.body, "error.code") != tc.code || field(s.body, "error.message") != errs[tc.name].Error() {
				t.Fatalf("body %v", s.body)
			}
			if _, ok := field(s.body, "error").(map[string]any)["param"]; !ok {
				t.Fatalf("no param field: %v", s.body)
			}
			var rej *bulkhead.RejectedError
			errors.As(errs[tc.name], &rej)
			if field(s.body, "error.bulkhead.reason") != rej.Reason.String() {
				t.Fatalf("bulkhead detail %v", field(s.body, "error.bulkhead"))
			}
		})
	}
	// The rate rejection: exact milliseconds (100 tokens at 100 tokens/s
	// after the first call: 1.01 s) and OpenAI's rate headers.
	rec := httptest.NewRecorder()
	gateway.WriteError(rec, stream.OpenAIChat, errs["rate"])
	if got := rec.Header().Get("Retry-After-Ms"); got != "1010" {
		t.Fatalf("retry-after-ms %q", got)
	}
	if rec.Header().Get("X-Ratelimit-Limit-Tokens") != "6000" || rec.Header().Get("X-Ratelimit-Reset-Tokens") != "1.01s" {
		t.Fatalf("rate headers %v", rec.Header())
	}
	var body struct {
		Error struct {
			Bulkhead gateway.Detail `json:"bulkhead"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	d := body.Error.Bulkhead
	if d.Reason != "rate_limit" || d.RetryAfterMs != 1010 || d.Rate == nil || d.Rate.Limit != "tokens" || d.Rate.PerMinute != 6000 || d.Rate.Weight != 101 {
		t.Fatalf("detail %+v rate %+v", d, d.Rate)
	}
	// The bucket that turned the call away had no room left: 0 remains (the
	// pacer's level at the decision), as the header says.
	if d.Rate.Remaining == nil || *d.Rate.Remaining != 0 || rec.Header().Get("X-Ratelimit-Remaining-Tokens") != "0" {
		t.Fatalf("remaining %v, header %q", d.Rate.Remaining, rec.Header().Get("X-Ratelimit-Remaining-Tokens"))
	}
	// An output-token rate: OpenAI's "tokens" type, and headers named
	// with hyphens.
	err := errs["output rate"]
	rec = httptest.NewRecorder()
	gateway.WriteError(rec, stream.OpenAIChat, err)
	if rec.Header().Get("X-Ratelimit-Limit-Output-Tokens") != "6000" || rec.Header().Get("X-Ratelimit-Reset-Output-Tokens") != "1s" {
		t.Fatalf("output rate headers %v", rec.Header())
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if got := field(write(t, stream.OpenAIChat, err).body, "error.type"); got != "tokens" || body.Error.Bulkhead.Rate.Limit != "output_tokens" {
		t.Fatalf("output rate: type %v, detail %+v", got, body.Error.Bulkhead.Rate)
	}
	// The Anthropic and Gemini dialects send no OpenAI headers.
	rec = httptest.NewRecorder()
	gateway.WriteError(rec, stream.AnthropicMessages, errs["rate"])
	if got := rec.Header().Get("X-Ratelimit-Remaining-Tokens"); got != "" {
		t.Fatalf("anthropic remaining header %q", got)
	}
	// The cool-down: the provider's own time, exact in milliseconds.
	s := write(t, stream.OpenAIChat, errs["cooldown"])
	if s.retryAfterMs != "2500" || field(s.body, "error.bulkhead.retry_after_ms") != 2500.0 ||
		field(s.body, "error.bulkhead.cooldown.model") != "gpt-4o" || field(s.body, "error.bulkhead.reason") != "cooldown" {
		t.Fatalf("cooldown: %+v", s)
	}
	if tag := field(write(t, stream.OpenAIChat, errs["concurrency"]).body, "error.bulkhead.tag"); tag != "t1" {
		t.Fatalf("tag %v", tag)
	}
}

func TestWriteErrorAnthropic(t *testing.T) {
	errs := rejections(t)
	s := write(t, stream.AnthropicMessages, errs["concurrency"])
	if s.status != 529 || s.shouldRetry != "true" || field(s.body, "type") != "error" || field(s.body, "error.type") != "overloaded_error" ||
		field(s.body, "bulkhead.reason") != "concurrency_limit" || field(s.body, "bulkhead.max_concurrent") != 1.0 {
		t.Fatalf("overload: %+v", s)
	}
	s = write(t, stream.AnthropicMessages, errs["rate"])
	if s.status != 429 || s.retryAfter != "2" || s.retryAfterMs != "1010" || field(s.body, "error.type") != "rate_limit_error" {
		t.Fatalf("rate: %+v", s)
	}
	s = write(t, stream.AnthropicMessages, errs["cooldown"])
	if s.status != 429 || s.retryAfter != "3" || s.retryAfterMs != "2500" || field(s.body, "error.type") != "rate_limit_error" {
		t.Fatalf("cooldown: %+v", s)
	}
	s = write(t, stream.AnthropicMessages, errs["never fits"])
	if s.status != 413 || s.shouldRetry != "false" || field(s.body, "error.type") != "invalid_request_error" || field(s.body, "bulkhead.never_fits") != true {
		t.Fatalf("never fits: %+v", s)
	}
}

func TestWriteErrorGemini(t *testing.T) {
	errs := rejections(t)
	s := write(t, stream.Gemini, errs["rate"])
	if s.status != 429 || field(s.body, "error.code") != 429.0 || field(s.body, "error.status") != "RESOURCE_EXHAUSTED" || field(s.body, "error.bulkhead.reason") != "rate_limit" {
		t.Fatalf("rate: %+v", s)
	}
	s = write(t, stream.Gemini, errs["shutdown"])
	if s.status != 503 || field(s.body, "error.status") != "UNAVAILABLE" {
		t.Fatalf("shutdown: %+v", s)
	}
}

func TestWriteErrorOthers(t *testing.T) {
	_, bodyErr := stream.ParseRequest(stream.OpenAIChat, []byte(`{"messages": 3}`))
	for _, tc := range []struct {
		name   string
		err    error
		status int
		retry  string
	}{
		{"bad body", bodyErr, 400, "false"},
		{"too large", &stream.TooLargeError{Limit: 10}, 413, "false"},
		{"client gone", context.Canceled, gateway.StatusClientClosedRequest, "false"},
		{"upstream", errors.New("dial tcp: connection refused"), 502, "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := write(t, stream.OpenAIChat, tc.err)
			if s.status != tc.status || s.shouldRetry != tc.retry || s.retryAfter != "" || field(s.body, "error.bulkhead") != nil {
				t.Fatalf("%+v", s)
			}
		})
	}
}

func TestRetryAfterCapped(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Config{Model: "m", MaxConcurrent: 2, Clock: clock.NewMock(),
		RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 0.5, RequestBurst: bulkhead.NoBurst}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}
	p, _ := b.Acquire(context.Background(), req)
	defer p.Release(nil)
	_, err = b.Acquire(context.Background(), req)
	s := write(t, stream.OpenAIChat, err)
	if s.retryAfter != "60" || s.retryAfterMs != fmt.Sprint((2*time.Minute).Milliseconds()) {
		t.Fatalf("retry-after %q, retry-after-ms %q: want 60 s at most, and the exact 120000 ms", s.retryAfter, s.retryAfterMs)
	}
}
