package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// tracedUpstream is an OpenAI chat upstream that answers with a model of
// its own and a finish reason, plain or streamed, and records the trace
// context each request carried.
type tracedUpstream struct {
	srv *httptest.Server

	mu      sync.Mutex
	parents []string // the traceparent of each request
	headers []http.Header
}

func newTracedUpstream(t *testing.T) *tracedUpstream {
	u := &tracedUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.parents = append(u.parents, r.Header.Get("Traceparent"))
		u.headers = append(u.headers, r.Header.Clone())
		u.mu.Unlock()
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"chatcmpl-2\",\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"},\"finish_reason\":null}]}\n\n")
		fmt.Fprint(w, "data: {\"id\":\"chatcmpl-2\",\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprint(w, "data: {\"id\":\"chatcmpl-2\",\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5,\"total_tokens\":14}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *tracedUpstream) received() ([]string, []http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.parents...), append([]http.Header(nil), u.headers...)
}

const (
	tracedClientKey   = "client-key-0123456789abcdef"
	tracedUpstreamKey = "sk-upstream-secret-4242"
	tracedPrompt      = "the secret plan is in the drawer"
)

// tracedGateway builds a gateway with one client in front of up, its
// traces recorded in memory; extra is added to its configuration.
func tracedGateway(t *testing.T, up string, maxConcurrent int, extra string) (*tracetest.SpanRecorder, *httptest.Server) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(fmt.Sprintf(`
clients: {app: {key_env: APP_KEY}}
upstreams: {up: {base_url: %q, api_key_env: UP_KEY}}
bulkheads: {main: {model: gpt-4o, max_concurrent: %d, token_budget: 100000}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}, {api: anthropic-messages, upstream: up, bulkhead: main}]
%s`, up, maxConcurrent, extra)))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.Build(cfg, "gw.yaml", lookup(map[string]string{"APP_KEY": tracedClientKey, "UP_KEY": tracedUpstreamKey}),
		gateway.NewLogger(io.Discard, "json"), gateway.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler)
	t.Cleanup(func() {
		srv.Close()
		g.Shutdown(context.Background())
	})
	return rec, srv
}

// tracedCall sends a chat call with the client's key and parent's trace
// context, reads its answer whole and returns its status.
func tracedCall(t *testing.T, url string, parent trace.SpanContext, stream bool) int {
	t.Helper()
	body := `{"model":"gpt-4o","max_tokens":64,"stream":` + fmt.Sprint(stream) + `,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + tracedPrompt + `"}]}`
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tracedClientKey)
	req.Header.Set("Content-Type", "application/json")
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), parent), propagation.HeaderCarrier(req.Header))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode
}

// parentContext is a sampled remote span context, as a caller's SDK sends.
func parentContext(n byte) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3, n}, SpanID: trace.SpanID{9, 8, 7, n},
		TraceFlags: trace.FlagsSampled, Remote: true})
}

