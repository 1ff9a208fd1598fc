package jaegertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead/gateway"
)

// syncBuffer is a bytes.Buffer safe for a process's output and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// jaeger is a Jaeger running on loopback, its traces in memory.
type jaeger struct {
	otlpHTTP, otlpGRPC string // host:port of its OTLP receivers
	query              string // the base URL of its query API
}

// jaegerConfig is Jaeger's configuration: its own all-in-one cut to the
// OTLP receivers, the memory store and the query service, each on a
// loopback port of the test's choosing, its own telemetry and tracing off.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 50ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// freePorts returns n ports free on loopback a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// startJaeger builds Jaeger (the module's tool; the build cache keeps it)
// and runs it until the test ends.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	built := time.Now()
	out, err := exec.Command("go", "tool", "-n", "jaeger").CombinedOutput()
	if err != nil {
		t.Fatalf("building Jaeger (go tool -n jaeger): %v\n%s", err, out)
	}
	bin := strings.TrimSpace(string(out))
	t.Logf("Jaeger built in %v: %s", time.Since(built).Round(time.Millisecond), bin)
	p := freePorts(t, 4)
	j := &jaeger{query: fmt.Sprintf("http://127.0.0.1:%d", p[0]), otlpGRPC: fmt.Sprintf("127.0.0.1:%d", p[2]), otlpHTTP: fmt.Sprintf("127.0.0.1:%d", p[3])}
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(jaegerConfig, p[0], p[1], p[2], p[3])), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logs, logs
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("Jaeger's output:\n%s", logs.String())
		}
	})
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := client.Get(j.query + "/api/services")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				t.Logf("Jaeger answers after %v", time.Since(started).Round(time.Millisecond))
				return j
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("Jaeger exited: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger did not answer within a minute:\n%s", logs.String())
		}
	}
}

// jaegerSpan is a span as Jaeger's query API returns it.
type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
	ProcessID string `json:"processID"`
	service   string
}

// tag returns the value of the span's tag key, as text; "" when absent.
func (s *jaegerSpan) tag(key string) string {
	for _, tg := range s.Tags {
		if tg.Key == key {
			return fmt.Sprint(tg.Value)
		}
	}
	return ""
}

// parent returns the ID of the span's parent, "" for a root.
func (s *jaegerSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// trace reads trace id back from Jaeger, waiting until it has n spans.
func (j *jaeger) trace(t *testing.T, id trace.TraceID, n int) []*jaegerSpan {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var spans []*jaegerSpan
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans = nil
		res, err := client.Get(j.query + "/api/traces/" + id.String())
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Data []struct {
				Spans     []*jaegerSpan `json:"spans"`
				Processes map[string]struct {
					ServiceName string `json:"serviceName"`
				} `json:"processes"`
			} `json:"data"`
		}
		err = json.NewDecoder(res.Body).Decode(&doc)
		res.Body.Close()
		if err == nil && len(doc.Data) == 1 {
			for _, s := range doc.Data[0].Spans {
				s.service = doc.Data[0].Processes[s.ProcessID].ServiceName
				spans = append(spans, s)
			}
		}
		if len(spans) >= n || time.Now().After(deadline) {
			return spans
		}
		time.Sleep(50 * time.Millisecond) // Jaeger writes what it receives in batches
	}
}

// find returns the span of service named name, nil for none.
func find(spans []*jaegerSpan, service, name string) *jaegerSpan {
	for _, s := range spans {
		if s.service == service && (name == "" || s.OperationName == name) {
			if name != "" || s.tag("span.kind") == "client" {
				return s
			}
		}
	}
	return nil
}

