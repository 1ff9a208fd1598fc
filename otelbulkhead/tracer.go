package otelbulkhead

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// Tracer records the admission of a bulkhead's calls on their traces: how
// long each waited, in the queue and for its rate turn, whether it was
// admitted, bypassed or refused, why, with the numbers that decided it,
// what it reserved and, at its release, the usage it settled.
//
// Call the bulkhead through the Tracer, with the caller's context: its
// Acquire, or this package's Run. By default the Tracer records on the
// span the context carries (attributes and span events); with
// Options.ChildSpan it records on a span of its own, a child of that one.
// A call whose span does not record (no span, or one the sampler dropped)
// goes straight to the bulkhead, at no cost.
//
// What the caller learns when the call returns (the decision, the
// rejection and its numbers, the class, the reservation) is recorded
// before it returns. The waits and the release come from the bulkhead's
// events, a moment later, on the bulkhead's event goroutine: a child span
// ends only once they are recorded, while on the caller's span they are
// recorded if the span has not ended by then (a span ends its recording
// at End).
//
// The bulkhead sees, and its events carry, a shallow copy of each
// request: its address tells the Tracer which call an event is about.
//
// A Tracer is safe for concurrent use. Close it when the bulkhead is shut
// down.
type Tracer struct {
	b      *bulkhead.Bulkhead
	tracer trace.Tracer
	opts   Options
	clk    clock.Clock
	// dedup says that b deduplicates: a Run refused before its callback
	// may share its leader's rejection, which has no event of its own.
	dedup bool

	mu          sync.Mutex
	calls       map[*bulkhead.Request]*call
	closed      bool
	unsubscribe func()
}

// call is one traced call.
type call struct {
	// req is the copy of the caller's request given to the bulkhead.
	req  bulkhead.Request
	span trace.Span
	// start is when the call asked for admission.
	start time.Time

	// Guarded by Tracer.mu. decided is set once the decision is recorded;
	// returned once the call has returned to its caller; want is the
	// events the span waits for before it ends, seen those recorded;
	// endAt is when the span ends.
	decided, returned bool
	want, seen        uint8
	endAt             time.Time
}

// The events a span waits for.
const (
	// evTiming is the admit or reject event, with the decision's timing.
	evTiming uint8 = 1 << iota
	// evRelease is the release event of an admission or a bypassed call.
	evRelease
)

// NewTracer returns a Tracer of b's calls and subscribes it to b's events.
// A nil b is an error.
//
// Its listeners make the bulkhead time each decision and emit its admit,
// reject and release events, a small cost on every call, traced or not.
func NewTracer(b *bulkhead.Bulkhead, opts Options) (*Tracer, error) {
	if b == nil {
		return nil, errors.New("otelbulkhead: nil *bulkhead.Bulkhead")
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	t := &Tracer{
		b:      b,
		tracer: tp.Tracer(instrumentation, trace.WithSchemaURL(schemaURL)),
		opts:   opts,
		clk:    clock.OrReal(opts.Clock),
		dedup:  b.Stats().Dedup != nil,
		calls:  map[*bulkhead.Request]*call{},
	}
	t.unsubscribe = b.Subscribe(bulkhead.Hooks{
		Admit:         func(e bulkhead.AdmitEvent) { t.onTiming(e.Request, e.Timing) },
		Reject:        func(e bulkhead.RejectEvent) { t.onTiming(e.Request, e.Timing) },
		Release:       t.onRelease,
		BypassRelease: t.onBypassRelease,
		Abandon:       t.onAbandon,
	})
	return t, nil
}

// Close unsubscribes the Tracer from the bulkhead's events and ends the
// child spans of the calls still open (admissions not yet released),
// with what they have recorded. Calls made after Close go straight to
// the bulkhead. It is idempotent.
func (t *Tracer) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	open := t.calls
	t.calls = nil
	t.mu.Unlock()
	t.unsubscribe()
	now := t.clk.Now()
	for _, c := range open {
		if t.opts.ChildSpan {
			c.span.End(trace.WithTimestamp(now))
		}
	}
}

// Acquire is Bulkhead.Acquire, recorded on the span of ctx (see Tracer).
// Release the permit as usual: its release is recorded from the
// bulkhead's release event.
func (t *Tracer) Acquire(ctx context.Context, req *bulkhead.Request, opts ...bulkhead.Option) (p *bulkhead.Permit, err error) {
	c := t.begin(ctx, req)
	if c == nil {
		return t.b.Acquire(ctx, req, opts...)
	}
	defer func() {
		if p != nil {
			t.admitted(c, p, nil)
		}
		t.returned(c, err, false)
	}()
	return t.b.Acquire(ctx, &c.req, opts...)
}