// endedSpans waits until rec has n ended spans of trace id and returns
// them by name.
func endedSpans(t *testing.T, rec *tracetest.SpanRecorder, id trace.TraceID, n int) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	var spans map[string]sdktrace.ReadOnlySpan
	testutil.WaitFor(t, fmt.Sprintf("%d ended spans", n), func() bool {
		spans = map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == id {
				spans[s.Name()] = s
			}
		}
		return len(spans) >= n
	})
	return spans
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestGatewayTracesEachCallInTheGenAIShape: each call is a server span
// "chat gpt-4o", the child of the caller's span from its traceparent, with
// the generative AI attributes of the call and its answer; the admission
// and the upstream call are its children, and the upstream receives the
// upstream span's trace context; no attribute holds a key, a credential or
// the prompt.
func TestGatewayTracesEachCallInTheGenAIShape(t *testing.T) {
	up := newTracedUpstream(t)
	rec, srv := tracedGateway(t, up.srv.URL, 4, "")
	for i, streamed := range []bool{false, true} {
		parent := parentContext(byte(i))
		if st := tracedCall(t, srv.URL, parent, streamed); st != http.StatusOK {
			t.Fatalf("status %d", st)
		}
		spans := endedSpans(t, rec, parent.TraceID(), 3)
		call, adm, upstream := spans["chat gpt-4o"], spans["bulkhead.admission"], spans["POST"]
		if call == nil || adm == nil || upstream == nil {
			t.Fatalf("spans %v", spans)
		}
		if call.SpanKind() != trace.SpanKindServer || call.Parent().SpanID() != parent.SpanID() {
			t.Errorf("the call's span: kind %v, parent %v, want a server span under the caller's", call.SpanKind(), call.Parent().SpanID())
		}
		if adm.Parent().SpanID() != call.SpanContext().SpanID() || upstream.Parent().SpanID() != call.SpanContext().SpanID() {
			t.Errorf("admission's parent %v, upstream's %v: want the call's %v", adm.Parent().SpanID(), upstream.Parent().SpanID(), call.SpanContext().SpanID())
		}
		if upstream.SpanKind() != trace.SpanKindClient {
			t.Errorf("the upstream span's kind %v", upstream.SpanKind())
		}
		parents, headers := up.received()
		wantParent := fmt.Sprintf("00-%s-%s-01", parent.TraceID(), upstream.SpanContext().SpanID())
		if got := parents[len(parents)-1]; got != wantParent {
			t.Errorf("the upstream received traceparent %q, want the upstream span's %q", got, wantParent)
		}
		if got := headers[len(headers)-1].Get("Authorization"); got != "Bearer "+tracedUpstreamKey {
			t.Errorf("the upstream received Authorization %q", got)
		}
		a := attrsOf(call)
		finish, output := "stop", int64(2)
		if streamed {
			finish, output = "length", 5
		}
		for k, want := range map[attribute.Key]attribute.Value{
			"gen_ai.operation.name":          attribute.StringValue("chat"),
			"gen_ai.provider.name":           attribute.StringValue("openai"),
			"gen_ai.request.model":           attribute.StringValue("gpt-4o"),
			"gen_ai.request.max_tokens":      attribute.Int64Value(64),
			"gen_ai.request.stream":          attribute.BoolValue(streamed),
			"gen_ai.response.model":          attribute.StringValue("gpt-4o-2024-08-06"),
			"gen_ai.response.finish_reasons": attribute.StringSliceValue([]string{finish}),
			"gen_ai.usage.input_tokens":      attribute.Int64Value(9),
			"gen_ai.usage.output_tokens":     attribute.Int64Value(output),
			"http.request.method":            attribute.StringValue("POST"),
			"http.response.status_code":      attribute.IntValue(200),
			"bulkhead.name":                  attribute.StringValue("main"),
			"bulkhead.gateway.end":           attribute.StringValue("done"),
			"bulkhead.gateway.client":        attribute.StringValue("app"),
		} {
			if got, ok := a[k]; !ok || got != want {
				t.Errorf("stream %v: %s = %v, want %v", streamed, k, got.Emit(), want.Emit())
			}
		}
		if _, ok := a["bulkhead.admission.id"]; !ok {
			t.Error("no bulkhead.admission.id")
		}
		if got := attrsOf(adm)["bulkhead.outcome"].AsString(); got != "admitted" {
			t.Errorf("the admission's outcome %q", got)
		}
		if got := attrsOf(upstream)["http.response.status_code"].AsInt64(); got != 200 {
			t.Errorf("the upstream span's status %d", got)
		}
		for _, s := range spans {
			for _, kv := range s.Attributes() {
				v := kv.Value.Emit()
				for _, secret := range []string{tracedClientKey, tracedUpstreamKey, tracedPrompt, "Bearer"} {
					if strings.Contains(v, secret) || strings.Contains(strings.ToLower(string(kv.Key)), "authorization") {
						t.Errorf("span %s: %s = %q holds something secret", s.Name(), kv.Key, v)
					}
				}
			}
		}
	}
}

