package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/stream"
)

// ParseConfig checks a configuration file: a misspelt key is an error
// naming its line and the key it may have meant, and so is an upstream a
// route cannot use.
func ExampleParseConfig() {
	for _, text := range []string{
		`upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {max_concurent: 8}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]`,
		`clients: {app: {key_env: APP_KEY}}
upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {max_concurrent: 8}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]`,
	} {
		_, err := gateway.ParseConfig("gateway.yaml", []byte(text))
		fmt.Println(errors.Is(err, bulkhead.ErrInvalid), err)
	}
	// Output:
	// true gateway: gateway.yaml:2: bulkheads.main: unknown key "max_concurent" (did you mean max_concurrent?)
	// true gateway: gateway.yaml:2: upstreams.openai.api_key_env: is needed with clients: a client's key is the gateway's own, never sent upstream
}

// WriteError answers a call your own handler turned away, in the dialect
// of the API the client called.
func ExampleWriteError() {
	b, _ := bulkhead.New(bulkhead.Config{Model: "claude-sonnet-4-5", MaxConcurrent: 1, RateLimits: &bulkhead.RateLimits{
		PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst},
	}})
	ctx := context.Background()
	defer b.Shutdown(ctx)
	req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}
	first, _ := b.Acquire(ctx, req)
	_ = first.Release(nil)
	_, err := b.Acquire(ctx, req) // over the rate: one call a second

	w := httptest.NewRecorder()
	status := gateway.WriteError(w, stream.AnthropicMessages, err)
	d, _ := time.ParseDuration(w.Header().Get("Retry-After") + "s")
	fmt.Println(status, w.Header().Get("X-Should-Retry"), w.Header().Get("X-Bulkhead-Reason"), d > 0)
	// Output: 429 true rate_limit true
}
