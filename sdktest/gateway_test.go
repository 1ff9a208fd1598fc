package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// gatewayRig is a gateway in front of a fake provider, with one bulkhead
// per API; the SDKs talk to the gateway over plain HTTP.
type gatewayRig struct {
	srv      *httptest.Server
	b        *bulkhead.Bulkhead
	attempts atomic.Int64 // the calls the gateway was sent
}

func newGatewayRig(t *testing.T, p *provider, cfg bulkhead.Config) *gatewayRig {
	t.Helper()
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(p.srv.URL)
	base := &http.Transport{}
	h, err := gateway.New(
		gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, Transport: base},
		gateway.Route{Format: stream.AnthropicMessages, Upstream: u, Bulkhead: b, Transport: base},
	)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatewayRig{b: b}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.attempts.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		g.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
			t.Errorf("Shutdown = %+v, %v: an admission leaked", res, err)
		}
		base.CloseIdleConnections()
	})
	return g
}

func (g *gatewayRig) openai(opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(g.srv.URL + "/v1"), option.WithAPIKey("test")}, opts...)...)
}

func (g *gatewayRig) anthropic(opts ...aoption.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]aoption.RequestOption{aoption.WithBaseURL(g.srv.URL), aoption.WithAPIKey("test")}, opts...)...)
}

// idle waits until the gateway's bulkhead holds nothing.
func (g *gatewayRig) idle(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, "the gateway's bulkhead to hold nothing", func() bool {
		st := g.b.Stats()
		return st.Calls.InFlight == 0 && st.Gate.InFlight == 0 && (st.TokenBudget == nil || st.TokenBudget.InFlightTokens == 0)
	})
}

func TestGatewayOpenAI(t *testing.T) {
	p := newProvider(t, chatStream)
	g := newGatewayRig(t, p, budgetConfig("gpt-4o", 4, 10_000))
	c := g.openai()
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams)
	var text strings.Builder
	for s.Next() {
		if ch := s.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if text.String() != "Hello there, friend." {
		t.Errorf("text = %q", text.String())
	}
	g.idle(t)
	if st := g.b.Stats(); st.TokenBudget.TotalConsumed != 19 {
		t.Errorf("settled %d tokens, want the provider's 19", st.TokenBudget.TotalConsumed)
	}
}

// TestGatewayOpenAIShed: a shed call reaches the SDK as an *openai.Error
// with the gateway's status; the SDK retries a 503 (x-should-retry: true)
// and never a 413 (x-should-retry: false); nothing reaches the provider.
func TestGatewayOpenAIShed(t *testing.T) {
	p := newProvider(t, chatStream)
	full := newGatewayRig(t, p, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 0})
	fc := full.openai(option.WithMaxRetries(1))
	_, err := fc.Chat.Completions.New(context.Background(), chatParams)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 503 || !strings.Contains(oe.RawJSON(), `"reason":"concurrency_limit"`) {
		t.Fatalf("error = %v, want a 503 *openai.Error with the bulkhead's reason", err)
	}
	if n := full.attempts.Load(); n != 2 {
		t.Errorf("%d attempts at the gateway, want 2 (the first and its one retry)", n)
	}
	tooBig := newGatewayRig(t, p, budgetConfig("gpt-4o", 4, 50)) // 107 tokens never fit
	tc := tooBig.openai()
	_, err = tc.Chat.Completions.New(context.Background(), chatParams)
	if !errors.As(err, &oe) || oe.StatusCode != 413 {
		t.Fatalf("error = %v, want a 413 *openai.Error", err)
	}
	if n := tooBig.attempts.Load(); n != 1 {
		t.Errorf("%d attempts at the gateway, want 1: x-should-retry false stops the SDK", n)
	}
	if p.hits.Load() != 0 {
		t.Errorf("the provider saw %d requests", p.hits.Load())
	}
}

