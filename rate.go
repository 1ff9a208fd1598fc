package bulkhead

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// RateLimits caps the rate of calls and of tokens, per model, per class, or
// both, on top of the concurrency and token limits: the requests and tokens
// per minute of a provider account.
//
// The rate is checked when a call is about to take its slot, after every
// capacity check has passed, so a call that the bulkhead turns away for
// capacity spends no rate, and a queued call is counted when it leaves the
// queue, not when it arrives. A call over the rate is rejected RateLimit
// with the exact time after which it would go (RejectedError.RetryAfter),
// and records nothing; with Pace set, it waits for its turn instead, before
// it takes a slot.
//
// A call's token weight is its reservation (input estimate plus max output),
// the way providers count tokens per minute on entry. When the usage
// settled at release exceeds the reservation, the excess is booked then, so
// the calls after it wait for it; a call that used less than its
// reservation gets nothing back (a rate, unlike the in-flight budget, has
// no refund). On a Redis store that booking is one Redis call made by the
// releasing goroutine, bounded by the store's timeout; only releases beyond
// their reservation make it.
//
// Observe mode (WithMode) does not shadow RateLimit: the rate limits are
// enforced for observe-mode calls that are admitted, and a bypassed call
// books no rate.
type RateLimits struct {
	// Store keeps the rate state. Nil means an in-process store on
	// Config.Clock, private to this bulkhead. Pass a pacer.NewRedis store
	// to share the rates between the replicas of a service: bulkheads with
	// the same Name on one Redis share them. The store's failure policy
	// (pacer.RedisOptions.OnFailure) decides a call while Redis is down:
	// FailOpen lets it go; FailClosed rejects it RateLimit with the
	// policy's FailureDelay as retry-after (RateUnavailable with Pace,
	// which cannot book a turn without the store); FailError, the default,
	// rejects it RateUnavailable.
	Store pacer.Store

	// Name identifies the bulkhead's rates in Store; zero means
	// "bulkhead". It must not contain '{' or '}'. Its rates live under the
	// pacer names "<Name>:model:<model>:requests" (and ":tokens") and
	// "<Name>:class:<class>:requests" (and ":tokens").
	Name string

	// Pace makes a call over the rate wait for its turn (bounded by its
	// context and its queue timeout, which also bounds its wait for a slot
	// after that) instead of being rejected. A call whose turn comes after
	// its queue timeout or its context's deadline is rejected RateLimit at
	// once, booking nothing. A call that waited its turn has booked it:
	// should capacity then turn it away, or its context end while it waits,
	// the turn is spent.
	Pace bool

	// PerModel applies to every call, counted per model: the request's
	// Model, or Config.Model for a request that names none. The zero Rate
	// means no per-model rate.
	PerModel Rate

	// PerClass applies to the calls of each class it names, counted per
	// class, across models. It needs Config.Classes, and every name must
	// be one of its classes. A call of a class it does not name has no
	// class rate.
	PerClass map[string]Rate
}

// Rate is a requests-per-minute and a tokens-per-minute limit. A zero
// field means no limit of that kind.
type Rate struct {
	// RequestsPerMinute is the most calls per minute, on average.
	RequestsPerMinute float64
	// TokensPerMinute is the most tokens per minute, on average, each call
	// weighing its reservation. It needs Config.TokenBudget, whose
	// estimator makes the reservations.
	TokensPerMinute float64
	// RequestBurst is how many calls may go at once on top of the steady
	// rate after a quiet period: RequestBurst+1 calls go at once, then one
	// per 60/RequestsPerMinute seconds. Zero means no burst: calls are
	// spaced 60/RequestsPerMinute seconds apart.
	RequestBurst float64
	// TokenBurst is the same for tokens.
	TokenBurst float64
}

// MaxPerMinute is the highest rate a Rate may set: the rate state keeps
// whole microseconds, so a one-token call must book at least one.
const MaxPerMinute = pacer.MaxQPS * 60

