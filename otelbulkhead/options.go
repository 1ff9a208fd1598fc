package otelbulkhead

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead/clock"
)

// Options configures a Tracer and a Metrics. The zero value is ready to
// use: it records on the caller's span, with the global providers.
type Options struct {
	// TracerProvider gives the Tracer its tracer. Nil means the global
	// provider (otel.GetTracerProvider). Metrics does not use it.
	TracerProvider trace.TracerProvider

	// MeterProvider gives the Metrics its meter. Nil means the global
	// provider (otel.GetMeterProvider). Tracer does not use it.
	MeterProvider metric.MeterProvider

	// ChildSpan makes the Tracer record each call on a span of its own,
	// named "bulkhead.admission", a child of the caller's span, from the
	// moment the call asks for admission until it is released (or
	// refused). By default the Tracer records on the caller's span.
	ChildSpan bool

	// Name, when not empty, is the attribute bulkhead.name of every span,
	// event and measurement, to tell the bulkheads of one program apart.
	Name string

	// Model is the gen_ai.request.model of a call whose Request names no
	// model: set it to the bulkhead's Config.Model. Empty means such a
	// call has no gen_ai.request.model.
	Model string

	// Provider is the gen_ai.provider.name of the generative AI metrics,
	// such as "openai" or "anthropic" (the conventions list the names).
	// Empty leaves it out.
	Provider string

	// Operation is the gen_ai.operation.name of the generative AI
	// metrics. Empty means "chat".
	Operation string

	// Attributes are added to every measurement of a Metrics, such as the
	// deployment or the region. They must not use the names the package
	// sets itself.
	Attributes []attribute.KeyValue

	// Clock is where the Tracer and the Metrics read the time of the
	// moments they record (a call's arrival, its decision, its release).
	// Nil means the wall clock. Give the bulkhead's Config.Clock in tests.
	Clock clock.Clock
}

// model returns the model of a call whose request names m.
func (o *Options) model(m string) string {
	if m != "" {
		return m
	}
	return o.Model
}