// TestGatewayOpenAIRetryAfter: a rate-limited call is answered 429 with
// the exact retry-after-ms, which the SDK waits before its retry, which
// then goes through.
func TestGatewayOpenAIRetryAfter(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	cfg := budgetConfig("gpt-4o", 4, 10_000)
	cfg.RateLimits = &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 600, RequestBurst: bulkhead.NoBurst}} // one call per 100 ms
	g := newGatewayRig(t, p, cfg)
	c := g.openai()
	params := chatParams
	if _, err := c.Chat.Completions.New(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Chat.Completions.New(context.Background(), params); err != nil {
		t.Fatalf("the second call, after its retry: %v", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("the retry came after %v: the SDK did not wait for retry-after-ms", d)
	}
	st := g.b.Stats()
	if st.Calls.Admitted != 2 || st.Calls.RejectedByReason[bulkhead.RateLimit] < 1 || p.hits.Load() != 2 {
		t.Errorf("admitted %d, rate-limited %d, provider hits %d", st.Calls.Admitted, st.Calls.RejectedByReason[bulkhead.RateLimit], p.hits.Load())
	}
	g.idle(t)
}

func TestGatewayAnthropic(t *testing.T) {
	p := newProvider(t, anthropicStream)
	g := newGatewayRig(t, p, budgetConfig("claude-sonnet-4-5", 4, 10_000))
	ac := g.anthropic()
	msg := accumulate(t, ac.Messages.NewStreaming(context.Background(), messageParams))
	if len(msg.Content) != 1 || msg.Content[0].Text != "A number system." {
		t.Errorf("accumulated %+v", msg)
	}
	g.idle(t)

	full := newGatewayRig(t, p, bulkhead.Config{Model: "claude-sonnet-4-5", MaxConcurrent: 0})
	fa := full.anthropic(aoption.WithMaxRetries(0))
	_, err := fa.Messages.New(context.Background(), messageParams)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 529 || !strings.Contains(ae.RawJSON(), `"overloaded_error"`) {
		t.Fatalf("error = %v, want a 529 overloaded *anthropic.Error", err)
	}
}

// failingProvider answers every call 500 in the dialect of its path: the
// SDKs retry a 500.
func failingProvider(t *testing.T) *provider {
	return newProvider(t, func(w http.ResponseWriter, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		if _, ok := body["system"]; ok || strings.HasPrefix(fmt.Sprint(body["model"]), "claude") {
			io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":"boom"}}`)
			return
		}
		io.WriteString(w, `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`)
	})
}

// retryBudgetConfig is a gateway's bulkhead whose retry budget, with no
// floor, has no room for a retry until ten first attempts are admitted.
func retryBudgetConfig(model string) bulkhead.Config {
	cfg := budgetConfig(model, 4, 10_000)
	cfg.RetryBudgets = &bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 0.1}}
	return cfg
}

// TestGatewayRetryOverBudgetStopsOpenAI: the provider fails a call (500);
// openai-go retries it, marked X-Stainless-Retry-Count: 1; the gateway's
// retry budget refuses the retry with x-should-retry: false, and the SDK
// raises that at once instead of trying a third time: the provider saw
// one attempt, the gateway two. Without the budget the SDK's two retries
// both reach the provider.
func TestGatewayRetryOverBudgetStopsOpenAI(t *testing.T) {
	p := failingProvider(t)
	g := newGatewayRig(t, p, retryBudgetConfig("gpt-4o"))
	c := g.openai()
	_, err := c.Chat.Completions.New(context.Background(), chatParams)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 503 || !strings.Contains(oe.RawJSON(), `"reason":"retry_budget"`) ||
		oe.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("error = %v, want the gateway's 503 retry_budget", err)
	}
	if n, hits := g.attempts.Load(), p.hits.Load(); n != 2 || hits != 1 {
		t.Errorf("%d attempts at the gateway, %d at the provider; want 2 and 1", n, hits)
	}
	if st := g.b.Stats(); st.Calls.RejectedByReason[bulkhead.RetryBudget] != 1 || st.Calls.Admitted != 1 {
		t.Errorf("stats %+v", st.Calls)
	}
	g.idle(t)

	p2 := failingProvider(t)
	plain := newGatewayRig(t, p2, budgetConfig("gpt-4o", 4, 10_000))
	pc := plain.openai()
	_, err = pc.Chat.Completions.New(context.Background(), chatParams)
	if !errors.As(err, &oe) || oe.StatusCode != 500 {
		t.Fatalf("without a budget: error = %v, want the provider's 500", err)
	}
	if n, hits := plain.attempts.Load(), p2.hits.Load(); n != 3 || hits != 3 {
		t.Errorf("without a budget: %d attempts at the gateway, %d at the provider; want 3 and 3", n, hits)
	}
	plain.idle(t)
}

// TestGatewayRetryOverBudgetStopsAnthropic: the same with
// anthropic-sdk-go, answered 529 overloaded_error with x-should-retry:
// false.
func TestGatewayRetryOverBudgetStopsAnthropic(t *testing.T) {
	p := failingProvider(t)
	g := newGatewayRig(t, p, retryBudgetConfig("claude-sonnet-4-5"))
	ac := g.anthropic()
	_, err := ac.Messages.New(context.Background(), messageParams)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 529 || !strings.Contains(ae.RawJSON(), `"reason":"retry_budget"`) ||
		!strings.Contains(ae.RawJSON(), `"overloaded_error"`) || ae.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("error = %v, want the gateway's 529 retry_budget", err)
	}
	if n, hits := g.attempts.Load(), p.hits.Load(); n != 2 || hits != 1 {
		t.Errorf("%d attempts at the gateway, %d at the provider; want 2 and 1", n, hits)
	}
	g.idle(t)

	p2 := failingProvider(t)
	plain := newGatewayRig(t, p2, budgetConfig("claude-sonnet-4-5", 4, 10_000))
	pac := plain.anthropic()
	_, err = pac.Messages.New(context.Background(), messageParams)
	if !errors.As(err, &ae) || ae.StatusCode != 500 {
		t.Fatalf("without a budget: error = %v, want the provider's 500", err)
	}
	if n, hits := plain.attempts.Load(), p2.hits.Load(); n != 3 || hits != 3 {
		t.Errorf("without a budget: %d attempts at the gateway, %d at the provider; want 3 and 3", n, hits)
	}
	plain.idle(t)
}
