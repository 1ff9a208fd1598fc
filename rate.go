package bulkhead

import (
	"errors"
	"fmt"
	"time"

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
// Each rate is a bucket that holds, by default, a minute of the rate and
// refills continuously, the way providers describe their per-minute
// limits: after a quiet spell a whole minute's worth may go at once (see
// Rate).
//
// What a call weighs is what the provider counts for it: in a
// tokens-per-minute rate, what TokenWeight says (by default its
// reservation, input estimate plus max output); in an input-tokens rate,
// its input estimate; in an output-tokens rate, its max output. The usage
// settled at release corrects them: the tokens used beyond what the call
// weighed are booked then, so the calls after it wait for them; and the
// input and output rates, which count as Anthropic counts them, are also
// given back what the call did not use (its unused output, its input
// estimate above its real input, and its input read from the provider's
// prompt cache, which Anthropic does not count), so the calls after it go
// sooner. On a Redis store each of those corrections is one Redis call,
// bounded by the store's timeout, and Release returns once they are made.
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
	// pacer names "<Name>:model:<model>:<limit>" and
	// "<Name>:class:<class>:<limit>", where <limit> is "requests",
	// "tokens", "input_tokens" or "output_tokens".
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

	// TokenWeight is what a call weighs in the tokens-per-minute rates
	// (Rate.TokensPerMinute), after the provider's own rule; zero means
	// WeightReservation.
	TokenWeight TokenWeight

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

// TokenWeight says what a call weighs in a tokens-per-minute rate, and so
// how its usage settles it at release: by the same rule.
type TokenWeight uint8

// The token weights.
const (
	// WeightReservation: a call weighs its reservation, input estimate
	// plus max output; at release, its input plus its output.
	WeightReservation TokenWeight = iota
	// WeightLarger: a call weighs the larger of its input estimate and its
	// max output, as OpenAI's rate-limit guide says a request counts; at
	// release, the larger of its input and its output.
	WeightLarger
	// WeightInput: a call weighs its input estimate alone, as Google's
	// Gemini API counts tokens per minute (input tokens); at release, its
	// input.
	WeightInput
)

// String returns "reservation", "larger" or "input".
func (w TokenWeight) String() string {
	switch w {
	case WeightReservation:
		return "reservation"
	case WeightLarger:
		return "larger"
	case WeightInput:
		return "input"
	}
	return fmt.Sprintf("TokenWeight(%d)", uint8(w))
}

// NoBurst, as any burst of a Rate, asks for no burst at all: calls are
// spaced evenly, 60/RequestsPerMinute seconds apart (the first goes at
// once), and each call's tokens take their time at the rate before the
// next may go. (A zero burst, by contrast, is the default: a minute.)
const NoBurst = -1

// Rate is a set of per-minute limits: requests, tokens, input tokens and
// output tokens. A zero per-minute field means no limit of that kind.
//
// Each limit is a bucket as large as its burst that refills continuously
// at its rate. A zero burst is the default, a minute of the rate, the
// bucket a provider describes for its own per-minute limit: RequestBurst
// is RequestsPerMinute-1, so that with the call that overflows the bucket
// (which takes the next turn and goes too) exactly RequestsPerMinute calls
// go at once after a quiet spell; a token burst is its whole per-minute
// limit, on top of which the call that overflows it goes too. A burst of
// N lets N+1 calls of weight 1 through at once, then one per
// 60/RequestsPerMinute seconds; NoBurst spaces every call.
//
// Over any window of time T a limit lets through at most its burst + its
// rate x T, plus one call's weight. The input and output limits, which are
// given back what calls did not use, keep that bound for what they let
// through less what they were given back within the window; what a call
// gives back goes to the calls after it once the calls that were waiting
// for their turns when it was given back have had them.
type Rate struct {
	// RequestsPerMinute is the most calls per minute, on average.
	RequestsPerMinute float64
	// TokensPerMinute is the most tokens per minute, on average, each call
	// weighing what RateLimits.TokenWeight says. It needs
	// Config.TokenBudget, whose estimator makes the reservations.
	TokensPerMinute float64
	// RequestBurst is how many calls may go at once on top of the steady
	// rate after a quiet period; zero means RequestsPerMinute-1 (a minute
	// of calls at once), NoBurst none.
	RequestBurst float64
	// TokenBurst is the same for tokens; zero means TokensPerMinute.
	TokenBurst float64
	// InputTokensPerMinute is the most input tokens per minute (Anthropic's
	// ITPM), each call weighing its input estimate, settled at release to
	// its real input less what the provider read from its prompt cache.
	// It needs Config.TokenBudget.
	InputTokensPerMinute float64
	// OutputTokensPerMinute is the most output tokens per minute
	// (Anthropic's OTPM), each call weighing its max output (the request's
	// MaxTokens, or the output cap), settled at release to its real
	// output. It needs Config.TokenBudget.
	OutputTokensPerMinute float64
	// InputTokenBurst and OutputTokenBurst are their bursts; zero means
	// their per-minute limits.
	InputTokenBurst  float64
	OutputTokenBurst float64
}

// MaxPerMinute is the highest rate a Rate may set: the rate state keeps
// whole microseconds, so a one-token call must book at least one.
const MaxPerMinute = pacer.MaxQPS * 60

// RateDetail describes the rate limit that decided a RateLimit or
// RateUnavailable rejection.
type RateDetail struct {
	// Scope is "model" or "class", and Key the model or the class.
	Scope string
	Key   string
	// Limit is "requests", "tokens", "input_tokens" or "output_tokens".
	Limit string
	// PerMinute and Burst are the limit's rate and the burst that applies
	// (the default resolved: zero for NoBurst).
	PerMinute float64
	Burst     float64
	// Weight is what the call weighed in the limit: 1, or its tokens (see
	// RateLimits).
	Weight float64
	// Remaining is what the limit's bucket had room for when the call was
	// decided, in requests or tokens: Burst less the level the call found
	// (never below 0). It is set with Limit, by the store's decision; when
	// Limit is empty (the store failed) it is zero and means nothing.
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
	// Overruns counts the releases that booked tokens used beyond what
	// their calls weighed, and OverrunTokens those tokens (for each kind of
	// token rate that applies: tokens, input tokens, output tokens).
	// OverrunErrors counts such bookings (and give-backs) the store failed.
	// An overrun books a rate at most one window (its burst plus a minute
	// of it) ahead of now; OverrunDropped sums the tokens that did not
	// fit, each such drop logged.
	Overruns       int64
	OverrunTokens  int64
	OverrunErrors  int64
	OverrunDropped int64
	// Refunds counts the releases that gave tokens back to the input or
	// output rates, and RefundedTokens the tokens they gave back (output
	// reserved but not produced, input estimated but not sent or read
	// from the prompt cache), as far as the rates' buckets held them
	// (rounded to whole tokens at each release).
	Refunds        int64
	RefundedTokens int64
	// Waiting is the paced calls waiting now: for their turn, for a
	// cool-down to end before it, or for the store to book it.
	Waiting int
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
