package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/semconv"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
)

// TelemetryConfig is the gateway's OpenTelemetry: a trace of every call
// (the gateway's span in the generative AI conventions' shape, the
// admission, the upstream call) and the bulkheads' metrics, exported over
// OTLP, by HTTP or gRPC. Both are off by default, and cost nothing then.
//
// The standard OpenTelemetry environment variables configure what the file
// leaves out: an OTLP endpoint in OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _METRICS_ENDPOINT), or
// OTEL_TRACES_EXPORTER=otlp (OTEL_METRICS_EXPORTER=otlp), turns traces
// (metrics) on; OTEL_TRACES_EXPORTER=none turns them off;
// OTEL_EXPORTER_OTLP_PROTOCOL chooses the protocol; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES describe the service; OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG choose the sampler; the exporters read the rest
// themselves (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _CERTIFICATE,
// _COMPRESSION...). OTEL_SDK_DISABLED=true turns everything off. A key the
// file sets wins over its variable.
//
//	telemetry: {traces: true, metrics: true, endpoint: "http://otel-collector:4318", protocol: http/protobuf}
type TelemetryConfig struct {
	// Traces turns the traces on or off; absent means as the environment
	// says (on when it names an OTLP endpoint).
	Traces *bool `yaml:"traces"`
	// Metrics turns the OTLP metrics on or off; absent means as the
	// environment says. The Prometheus endpoint /metrics serves the same
	// figures either way.
	Metrics *bool `yaml:"metrics"`
	// Endpoint is the OTLP receiver, such as "http://otel-collector:4318"
	// (http/protobuf: /v1/traces and /v1/metrics are joined to its path)
	// or "http://otel-collector:4317" (grpc); an http URL sends in plain
	// text, an https one over TLS. Empty means the environment's, else the
	// exporters' default (localhost:4318, or localhost:4317 for grpc).
	Endpoint string `yaml:"endpoint"`
	// Protocol is "http/protobuf" (the default) or "grpc".
	Protocol string `yaml:"protocol"`
	// ServiceName is the service.name of the telemetry; empty means
	// OTEL_SERVICE_NAME, else "bulkhead-gateway".
	ServiceName string `yaml:"service_name"`
	// SampleRatio, when set, samples this share of the traces that start
	// at the gateway, from 0 to 1; a call whose caller sent a trace
	// context follows its caller's decision. Absent means
	// OTEL_TRACES_SAMPLER, else every trace.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// MetricsInterval is the time between two exports of the metrics;
	// zero means OTEL_METRIC_EXPORT_INTERVAL, else 60s.
	MetricsInterval Duration `yaml:"metrics_interval"`
	// CaptureContent records the prompts (system instructions and
	// messages) on the gateway's spans. Off by default: they may hold
	// anything a user wrote.
	CaptureContent bool `yaml:"capture_content"`
}

// The OTLP protocols.
const (
	protocolHTTP = "http/protobuf"
	protocolGRPC = "grpc"
)

// checkTelemetry checks the telemetry section's own values; what depends
// on the environment is checked by Build.
func (v *validator) checkTelemetry(t *TelemetryConfig) {
	p := []string{"telemetry"}
	switch t.Protocol {
	case "", protocolHTTP, protocolGRPC:
	default:
		v.failf(append(p, "protocol"), "want http/protobuf or grpc, got %q", t.Protocol)
	}
	if t.Endpoint != "" {
		if _, err := otlpEndpoint(t.Endpoint); err != nil {
			v.failf(append(p, "endpoint"), "%v", err)
		}
	}
	if r := t.SampleRatio; r != nil && !(*r >= 0 && *r <= 1) {
		v.failf(append(p, "sample_ratio"), "want a number from 0 to 1, got %v", *r)
	}
	if name := t.ServiceName; name != strings.TrimSpace(name) {
		v.failf(append(p, "service_name"), "has spaces around it: %q", name)
	}
}

// otlpEndpoint reads an OTLP endpoint: an http or https URL with a host,
// without a query.
func otlpEndpoint(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("want an http or https URL such as http://otel-collector:4318, got %q", s)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, fmt.Errorf("want a URL without credentials, query or fragment, got %q", s)
	}
	return u, nil
}

// A BuildOption changes what Build makes.
type BuildOption func(*buildOptions)

type buildOptions struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider makes the gateway trace its calls with tp, in place of
// the OTLP exporter its configuration's telemetry section would make: the
// traces are on whatever the file and the environment say, and tp stays
// the caller's to shut down (after the gateway's Shutdown). The
// telemetry section's capture_content still applies.
func WithTracerProvider(tp trace.TracerProvider) BuildOption {
	return func(o *buildOptions) { o.tp = tp }
}

