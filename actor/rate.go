package actor

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// Rates is the engine's form of bulkhead.RateLimits, validated by the
// facade: requests and tokens per minute, per model and per class.
type Rates struct {
	// Store keeps the rate state: nil keeps it in the state machine
	// itself, in a pacer.Table on the engine's clock; a pacer.Table given
	// here becomes the engine's own the same way (the engine sets its time,
	// so it must not be used elsewhere); a pacer.Local (shared with others,
	// on its own clock) is asked from the actor too, as it never blocks;
	// any other store (Redis) is a remote stage, asked by a worker.
	Store pacer.Store
	// Name prefixes the pacers' names and is their call key.
	Name string
	// Pace makes a call over the rate wait for its turn instead of being
	// turned away.
	Pace bool
	// Model is the bulkhead's own model, for calls that name none.
	Model string
	// Weight is what a call weighs in the tokens-per-minute limits.
	Weight TokenWeight
	// PerModel applies to every call, per model; PerClass to the calls of
	// each class it names.
	PerModel Rate
	PerClass map[string]Rate
}

// TokenWeight is the engine's form of bulkhead.TokenWeight: what a call
// weighs in a tokens-per-minute limit, and its usage at release.
type TokenWeight uint8

// The token weights, as the facade numbers them.
const (
	WeightReservation TokenWeight = iota // input estimate + max output
	WeightLarger                         // the larger of the two
	WeightInput                          // the input estimate
)

// Rate is one set of per-minute limits, their bursts resolved by the
// facade (0: none).
type Rate struct {
	RequestsPerMinute, TokensPerMinute          float64
	RequestBurst, TokenBurst                    float64
	InputTokensPerMinute, OutputTokensPerMinute float64
	InputTokenBurst, OutputTokenBurst           float64
}

func (r Rate) zero() bool {
	return r.RequestsPerMinute == 0 && r.TokensPerMinute == 0 && r.InputTokensPerMinute == 0 && r.OutputTokensPerMinute == 0
}

// limitKind is what a rate limit counts.
type limitKind uint8

const (
	limitRequests limitKind = iota
	limitTokens             // the call's weight as Rates.Weight says
	limitInput              // its input estimate, settled both ways
	limitOutput             // its max output, settled both ways
	numLimitKinds
)

// limitNames are the kinds' names, in pacer names and rate details.
var limitNames = [numLimitKinds]string{"requests", "tokens", "input_tokens", "output_tokens"}

// weight is what a call reserving res weighs in a limit of kind k.
func (k limitKind) weight(w TokenWeight, res *admission.Reservation) int64 {
	switch k {
	case limitTokens:
		switch w {
		case WeightLarger:
			return max(res.Input, res.MaxOutput)
		case WeightInput:
			return res.Input
		}
		return res.Reserved
	case limitInput:
		return res.Input
	case limitOutput:
		return res.MaxOutput
	}
	return 1
}

// used is what a call that used u counts in a limit of kind k, by the
// same rule as weight: the input limit counts no input read from the
// provider's prompt cache.
func (k limitKind) used(w TokenWeight, u *admission.Usage) int64 {
	switch k {
	case limitTokens:
		switch w {
		case WeightLarger:
			return max(u.Input, u.Output)
		case WeightInput:
			return u.Input
		}
		return u.Total()
	case limitInput:
		return max(0, u.Input-u.CachedInput)
	case limitOutput:
		return u.Output
	}
	return 0
}

// settled reports whether a limit of kind k is given back what a call
// did not use (Anthropic's input and output limits), not only booked what
// it used beyond its weight.
func (k limitKind) settled() bool { return k == limitInput || k == limitOutput }

// maxrateSets bounds the cache of rate sets: beyond it (a flood of model
// names), sets are built per call.
const maxrateSets = 1024

type rateSetKey struct{ model, class string }

// rateStage is the bulkhead's rate limits: the rate sets, built on demand
// by the state machine (which alone reads and writes the maps), and the
// counters, which the remote workers update too.
type rateStage struct {
	cfg    Rates
	store  pacer.Store
	table  *pacer.Table // the engine's own store, nil when Store was given
	remote bool         // the store may block: it is asked off the actor

	own  map[string]*rateSet // Config.Model's sets, by class
	sets map[rateSetKey]*rateSet

	checked, paced, pacedNs, fallbacks  atomic.Int64
	overruns, overrunTokens, overrunErr atomic.Int64
	overrunDropped                      atomic.Int64
	refunds, refundedTokens             atomic.Int64
}

