package bulkhead

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// Bulkhead is an admission controller for LLM calls. Its methods are safe
// for concurrent use. Shutdown (or Close, then Drain) ends it.
type Bulkhead struct {
	eng       *actor.Engine
	estimator Estimator
	hasBudget bool
	timeout   time.Duration
	// dedup is in-flight deduplication, nil when off.
	dedup *deduper
	// clk is Config.Clock, or the wall clock; model is Config.Model.
	clk   clock.Clock
	model string
	// log is Config.Logger, or a logger that discards. usageCeiling is
	// Config.UsageCeiling with the default applied; suspect and
	// suspectTokens count the usage figures clamped to it.
	log          *slog.Logger
	usageCeiling int64
	// remoteRates is set when the rate limits are kept in Redis: a
	// release waits for the overrun it books there.
	remoteRates            bool
	suspect, suspectTokens atomic.Int64
}

// New validates cfg and starts a Bulkhead.
func New(cfg Config) (*Bulkhead, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rates, err := rateConfig(&cfg)
	if err != nil {
		return nil, err
	}
	retry, err := retryConfig(&cfg)
	if err != nil {
		return nil, err
	}
	adapt, err := adaptiveConfig(&cfg)
	if err != nil {
		return nil, err
	}
	b := &Bulkhead{timeout: cfg.QueueTimeout, clk: clock.OrReal(cfg.Clock), model: cfg.Model,
		log: cfg.Logger, usageCeiling: cfg.UsageCeiling}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if b.usageCeiling == 0 {
		b.usageCeiling = DefaultUsageCeiling
	}
	shed := cfg.Adaptive != nil && cfg.Adaptive.Cooldown == ShedCooldown
	if rates != nil {
		switch rates.Store.(type) {
		case nil, *pacer.Local, *pacer.Table:
		default:
			b.remoteRates = true
		}
	}
	limits := Limits{Revision: cfg.InitialRevision, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue}
	if tb := cfg.TokenBudget; tb != nil {
		b.hasBudget = true
		b.estimator = tb.Estimator
		if b.estimator == nil {
			b.estimator = newDefaultEstimator(cfg.Model, tb.OutputCap)
		}
		limits.TokenBudget = &BudgetLimits{Budget: tb.Budget, HighPriorityReserve: tb.HighPriorityReserve}
	}
	if cfg.Classes != nil {
		limits.Classes = cfg.Classes
	}
	eng, err := actor.Start(actor.Config{Limits: engineLimits(limits), Clock: cfg.Clock, Logger: cfg.Logger, Dedup: cfg.Dedup != nil,
		Queue: actor.QueuePolicy{Fair: cfg.Queue.Fair, Weights: cfg.Queue.Weights, WaitForCapacity: cfg.Queue.WaitForCapacity,
			RetryAging: retryAging(cfg.Queue.RetryAging)},
		Model: cfg.Model, ShedCooldown: shed, Adaptive: adapt, Rates: rates, Fleet: cfg.Fleet, Retry: retry})
	if err != nil {
		return nil, publicError(err)
	}
	b.eng = eng
	if cfg.Dedup != nil {
		b.dedup = newDeduper(*cfg.Dedup)
	}
	return b, nil
}

// reserve validates req and computes its reservation, exactly once per
// call: the override when given, else the estimator. Without a budget it
// validates the request (and an override) and reserves nothing.
func (b *Bulkhead) reserve(req *Request, override *Reservation) (Reservation, error) {
	if !b.hasBudget {
		if override != nil {
			// Validated, then ignored: there is no budget to reserve from.
			_, err := reserve(nil, req, override)
			return Reservation{}, err
		}
		return Reservation{}, req.Validate()
	}
	return reserve(b.estimator, req, override)
}

// Acquire waits for admission and returns a Permit holding the slot and the
// token reservation until Permit.Release. It never deduplicates.
//
// A call that finds a free slot (and room in the token budget) is admitted
// at once. Otherwise it queues when the queue has room, until a slot frees,
// its queue timeout expires (Timeout) or ctx ends (Aborted); else it is
// rejected at once. A ctx that is already done is rejected Aborted before
// anything is taken. The error is a *RejectedError, or a *ConfigError for
// invalid input (or, should the engine fail, an error matching ErrInternal);
// the Permit is then nil.
//
// A waiter is never admitted once the engine has seen its ctx end. If ctx
// ends at the very moment a slot is handed over, the admission stands and
// Acquire returns its Permit (which, like any, must be released): each call
// ends exactly one way, and Stats and events agree with what the caller saw.
func (b *Bulkhead) Acquire(ctx context.Context, req *Request, opts ...Option) (*Permit, error) {
	o := resolve(opts)
	return b.acquire(ctx, req, &o, "Acquire")
}

