package gateway_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/stream"
)

// This example puts an OpenAI-compatible upstream behind a bulkhead that
// admits no call (MaxConcurrent 0, a kill switch), so the client is told,
// in OpenAI's own dialect, to retry later.
func ExampleNew() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[]}`)
	}))
	defer upstream.Close()

	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 0})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	u, _ := url.Parse(upstream.URL)
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b})
	if err != nil {
		log.Fatal(err)
	}
	gw := httptest.NewServer(h) // or http.ListenAndServe(":8080", h)
	defer gw.Close()

	res, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	fmt.Println(res.StatusCode, res.Header.Get("X-Should-Retry"))
	// Output:
	// 503 true
}
