// Package otelbulkhead records a bulkhead's admission decisions on
// OpenTelemetry traces and exports its figures as OpenTelemetry metrics,
// for programs whose telemetry goes through an OpenTelemetry pipeline
// (OTLP) rather than, or beside, a Prometheus scrape.
//
// A Tracer records the admission of each call on the caller's span, or on
// a child span of its own: the waits (in the queue, for a rate turn, for a
// cool-down held in the queue), the decision, the reason of a rejection
// with the numbers that decided it, the class, the reservation, and at
// release the settled usage. Call the bulkhead through it:
//
//	tr, err := otelbulkhead.NewTracer(b, otelbulkhead.Options{TracerProvider: tp})
//	if err != nil { ... }
//	defer tr.Close()
//	v, err := otelbulkhead.Run(ctx, tr, req, fn) // or tr.Acquire(ctx, req)
//
// A Metrics exports the figures package metrics gives Prometheus, read
// from Stats at each collection, the histograms of waits and usage, and
// the generative AI client metrics gen_ai.client.token.usage and
// gen_ai.client.operation.duration:
//
//	m, err := otelbulkhead.NewMetrics(b, otelbulkhead.Options{MeterProvider: mp, Provider: "openai"})
//	if err != nil { ... }
//	defer m.Close()
//
// Names follow the OpenTelemetry semantic conventions for generative AI,
// version SemConvVersion, where they have one (gen_ai.request.model,
// gen_ai.usage.input_tokens...); the rest are in the bulkhead.* namespace.
// The guide docs/observability.md lists every attribute and instrument.
//
// The package uses only the OpenTelemetry API (trace, metric, attribute),
// at the version the bulkhead's engine already requires, so importing it
// adds no module to a program's graph; a program that does not import it
// links none of it.
package otelbulkhead