func (r Rate) zero() bool { return r.RequestsPerMinute == 0 && r.TokensPerMinute == 0 }

// RateDetail describes the rate limit that decided a RateLimit or
// RateUnavailable rejection.
type RateDetail struct {
	// Scope is "model" or "class", and Key the model or the class.
	Scope string
	Key   string
	// Limit is "requests" or "tokens".
	Limit string
	// PerMinute and Burst are the limit's rate and burst.
	PerMinute float64
	Burst     float64
	// Weight is what the call weighed: 1, or its reservation in tokens.
	Weight float64
	// Remaining is what the limit's bucket had room for when the call was
	// decided, in requests or tokens: Burst less the level the call found
	// (never below 0), so a rejected call's Weight is above it. It is set
	// with Limit, by the store's decision; when Limit is empty (the store
	// failed) it is zero and means nothing.
	Remaining float64
	// RetryAfter is how long after the decision the call would go: the
	// exact time for a call over the rate; the store's FailureDelay when
	// the store failed under the FailClosed policy; zero when the store
	// failed otherwise.
	RetryAfter time.Duration
	// Fallback is the store's error when the store could not decide and
	// its failure policy did (or, for RateUnavailable, nobody did).
	Fallback error
}

// RateStats counts the rate checks.
type RateStats struct {
	// Checked counts the calls whose rate was checked (or booked, in Pace
	// mode); RejectedByReason counts those turned away.
	Checked int64
	// Paced counts the calls that waited for their turn, and PacedTime the
	// time they waited in all.
	Paced     int64
	PacedTime time.Duration
	// Fallbacks counts the calls the store's failure policy decided while
	// the store could not.
	Fallbacks int64
	// OverrunTokens counts the tokens used beyond the reservations, booked
	// at release, and Overruns the releases that booked them. OverrunErrors
	// counts such bookings the store failed. An overrun books a rate at
	// most one window (its burst plus a minute of it) ahead of now;
	// OverrunDropped sums the tokens that did not fit, each such drop
	// logged.
	Overruns       int64
	OverrunTokens  int64
	OverrunErrors  int64
	OverrunDropped int64
}

// rateLimiter is a bulkhead's rate limits.
type rateLimiter struct {
	store pacer.Store
	// name prefixes the pacers' names and is their call key: every rate of
	// the bulkhead shares it, so one decision covers them all.
	name  string
	pace  bool
	local bool   // store is in-process: the engine checks the rates itself
	model string // Config.Model
	clk   clock.Clock

	perModel Rate
	perClass map[string]Rate

	// closing is closed by Close: Pace-mode waits end at once, and the
	// calls are rejected Shutdown.
	closing   chan struct{}
	closeOnce sync.Once

	// own holds the rate sets of Config.Model, by class, built with the
	// limiter and read-only after: the common lookup takes no lock. Other
	// models' sets are built on demand into sets, up to maxRateSets.
	own    map[string]*rateSet
	setsMu sync.RWMutex
	sets   map[rateSetKey]*rateSet

	checked, paced, pacedNs, fallbacks  atomic.Int64
	overruns, overrunTokens, overrunErr atomic.Int64
	overrunDropped                      atomic.Int64
}

// maxRateSets bounds the cache of rate sets: beyond it (a flood of model
// names), sets are built per call.
const maxRateSets = 1024

type rateSetKey struct{ model, class string }

// rateSet is the rates that apply to calls of one model and class: one
// composite, deciding every rate at once.
type rateSet struct {
	comp    *pacer.Composite
	members []rateMember
	tokens  bool // some member counts tokens
}

type rateMember struct {
	p      *pacer.Pacer
	detail admission.RateDetail // without the call's numbers
	tokens bool
}