func (b *Bulkhead) acquire(ctx context.Context, req *Request, o *callOptions, method string) (*Permit, error) {
	r, p, err := b.prepare(ctx, req, o, method, b.eng.NewRequest)
	if err != nil {
		return nil, err
	}
	return b.send(r, p, o.tag)
}

// send sends r, prepared with its permit p, for admission and returns the
// admission or the rejection, tagged with tag; r goes back to the pool.
// Every stage is the engine's: the cool-down, the capacity checks and the
// slot, a paced turn, and the remote stages (a fleet pool, rates in Redis),
// which a worker of the engine's runs while the admission is provisional.
// A panic in code those run for the call (its context, a Redis hook) is
// raised again here, on the caller's goroutine, once everything the call
// held is given back.
func (b *Bulkhead) send(r *actor.AcquireRequest, p *Permit, tag string) (*Permit, error) {
	err := b.eng.Acquire(r)
	pv := r.Panic
	switch {
	case err == nil:
		r.Spare = nil
	case errors.Is(err, actor.ErrInternal):
		// The engine failed mid-call: the permit may be half written, so
		// neither the caller nor the next call gets it.
		r.Spare, p = nil, nil
	default:
		// A permit that a rejected call did not need stays with the pooled
		// request for the next call, so rejections allocate no permit; not
		// one whose admission was rolled back (its lease has been used).
		r.Spare = nil
		if p.l.ID == (admission.ID{}) {
			r.Spare = p
		}
		p = nil
		err = withTag(publicError(err), tag)
	}
	b.eng.PutRequest(r)
	if pv != nil {
		panic(pv)
	}
	return p, err
}

// prepare validates a call and fills a request for it, from newRequest,
// with the permit that will record its admission.
func (b *Bulkhead) prepare(ctx context.Context, req *Request, o *callOptions, method string, newRequest func() *actor.AcquireRequest) (*actor.AcquireRequest, *Permit, error) {
	if ctx == nil {
		return nil, nil, invalidf("ctx", "must not be nil")
	}
	var start time.Time
	if b.eng.WantTiming() {
		start = b.eng.Now()
	}
	class, res, err := b.check(req, o, method, true)
	if err != nil {
		return nil, nil, err
	}
	r := newRequest()
	p, _ := r.Spare.(*Permit)
	if p == nil {
		p = &Permit{b: b}
	}
	r.Spare = nil
	r.Ctx = ctx
	r.Request = call(req, o.tag, o.attempt)
	r.Retry = o.attempt > 0
	r.Priority = admission.Priority(o.priority)
	r.Reservation = admission.Reservation(res)
	r.QueueTimeout = b.timeout
	if o.hasQueueTimeout {
		r.QueueTimeout = o.queueTimeout
	}
	r.Lease = &p.l
	r.Start = start
	r.Class = class
	r.BorrowedDeadline = o.borrowedDeadline
	r.Shadow = o.shadowSet
	r.Model = b.modelOf(req.model())
	if dl, ok := ctx.Deadline(); ok {
		// Context deadlines are on the wall clock; the engine's are on the
		// bulkhead's.
		r.Deadline = b.clk.Now().Add(time.Until(dl))
	}
	return r, p, nil
}

// modelOf is the model of a call naming model m: m, or Config.Model for
// "".
func (b *Bulkhead) modelOf(m string) string {
	if m != "" {
		return m
	}
	return b.model
}

// model is r's model, "" for none (or a nil r).
func (r *Request) model() string {
	if r == nil {
		return ""
	}
	return r.Model
}

