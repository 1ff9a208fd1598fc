package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
	"github.com/llmbulkhead/bulkhead/internal/simprovider/httpapi"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// TestGatewayInFrontOfSimulatedProvider runs the gateway, built from its
// configuration, in front of the simulated provider of 'bulkhead
// provider', as the quick start does: every API answers 200, streamed and
// not; the bulkhead settles what the provider billed; the provider's
// rate-limit headers reach the bulkhead, which then turns away the call
// its account has no room for before the provider sees it; and a
// provider's 429 comes back to the caller with its Retry-After, and cools
// its model down.
func TestGatewayInFrontOfSimulatedProvider(t *testing.T) {
	prov, err := simprovider.New(simprovider.Config{RequestsPerMinute: 8, TokensPerMinute: 1_000_000, OutputMedian: 20, ChunkTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(httpapi.NewHandler(prov, httpapi.Options{}))
	defer up.Close()
	g, srv := buildGateway(t, `upstreams: {sim: {base_url: "`+up.URL+`"}}
bulkheads: {account: {model: gpt-4o, max_concurrent: 4, token_budget: 100000, adaptive: {rule: aimd, cooldown: shed}}}
routes:
  - {api: openai-chat, upstream: sim, bulkhead: account}
  - {api: openai-responses, upstream: sim, bulkhead: account}
  - {api: anthropic-messages, upstream: sim, bulkhead: account}
  - {api: gemini, upstream: sim, bulkhead: account}
`, nil, io.Discard)
	b := g.Bulkheads["account"]
	call := func(path, body string) *http.Response {
		t.Helper()
		res, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(res.Body); err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	const (
		chat     = `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello, world!"}],"max_tokens":64}`
		messages = `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hello, world!"}]}`
	)
	// Eight calls spend the account's eight requests a minute; the last
	// two, of gpt-4o, say no request is left.
	for _, c := range []struct{ path, body string }{
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"Hello, world!"}]}]}`},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", `{"contents":[{"parts":[{"text":"Hello, world!"}]}]}`},
		{"/v1/messages", messages},
		{"/v1/messages", strings.Replace(messages, `{"model"`, `{"stream":true,"model"`, 1)},
		{"/v1/responses", `{"model":"gpt-4o","input":"Hello, world!","max_output_tokens":64}`},
		{"/v1/responses", `{"model":"gpt-4o","input":"Hello, world!","max_output_tokens":64,"stream":true}`},
		{"/v1/chat/completions", chat},
		{"/v1/chat/completions", strings.Replace(chat, `{"model"`, `{"stream":true,"model"`, 1)},
	} {
		if res := call(c.path, c.body); res.StatusCode != 200 {
			t.Fatalf("%s: %d %v", c.path, res.StatusCode, res.Header)
		}
	}
	testutil.WaitFor(t, "the bulkhead to hold nothing", func() bool { return b.Stats().Calls.InFlight == 0 })
	st, billed := b.Stats(), prov.Stats()
	if st.TokenBudget.TotalConsumed != billed.InputTokens+billed.OutputTokens || billed.Completed != 8 {
		t.Errorf("the bulkhead settled %d tokens, the provider billed %d input + %d output", st.TokenBudget.TotalConsumed, billed.InputTokens, billed.OutputTokens)
	}
	if st.Cooldown.HeadroomReports != 6 { // every answer but Gemini's, which has no rate-limit headers
		t.Errorf("%d headroom reports, want 6", st.Cooldown.HeadroomReports)
	}

	// gpt-4o has no request left: the gateway answers for the provider.
	res := call("/v1/chat/completions", chat)
	if res.StatusCode != 429 || res.Header.Get("X-Bulkhead-Reason") != "cooldown" || res.Header.Get("Retry-After") == "" {
		t.Errorf("past the headroom: %d %v, want the gateway's own 429", res.StatusCode, res.Header)
	}
	if n := prov.Stats().Requests; n != 8 {
		t.Errorf("the provider saw %d requests, want 8", n)
	}
	// The claude model's last report said four were left: the call goes
	// up, and the provider's 429 comes back with its Retry-After; the next
	// one the gateway turns away itself.
	res = call("/v1/messages", messages)
	if res.StatusCode != 429 || res.Header.Get("X-Bulkhead-Reason") != "" || res.Header.Get("Retry-After") == "" || res.Header.Get("Anthropic-Ratelimit-Requests-Remaining") != "0" {
		t.Errorf("past the account's rate: %d %v, want the provider's 429", res.StatusCode, res.Header)
	}
	if res = call("/v1/messages", messages); res.StatusCode != 429 || res.Header.Get("X-Bulkhead-Reason") != "cooldown" {
		t.Errorf("after the provider's 429: %d %v, want the gateway's cool-down", res.StatusCode, res.Header)
	}
	if st := prov.Stats(); st.Requests != 9 || st.RateLimitedRequests != 1 {
		t.Errorf("provider %+v: want 9 requests, one over its rate", st)
	}
}
