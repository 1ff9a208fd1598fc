package stream_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// A server reads a call from an incoming request: the format comes from
// the path, and the body stays readable for forwarding.
func ExampleReadRequest() {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":200}`))
	call, err := stream.ReadRequest(req, 0) // 0: the default limit, 32 MiB
	if err != nil {
		fmt.Println(err) // a *stream.BodyError or *stream.TooLargeError, matching bulkhead.ErrInvalid
		return
	}
	body, _ := io.ReadAll(req.Body)
	fmt.Println(call.Format, call.Request.Model, call.Request.MaxTokens, call.Stream, len(body) > 0)
	// Output: openai_chat gpt-4o 200 true true
}

// MeterResponse wraps a provider's response: the caller reads the body as
// it came, and the permit is released with the provider's usage at its end.
func ExampleMeterResponse() {
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4, TokenBudget: &bulkhead.TokenBudget{Budget: 100_000}})
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())
	released := make(chan bulkhead.ReleaseEvent, 1)
	b.Subscribe(bulkhead.Hooks{Release: func(e bulkhead.ReleaseEvent) { released <- e }})

	p, err := b.Acquire(context.Background(), &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}, MaxTokens: 100})
	if err != nil {
		panic(err)
	}
	resp := &http.Response{
		StatusCode: 200,
		Header:     http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"id":"c1","object":"chat.completion","model":"gpt-4o",
			"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":8,"completion_tokens":3,"total_tokens":11}}`)),
	}
	m, err := stream.MeterResponse(resp, p, stream.MeterOptions{Format: stream.OpenAIChat, Model: "gpt-4o"})
	if err != nil {
		p.Release(nil)
		panic(err)
	}
	defer m.Close()
	text, _ := io.ReadAll(resp.Body) // resp.Body is m
	e := <-released
	fmt.Println(len(text) > 0, e.Usage.Input, e.Usage.Output)
	// Output: true 8 3
}

// FormatOf recognises an API by its endpoint, whatever comes before it.
func ExampleFormatOf() {
	for _, path := range []string{
		"/v1/chat/completions",
		"/openai/deployments/gpt-4o/chat/completions",
		"/v1/messages",
		"/v1beta/models/gemini-2.5-pro:streamGenerateContent",
		"/v1/embeddings",
	} {
		f, ok := stream.FormatOf(path)
		fmt.Printf("%s: %q %v\n", path, f, ok)
	}
	// Output:
	// /v1/chat/completions: "openai_chat" true
	// /openai/deployments/gpt-4o/chat/completions: "openai_chat" true
	// /v1/messages: "anthropic_messages" true
	// /v1beta/models/gemini-2.5-pro:streamGenerateContent: "gemini" true
	// /v1/embeddings: "" false
}

// HeadroomOf reads what a provider says is left of its rate limits, for
// Permit.FeedbackHeadroom.
func ExampleHeadroomOf() {
	h := http.Header{}
	h.Set("x-ratelimit-limit-tokens", "30000")
	h.Set("x-ratelimit-remaining-tokens", "1200")
	h.Set("x-ratelimit-reset-tokens", "6s")
	hr := stream.HeadroomOf(h, time.Now())
	fmt.Println(hr.Tokens, hr.TokensLimit, hr.TokensReset, hr.Requests)
	// Output: 1200 30000 6s -1
}

// OutcomeOf turns a provider's answer into feedback for the bulkhead's
// adaptive limits and cool-downs (a Transport does it for every call).
func ExampleOutcomeOf() {
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After-Ms": {"1500"}}}
	o, retryAfter, ok := stream.OutcomeOf(resp, nil)
	fmt.Println(o, retryAfter, ok)
	// Output: rate_limited 1.5s true
}