// check validates a call's options and request, then resolves its class
// and computes its reservation, once.
func (b *Bulkhead) check(req *Request, o *callOptions, method string, queueing bool) (classes.Class, Reservation, error) {
	if err := o.validate(method, queueing); err != nil {
		return classes.None, Reservation{}, err
	}
	if o.hasDedupScope && b.dedup == nil {
		return classes.None, Reservation{}, invalidf("WithDedupScope", "applies only with Config.Dedup set")
	}
	if o.hasDedupKey && b.dedup == nil {
		return classes.None, Reservation{}, invalidf("WithDedupKey", "applies only with Config.Dedup set")
	}
	class, err := b.eng.LookupClass(o.class)
	if err != nil {
		return classes.None, Reservation{}, publicError(err)
	}
	res, err := b.reserve(req, o.reservation)
	return class, res, err
}

// WouldAdmit says whether a call would be admitted now (or would queue),
// without reserving, counting, booking a rate or emitting anything. With
// rate limits, a call that capacity would admit is then checked against
// them: over the rate it answers RateLimit (with the retry-after in the
// detail); a store that cannot decide answers RateUnavailable unless its
// failure policy decides. In Pace mode a call over the rate would wait, so
// the rates do not change the answer. A call whose model is cooling down
// (see Bulkhead.Feedback) answers Cooldown when it would be turned away:
// with ShedCooldown, a cool-down that outlasts Config.QueueTimeout, or no
// room in the queue to be held in. It does not ask the fleet pool
// (Config.Fleet). It is advisory: by the
// time the caller acts, other calls may have changed the answer. Invalid
// input is an error, even on a closed bulkhead. A retry (WithAttempt above
// 0) that its retry budget has no room for answers RetryBudget. Options:
// WithPriority, WithClass, WithReservation, WithAttempt, WithDetail.
func (b *Bulkhead) WouldAdmit(req *Request, opts ...Option) (Decision, error) {
	o := resolve(opts)
	class, res, err := b.check(req, &o, "WouldAdmit", false)
	if err != nil {
		return Decision{}, err
	}
	why, d := b.eng.WouldAdmit(class, admission.Priority(o.priority), admission.Reservation(res), b.modelOf(req.model()), b.timeout, o.attempt > 0, o.detail)
	return Decision{Admit: why == admission.NoReason, Reason: Reason(why), Detail: rejectDetailFor(d, Reason(why))}, nil
}

// Estimate returns the reservation the bulkhead would take for req, through
// the same validation and estimator as admission, or nil without a token
// budget. The result round-trips through WithReservation.
func (b *Bulkhead) Estimate(req *Request) (*Reservation, error) {
	res, err := b.reserve(req, nil)
	if err != nil || !b.hasBudget {
		return nil, err
	}
	return &res, nil
}

// Stats returns a copy of the bulkhead's counters and gauges. It reflects
// every change whose event a listener has seen.
func (b *Bulkhead) Stats() Stats {
	st := stats(b.eng.Stats())
	st.Events.Backlog = b.eng.Backlog()
	st.Calls.SuspectUsage, st.Calls.SuspectTokens = b.suspect.Load(), b.suspectTokens.Load()
	return st
}

// Limits returns the current limits snapshot.
func (b *Bulkhead) Limits() Limits { return publicLimits(b.eng.Limits()) }

// ApplyLimits replaces the whole limits snapshot atomically.
//
// A snapshot whose Revision is not above the current one changes nothing and
// returns Applied false with Reason StaleRevision. An invalid snapshot is a
// *ConfigError and changes nothing; TokenBudget must be set exactly when the
// bulkhead has a budget, and Classes exactly when it has classes, with the
// same class names. Lowering a limit revokes nothing: it takes effect as
// work finishes. Raising MaxConcurrent admits waiters at once;
// MaxConcurrent 0 is a kill switch that rejects new calls and keeps queued
// ones waiting.
func (b *Bulkhead) ApplyLimits(next Limits) (ApplyResult, error) {
	res, err := b.eng.ApplyLimits(engineLimits(next))
	if err != nil {
		return ApplyResult{}, publicError(err)
	}
	return applyResult(res), nil
}

// SetBudget applies the current limits with Budget replaced, at the next
// revision. It is an error without a token budget.
func (b *Bulkhead) SetBudget(budget int64) (ApplyResult, error) {
	if err := checkNonNegative("Budget", budget); err != nil {
		return ApplyResult{}, err
	}
	res, err := b.eng.SetBudget(budget)
	if err != nil {
		return ApplyResult{}, publicError(err)
	}
	return applyResult(res), nil
}

