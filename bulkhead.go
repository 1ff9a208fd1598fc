// Package bulkhead decides whether an LLM call should run before it runs.
//
// A Bulkhead admits, queues or rejects each call in microseconds, in-process,
// from how many calls are in flight and how many tokens they have already
// committed. Services that call LLM providers under concurrent traffic wrap
// each call in one: a fast, typed rejection beats a request that piles onto a
// saturated provider and turns a burst into a storm of 429s.
//
// Build one with New, from a Config or a profile (Interactive, Batch). Wrap a
// call with Run, or hold a slot by hand with Acquire and Token.Release.
// Rejections are *RejectedError values: errors.Is(err, ErrRejected) matches
// them all and errors.Is(err, ErrBudgetLimit) (one sentinel per reason)
// matches one reason; errors.As gives the capacity snapshot the decision was
// made on. Invalid input is a *ConfigError, never a rejection.
//
// Inside, one actor owns all admission state and decides one message at a
// time (package actor); this package is the synchronous facade over it.
package bulkhead

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/admission"
	"github.com/llmbulkhead/bulkhead/classes"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// Config configures a Bulkhead. The zero value of each optional field is
// documented with it; New rejects anything invalid with a *ConfigError
// naming the field.
type Config struct {
	// Model is the model the bulkhead guards, such as "gpt-4o". Required.
	// It seeds the default estimator; a request's own Model wins there.
	Model string

	// MaxConcurrent is the number of calls that may be in flight at once.
	// Zero rejects every call with ConcurrencyLimit until ApplyLimits raises
	// it (a fail-closed start).
	MaxConcurrent int

	// MaxQueue is how many calls may wait for a slot. Zero means fail fast:
	// a call that finds no free slot is rejected at once.
	MaxQueue int

	// QueueTimeout bounds the wait in the queue. Zero means wait until the
	// call's context ends.
	QueueTimeout time.Duration

	// InitialRevision is the revision of the starting limits. ApplyLimits
	// takes only snapshots with a higher revision.
	InitialRevision int64

	// TokenBudget turns on token admission. Nil means none: calls are
	// admitted on concurrency alone.
	TokenBudget *TokenBudget

	// Classes partitions capacity between a fixed set of admission classes
	// (tenants, workloads), with floors no other class may take and
	// ceilings a class may not exceed. Nil means none.
	Classes *Classes

	// Clock is the time source. Nil means the wall clock; tests pass
	// clock.NewMock().
	Clock clock.Clock

	// Logger receives the engine's own diagnostics (recovered panics). Nil
	// means silence.
	Logger *slog.Logger
}

// TokenBudget bounds the tokens that admitted calls may hold at once. It is
// an in-flight ceiling, not a spend cap: each admission holds its
// reservation (input estimate + max output) until it is released.
type TokenBudget struct {
	// Budget is the most tokens admitted calls may hold at once. Zero is
	// valid: it admits only calls that reserve nothing.
	Budget int64

	// HighPriorityReserve is the part of Budget that only High priority
	// calls may use. It must not exceed Budget.
	HighPriorityReserve int64

	// Estimator turns a request into its reservation. Nil means the
	// model-aware estimator for Config.Model.
	Estimator Estimator

	// OutputCap is the default estimator's max output for a request that
	// sets no MaxTokens. Zero means 2048.
	OutputCap int64
}

// Interactive returns a Config for latency-sensitive traffic: no queue, so a
// call that finds every slot taken is rejected at once.
func Interactive(model string, maxConcurrent int) Config {
	return Config{Model: model, MaxConcurrent: maxConcurrent}
}

// Batch returns a Config for throughput traffic: up to 20 calls wait, each
// for at most 30 seconds.
func Batch(model string, maxConcurrent int) Config {
	return Config{Model: model, MaxConcurrent: maxConcurrent, MaxQueue: 20, QueueTimeout: 30 * time.Second}
}

// Bulkhead is an admission controller for LLM calls. Its methods are safe
// for concurrent use. Close and Drain end it.
type Bulkhead struct {
	eng       *actor.Engine
	estimator Estimator
	hasBudget bool
	timeout   time.Duration
}