// Run is bulkhead.Run, recorded on the span of ctx (see Tracer). fn gets
// ctx as Run passes it, with the caller's span.
func Run[T any](ctx context.Context, t *Tracer, req *bulkhead.Request, fn func(context.Context, *bulkhead.RunContext) (T, error), opts ...bulkhead.Option) (v T, err error) {
	var c *call
	if fn != nil {
		c = t.begin(ctx, req)
	}
	if c == nil {
		return bulkhead.Run(ctx, t.b, req, fn, opts...)
	}
	defer func() { t.returned(c, err, true) }()
	return bulkhead.Run(ctx, t.b, &c.req, func(ctx context.Context, rc *bulkhead.RunContext) (T, error) {
		t.admitted(c, rc, rc.Bypass())
		return fn(ctx, rc)
	}, opts...)
}

// begin starts tracing a call of req: it returns the call, registered
// under the address of its copy of req, or nil when the call is not
// traced.
func (t *Tracer) begin(ctx context.Context, req *bulkhead.Request) *call {
	if req == nil || ctx == nil {
		return nil // invalid: the bulkhead says so
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() && !t.opts.ChildSpan || t.isClosed() {
		return nil
	}
	now := t.clk.Now()
	if t.opts.ChildSpan {
		_, span = t.tracer.Start(ctx, spanName, trace.WithTimestamp(now), trace.WithSpanKind(trace.SpanKindInternal))
		if !span.IsRecording() {
			span.End()
			return nil
		}
	}
	c := &call{req: *req, span: span, start: now}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.endSpan(c, now)
		return nil
	}
	t.calls[&c.req] = c
	t.mu.Unlock()
	attrs := make([]attribute.KeyValue, 0, 3)
	if t.opts.Name != "" {
		attrs = append(attrs, keyName.String(t.opts.Name))
	}
	if m := t.opts.model(req.Model); m != "" {
		attrs = append(attrs, genAIRequestModel.String(m))
	}
	if req.MaxTokens > 0 {
		attrs = append(attrs, genAIRequestMaxTokens.Int64(req.MaxTokens))
	}
	span.SetAttributes(attrs...)
	return c
}

// isClosed reports whether Close was called.
func (t *Tracer) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// admission is what a Permit and a RunContext tell of an admission.
type admission interface {
	ID() bulkhead.ID
	Class() string
	Priority() bulkhead.Priority
	Tag() string
	LimitRevision() int64
	Reservation() *bulkhead.Reservation
	Resources() bulkhead.Resources
}

// admitted records the admission of c (or, with by, its bypass) now, and
// that its span waits for the release.
func (t *Tracer) admitted(c *call, a admission, by *bulkhead.Bypass) {
	now := t.clk.Now()
	outcome, name := outcomeAdmitted, eventAdmitted
	if by != nil {
		outcome, name = outcomeBypassed, eventBypassed
	}
	attrs := []attribute.KeyValue{
		keyOutcome.String(outcome),
		keyAdmissionID.String(a.ID().String()),
		keyPriority.String(a.Priority().String()),
		keyLimitRevision.Int64(a.LimitRevision()),
		keyWaitTotal.Float64(now.Sub(c.start).Seconds()),
	}
	if class := a.Class(); class != "" {
		res := a.Resources()
		attrs = append(attrs, keyClass.String(class),
			keyBorrowedSlot.Bool(res.BorrowedConcurrency), keyBorrowedTokens.Int64(res.BorrowedTokens))
	}
	if tag := a.Tag(); tag != "" {
		attrs = append(attrs, keyTag.String(tag))
	}
	if r := a.Reservation(); r != nil {
		attrs = append(attrs, keyReservedInput.Int64(r.Input), keyReservedOutput.Int64(r.MaxOutput), keyReserved.Int64(r.Reserved))
	}
	event := []attribute.KeyValue{keyAdmissionID.String(a.ID().String())}
	want := evTiming | evRelease
	if by != nil {
		attrs = append(attrs, keyReason.String(by.Reason.String()))
		event = append(event, keyReason.String(by.Reason.String()), attribute.Bool(bypassPrefix+".race", by.Race))
		if by.Detail != nil {
			event = appendLogValue(event, bypassPrefix+".detail", by.Detail.LogValue())
		}
		// A bypass refused on arrival has no reject event, a race bypass
		// one: the span waits only for the release.
		want = evRelease
	}
	c.span.SetAttributes(attrs...)
	c.span.AddEvent(name, trace.WithTimestamp(now), trace.WithAttributes(event...))
	t.mu.Lock()
	c.decided, c.want = true, want
	t.mu.Unlock()
}

// returned records the end of c's call to the bulkhead, with err, when
// nothing recorded its decision yet, and ends c's span when it waits for
// nothing more. run says the call was a Run.
func (t *Tracer) returned(c *call, err error, run bool) {
	now := t.clk.Now()
	t.mu.Lock()
	decided := c.decided
	t.mu.Unlock()
	var want uint8
	if !decided {
		want = t.refused(c, err, run, now)
	}
	t.mu.Lock()
	c.returned = true
	if !decided {
		c.decided, c.want = true, want
	}
	if c.endAt.IsZero() {
		c.endAt = now
	}
	done := t.doneLocked(c)
	t.mu.Unlock()
	if done {
		t.endSpan(c, c.endAt)
	}
}