var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func validateRate(field string, r Rate, hasBudget bool) error {
	check := func(name string, v float64, max float64) error {
		if math.IsNaN(v) || v < 0 || v > max {
			return invalidf(field+"."+name, "must be in [0, %g], got %v", max, v)
		}
		return nil
	}
	for _, f := range []struct {
		name string
		v    float64
		max  float64
	}{
		{"RequestsPerMinute", r.RequestsPerMinute, MaxPerMinute},
		{"TokensPerMinute", r.TokensPerMinute, MaxPerMinute},
		{"RequestBurst", r.RequestBurst, math.MaxFloat64},
		{"TokenBurst", r.TokenBurst, math.MaxFloat64},
	} {
		if err := check(f.name, f.v, f.max); err != nil {
			return err
		}
	}
	if r.TokensPerMinute > 0 && !hasBudget {
		return invalidf(field+".TokensPerMinute", "needs Config.TokenBudget: its estimator makes the reservations that tokens per minute count")
	}
	if r.RequestBurst > 0 && r.RequestsPerMinute == 0 {
		return invalidf(field+".RequestBurst", "applies only with RequestsPerMinute set")
	}
	if r.TokenBurst > 0 && r.TokensPerMinute == 0 {
		return invalidf(field+".TokenBurst", "applies only with TokensPerMinute set")
	}
	return nil
}

// newRateLimiter validates cfg.RateLimits and builds the limiter, nil when
// there are none.
func newRateLimiter(cfg *Config) (*rateLimiter, error) {
	rl := cfg.RateLimits
	if rl == nil {
		return nil, nil
	}
	name := rl.Name
	if name == "" {
		name = "bulkhead"
	}
	if strings.ContainsAny(name, "{}") {
		return nil, invalidf("Config.RateLimits.Name", "must not contain '{' or '}', got %q", name)
	}
	hasBudget := cfg.TokenBudget != nil
	if err := validateRate("Config.RateLimits.PerModel", rl.PerModel, hasBudget); err != nil {
		return nil, err
	}
	if len(rl.PerClass) > 0 && cfg.Classes == nil {
		return nil, invalidf("Config.RateLimits.PerClass", "needs Config.Classes")
	}
	perClass := make(map[string]Rate, len(rl.PerClass))
	for c, r := range rl.PerClass {
		field := fmt.Sprintf("Config.RateLimits.PerClass[%q]", c)
		if c == "" {
			return nil, invalidf(field, "must name a class")
		}
		if _, ok := cfg.Classes.Limits[c]; !ok {
			return nil, invalidf(field, "is not one of Config.Classes")
		}
		if err := validateRate(field, r, hasBudget); err != nil {
			return nil, err
		}
		if !r.zero() {
			perClass[c] = r
		}
	}
	if rl.PerModel.zero() && len(perClass) == 0 {
		return nil, invalidf("Config.RateLimits", "sets no rate: set PerModel or PerClass")
	}
	store := rl.Store
	if store == nil {
		store = pacer.NewLocal(pacer.LocalOptions{Clock: cfg.Clock})
	}
	lim := &rateLimiter{
		store: store, name: name, pace: rl.Pace, model: cfg.Model,
		clk: clock.OrReal(cfg.Clock), perModel: rl.PerModel, perClass: perClass,
		closing: make(chan struct{}), local: isLocal(store), sets: map[rateSetKey]*rateSet{},
	}
	var classes []string
	if cfg.Classes != nil {
		for c := range cfg.Classes.Limits {
			classes = append(classes, c)
		}
	}
	if err := lim.buildOwn(classes); err != nil {
		return nil, err
	}
	return lim, nil
}

func isLocal(s pacer.Store) bool {
	_, ok := s.(*pacer.Local)
	return ok
}

// Check decides the rate check of a call whose slot the engine is granting
// (an in-process store only: it never blocks). It implements actor.Checker.
func (rl *rateLimiter) Check(r *actor.AcquireRequest) (admission.Reason, *admission.External) {
	why, ext, _ := rl.decide(context.Background(), r.CheckArg.(*rateSet), r.Reservation.Reserved)
	return why, ext
}