// WithMeterProvider makes the gateway export its bulkheads' metrics through
// mp, in place of the OTLP exporter its configuration's telemetry section
// would make; mp stays the caller's to shut down.
func WithMeterProvider(mp metric.MeterProvider) BuildOption {
	return func(o *buildOptions) { o.mp = mp }
}

// telemetry is a gateway's OpenTelemetry: nil when both traces and metrics
// are off.
type telemetry struct {
	// tracer is nil when traces are off.
	tracer  trace.Tracer
	prop    propagation.TextMapPropagator
	capture bool
	// tracers record each bulkhead's admissions, with traces.
	tracers map[*bulkhead.Bulkhead]*otelbulkhead.Tracer
	metrics []*otelbulkhead.Metrics
	// owned are the providers the gateway made, to shut down.
	owned []func(context.Context) error
}

// telemetryShutdownTimeout bounds the last export at Shutdown: a collector
// that cannot be reached must not hold the gateway's exit.
const telemetryShutdownTimeout = 5 * time.Second

// instrumentation is the name of the gateway's tracer.
const instrumentation = "github.com/llmbulkhead/bulkhead/gateway"

// on reports whether the environment (with lookupEnv) and the file's
// switch turn a signal on; exporterVar and endpointVar are the signal's
// variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
func signalOn(file *bool, lookupEnv func(string) (string, bool), exporterVar, endpointVar string) (bool, error) {
	if v, _ := lookupEnv("OTEL_SDK_DISABLED"); strings.EqualFold(strings.TrimSpace(v), "true") {
		return false, nil
	}
	if file != nil {
		return *file, nil
	}
	exp, _ := lookupEnv(exporterVar)
	switch strings.TrimSpace(exp) {
	case "otlp":
		return true, nil
	case "none":
		return false, nil
	case "":
		for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", endpointVar} {
			if v, _ := lookupEnv(name); strings.TrimSpace(v) != "" {
				return true, nil
			}
		}
		return false, nil
	}
	return false, fmt.Errorf("%s is %q: the gateway exports otlp, or none", exporterVar, exp)
}

// protocolOf returns the OTLP protocol of a signal: the file's, else the
// signal's variable (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL), else
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf.
func protocolOf(file string, lookupEnv func(string) (string, bool), signalVar string) (string, error) {
	if file != "" {
		return file, nil
	}
	for _, name := range []string{signalVar, "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch v, _ := lookupEnv(name); strings.TrimSpace(v) {
		case "":
			continue
		case protocolHTTP, protocolGRPC:
			return strings.TrimSpace(v), nil
		default:
			return "", fmt.Errorf("%s is %q: want http/protobuf or grpc", name, v)
		}
	}
	return protocolHTTP, nil
}

// newTelemetry makes the telemetry of cfg for the bulkheads, by name;
// models are their models, and providers the gen_ai.provider.name of
// their metrics. It returns nil when traces and metrics are both off.
func newTelemetry(cfg *TelemetryConfig, v *validator, lookupEnv func(string) (string, bool), o buildOptions,
	bulkheads map[string]*bulkhead.Bulkhead, models, providers map[string]string) (*telemetry, error) {
	p := []string{"telemetry"}
	traces, err := signalOn(cfg.Traces, lookupEnv, "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if err != nil {
		return nil, v.at(append(p, "traces"), "%v", err)
	}
	metrics, err := signalOn(cfg.Metrics, lookupEnv, "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
	if err != nil {
		return nil, v.at(append(p, "metrics"), "%v", err)
	}
	traces, metrics = traces || o.tp != nil, metrics || o.mp != nil
	if !traces && !metrics {
		return nil, nil
	}
	t := &telemetry{capture: cfg.CaptureContent,
		prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	fail := func(err error) (*telemetry, error) {
		_ = t.close()
		return nil, err
	}
	var endpoint *url.URL
	if cfg.Endpoint != "" {
		endpoint, _ = otlpEndpoint(cfg.Endpoint) // checked by ParseConfig
	}
	var res *resource.Resource
	if o.tp == nil && traces || o.mp == nil && metrics {
		if res, err = telemetryResource(cfg.ServiceName); err != nil {
			return fail(v.at(append(p, "service_name"), "%v", err))
		}
	}
	ctx := context.Background()
	if traces {
		tp := o.tp
		if tp == nil {
			proto, err := protocolOf(cfg.Protocol, lookupEnv, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
			if err != nil {
				return fail(v.at(append(p, "protocol"), "%v", err))
			}
			exp, err := traceExporter(ctx, proto, endpoint)
			if err != nil {
				return fail(v.at(append(p, "endpoint"), "%v", err))
			}
			opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
			if r := cfg.SampleRatio; r != nil {
				opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*r))))
			}
			sdk := sdktrace.NewTracerProvider(opts...)
			t.owned = append(t.owned, sdk.Shutdown)
			tp = sdk
		}
		t.tracer = tp.Tracer(instrumentation, trace.WithSchemaURL(semconv.SchemaURL))
		t.tracers = map[*bulkhead.Bulkhead]*otelbulkhead.Tracer{}
		for _, name := range sortedKeys(bulkheads) {
			b := bulkheads[name]
			tr, err := otelbulkhead.NewTracer(b, otelbulkhead.Options{TracerProvider: tp, ChildSpan: true, Name: name, Model: models[name]})
			if err != nil {
				return fail(err)
			}
			t.tracers[b] = tr
		}
	}
	if metrics {
		mp := o.mp
		if mp == nil {
			proto, err := protocolOf(cfg.Protocol, lookupEnv, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
			if err != nil {
				return fail(v.at(append(p, "protocol"), "%v", err))
			}
			exp, err := metricExporter(ctx, proto, endpoint)
			if err != nil {
				return fail(v.at(append(p, "endpoint"), "%v", err))
			}
			var ropts []sdkmetric.PeriodicReaderOption
			if d := time.Duration(cfg.MetricsInterval); d > 0 {
				ropts = append(ropts, sdkmetric.WithInterval(d))
			}
			sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, ropts...)), sdkmetric.WithResource(res))
			t.owned = append(t.owned, sdk.Shutdown)
			mp = sdk
		}
		for _, name := range sortedKeys(bulkheads) {
			m, err := otelbulkhead.NewMetrics(bulkheads[name], otelbulkhead.Options{MeterProvider: mp, Name: name, Model: models[name], Provider: providers[name]})
			if err != nil {
				return fail(err)
			}
			t.metrics = append(t.metrics, m)
		}
	}
	return t, nil
}