// refused records the outcome of a call that returned at now, with err,
// without being admitted, and returns the events its span waits for.
func (t *Tracer) refused(c *call, err error, run bool, now time.Time) (want uint8) {
	wait := keyWaitTotal.Float64(now.Sub(c.start).Seconds())
	var rej *bulkhead.RejectedError
	switch {
	case errors.As(err, &rej):
		reason := rej.Reason.String()
		attrs := []attribute.KeyValue{keyOutcome.String(outcomeRejected), keyReason.String(reason), wait}
		if d := rej.Detail; d != nil {
			attrs = append(attrs, keyLimitRevision.Int64(d.LimitRevision))
			if d.Class != nil {
				attrs = append(attrs, keyClass.String(d.Class.Name))
			}
		}
		if rej.Tag != "" {
			attrs = append(attrs, keyTag.String(rej.Tag))
		}
		event := appendLogValue(nil, rejectionPrefix, rej.LogValue())
		if d, ok := rej.RetryAfter(); ok {
			attrs = append(attrs, keyRetryAfter.Float64(d.Seconds()))
		}
		c.span.SetAttributes(attrs...)
		c.span.AddEvent(eventRejected, trace.WithTimestamp(now), trace.WithAttributes(event...))
		if t.opts.ChildSpan {
			c.span.SetAttributes(errorType.String(reason))
			c.span.SetStatus(codes.Error, rej.Error())
		}
		// A closed bulkhead may have stopped its events; a Run refused
		// before its callback may share its leader's rejection, which has
		// no event of its own (with deduplication).
		if rej.Reason == bulkhead.Shutdown || run && t.dedup {
			return 0
		}
		return evTiming
	case run && (err == nil || t.dedup && !errors.Is(err, bulkhead.ErrInvalid) && !errors.Is(err, bulkhead.ErrInternal)):
		// A follower: it returned the outcome of an identical call in
		// flight, without calling fn.
		c.span.SetAttributes(keyOutcome.String(outcomeDeduplicated), wait)
		c.span.AddEvent(eventDeduplicated, trace.WithTimestamp(now))
		return 0
	}
	// Invalid input, or the engine failed: nothing was decided.
	c.span.SetAttributes(keyOutcome.String(outcomeFailed), wait)
	if err != nil {
		c.span.SetAttributes(keyError.String(err.Error()))
		if t.opts.ChildSpan {
			c.span.RecordError(err, trace.WithTimestamp(now))
			c.span.SetStatus(codes.Error, err.Error())
		}
	}
	return 0
}

// doneLocked reports whether c waits for nothing more, and forgets it if
// so. t.mu is held.
func (t *Tracer) doneLocked(c *call) bool {
	if !c.returned || c.seen&c.want != c.want {
		return false
	}
	if t.calls != nil {
		delete(t.calls, &c.req)
	}
	return true
}

// endSpan ends c's span at at, when it is the Tracer's own.
func (t *Tracer) endSpan(c *call, at time.Time) {
	if t.opts.ChildSpan {
		c.span.End(trace.WithTimestamp(at))
	}
}

// event records what an event of the call of req says, with record, and
// marks the event ev as seen.
func (t *Tracer) event(req *bulkhead.Request, ev uint8, record func(c *call)) {
	t.mu.Lock()
	c := t.calls[req]
	t.mu.Unlock()
	if c == nil {
		return // not traced, or already ended
	}
	record(c)
	t.mu.Lock()
	c.seen |= ev
	done := ev != 0 && t.doneLocked(c)
	t.mu.Unlock()
	if done {
		t.endSpan(c, c.endAt)
	}
}

func (t *Tracer) onTiming(req *bulkhead.Request, tm bulkhead.Timing) {
	t.event(req, evTiming, func(c *call) { c.span.SetAttributes(timingAttributes(tm)...) })
}

func (t *Tracer) onRelease(e bulkhead.ReleaseEvent) {
	t.released(e.Request, e.Usage, keyHeld.Int64(e.Held), keyRefunded.Int64(e.Refunded))
}

func (t *Tracer) onBypassRelease(e bulkhead.BypassReleaseEvent) {
	t.released(e.Request, e.Usage)
}

// released records the release of the call of req, with its final usage
// u (nil for none) and more attributes.
func (t *Tracer) released(req *bulkhead.Request, u *bulkhead.Usage, more ...attribute.KeyValue) {
	now := t.clk.Now()
	t.event(req, evRelease, func(c *call) {
		if u != nil {
			usage := UsageAttributes(u)
			c.span.SetAttributes(usage...)
			more = append(more, usage...)
		}
		c.span.AddEvent(eventReleased, trace.WithTimestamp(now), trace.WithAttributes(more...))
		t.mu.Lock()
		c.endAt = now
		t.mu.Unlock()
	})
}

func (t *Tracer) onAbandon(e bulkhead.AbandonEvent) {
	now := t.clk.Now()
	t.event(e.Request, 0, func(c *call) {
		c.span.AddEvent(eventAbandoned, trace.WithTimestamp(now), trace.WithAttributes(keyAbandonCause.String(e.Cause.String())))
	})
}