// New validates cfg and starts a Bulkhead.
func New(cfg Config) (*Bulkhead, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Bulkhead{timeout: cfg.QueueTimeout}
	limits := Limits{Revision: cfg.InitialRevision, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue}
	if tb := cfg.TokenBudget; tb != nil {
		b.hasBudget = true
		b.estimator = tb.Estimator
		if b.estimator == nil {
			est, err := estimate.NewModelAware(estimate.ModelAwareOptions{DefaultModel: cfg.Model, OutputCap: tb.OutputCap})
			if err != nil {
				return nil, err
			}
			b.estimator = est
		}
		limits.TokenBudget = &BudgetLimits{Budget: tb.Budget, HighPriorityReserve: tb.HighPriorityReserve}
	}
	if cfg.Classes != nil {
		c := cfg.Classes.Clone()
		limits.Classes = &c
	}
	eng, err := actor.Start(actor.Config{Limits: limits, Clock: cfg.Clock, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	b.eng = eng
	return b, nil
}

func (cfg *Config) validate() error {
	if strings.TrimSpace(cfg.Model) == "" {
		return admission.Invalidf("Config.Model", "must not be blank")
	}
	if cfg.MaxConcurrent < 0 {
		return admission.Invalidf("Config.MaxConcurrent", "must be >= 0, got %d", cfg.MaxConcurrent)
	}
	if cfg.MaxQueue < 0 {
		return admission.Invalidf("Config.MaxQueue", "must be >= 0, got %d", cfg.MaxQueue)
	}
	if cfg.QueueTimeout < 0 {
		return admission.Invalidf("Config.QueueTimeout", "must be >= 0, got %v", cfg.QueueTimeout)
	}
	if err := admission.CheckNonNegative("Config.InitialRevision", cfg.InitialRevision); err != nil {
		return err
	}
	if tb := cfg.TokenBudget; tb != nil {
		if err := admission.CheckNonNegative("Config.TokenBudget.Budget", tb.Budget); err != nil {
			return err
		}
		if err := admission.CheckNonNegative("Config.TokenBudget.HighPriorityReserve", tb.HighPriorityReserve); err != nil {
			return err
		}
		if tb.HighPriorityReserve > tb.Budget {
			return admission.Invalidf("Config.TokenBudget.HighPriorityReserve",
				"must not exceed Budget (%d), got %d", tb.Budget, tb.HighPriorityReserve)
		}
		if err := admission.CheckNonNegative("Config.TokenBudget.OutputCap", tb.OutputCap); err != nil {
			return err
		}
	}
	return nil
}

// reserve validates req and computes its reservation, exactly once per
// call: the override when given, else the estimator. Without a budget it
// validates the request and reserves nothing.
func (b *Bulkhead) reserve(req *Request, override *Reservation) (Reservation, error) {
	if !b.hasBudget {
		if override != nil {
			// Validated, then ignored: there is no budget to reserve from.
			_, err := estimate.Reserve(nil, req, override)
			return Reservation{}, err
		}
		return Reservation{}, estimate.ValidateRequest(req)
	}
	return estimate.Reserve(b.estimator, req, override)
}

// Acquire waits for admission and returns a Token holding the slot and the
// token reservation until Token.Release. It never deduplicates.
//
// A call that finds a free slot (and room in the token budget) is admitted
// at once. Otherwise it queues when the queue has room, until a slot frees,
// its queue timeout expires (Timeout) or ctx ends (Aborted); else it is
// rejected at once. A ctx that is already done is rejected Aborted before
// anything is taken. The error is a *RejectedError, or a *ConfigError for
// invalid input (or, should the engine fail, an error matching ErrInternal).
// A waiter is never admitted once its ctx has ended: the engine checks ctx
// when it hands the waiter a slot. If ctx ends at the very moment a slot is
// handed over, the admission stands and Acquire returns its Token (which,
// like any, must be released): each call ends exactly one way, and Stats
// and events agree with what the caller saw.
func (b *Bulkhead) Acquire(ctx context.Context, req *Request, opts ...Option) (*Token, error) {
	o := resolve(opts)
	return b.acquire(ctx, req, &o, "Acquire")
}

func (b *Bulkhead) acquire(ctx context.Context, req *Request, o *callOptions, method string) (*Token, error) {
	r, tok, err := b.prepare(ctx, req, o, method, b.eng.NewRequest)
	if err != nil {
		return nil, err
	}
	err = b.eng.Acquire(r)
	switch {
	case err == nil:
		r.Spare = nil
	case errors.Is(err, actor.ErrInternal):
		tok = nil // the engine failed mid-call: the token may be half written
	default:
		// A token that a rejected call did not need stays with the pooled
		// request for the next call, so rejections allocate no token.
		r.Spare = tok
		tok = nil
	}
	b.eng.PutRequest(r)
	return tok, err
}

// prepare validates a call and fills a request for it, from newRequest,
// with the token that will record its admission.
func (b *Bulkhead) prepare(ctx context.Context, req *Request, o *callOptions, method string, newRequest func() *actor.AcquireRequest) (*actor.AcquireRequest, *Token, error) {
	if ctx == nil {
		return nil, nil, admission.Invalidf("ctx", "must not be nil")
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
	tok, _ := r.Spare.(*Token)
	if tok == nil {
		tok = &Token{b: b}
	}
	r.Ctx = ctx
	r.Request = req
	r.Priority = o.priority
	r.Reservation = res
	r.QueueTimeout = b.timeout
	if o.hasQueueTimeout {
		r.QueueTimeout = o.queueTimeout
	}
	r.Lease = &tok.l
	r.Start = start
	r.Class = class
	r.BorrowedDeadline = o.borrowedDeadline
	return r, tok, nil
}

// check validates a call's options and request, then resolves its class
// and computes its reservation, once.
func (b *Bulkhead) check(req *Request, o *callOptions, method string, queueing bool) (classes.Class, Reservation, error) {
	if err := o.validate(method, queueing); err != nil {
		return classes.None, Reservation{}, err
	}
	class, err := b.eng.LookupClass(o.class)
	if err != nil {
		return classes.None, Reservation{}, err
	}
	res, err := b.reserve(req, o.reservation)
	return class, res, err
}

// WouldAdmit says whether a call would be admitted now (or would queue),
// without reserving, counting or emitting anything. It is advisory: by the
// time the caller acts, other calls may have changed the answer. Invalid
// input is an error, even on a closed bulkhead. Options: WithPriority,
// WithClass, WithReservation, WithDetail.
func (b *Bulkhead) WouldAdmit(req *Request, opts ...Option) (Decision, error) {
	o := resolve(opts)
	class, res, err := b.check(req, &o, "WouldAdmit", false)
	if err != nil {
		return Decision{}, err
	}
	return b.eng.WouldAdmit(class, o.priority, res, o.detail), nil
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
func (b *Bulkhead) Stats() Stats { return b.eng.Stats() }

// Limits returns the current limits snapshot.
func (b *Bulkhead) Limits() Limits { return b.eng.Limits() }

// ApplyLimits replaces the whole limits snapshot atomically.
//
// A snapshot whose Revision is not above the current one changes nothing and
// returns Applied false with Reason StaleRevision. An invalid snapshot is a
// *ConfigError and changes nothing; TokenBudget must be set exactly when the
// bulkhead has a budget. Lowering a limit revokes nothing: it takes effect
// as work finishes. Raising MaxConcurrent admits waiters at once;
// MaxConcurrent 0 is a kill switch that rejects new calls and keeps queued
// ones waiting.
func (b *Bulkhead) ApplyLimits(next Limits) (ApplyResult, error) { return b.eng.ApplyLimits(next) }

// SetBudget applies the current limits with Budget replaced, at the next
// revision. It is an error without a token budget.
func (b *Bulkhead) SetBudget(budget int64) (ApplyResult, error) {
	if err := admission.CheckNonNegative("Budget", budget); err != nil {
		return ApplyResult{}, err
	}
	return b.eng.SetBudget(budget)
}

// Subscribe adds event listeners and returns the function that removes
// them. The listeners see the events of every change made after Subscribe
// returns, in order, on the bulkhead's event goroutine.
func (b *Bulkhead) Subscribe(h Hooks) (unsubscribe func()) { return b.eng.Subscribe(h) }

// Close stops admitting: queued calls and every later call are rejected
// Shutdown, while calls in flight run on and release normally. It is
// idempotent and final.
func (b *Bulkhead) Close() { b.eng.Close() }

// Drain waits until nothing is in flight or queued and every admission has
// been released, or until ctx ends; it cancels nothing. An event listener
// must not call Drain on a closed bulkhead: Drain waits for the delivery of
// pending events, which waits for that listener. When ctx ends first
// it returns Drained false with the counts still outstanding, and ctx's
// error. After Close and a Drain that drained, the bulkhead's goroutines
// have ended; later calls are rejected Shutdown.
func (b *Bulkhead) Drain(ctx context.Context) (DrainResult, error) {
	if ctx == nil {
		return DrainResult{}, admission.Invalidf("ctx", "must not be nil")
	}
	res := b.eng.Drain(ctx)
	if !res.Drained {
		return res, context.Cause(ctx)
	}
	return res, nil
}