// Subscribe adds event listeners and returns the function that removes
// them. The listeners see the events of every change made after Subscribe
// returns, in order, on the bulkhead's event goroutine.
func (b *Bulkhead) Subscribe(h Hooks) (unsubscribe func()) {
	kinds := actor.Kinds{
		admission.EventAdmit:         h.Admit != nil,
		admission.EventReject:        h.Reject != nil,
		admission.EventRelease:       h.Release != nil,
		admission.EventReconfigure:   h.Reconfigure != nil,
		admission.EventUsage:         h.Usage != nil,
		admission.EventAbandon:       h.Abandon != nil,
		admission.EventBypass:        h.Bypass != nil,
		admission.EventBypassUsage:   h.BypassUsage != nil,
		admission.EventBypassRelease: h.BypassRelease != nil,
		admission.EventDedup:         h.Dedup != nil,
	}
	return b.eng.Subscribe(kinds, func(ev *admission.Event) { b.deliver(&h, ev) })
}

// Close stops admitting: queued calls and every later call are rejected
// Shutdown, while calls in flight run on and release normally. It is
// idempotent and final.
func (b *Bulkhead) Close() {
	b.eng.Close()
}

// Drain waits until nothing is in flight or queued (an admission whose
// rate or fleet check is under way included), every admission has been
// released, every call bypassed in Observe mode has ended, every
// deduplicated leader has returned (a leader rejected in the queue by
// Close included, so its followers have their outcome) and, once the
// bulkhead is closed, every event has been delivered, or until ctx ends; it
// cancels nothing. (On a bulkhead still open, events may still be on their
// way to listeners when Drain returns.) When ctx ends first it returns Drained false with the counts
// still outstanding, and ctx's error, as soon as ctx ends (a blocked
// listener does not hold it). After Close and a Drain that drained, the
// bulkhead's goroutines have ended; later calls are rejected Shutdown. An
// event listener should not call Drain or Shutdown: it would wait for its
// own delivery until its ctx ends (other Drains are not held up by it).
func (b *Bulkhead) Drain(ctx context.Context) (DrainResult, error) {
	if ctx == nil {
		return DrainResult{}, invalidf("ctx", "must not be nil")
	}
	res := DrainResult(b.eng.Drain(ctx))
	if !res.Drained {
		return res, context.Cause(ctx)
	}
	return res, nil
}

// Shutdown closes the bulkhead (see Close) and drains it (see Drain): it
// returns once every admission has been released, every bypassed call has
// ended and every event has been delivered, or when ctx ends, with Drain's result and error.
func (b *Bulkhead) Shutdown(ctx context.Context) (DrainResult, error) {
	if ctx == nil {
		return DrainResult{}, invalidf("ctx", "must not be nil")
	}
	b.Close()
	return b.Drain(ctx)
}

// Run waits for admission, calls fn, and releases afterwards whatever fn
// does: returns, fails, panics (the panic then propagates) or exits its
// goroutine with runtime.Goexit. fn runs only after admission, with the
// caller's ctx; the bulkhead never cancels admitted work, except through
// WithBorrowedDeadline.
//
// The usage settled at release is what fn recorded with RunContext.SetUsage,
// or else the last RunContext.ReportUsage; when fn returns an error, only the
// last report counts. A rejection is a *RejectedError and fn is not called.
// Options are those of Acquire, plus WithBorrowedDeadline, and WithMode and
// WithShadowReasons: in Observe mode, a call its limits would turn away may
// run without admission (RunContext.Bypass tells).
//
// With Config.Dedup set, a Run identical to one in flight shares that one's
// result instead of calling fn (see DedupConfig); NoDedup and
// WithDedupScope choose per call.
func Run[T any](ctx context.Context, b *Bulkhead, req *Request, fn func(context.Context, *RunContext) (T, error), opts ...Option) (T, error) {
	var zero T
	if fn == nil {
		return zero, invalidf("fn", "must not be nil")
	}
	o := resolve(opts)
	if b.dedup != nil && !o.noDedup {
		return runDedup(ctx, b, req, fn, &o)
	}
	p, err := b.acquire(ctx, req, &o, "Run")
	if err != nil {
		return zero, err
	}
	return runPermit(ctx, p, fn)
}

