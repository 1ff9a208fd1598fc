package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmbulkhead/bulkhead/gateway"
)

const (
	clientKey   = "gw-sdk-client-key-0123456789"
	upstreamKey = "sk-provider-key"
)

// keyedRig is a gateway built from a configuration with a client key, in
// front of a provider of both APIs that records the key each request
// carried.
type keyedRig struct {
	srv  *httptest.Server
	g    *gateway.Gateway
	hits atomic.Int64

	mu   sync.Mutex
	keys []string // the Authorization or x-api-key each request carried upstream
}

func newKeyedRig(t *testing.T, maxBody string) *keyedRig {
	t.Helper()
	r := &keyedRig{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get("Authorization")+req.Header.Get("X-Api-Key"))
		r.mu.Unlock()
		var body map[string]any
		raw, _ := io.ReadAll(req.Body)
		_ = json.Unmarshal(raw, &body)
		if strings.HasSuffix(req.URL.Path, "/messages") {
			anthropicStream(w, body)
			return
		}
		chatStream(w, body)
	}))
	t.Cleanup(up.Close)
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(`clients: {app: {key_env: CLIENT_KEY}}
upstreams: {up: {base_url: "`+up.URL+`", api_key_env: UPSTREAM_KEY}}
bulkheads: {main: {max_concurrent: 4}}
routes:
  - {api: openai-chat, upstream: up, bulkhead: main`+maxBody+`}
  - {api: anthropic-messages, upstream: up, bulkhead: main}
`))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CLIENT_KEY": clientKey, "UPSTREAM_KEY": upstreamKey}
	r.g, err = gateway.Build(cfg, "gw.yaml", func(k string) (string, bool) { v, ok := env[k]; return v, ok }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewServer(r.g.Handler)
	t.Cleanup(func() {
		r.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if left := r.g.Shutdown(ctx); len(left) != 0 {
			t.Errorf("left in flight: %v", left)
		}
	})
	return r
}

// TestGatewayClientKeys: an SDK without the gateway's client key, or with
// another, gets the 401 its API answers (an *openai.Error or
// *anthropic.Error with status 401, not retried) and nothing reaches the
// provider; with the key its calls go through, sent upstream with the
// provider's key instead.
func TestGatewayClientKeys(t *testing.T) {
	r := newKeyedRig(t, "")
	for _, key := range []string{"", "sk-not-a-client-key-0123"} {
		oc := openai.NewClient(option.WithBaseURL(r.srv.URL+"/v1"), option.WithAPIKey(key))
		_, err := oc.Chat.Completions.New(context.Background(), chatParams)
		var oe *openai.Error
		if !errors.As(err, &oe) || oe.StatusCode != 401 || oe.Code != "invalid_api_key" {
			t.Fatalf("openai with key %q: %v; want a 401 invalid_api_key", key, err)
		}
		if key == "" {
			continue // the Anthropic SDK sends nothing without a key
		}
		ac := anthropic.NewClient(aoption.WithBaseURL(r.srv.URL), aoption.WithAPIKey(key))
		_, err = ac.Messages.New(context.Background(), messageParams)
		var ae *anthropic.Error
		if !errors.As(err, &ae) || ae.StatusCode != 401 || !strings.Contains(ae.RawJSON(), `"authentication_error"`) {
			t.Fatalf("anthropic with key %q: %v; want a 401 authentication_error", key, err)
		}
	}
	if n := r.hits.Load(); n != 0 {
		t.Fatalf("the provider saw %d unauthenticated calls", n)
	}
	if st := r.g.Bulkheads["main"].Stats(); st.Calls.Admitted+st.Calls.Rejected != 0 {
		t.Fatalf("unauthenticated calls reached the bulkhead: %v", st)
	}

	oc := openai.NewClient(option.WithBaseURL(r.srv.URL+"/v1"), option.WithAPIKey(clientKey))
	s := oc.Chat.Completions.NewStreaming(context.Background(), chatParams)
	for s.Next() {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ac := anthropic.NewClient(aoption.WithBaseURL(r.srv.URL), aoption.WithAPIKey(clientKey))
	msg := accumulate(t, ac.Messages.NewStreaming(context.Background(), messageParams))
	if len(msg.Content) != 1 {
		t.Fatalf("accumulated %+v", msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) != 2 || r.keys[0] != "Bearer "+upstreamKey || r.keys[1] != upstreamKey {
		t.Fatalf("the provider saw keys %q; want the gateway's own", r.keys)
	}
}

// TestGatewayOversizedBodySDK: a body over the route's limit reaches the
// SDK as a 413 it reads (not a broken connection), and is not retried.
func TestGatewayOversizedBodySDK(t *testing.T) {
	r := newKeyedRig(t, ", max_body_bytes: 65536")
	oc := openai.NewClient(option.WithBaseURL(r.srv.URL+"/v1"), option.WithAPIKey(clientKey))
	params := chatParams
	params.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("many words ", 50_000))}
	_, err := oc.Chat.Completions.New(context.Background(), params)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 413 || oe.Code != "request_too_large" {
		t.Fatalf("error %v; want a 413 request_too_large", err)
	}
	if n := r.hits.Load(); n != 0 {
		t.Fatalf("the provider saw %d calls", n)
	}
}
