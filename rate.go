package bulkhead

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
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
// no refund). On a Redis store that booking is one Redis call, bounded by
// the store's timeout, and Release returns once it is made; only releases
// beyond their reservation make it.
//
// Observe mode (WithMode) does not shadow RateLimit: the rate limits are
// enforced for observe-mode calls that are admitted, and a bypassed call
// books no rate.
type RateLimits struct {
	// Store keeps the rate state. Nil means an in-process store on
	// Config.Clock, private to this bulkhead; so does a pacer.Table, which
	// the bulkhead then owns (it sets the table's time: use the table
	// nowhere else). Pass a pacer.NewRedis store
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
	// the turn is spent. Paced calls take their turns in the order they
	// came; a cool-down of their model that begins while they wait moves
	// the turns that fall inside it after it (see HoldCooldown and
	// ShedCooldown).
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
	// Waiting is the paced calls waiting now: for their turn, for a
	// cool-down to end before it, or for the store to book it.
	Waiting int
}

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

// rateConfig validates cfg.RateLimits and returns the engine's form of
// them, nil when there are none.
func rateConfig(cfg *Config) (*actor.Rates, error) {
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
	rates := &actor.Rates{Store: rl.Store, Name: name, Pace: rl.Pace, Model: cfg.Model, PerModel: actor.Rate(rl.PerModel)}
	if len(perClass) > 0 {
		rates.PerClass = make(map[string]actor.Rate, len(perClass))
		for c, r := range perClass {
			rates.PerClass[c] = actor.Rate(r)
		}
	}
	return rates, nil
}

// model is r's model, "" for none (or a nil r).
func (r *Request) model() string {
	if r == nil {
		return ""
	}
	return r.Model
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