// rateSet is the rates that apply to the calls of one model and class:
// one composite, deciding every rate at once. It is immutable, so a remote
// worker may use it off the actor.
type rateSet struct {
	comp    *pacer.Composite
	members []rateMember
	tokens  bool // some member counts tokens, of any kind
}

type rateMember struct {
	p      *pacer.Pacer
	detail admission.RateDetail // without the call's numbers
	kind   limitKind
	window time.Duration // how far ahead a settlement may book it
}

var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func newRateStage(cfg *Rates) *rateStage {
	if cfg == nil {
		return nil
	}
	rs := &rateStage{cfg: *cfg, store: cfg.Store, sets: map[rateSetKey]*rateSet{}, own: map[string]*rateSet{}}
	switch st := cfg.Store.(type) {
	case nil:
		rs.table = pacer.NewTable()
		rs.store = rs.table
	case *pacer.Table:
		rs.table = st // it decides at the time the engine gives it
	case *pacer.Local:
	default:
		rs.remote = true
	}
	return rs
}

// setTime sets the time of the decisions the state machine makes next on
// its own table.
func (rs *rateStage) setTime(now time.Time) {
	if rs.table != nil {
		rs.table.SetTime(now)
	}
}

// set returns the rates of a call of model and class, nil when none apply.
// An error is a pacer that cannot be built (a name the store refuses).
func (rs *rateStage) set(model, class string) (*rateSet, error) {
	if model == "" {
		model = rs.cfg.Model
	}
	if model == rs.cfg.Model {
		if s, ok := rs.own[class]; ok {
			return s, nil
		}
	}
	k := rateSetKey{model, class}
	if s, ok := rs.sets[k]; ok {
		return s, nil
	}
	s, err := rs.build(model, class)
	if err != nil {
		return nil, err
	}
	switch {
	case model == rs.cfg.Model:
		rs.own[class] = s
	case len(rs.sets) < maxrateSets:
		rs.sets[k] = s // nil too: no rate applies
	}
	return s, nil
}