// runPermit calls fn for admission (or bypass) p and releases p afterwards.
func runPermit[T any](ctx context.Context, p *Permit, fn func(context.Context, *RunContext) (T, error)) (T, error) {
	rc := &p.run
	rc.p = p
	if _, expired := p.l.Deadline(); expired != nil {
		return runWithDeadline(ctx, p, fn, nil)
	}
	return runAdmitted(ctx, p, fn)
}

// runAdmitted calls fn for admission p and releases p afterwards.
func runAdmitted[T any](ctx context.Context, p *Permit, fn func(context.Context, *RunContext) (T, error)) (T, error) {
	rc := &p.run
	failed := true
	defer func() {
		var u *admission.Usage
		if !failed && rc.hasUsage {
			u = (*admission.Usage)(&rc.usage)
		}
		p.release(u)
	}()
	v, err := fn(ctx, rc)
	failed = err != nil
	return v, err
}

type runResult[T any] struct {
	v      T
	err    error
	panic  any
	stack  []byte
	goexit bool
}

// runWithDeadline runs fn on its own goroutine, so that Run can return as
// soon as the admission's borrowed-slot deadline expires. fn's context is
// then cancelled with the *BorrowedDeadlineError as its cause; fn's result,
// when it comes, is discarded, but its release still settles the tokens.
// A panic or Goexit in fn propagates to Run's caller while Run is still
// waiting; a panic after Run returned on the deadline has nobody to reach,
// so it is recovered and logged (Config.Logger) instead of crashing the
// process.
//
// Run's answer always agrees with the engine's books: when the engine
// abandoned the slot on the deadline before it settled fn's release, Run
// returns the deadline error even if fn's result is already in.
//
// l, when not nil, is a dedup leader's entry, settled before the release
// once the deadline is ended (see leadAdmitted), so that the followers get
// what Run returns.
func runWithDeadline[T any](ctx context.Context, p *Permit, fn func(context.Context, *RunContext) (T, error), l *leader) (T, error) {
	deadline, expired := p.l.Deadline()
	fnCtx, cancel := context.WithCancelCause(ctx)
	results := make(chan runResult[T])
	gone := make(chan struct{}) // closed when Run has returned on the deadline
	go func() {
		var res runResult[T]
		returned := false
		defer func() {
			if pv := recover(); pv != nil {
				res.panic, res.stack = pv, debug.Stack()
			} else if !returned {
				res.goexit = true
			}
			// The release is settled once this returns, so whether the
			// deadline expired first is known.
			p.l.Sync()
			select {
			case results <- res:
			case <-gone:
				if res.panic != nil {
					p.b.eng.LogError("bulkhead: Run callback panicked after its borrowed-slot deadline",
						"panic", res.panic, "admission_id", p.ID().String(), "stack", string(res.stack))
				}
			}
			cancel(nil)
		}()
		if l != nil {
			res.v, res.err = leadAdmitted(fnCtx, p, fn, l, expired)
		} else {
			res.v, res.err = runAdmitted(fnCtx, p, fn)
		}
		returned = true
	}()
	select {
	case res := <-results:
		select {
		case <-expired:
			if res.panic == nil && !res.goexit {
				return deadlineExpired[T](p, deadline, cancel)
			}
		default:
		}
		return res.unwrap()
	case <-expired:
		close(gone)
		return deadlineExpired[T](p, deadline, cancel)
	}
}

// deadlineExpired cancels fn's context with the deadline error and returns
// it.
func deadlineExpired[T any](p *Permit, deadline time.Duration, cancel context.CancelCauseFunc) (T, error) {
	err := deadlineError(p, deadline)
	cancel(err)
	var zero T
	return zero, err
}

// deadlineError is the error of admission p whose borrowed-slot deadline
// expired.
func deadlineError(p *Permit, deadline time.Duration) *BorrowedDeadlineError {
	return &BorrowedDeadlineError{Deadline: deadline, AdmissionID: p.ID(), Resources: p.Resources(), Class: p.Class(), Tag: p.Tag()}
}

func (r runResult[T]) unwrap() (T, error) {
	if r.panic != nil {
		panic(r.panic)
	}
	if r.goexit {
		runtime.Goexit()
	}
	return r.v, r.err
}
