package benchmarks

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
)

// BenchmarkTracer is the cost of otelbulkhead's Tracer on an admitted call
// (Acquire+Release), against the bulkhead alone in the same run:
// "untraced" goes through a Tracer with no span in the context (the
// sampler's "no" costs this much), "caller-span" records on a sampled
// caller's span, "child-span" on a span of its own, both with the SDK's
// in-memory exporter. The caller's own span is started and ended outside
// the timed part only in "baseline"; in the traced runs each iteration
// starts and ends it too (its cost is the SDK's, not the Tracer's), so
// compare "caller-span" with "span-only".
func BenchmarkTracer(b *testing.B) {
	run := func(b *testing.B, mode string) {
		bh := newBench(b, bulkhead.Config{MaxConcurrent: 64})
		rec := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rec))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		var tr *otelbulkhead.Tracer
		if mode != "baseline" && mode != "span-only" {
			var err error
			tr, err = otelbulkhead.NewTracer(bh, otelbulkhead.Options{TracerProvider: tp, ChildSpan: mode == "child-span"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(tr.Close)
		}
		tracer := tp.Tracer("bench")
		b.ReportAllocs()
		for b.Loop() {
			ctx := context.Background()
			var end func()
			if mode != "baseline" && mode != "untraced" {
				c, span := tracer.Start(ctx, "chat")
				ctx, end = c, func() { span.End() }
			}
			var p *bulkhead.Permit
			var err error
			if tr != nil {
				p, err = tr.Acquire(ctx, benchRequest)
			} else {
				p, err = bh.Acquire(ctx, benchRequest)
			}
			if err != nil {
				b.Fatal(err)
			}
			_ = p.Release(nil)
			if end != nil {
				end()
			}
			rec.Reset()
		}
	}
	for _, mode := range []string{"baseline", "untraced", "span-only", "caller-span", "child-span"} {
		b.Run(mode, func(b *testing.B) { run(b, mode) })
	}
}