// decide runs the rate check of a call reserving reserved tokens, and
// records it when it goes: NoReason, or the reason to turn the call down,
// the detail and the cause.
func (rl *rateLimiter) decide(ctx context.Context, set *rateSet, reserved int64) (admission.Reason, *admission.External, error) {
	rl.checked.Add(1)
	var delay time.Duration
	var fallback, err error
	var rd *admission.RateDetail
	if len(set.members) == 1 {
		// One rate: the pacer alone, without the composite's bookkeeping.
		m := &set.members[0]
		w := 1.0
		if m.tokens {
			w = float64(reserved)
		}
		var out pacer.Outcome
		out, err = m.p.RateLimit(ctx, rl.name, w)
		delay, fallback = out.Delay, out.Fallback
		if delay > 0 && fallback == nil {
			d := m.detail
			d.Weight, d.RetryAfter, d.Remaining = w, delay, remaining(out)
			rd = &d
		} else if delay > 0 {
			rd = &admission.RateDetail{RetryAfter: delay, Fallback: fallback}
		}
	} else {
		var buf [4]float64
		var out pacer.CompositeOutcome
		out, err = set.comp.RateLimit(ctx, rl.name, set.weights(buf[:], reserved)...)
		delay, fallback = out.Delay, out.Fallback
		if delay > 0 {
			rd = set.detail(out)
		}
	}
	if why, frd, cause := rl.failure(ctx, fallback, err, true); why != admission.NoReason {
		return why, rateExternal(frd, err), cause
	}
	if delay > 0 {
		return admission.RateLimit, &admission.External{Rate: rd}, nil
	}
	return admission.NoReason, nil, nil
}

// set returns the rates of a call of model and class, nil when none apply.
func (rl *rateLimiter) set(model, class string) (*rateSet, error) {
	if model == "" || model == rl.model {
		if s, ok := rl.own[class]; ok {
			return s, nil
		}
		model = rl.model
	}
	k := rateSetKey{model, class}
	rl.setsMu.RLock()
	s, ok := rl.sets[k]
	rl.setsMu.RUnlock()
	if ok {
		return s, nil
	}
	s, err := rl.build(model, class)
	if err != nil {
		return nil, err
	}
	rl.setsMu.Lock()
	defer rl.setsMu.Unlock()
	if prev, ok := rl.sets[k]; ok {
		return prev, nil
	}
	if len(rl.sets) < maxRateSets {
		rl.sets[k] = s // nil too: no rate applies
	}
	return s, nil
}

// buildOwn builds the rate sets of Config.Model for the default class ("")
// and each class of classes.
func (rl *rateLimiter) buildOwn(classes []string) error {
	rl.own = make(map[string]*rateSet, len(classes)+1)
	for _, c := range append([]string{""}, classes...) {
		s, err := rl.build(rl.model, c)
		if err != nil {
			return err
		}
		rl.own[c] = s
	}
	return nil
}

func (rl *rateLimiter) build(model, class string) (*rateSet, error) {
	s := &rateSet{}
	add := func(scope, key string, r Rate) error {
		for _, m := range []struct {
			limit     string
			perMinute float64
			burst     float64
		}{
			{"requests", r.RequestsPerMinute, r.RequestBurst},
			{"tokens", r.TokensPerMinute, r.TokenBurst},
		} {
			if m.perMinute == 0 {
				continue
			}
			p, err := pacer.New(rl.store, pacer.Options{
				Name:     rl.name + ":" + scope + ":" + keyEscaper.Replace(key) + ":" + m.limit,
				QPS:      m.perMinute / 60,
				MaxBurst: m.burst,
			})
			if err != nil {
				return err
			}
			tokens := m.limit == "tokens"
			s.tokens = s.tokens || tokens
			s.members = append(s.members, rateMember{p: p, tokens: tokens, detail: admission.RateDetail{
				Scope: scope, Key: key, Limit: m.limit, PerMinute: m.perMinute, Burst: m.burst,
			}})
		}
		return nil
	}
	if !rl.perModel.zero() {
		if err := add("model", model, rl.perModel); err != nil {
			return nil, err
		}
	}
	if r, ok := rl.perClass[class]; ok {
		if err := add("class", class, r); err != nil {
			return nil, err
		}
	}
	if len(s.members) == 0 {
		return nil, nil
	}
	ps := make([]*pacer.Pacer, len(s.members))
	for i := range s.members {
		ps[i] = s.members[i].p
	}
	comp, err := pacer.NewComposite(ps...)
	if err != nil {
		return nil, err
	}
	s.comp = comp
	return s, nil
}

