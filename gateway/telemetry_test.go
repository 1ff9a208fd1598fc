package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
)

// otlpReceiver keeps what OTLP exporters send it: the span names and
// metric names, and the service names of their resources.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	colmetricpb.UnimplementedMetricsServiceServer

	mu       sync.Mutex
	spans    []string
	metrics  []string
	services []string
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				r.services = append(r.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, s.Name)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// metricsService adapts the receiver to the metrics service, whose method
// has the trace service's name.
type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	r *otlpReceiver
}

func (m metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	for _, rm := range req.ResourceMetrics {
		for _, sm := range rm.ScopeMetrics {
			for _, x := range sm.Metrics {
				m.r.metrics = append(m.r.metrics, x.Name)
			}
		}
	}
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

func (r *otlpReceiver) got() (spans, metrics, services []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans), slices.Clone(r.metrics), slices.Clone(r.services)
}

// serveHTTP serves the receiver as OTLP over HTTP (protobuf) and returns
// its address.
func (r *otlpReceiver) serveHTTP(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		var resp proto.Message
		switch req.URL.Path {
		case "/otlp/v1/traces":
			var m coltracepb.ExportTraceServiceRequest
			if err = proto.Unmarshal(body, &m); err == nil {
				resp, err = r.Export(req.Context(), &m)
			}
		case "/otlp/v1/metrics":
			var m colmetricpb.ExportMetricsServiceRequest
			if err = proto.Unmarshal(body, &m); err == nil {
				resp, err = metricsService{r: r}.Export(req.Context(), &m)
			}
		default:
			http.NotFound(w, req)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		out, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/otlp"
}

// serveGRPC serves the receiver as OTLP over gRPC and returns its address.
func (r *otlpReceiver) serveGRPC(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(s, r)
	colmetricpb.RegisterMetricsServiceServer(s, metricsService{r: r})
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return "http://" + ln.Addr().String()
}

// TestTelemetryExportsOverOTLP: with traces and metrics on in the file,
// the gateway exports its spans and its bulkheads' metrics to the
// endpoint, over HTTP and over gRPC, as the service the file names; what
// is left is exported at Shutdown.
func TestTelemetryExportsOverOTLP(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			r := &otlpReceiver{}
			endpoint := r.serveHTTP(t)
			if protocol == "grpc" {
				endpoint = r.serveGRPC(t)
			}
			up := newTracedUpstream(t)
			cfg, err := gateway.ParseConfig("gw.yaml", []byte(fmt.Sprintf(`
upstreams: {up: {base_url: %q}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 4}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
telemetry: {traces: true, metrics: true, endpoint: %q, protocol: %s, service_name: gw-test, sample_ratio: 1}
`, up.srv.URL, endpoint, protocol)))
			if err != nil {
				t.Fatal(err)
			}
			g, err := gateway.Build(cfg, "gw.yaml", nil, gateway.NewLogger(io.Discard, "json"))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(g.Handler)
			if st := tracedCall(t, srv.URL, parentContext(1), false); st != http.StatusOK {
				t.Errorf("status %d", st)
			}
			srv.Close()
			g.Shutdown(context.Background())
			spans, metrics, services := r.got()
			for _, want := range []string{"chat gpt-4o", "bulkhead.admission", "POST"} {
				if !slices.Contains(spans, want) {
					t.Errorf("spans %q: no %s", spans, want)
				}
			}
			for _, want := range []string{"bulkhead.admitted", "gen_ai.client.token.usage", "gen_ai.client.operation.duration"} {
				if !slices.Contains(metrics, want) {
					t.Errorf("metrics %q: no %s", metrics, want)
				}
			}
			if len(services) == 0 || services[0] != "gw-test" {
				t.Errorf("service names %q", services)
			}
		})
	}
}

// TestTelemetryFromTheEnvironment: an OTLP endpoint in the environment
// turns the traces on, OTEL_TRACES_EXPORTER=none off, and the file's
// switch wins over both; OTEL_SDK_DISABLED turns everything off.
func TestTelemetryFromTheEnvironment(t *testing.T) {
	r := &otlpReceiver{}
	endpoint := r.serveHTTP(t)
	up := newTracedUpstream(t)
	for _, c := range []struct {
		name  string
		file  string
		env   map[string]string
		spans bool
	}{
		{"endpoint", "", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "set"}, true},
		{"exporter otlp", "", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter none", "", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "set"}, false},
		{"nothing", "", nil, false},
		{"file off", "traces: false", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "set"}, false},
		{"file on", "traces: true", map[string]string{"OTEL_TRACES_EXPORTER": "none"}, true},
		{"sdk disabled", "traces: true", map[string]string{"OTEL_SDK_DISABLED": "true"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, _, _ := r.got()
			cfg, err := gateway.ParseConfig("gw.yaml", []byte(fmt.Sprintf(`
upstreams: {up: {base_url: %q}}
bulkheads: {main: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
telemetry: {endpoint: %q, %s}
`, up.srv.URL, endpoint, c.file)))
			if err != nil {
				t.Fatal(err)
			}
			g, err := gateway.Build(cfg, "gw.yaml", lookup(c.env), gateway.NewLogger(io.Discard, "json"))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(g.Handler)
			tracedCall(t, srv.URL, parentContext(2), false)
			srv.Close()
			g.Shutdown(context.Background())
			after, _, _ := r.got()
			if got := len(after) > len(before); got != c.spans {
				t.Errorf("spans exported: %v, want %v", got, c.spans)
			}
		})
	}
}

func TestTelemetryConfigErrors(t *testing.T) {
	base := `
upstreams: {up: {base_url: "http://127.0.0.1:1"}}
bulkheads: {main: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
`
	for _, c := range []struct {
		telemetry string
		env       map[string]string
		want      string
	}{
		{"{protocol: http/json}", nil, "gw.yaml:5: telemetry.protocol: want http/protobuf or grpc, got \"http/json\""},
		{"{endpoint: \"collector:4318\"}", nil, "gw.yaml:5: telemetry.endpoint: want an http or https URL"},
		{"{endpoint: \"http://u:p@collector:4318\"}", nil, "telemetry.endpoint: want a URL without credentials"},
		{"{sample_ratio: 1.5}", nil, "gw.yaml:5: telemetry.sample_ratio: want a number from 0 to 1, got 1.5"},
		{"{traces: maybe}", nil, "telemetry.traces: want true or false"},
		{"{tracs: true}", nil, `unknown key "tracs" (did you mean traces?)`},
		{"{metrics_interval: soon}", nil, "telemetry.metrics_interval: want a duration"},
		{"{}", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, `gw.yaml:5: telemetry.traces: OTEL_TRACES_EXPORTER is "zipkin": the gateway exports otlp, or none`},
		{"{traces: true}", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, `gw.yaml:5: telemetry.protocol: OTEL_EXPORTER_OTLP_PROTOCOL is "http/json": want http/protobuf or grpc`},
		{"{metrics: true}", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "udp"}, `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL is "udp"`},
	} {
		t.Run(c.telemetry, func(t *testing.T) {
			cfg, err := gateway.ParseConfig("gw.yaml", []byte(base+"telemetry: "+c.telemetry+"\n"))
			if err == nil {
				var g *gateway.Gateway
				if g, err = gateway.Build(cfg, "gw.yaml", lookup(c.env), gateway.NewLogger(io.Discard, "json")); err == nil {
					g.Shutdown(context.Background())
				}
			}
			var ce *gateway.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want a *ConfigError with %q", err, c.want)
			}
		})
	}
}