func (rs *rateStage) build(model, class string) (*rateSet, error) {
	s := &rateSet{}
	// Every member's bucket drains at the rate itself (factor 1) when the
	// calls are rate-limited and at the pacer's default for Pace, and so
	// do its settlements.
	factor := pacer.DefaultRateLimitFactor
	if rs.cfg.Pace {
		factor = pacer.DefaultPaceFactor
	}
	add := func(scope, key string, r Rate) error {
		for _, m := range [...]struct {
			kind      limitKind
			perMinute float64
			burst     float64
		}{
			{limitRequests, r.RequestsPerMinute, r.RequestBurst},
			{limitTokens, r.TokensPerMinute, r.TokenBurst},
			{limitInput, r.InputTokensPerMinute, r.InputTokenBurst},
			{limitOutput, r.OutputTokensPerMinute, r.OutputTokenBurst},
		} {
			if m.perMinute == 0 {
				continue
			}
			name := limitNames[m.kind]
			p, err := pacer.New(rs.store, pacer.Options{
				Name:        rs.cfg.Name + ":" + scope + ":" + keyEscaper.Replace(key) + ":" + name,
				QPS:         m.perMinute / 60,
				MaxBurst:    m.burst,
				BurstFactor: factor,
			})
			if err != nil {
				return err
			}
			s.tokens = s.tokens || m.kind != limitRequests
			s.members = append(s.members, rateMember{p: p, kind: m.kind, window: rateWindow(p.Options()), detail: admission.RateDetail{
				Scope: scope, Key: key, Limit: name, PerMinute: m.perMinute, Burst: m.burst,
			}})
		}
		return nil
	}
	if !rs.cfg.PerModel.zero() {
		if err := add("model", model, rs.cfg.PerModel); err != nil {
			return nil, err
		}
	}
	if r, ok := rs.cfg.PerClass[class]; ok {
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

// weighted returns, in buf, each member's weight for a call reserving res.
func (s *rateSet) weighted(buf []float64, w TokenWeight, res *admission.Reservation) []float64 {
	out := buf[:0]
	for i := range s.members {
		out = append(out, float64(s.members[i].kind.weight(w, res)))
	}
	return out
}

// eachBooked calls f with the name of each member in which a paced call
// reserving res, weighed by w, books a turn: those it weighs anything in.
func (s *rateSet) eachBooked(w TokenWeight, res *admission.Reservation, f func(name string)) {
	for _, m := range s.members {
		if m.kind.weight(w, res) > 0 {
			f(m.p.Name())
		}
	}
}

// detail describes the outcome's deciding member, with the call's weight
// and its retry-after.
func (s *rateSet) detail(out pacer.CompositeOutcome) *admission.RateDetail {
	for i, m := range s.members {
		if m.p == out.Pacer {
			d := m.detail
			d.Weight = out.Members[i].Weight
			d.Remaining = max(0, out.Members[i].MaxBurst-out.Members[i].Level)
			d.RetryAfter = out.Delay
			return &d
		}
	}
	return &admission.RateDetail{RetryAfter: out.Delay, Fallback: out.Fallback}
}

// decide runs the rate check of a call reserving reserved tokens, and
// records it when it goes: NoReason, or the reason to turn the call down,
// the detail and the cause. On a remote store it runs on a worker.
func (rs *rateStage) decide(ctx context.Context, s *rateSet, res *admission.Reservation) (admission.Reason, *admission.External, error) {
	rs.checked.Add(1)
	if len(s.members) == 1 {
		// One rate: the pacer alone, without the composite's bookkeeping
		// (and its allocation).
		m := &s.members[0]
		w := float64(m.kind.weight(rs.cfg.Weight, res))
		out, err := m.p.RateLimit(ctx, rs.cfg.Name, w)
		if why, rd, cause := rs.failure(ctx, out.Fallback, err, true); why != admission.NoReason {
			return why, rateExternal(rd, err), cause
		}
		if out.Delay == 0 {
			return admission.NoReason, nil, nil
		}
		if out.Fallback != nil { // FailClosed: the policy's delay
			return admission.RateLimit, &admission.External{Rate: &admission.RateDetail{RetryAfter: out.Delay, Fallback: out.Fallback}}, nil
		}
		d := m.detail
		d.Weight, d.RetryAfter, d.Remaining = w, out.Delay, max(0, out.MaxBurst-out.Level)
		return admission.RateLimit, &admission.External{Rate: &d}, nil
	}
	var buf [2 * numLimitKinds]float64
	out, err := s.comp.RateLimit(ctx, rs.cfg.Name, s.weighted(buf[:], rs.cfg.Weight, res)...)
	if why, rd, cause := rs.failure(ctx, out.Fallback, err, true); why != admission.NoReason {
		return why, rateExternal(rd, err), cause
	}
	if out.Delay > 0 {
		return admission.RateLimit, &admission.External{Rate: s.detail(out)}, nil
	}
	return admission.NoReason, nil, nil
}

// pace books a paced call's turn, no later than maxWait from now: its
// delay, or the reason to turn it away, the detail and the cause (a turn
// that comes too late books nothing).
func (rs *rateStage) pace(ctx context.Context, s *rateSet, res *admission.Reservation, maxWait time.Duration) (time.Duration, admission.Reason, *admission.External, error) {
	rs.checked.Add(1)
	var buf [2 * numLimitKinds]float64
	out, err := s.comp.PaceWithin(ctx, rs.cfg.Name, max(0, maxWait), s.weighted(buf[:], rs.cfg.Weight, res)...)
	if errors.Is(err, pacer.ErrTooLong) {
		return 0, admission.RateLimit, &admission.External{Rate: s.detail(out)}, nil
	}
	if why, rd, cause := rs.failure(ctx, out.Fallback, err, true); why != admission.NoReason {
		return 0, why, rateExternal(rd, err), cause
	}
	return out.Delay, admission.NoReason, nil, nil
}

// peek is the advisory answer of the rates for a call: NoReason when it
// would go, else why not and the detail. It records nothing.
func (rs *rateStage) peek(ctx context.Context, s *rateSet, res *admission.Reservation) (admission.Reason, *admission.RateDetail) {
	var buf [2 * numLimitKinds]float64
	out, err := s.comp.Peek(ctx, rs.cfg.Name, s.weighted(buf[:], rs.cfg.Weight, res)...)
	why, rd, _ := rs.failure(ctx, out.Fallback, err, false)
	if why == admission.NoReason && out.Delay > 0 {
		why, rd = admission.RateLimit, s.detail(out)
	}
	return why, rd
}

// deltas returns, in buf, what each member of s counted wrong for a call
// that reserved res and used u: for the input and output limits, what it
// used less what it weighed (positive: beyond it; negative: not used); for
// the tokens limits, only what it used beyond its weight; nothing for the
// requests limits. ok reports whether some delta is not zero.
func (rs *rateStage) deltas(s *rateSet, buf []float64, res *admission.Reservation, u *admission.Usage) (d []float64, ok bool) {
	d = buf[:0]
	for i := range s.members {
		m := &s.members[i]
		var delta float64
		if m.kind != limitRequests {
			// Both are at least 0, so the difference never overflows.
			delta = float64(m.kind.used(rs.cfg.Weight, u) - m.kind.weight(rs.cfg.Weight, res))
		}
		if delta < 0 {
			// A bucket gives back at most what it holds: none without a
			// burst (nor do the tokens limits give back), and never more
			// than the burst, which also keeps the weight within what the
			// pacer takes.
			back := 0.0
			if m.kind.settled() {
				back = min(-delta, m.p.Options().MaxBurst)
			}
			delta = -back
		}
		d = append(d, delta)
		ok = ok || delta != 0
	}
	return d, ok
}

// settle corrects, at release, what the token limits of s counted for a
// call, by deltas (see deltas): it books what the call used beyond its
// weight, in each limit at most one window (its burst plus a minute of
// it) ahead of now, and gives the input and output limits back what it
// did not use. It returns the tokens that did not fit.
func (rs *rateStage) settle(ctx context.Context, s *rateSet, deltas []float64) (dropped int64) {
	// By kind, so that a model's and a class's limit of one kind count
	// once: the tokens used beyond the call's weight, and the most either
	// was given back.
	var over, back [numLimitKinds]float64
	var d float64
	for i := range s.members {
		m, delta := &s.members[i], deltas[i]
		if delta == 0 {
			continue
		}
		if delta > 0 {
			over[m.kind] = delta
		}
		out, err := m.p.Settle(ctx, rs.cfg.Name, m.window, delta)
		if err != nil || out.Fallback != nil {
			rs.overrunErr.Add(1)
			continue
		}
		if delta > 0 {
			d = max(d, delta-out.Booked)
		} else {
			back[m.kind] = max(back[m.kind], -out.Booked)
		}
	}
	var overTokens int64
	var backTokens float64 // the bucket's level, and so what it gives back, may be a fraction
	for k := range over {
		overTokens += int64(over[k])
		backTokens += back[k]
	}
	if overTokens > 0 {
		rs.overruns.Add(1)
		rs.overrunTokens.Add(overTokens)
	}
	if backTokens > 0 {
		rs.refunds.Add(1)
		rs.refundedTokens.Add(int64(math.Round(backTokens)))
	}
	if d > 0 {
		dropped = int64(math.Ceil(d))
		rs.overrunDropped.Add(dropped)
	}
	return dropped
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

// rateExternal is the detail of a rate rejection: a weight the rate can
// never book (err matches ErrInvalid) never fits.
func rateExternal(rd *admission.RateDetail, err error) *admission.External {
	if rd == nil {
		return nil
	}
	return &admission.External{Rate: rd, NeverFits: errors.Is(err, admission.ErrInvalid)}
}

// failure turns a failed rate decision into a reason to reject, its detail
// and its cause; NoReason when the decision did not fail (or the store's
// failure policy decided it).
func (rs *rateStage) failure(ctx context.Context, fallback, err error, count bool) (admission.Reason, *admission.RateDetail, error) {
	switch {
	case err == nil:
		if fallback != nil && count {
			rs.fallbacks.Add(1)
		}
		return admission.NoReason, nil, nil
	case errors.Is(err, pacer.ErrUnavailable):
		return admission.RateUnavailable, &admission.RateDetail{Fallback: err}, err
	case ctx.Err() != nil:
		return admission.Aborted, nil, context.Cause(ctx)
	case errors.Is(err, admission.ErrInvalid):
		// The pacer refused the weight: more tokens than the rate can
		// ever book. The call can never go.
		return admission.RateLimit, &admission.RateDetail{Fallback: err}, err
	}
	return admission.RateUnavailable, &admission.RateDetail{Fallback: err}, err
}

func (rs *rateStage) stats() *admission.RateStats {
	if rs == nil {
		return nil
	}
	return &admission.RateStats{
		Checked: rs.checked.Load(), Paced: rs.paced.Load(), PacedTime: time.Duration(rs.pacedNs.Load()),
		Fallbacks: rs.fallbacks.Load(), Overruns: rs.overruns.Load(), OverrunTokens: rs.overrunTokens.Load(),
		OverrunErrors: rs.overrunErr.Load(), OverrunDropped: rs.overrunDropped.Load(),
		Refunds: rs.refunds.Load(), RefundedTokens: rs.refundedTokens.Load(),
	}
}
