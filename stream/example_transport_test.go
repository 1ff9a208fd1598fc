package stream_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// A Transport puts an HTTP client (an SDK's, through its HTTP client option)
// behind a bulkhead: each call is admitted before it is sent, and its
// admission is settled with the provider's own usage when the response
// ends.
func ExampleTransport() {
	// A fake OpenAI-compatible provider.
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o",
			"choices":[{"index":0,"message":{"role":"assistant","content":"Hi!"},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
	}))
	defer provider.Close()

	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 8,
		TokenBudget:   &bulkhead.TokenBudget{Budget: 20_000},
	})
	if err != nil {
		panic(err)
	}
	released := make(chan bulkhead.ReleaseEvent, 1)
	b.Subscribe(bulkhead.Hooks{Release: func(e bulkhead.ReleaseEvent) { released <- e }})

	client := &http.Client{Transport: &stream.Transport{Bulkhead: b}}
	resp, err := client.Post(provider.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"Say hi."}]}`))
	if err != nil {
		panic(err) // a rejection would be a *bulkhead.RejectedError here
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	e := <-released
	fmt.Printf("reserved %d tokens, consumed %d\n", e.Reserved, e.Usage.Total())
	b.Shutdown(context.Background())
	// Output: reserved 52 tokens, consumed 11
}