// exportTo is a TracerProvider of service that exports to Jaeger over
// OTLP/HTTP.
func exportTo(t *testing.T, j *jaeger, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpoint(j.otlpHTTP), otlptracehttp.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(50*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// provider is a fake OpenAI upstream that traces each call it serves as a
// server span of its own ("provider chat"), the child of the trace
// context the gateway sent it.
func provider(t *testing.T, tp trace.TracerProvider) *httptest.Server {
	tracer := tp.Tracer("fake-provider")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		_, span := tracer.Start(ctx, "provider chat", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}`,
			`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":" there."},"finish_reason":"stop"}]}`,
			`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`,
			`[DONE]`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

const clientKey = "jaeger-test-client-key-0123456789"

// TestGatewayTraceInJaeger: a call made with the official OpenAI SDK,
// traced on the client's side (its own span, and otelhttp's), goes
// through the gateway, whose telemetry exports to a real Jaeger over
// OTLP (HTTP, then gRPC), to a provider that traces too. Read back from
// Jaeger, each call is one trace: the client's spans, the gateway's span
// with the generative AI attributes, its admission and its upstream call,
// and the provider's span, each the child of the one before; a call the
// bulkhead sheds is marked as such, and reaches no provider.
func TestGatewayTraceInJaeger(t *testing.T) {
	j := startJaeger(t)
	clientTP, providerTP := exportTo(t, j, "sdk-client"), exportTo(t, j, "fake-provider")
	up := provider(t, providerTP)
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			endpoint := "http://" + j.otlpHTTP
			if protocol == "grpc" {
				endpoint = "http://" + j.otlpGRPC
			}
			cfg, err := gateway.ParseConfig("gw.yaml", []byte(fmt.Sprintf(`
clients: {app: {key_env: APP_KEY}}
upstreams: {openai: {base_url: %q, api_key_env: OPENAI_KEY}}
bulkheads:
  main: {model: gpt-4o, max_concurrent: 4, token_budget: 100000}
  closed: {model: gpt-4o-mini, max_concurrent: 0}
routes:
  - {api: openai-chat, models: [gpt-4o], upstream: openai, bulkhead: main}
  - {api: openai-chat, models: [gpt-4o-mini], upstream: openai, bulkhead: closed}
telemetry: {traces: true, endpoint: %q, protocol: %s, service_name: bulkhead-gateway}
`, up.URL, endpoint, protocol)))
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{"APP_KEY": clientKey, "OPENAI_KEY": "sk-provider"}
			g, err := gateway.Build(cfg, "gw.yaml", func(k string) (string, bool) { v, ok := env[k]; return v, ok }, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			gw := httptest.NewServer(g.Handler)
			transport := &http.Transport{}
			sdk := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey(clientKey), option.WithMaxRetries(0),
				option.WithHTTPClient(&http.Client{Transport: otelhttp.NewTransport(transport,
					otelhttp.WithTracerProvider(clientTP), otelhttp.WithPropagators(propagation.TraceContext{}))}))
			tracer := clientTP.Tracer("app")
			ask := func(model string, stream bool) (trace.TraceID, error) {
				ctx, span := tracer.Start(context.Background(), "ask the model")
				defer span.End()
				params := openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(64),
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")}}
				if !stream {
					_, err := sdk.Chat.Completions.New(ctx, params)
					return span.SpanContext().TraceID(), err
				}
				s := sdk.Chat.Completions.NewStreaming(ctx, params)
				for s.Next() {
				}
				err := s.Err()
				s.Close()
				return span.SpanContext().TraceID(), err
			}
			plain, err := ask("gpt-4o", false)
			if err != nil {
				t.Fatal(err)
			}
			streamed, err := ask("gpt-4o", true)
			if err != nil {
				t.Fatal(err)
			}
			shed, err := ask("gpt-4o-mini", false)
			var oe *openai.Error
			if !errors.As(err, &oe) || oe.StatusCode != 503 {
				t.Fatalf("the shed call: %v", err)
			}
			gw.Close()
			g.Shutdown(context.Background()) // exports what the gateway holds
			transport.CloseIdleConnections()
			if err := clientTP.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := providerTP.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}

			for _, c := range []struct {
				name string
				id   trace.TraceID
				want string // stream flag
			}{{"plain", plain, "false"}, {"streamed", streamed, "true"}} {
				spans := j.trace(t, c.id, 6)
				root, call := find(spans, "sdk-client", "ask the model"), find(spans, "sdk-client", "")
				gwSpan, adm, upSpan := find(spans, "bulkhead-gateway", "chat gpt-4o"), find(spans, "bulkhead-gateway", "bulkhead.admission"), find(spans, "bulkhead-gateway", "POST")
				prov := find(spans, "fake-provider", "provider chat")
				if len(spans) != 6 || root == nil || call == nil || gwSpan == nil || adm == nil || upSpan == nil || prov == nil {
					var names []string
					for _, s := range spans {
						names = append(names, s.service+"/"+s.OperationName)
					}
					t.Fatalf("%s: the trace has %d spans %q; want the client's two, the gateway's three and the provider's", c.name, len(spans), names)
				}
				for _, link := range []struct {
					child, parent *jaegerSpan
				}{{call, root}, {gwSpan, call}, {adm, gwSpan}, {upSpan, gwSpan}, {prov, upSpan}} {
					if link.child.parent() != link.parent.SpanID {
						t.Errorf("%s: %s/%s is the child of %s, want %s/%s (%s)", c.name, link.child.service, link.child.OperationName,
							link.child.parent(), link.parent.service, link.parent.OperationName, link.parent.SpanID)
					}
				}
				for key, want := range map[string]string{
					"span.kind":                      "server",
					"gen_ai.operation.name":          "chat",
					"gen_ai.provider.name":           "openai",
					"gen_ai.request.model":           "gpt-4o",
					"gen_ai.request.stream":          c.want,
					"gen_ai.response.model":          "gpt-4o-2024-08-06",
					"gen_ai.response.finish_reasons": `["stop"]`,
					"gen_ai.usage.input_tokens":      "12",
					"gen_ai.usage.output_tokens":     "3",
					"bulkhead.name":                  "main",
					"bulkhead.gateway.end":           "done",
					"bulkhead.gateway.client":        "app",
					"http.response.status_code":      "200",
				} {
					if got := gwSpan.tag(key); got != want {
						t.Errorf("%s: the gateway's span: %s = %q, want %q", c.name, key, got, want)
					}
				}
				if got := adm.tag("bulkhead.outcome"); got != "admitted" {
					t.Errorf("%s: the admission's outcome %q", c.name, got)
				}
				if got := upSpan.tag("span.kind"); got != "client" {
					t.Errorf("%s: the upstream span's kind %q", c.name, got)
				}
			}

			spans := j.trace(t, shed, 4)
			gwSpan, adm := find(spans, "bulkhead-gateway", "chat gpt-4o-mini"), find(spans, "bulkhead-gateway", "bulkhead.admission")
			if len(spans) != 4 || gwSpan == nil || adm == nil || find(spans, "fake-provider", "provider chat") != nil {
				t.Fatalf("the shed call's trace: %d spans", len(spans))
			}
			for key, want := range map[string]string{
				"error":                     "true",
				"otel.status_code":          "ERROR",
				"error.type":                "concurrency_limit",
				"bulkhead.reason":           "concurrency_limit",
				"bulkhead.gateway.end":      "shed",
				"http.response.status_code": "503",
			} {
				if got := gwSpan.tag(key); got != want {
					t.Errorf("the shed call's span: %s = %q, want %q", key, got, want)
				}
			}
			if got := adm.tag("bulkhead.outcome"); got != "rejected" {
				t.Errorf("the shed call's admission: outcome %q", got)
			}
		})
	}
}
