package otelbulkhead_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
)

// armedClock is a mock clock that says each time the engine arms a timer,
// with its duration, so a test can move time once a call waits on it.
type armedClock struct {
	*clock.Mock
	armed chan time.Duration
}

func newArmedClock() *armedClock {
	return &armedClock{Mock: clock.NewMock(), armed: make(chan time.Duration, 64)}
}

func (c *armedClock) NewTimer(d time.Duration) clock.Timer {
	t := c.Mock.NewTimer(d)
	c.armed <- d
	return t
}

func (c *armedClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Mock.AfterFunc(d, f)
	c.armed <- d
	return t
}

// newBulkhead builds a bulkhead on clk and shuts it down when the test
// ends.
func newBulkhead(t *testing.T, cfg bulkhead.Config, clk clock.Clock) *bulkhead.Bulkhead {
	t.Helper()
	cfg.Clock = clk
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatalf("bulkhead.New: %v", err)
	}
	t.Cleanup(func() { shutdown(t, b) })
	return b
}

// shutdown closes and drains b: every event has been delivered once it
// returns.
func shutdown(t *testing.T, b *bulkhead.Bulkhead) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
		t.Errorf("Shutdown: %+v, %v", res, err)
	}
}

// traced is a bulkhead's Tracer with an in-memory span recorder.
type traced struct {
	b    *bulkhead.Bulkhead
	tr   *otelbulkhead.Tracer
	rec  *tracetest.SpanRecorder
	tp   *sdktrace.TracerProvider
	seen chan string
}

// newTraced makes a Tracer of b on a recorder, with opts, and a fence: a
// listener subscribed after the Tracer, so that once the fence has seen an
// event the Tracer has recorded it.
func newTraced(t *testing.T, b *bulkhead.Bulkhead, opts otelbulkhead.Options) *traced {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts.TracerProvider = tp
	tr, err := otelbulkhead.NewTracer(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	x := &traced{b: b, tr: tr, rec: rec, tp: tp, seen: make(chan string, 64)}
	t.Cleanup(b.Subscribe(bulkhead.Hooks{
		Admit:         func(bulkhead.AdmitEvent) { x.seen <- "admit" },
		Reject:        func(bulkhead.RejectEvent) { x.seen <- "reject" },
		Release:       func(bulkhead.ReleaseEvent) { x.seen <- "release" },
		BypassRelease: func(bulkhead.BypassReleaseEvent) { x.seen <- "bypass_release" },
	}))
	return x
}

// wait waits until the fence has seen the events named, in order.
func (x *traced) wait(t *testing.T, events ...string) {
	t.Helper()
	for _, want := range events {
		select {
		case got := <-x.seen:
			if got != want {
				t.Fatalf("event %s, want %s", got, want)
			}
		case <-time.After(testutil.Settle):
			t.Fatalf("no %s event", want)
		}
	}
}

// until waits until the fence has seen an event named name, skipping
// the others.
func (x *traced) until(t *testing.T, name string) {
	t.Helper()
	for {
		select {
		case got := <-x.seen:
			if got == name {
				return
			}
		case <-time.After(testutil.Settle):
			t.Fatalf("no %s event", name)
		}
	}
}

// parent starts the caller's span.
func (x *traced) parent(ctx context.Context) (context.Context, trace.Span) {
	return x.tp.Tracer("test").Start(ctx, "chat gpt-4o")
}

// ended returns the ended span named name; it fails the test unless there
// is exactly one.
func (x *traced) ended(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range x.rec.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended spans named %q, want 1 (of %d)", len(found), name, len(x.rec.Ended()))
	}
	return found[0]
}

// attrs indexes attributes by key.
func attrs(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// event returns the span event named name; it fails the test unless there
// is exactly one.
func event(t *testing.T, s sdktrace.ReadOnlySpan, name string) sdktrace.Event {
	t.Helper()
	var found []sdktrace.Event
	for _, e := range s.Events() {
		if e.Name == name {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d events %q on span %q, want 1: %v", len(found), name, s.Name(), s.Events())
	}
	return found[0]
}

// want checks that got has each attribute of want, with its value.
func want(t *testing.T, where string, got map[string]attribute.Value, want map[string]any) {
	t.Helper()
	for k, w := range want {
		v, ok := got[k]
		if !ok {
			t.Errorf("%s: no attribute %s (want %v)", where, k, w)
			continue
		}
		if v.AsInterface() != w {
			t.Errorf("%s: %s = %v (%T), want %v (%T)", where, k, v.AsInterface(), v.AsInterface(), w, w)
		}
	}
}

var hi = &bulkhead.Request{Model: "gpt-4o", Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}, MaxTokens: 100}

// reserve is a per-call reservation.
func reserve(input, output int64) bulkhead.Option {
	return bulkhead.WithReservation(bulkhead.Reservation{Input: input, MaxOutput: output})
}