// weights returns each member's weight for a call reserving reserved
// tokens, in buf.
func (s *rateSet) weights(buf []float64, reserved int64) []float64 {
	return s.weighted(buf, float64(reserved), 1)
}

// weighted returns each member's weight, in buf: tokens for the members
// counting tokens, requests for the others.
func (s *rateSet) weighted(buf []float64, tokens, requests float64) []float64 {
	w := buf[:0]
	for _, m := range s.members {
		if m.tokens {
			w = append(w, tokens)
		} else {
			w = append(w, requests)
		}
	}
	return w
}

// detail describes the outcome's deciding member, with the call's weight
// and its retry-after.
func (s *rateSet) detail(out pacer.CompositeOutcome) *admission.RateDetail {
	for i, m := range s.members {
		if m.p == out.Pacer {
			d := m.detail
			d.Weight = out.Members[i].Weight
			d.Remaining = remaining(out.Members[i])
			d.RetryAfter = out.Delay
			return &d
		}
	}
	d := &admission.RateDetail{RetryAfter: out.Delay, Fallback: out.Fallback}
	return d
}

// remaining is the room a pacer's bucket had for the call of out.
func remaining(out pacer.Outcome) float64 { return max(0, out.MaxBurst-out.Level) }

// rateOf returns the rate set of a prepared call, nil when none applies.
func (b *Bulkhead) rateOf(r *actor.AcquireRequest) (*rateSet, error) {
	req, _ := callOf(r.Request)
	return b.rate.set(req.model(), b.eng.ClassName(r.Class))
}

// rateExternal is the detail of a rate rejection: a weight the rate can never
// book (err matches ErrInvalid) never fits.
func rateExternal(rd *admission.RateDetail, err error) *admission.External {
	if rd == nil {
		return nil
	}
	return &admission.External{Rate: rd, NeverFits: errors.Is(err, ErrInvalid)}
}

// failure turns a failed rate decision into a reason to reject, its detail
// and its cause; NoReason when the decision did not fail (or the store's
// failure policy decided it).
func (rl *rateLimiter) failure(ctx context.Context, fallback, err error, count bool) (admission.Reason, *admission.RateDetail, error) {
	switch {
	case err == nil:
		if fallback != nil && count {
			rl.fallbacks.Add(1)
		}
		return admission.NoReason, nil, nil
	case errors.Is(err, pacer.ErrUnavailable):
		return admission.RateUnavailable, &admission.RateDetail{Fallback: err}, err
	case ctx.Err() != nil:
		return admission.Aborted, nil, context.Cause(ctx)
	case errors.Is(err, ErrInvalid):
		// The pacer refused the weight: more tokens than the rate can
		// ever book. The call can never go.
		return admission.RateLimit, &admission.RateDetail{Fallback: err}, err
	}
	return admission.RateUnavailable, &admission.RateDetail{Fallback: err}, err
}