// defaultServiceName is the service.name of a gateway's telemetry when
// neither the file nor the environment names one.
const defaultServiceName = "bulkhead-gateway"

// telemetryResource describes the gateway: the SDK's own attributes, the
// service name (name, else OTEL_SERVICE_NAME, else "bulkhead-gateway") and
// OTEL_RESOURCE_ATTRIBUTES.
func telemetryResource(name string) (*resource.Resource, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", defaultServiceName)))
	if err == nil {
		res, err = resource.Merge(res, resource.Environment())
	}
	if err == nil && name != "" {
		res, err = resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", name)))
	}
	return res, err
}

// traceExporter makes an OTLP span exporter of protocol proto, to endpoint
// (nil: the environment's, else the default).
func traceExporter(ctx context.Context, proto string, endpoint *url.URL) (sdktrace.SpanExporter, error) {
	if proto == protocolGRPC {
		var opts []otlptracegrpc.Option
		if endpoint != nil {
			opts = append(opts, otlptracegrpc.WithEndpoint(endpoint.Host))
			if endpoint.Scheme == "http" {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	var opts []otlptracehttp.Option
	if endpoint != nil {
		opts = append(opts, otlptracehttp.WithEndpoint(endpoint.Host), otlptracehttp.WithURLPath(path.Join("/", endpoint.Path, "v1/traces")))
		if endpoint.Scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
	}
	return otlptracehttp.New(ctx, opts...)
}

// metricExporter makes an OTLP metric exporter of protocol proto, to
// endpoint (nil: the environment's, else the default).
func metricExporter(ctx context.Context, proto string, endpoint *url.URL) (sdkmetric.Exporter, error) {
	if proto == protocolGRPC {
		var opts []otlpmetricgrpc.Option
		if endpoint != nil {
			opts = append(opts, otlpmetricgrpc.WithEndpoint(endpoint.Host))
			if endpoint.Scheme == "http" {
				opts = append(opts, otlpmetricgrpc.WithInsecure())
			}
		}
		return otlpmetricgrpc.New(ctx, opts...)
	}
	var opts []otlpmetrichttp.Option
	if endpoint != nil {
		opts = append(opts, otlpmetrichttp.WithEndpoint(endpoint.Host), otlpmetrichttp.WithURLPath(path.Join("/", endpoint.Path, "v1/metrics")))
		if endpoint.Scheme == "http" {
			opts = append(opts, otlpmetrichttp.WithInsecure())
		}
	}
	return otlpmetrichttp.New(ctx, opts...)
}

// close ends the telemetry once the bulkheads have drained: the tracers
// end the spans still open, then the providers the gateway made export
// what they hold (the metrics as they are now), for at most
// telemetryShutdownTimeout. It returns what failed.
func (t *telemetry) close() error {
	if t == nil {
		return nil
	}
	for _, tr := range t.tracers {
		tr.Close()
	}
	err := t.shutdown() // the metrics' last export reads them
	for _, m := range t.metrics {
		m.Close()
	}
	return err
}

// shutdown shuts down the providers the gateway made.
func (t *telemetry) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
	defer cancel()
	var errs []error
	for _, f := range t.owned {
		errs = append(errs, f(ctx))
	}
	t.owned = nil
	return errors.Join(errs...)
}