// TestGatewayTraceMarksAShedCall: a call the bulkhead turns away is a span
// with status Error, error.type its reason and end shed, and an admission
// span that says so; nothing went upstream.
func TestGatewayTraceMarksAShedCall(t *testing.T) {
	up := newTracedUpstream(t)
	rec, srv := tracedGateway(t, up.srv.URL, 0, "")
	parent := parentContext(7)
	if st := tracedCall(t, srv.URL, parent, false); st != http.StatusServiceUnavailable {
		t.Fatalf("status %d", st)
	}
	spans := endedSpans(t, rec, parent.TraceID(), 2)
	call, adm := spans["chat gpt-4o"], spans["bulkhead.admission"]
	if call == nil || adm == nil || spans["POST"] != nil {
		t.Fatalf("spans %v", spans)
	}
	if call.Status().Code != codes.Error {
		t.Errorf("the call's status %v", call.Status())
	}
	a := attrsOf(call)
	if a["error.type"].AsString() != "concurrency_limit" || a["bulkhead.gateway.end"].AsString() != "shed" ||
		a["bulkhead.reason"].AsString() != "concurrency_limit" || a["http.response.status_code"].AsInt64() != 503 {
		t.Errorf("the shed call's attributes: %v", call.Attributes())
	}
	if got := attrsOf(adm)["bulkhead.outcome"].AsString(); got != "rejected" || adm.Status().Code != codes.Error {
		t.Errorf("the admission: outcome %q, status %v", got, adm.Status())
	}
	if parents, _ := up.received(); len(parents) != 0 {
		t.Errorf("%d calls went upstream", len(parents))
	}
}

// TestGatewayCapturesContentOnlyWhenAsked: with capture_content the
// prompt is on the call's span, in the conventions' shape: an OpenAI
// chat call's system message among its messages.
func TestGatewayCapturesContentOnlyWhenAsked(t *testing.T) {
	up := newTracedUpstream(t)
	rec, srv := tracedGateway(t, up.srv.URL, 4, "telemetry: {capture_content: true}")
	parent := parentContext(9)
	tracedCall(t, srv.URL, parent, false)
	a := attrsOf(endedSpans(t, rec, parent.TraceID(), 3)["chat gpt-4o"])
	want := `[{"role":"system","parts":[{"type":"text","content":"be brief"}]},{"role":"user","parts":[{"type":"text","content":"` + tracedPrompt + `"}]}]`
	if got := a["gen_ai.input.messages"].AsString(); got != want {
		t.Errorf("gen_ai.input.messages = %s, want %s", got, want)
	}

	// An Anthropic call's system prompt is its system instructions.
	parent = parentContext(10)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(
		`{"model":"gpt-4o","max_tokens":64,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{}}]}]}`))
	req.Header.Set("X-Api-Key", tracedClientKey)
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), parent), propagation.HeaderCarrier(req.Header))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	a = attrsOf(endedSpans(t, rec, parent.TraceID(), 3)["chat gpt-4o"])
	if got, want := a["gen_ai.system_instructions"].AsString(), `[{"type":"text","content":"be brief"}]`; got != want {
		t.Errorf("gen_ai.system_instructions = %s, want %s", got, want)
	}
	if got, want := a["gen_ai.input.messages"].AsString(), `[{"role":"user","parts":[{"type":"text","content":"hi"},{"type":"image"}]}]`; got != want {
		t.Errorf("gen_ai.input.messages = %s, want %s", got, want)
	}
	if got := a["gen_ai.provider.name"].AsString(); got != "anthropic" {
		t.Errorf("gen_ai.provider.name = %q", got)
	}
}

// TestGatewayWithoutTelemetryPassesTraceContextOn: with telemetry off (the
// default) the gateway makes no span and passes the caller's trace
// context upstream as it came.
func TestGatewayWithoutTelemetryPassesTraceContextOn(t *testing.T) {
	up := newTracedUpstream(t)
	_, srv := buildGateway(t, `
upstreams: {up: {base_url: "`+up.srv.URL+`"}}
bulkheads: {main: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
`, nil, io.Discard)
	parent := parentContext(3)
	if st := tracedCall(t, srv.URL, parent, false); st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
	parents, _ := up.received()
	if want := fmt.Sprintf("00-%s-%s-01", parent.TraceID(), parent.SpanID()); parents[0] != want {
		t.Errorf("traceparent upstream %q, want the caller's %q", parents[0], want)
	}
}