// pace books a Pace-mode call's turn and waits for it, leaving r with what
// is left of its queue timeout; or, when the call may not wait for its
// turn, sets r's refusal. Either way r is then sent for admission (a call
// whose context ended meanwhile is rejected Aborted there).
func (b *Bulkhead) pace(ctx context.Context, r *actor.AcquireRequest, set *rateSet) {
	// A call that capacity would turn away now books no turn: it is sent
	// as it is, and rejected with its own reason.
	if d := b.eng.WouldAdmit(r.Class, r.Priority, r.Reservation, false); !d.Admit {
		return
	}
	var buf [4]float64
	weights := set.weights(buf[:], r.Reservation.Reserved)
	rl := b.rate
	if ctx.Err() != nil {
		return // rejected Aborted
	}
	maxWait := pacer.Horizon
	if r.QueueTimeout > 0 {
		// A turn must leave some of the queue timeout for the slot: zero
		// would mean no timeout at all.
		maxWait = r.QueueTimeout - time.Microsecond
	}
	if dl, ok := ctx.Deadline(); ok {
		// Context deadlines are on the wall clock.
		maxWait = min(maxWait, time.Until(dl))
	}
	maxWait = max(0, maxWait) // 0: only a turn free now
	rl.checked.Add(1)
	out, err := set.comp.PaceWithin(ctx, rl.name, maxWait, weights...)
	if errors.Is(err, pacer.ErrTooLong) {
		r.Refuse, r.RefuseExt = admission.RateLimit, &admission.External{Rate: set.detail(out)}
		return
	}
	if why, rd, cause := rl.failure(ctx, out.Fallback, err, true); why == admission.Aborted {
		return // the engine rejects it Aborted, with the cause
	} else if why != admission.NoReason {
		r.Refuse, r.RefuseExt, r.RefuseCause = why, rateExternal(rd, err), cause
		return
	}
	if out.Delay > 0 {
		// A context that ends or a Close ends the wait: the engine rejects
		// the call Aborted or Shutdown, and the turn is spent.
		start := rl.clk.Now()
		b.wait(ctx, out.Delay, rl.closing, testHookRateWait)
		waited := min(out.Delay, max(0, rl.clk.Now().Sub(start)))
		rl.paced.Add(1)
		rl.pacedNs.Add(int64(waited))
		r.RateWait = waited
		b.waited(r, out.Delay) // the turn came within the queue timeout
	}
}

// wait waits d on the bulkhead's clock, until ctx ends or closing is
// closed, and reports whether d passed. armed, when not nil, is called once
// the timer is set.
func (b *Bulkhead) wait(ctx context.Context, d time.Duration, closing <-chan struct{}, armed func(time.Duration)) bool {
	t := b.clk.NewTimer(d)
	if armed != nil {
		armed(d)
	}
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
	case <-closing:
	}
	t.Stop()
	return false
}

// waited leaves r, which waited d (within its queue timeout) before asking
// for its slot, with what is left of its queue timeout, and starts its
// decision timing again.
func (b *Bulkhead) waited(r *actor.AcquireRequest, d time.Duration) {
	if r.QueueTimeout > 0 {
		r.QueueTimeout = max(time.Microsecond, r.QueueTimeout-d)
	}
	if !r.Start.IsZero() {
		r.Start = b.eng.Now()
	}
}

// testHookRateWait, when set by a test, is called once a Pace-mode wait's (or a paced call's cool-down wait's)
// timer is armed, so the test can move a mock clock.
var testHookRateWait func(time.Duration)

