package otelbulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
)

// newExampleBulkhead returns a bulkhead of two slots and no queue.
func newExampleBulkhead() *bulkhead.Bulkhead {
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 2})
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// A Tracer records each call's admission as a child span of the caller's
// span.
func ExampleNewTracer() {
	b := newExampleBulkhead()
	defer b.Shutdown(context.Background())
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	tr, err := otelbulkhead.NewTracer(b, otelbulkhead.Options{TracerProvider: tp, ChildSpan: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, span := tp.Tracer("app").Start(context.Background(), "chat gpt-4o")
	_, err = otelbulkhead.Run(ctx, tr, &bulkhead.Request{Model: "gpt-4o"}, func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
		// Call the provider here, and report its usage.
		return "hello", rc.SetUsage(bulkhead.Usage{Input: 12, Output: 5})
	})
	if err != nil {
		log.Fatal(err)
	}
	span.End()
	b.Shutdown(context.Background()) // delivers the release event
	tr.Close()
	for _, s := range rec.Ended() {
		if s.Name() == "bulkhead.admission" {
			fmt.Println(s.Name(), "child of", s.Parent().SpanID() == span.SpanContext().SpanID())
		}
	}
	// Output:
	// bulkhead.admission child of true
}

// Run calls fn once the call is admitted, as bulkhead.Run does, and
// records the admission on the span of ctx.
func ExampleRun() {
	b := newExampleBulkhead()
	defer b.Shutdown(context.Background())
	tr, err := otelbulkhead.NewTracer(b, otelbulkhead.Options{}) // the global TracerProvider
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	answer, err := otelbulkhead.Run(context.Background(), tr, &bulkhead.Request{Model: "gpt-4o"},
		func(ctx context.Context, rc *bulkhead.RunContext) (string, error) { return "hello", nil })
	fmt.Println(answer, err)
	// Output: hello <nil>
}

// Acquire returns a permit, as Bulkhead.Acquire does; a rejection is
// recorded with its reason and numbers.
func ExampleTracer_Acquire() {
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	tr, err := otelbulkhead.NewTracer(b, otelbulkhead.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	p, err := tr.Acquire(ctx, &bulkhead.Request{Model: "gpt-4o"})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Release(&bulkhead.Usage{Input: 12, Output: 5})
	_, err = tr.Acquire(ctx, &bulkhead.Request{Model: "gpt-4o"})
	fmt.Println(errors.Is(err, bulkhead.ErrConcurrencyLimit))
	// Output: true
}

// Metrics exports a bulkhead's figures through a MeterProvider.
func ExampleNewMetrics() {
	b := newExampleBulkhead()
	defer b.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader() // a PeriodicReader with an OTLP exporter in production
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	m, err := otelbulkhead.NewMetrics(b, otelbulkhead.Options{MeterProvider: mp, Name: "gpt-4o", Provider: "openai"})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, x := range rm.ScopeMetrics[0].Metrics {
		if x.Name == "bulkhead.max_concurrent" {
			fmt.Println(x.Name, x.Data.(metricdata.Gauge[int64]).DataPoints[0].Value)
		}
	}
	// Output: bulkhead.max_concurrent 2
}