// bookOverrun books, at release, the tokens an admission used beyond its
// reservation, in each tokens-per-minute limit of its rate set. Each
// booking reaches at most one window (the limit's burst plus a minute of
// its rate) ahead of now, so that one huge usage figure cannot lock the
// model out for days; what does not fit is dropped, counted and logged.
func (b *Bulkhead) bookOverrun(p *Permit, used int64) {
	over := used - p.l.Reservation.Reserved
	if b.rate == nil || over <= 0 || p.l.Bypass != nil {
		return
	}
	req, _ := callOf(p.l.Request)
	set, err := b.rate.set(req.model(), p.l.Class)
	if err != nil || set == nil || !set.tokens {
		return
	}
	b.rate.overruns.Add(1)
	b.rate.overrunTokens.Add(over)
	var dropped float64
	for _, m := range set.members {
		if !m.tokens {
			continue
		}
		out, err := m.p.Book(context.Background(), b.rate.name, rateWindow(m.p.Options()), float64(over))
		if err != nil || out.Fallback != nil {
			b.rate.overrunErr.Add(1)
			continue
		}
		dropped = max(dropped, float64(over)-out.Booked)
	}
	if dropped > 0 {
		n := int64(math.Ceil(dropped))
		b.rate.overrunDropped.Add(n)
		b.log.Warn("bulkhead: overrun larger than a rate window, partly dropped",
			"admission", p.ID().String(), "overrun", over, "dropped", n)
	}
}

// rateWindow is how far ahead an overrun may book a rate: its burst plus a
// minute of it, in time (capped at the pacer's horizon).
func rateWindow(o pacer.Options) time.Duration {
	burst := o.MaxBurst / o.QPS // seconds
	if !(burst < (pacer.Horizon - time.Minute).Seconds()) {
		return pacer.Horizon
	}
	return time.Minute + time.Duration(burst*float64(time.Second))
}

// model is r's model, "" for none (or a nil r).
func (r *Request) model() string {
	if r == nil {
		return ""
	}
	return r.Model
}

// stats returns the rate counters.
func (rl *rateLimiter) stats() *RateStats {
	if rl == nil {
		return nil
	}
	return &RateStats{
		Checked: rl.checked.Load(), Paced: rl.paced.Load(), PacedTime: time.Duration(rl.pacedNs.Load()),
		Fallbacks: rl.fallbacks.Load(), Overruns: rl.overruns.Load(), OverrunTokens: rl.overrunTokens.Load(),
		OverrunErrors: rl.overrunErr.Load(), OverrunDropped: rl.overrunDropped.Load(),
	}
}

// explain says, with numbers, why the rate limit rejected a call for why.
func (d *RateDetail) explain(why Reason) string {
	if errors.Is(d.Fallback, ErrInvalid) {
		return fmt.Sprintf("the call weighs more than a rate limit can ever book: %v", d.Fallback)
	}
	if d.Scope == "" {
		// The store failed: its policy decided, or nobody did.
		if why == RateLimit {
			return fmt.Sprintf("the rate limits' store failed (its policy rejects), retry after %v: %v", d.RetryAfter, d.Fallback)
		}
		return "the rate limits' store failed" // the error follows, as the cause
	}
	return fmt.Sprintf("%s %q: %s: %g per minute (burst %g), this call weighs %g, retry after %v",
		d.Scope, d.Key, d.Limit, d.PerMinute, d.Burst, d.Weight, d.RetryAfter)
}

// wouldAdmitRate completes d, an advisory decision to admit, with the rate
// limits' advisory answer for the call.
func (b *Bulkhead) wouldAdmitRate(req *Request, class classes.Class, res Reservation, d *admission.Decision) {
	if b.rate.pace {
		return // a call over the rate would wait for its turn, not be turned away
	}
	set, err := b.rate.set(req.model(), b.eng.ClassName(class))
	if err != nil || set == nil {
		return
	}
	var buf [4]float64
	out, err := set.comp.Peek(context.Background(), b.rate.name, set.weights(buf[:], res.Reserved)...)
	why, rd, _ := b.rate.failure(context.Background(), out.Fallback, err, false)
	if why == admission.NoReason && out.Delay > 0 {
		why, rd = admission.RateLimit, set.detail(out)
	}
	if why == admission.NoReason {
		return
	}
	d.Admit, d.Reason = false, why
	if d.Detail != nil { // asked for (WithDetail)
		d.Detail.Rate = rd
	}
}
