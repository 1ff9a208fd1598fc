package bulkhead

import (
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/adaptive"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Adaptive moves the bulkhead's MaxConcurrent (and, with a token budget,
// its Budget) from what the provider answers, reported with
// Bulkhead.Feedback or Permit.Feedback: it lowers them when the provider
// answers 429, overloaded (503, 529) or times out, and raises them again
// while calls succeed and the limit is in use.
//
// Every change is an ApplyLimits of the current limits at the next
// revision, so it is a ReconfigureEvent, and calls admitted before it keep
// their revision. A change that loses a race with a caller's own
// ApplyLimits is made again on the caller's limits. The limits stay within
// the bounds below, and Stats().Adaptive shows them. A MaxConcurrent of 0
// or a Budget of 0 that the caller applies is a kill switch the controller
// respects: while it is in place the controller leaves the limits alone.
// Any other limit the caller applies stands until the controller's next
// change, which starts from it (and brings it within the bounds).
//
// The token budget follows the concurrency limit in proportion: Budget =
// MaxBudget × MaxConcurrent limit / MaxConcurrent bound, kept within
// [MinBudget, MaxBudget]. The high-priority reserve is left as it is, so
// when the budget shrinks, High priority calls keep their share first.
//
// The controller is deterministic: the same feedback at the same clock
// readings moves the limits the same way. It starts no goroutine.
type Adaptive struct {
	// Rule is how the limit moves; the zero value is AIMD.
	Rule AdaptiveRule

	// MinConcurrent and MaxConcurrent bound MaxConcurrent. Zero
	// MinConcurrent means 1; zero MaxConcurrent means Config.MaxConcurrent.
	MinConcurrent, MaxConcurrent int

	// MinBudget and MaxBudget bound the token budget, only with
	// Config.TokenBudget. Zero MaxBudget means Config.TokenBudget.Budget;
	// zero MinBudget means MaxBudget × MinConcurrent / MaxConcurrent.
	MinBudget, MaxBudget int64

	// Backoff is the factor a decrease multiplies the limit by (each
	// decrease lowers it by at least one), in [0.5, 1); zero means 0.75.
	Backoff float64

	// Increase is what AIMD adds to the limit for each success that found
	// at least half of the limit in flight at its admission; zero means 1.
	Increase int

	// Tolerance is how far the recent latency may rise above the long-term
	// latency before Gradient lowers the limit, as a ratio >= 1; zero means
	// 1.5.
	Tolerance float64

	// Smoothing is how much of each Gradient step is taken, in (0, 1];
	// zero means 0.2.
	Smoothing float64

	// Window is the shortest time between two decreases, so that one
	// burst of 429s is one decrease; zero means one second. A drop reported
	// for a call admitted before the last decrease never decreases again:
	// it was sent under the old limit.
	Window time.Duration

	// Cooldown says what a call does while its model is cooling down after
	// a 429 with a Retry-After; the zero value is HoldCooldown. Without
	// Config.Adaptive, cool-downs still apply, in HoldCooldown mode.
	Cooldown CooldownMode
}

// AdaptiveRule is the rule that moves the adaptive limits.
type AdaptiveRule uint8

// The rules.
const (
	// AIMD raises the limit by Adaptive.Increase for each success that
	// found the limit in use (at least half of it in flight when the call
	// was admitted) and multiplies it by Adaptive.Backoff on a 429, an
	// overload or a timeout.
	AIMD AdaptiveRule = iota
	// Gradient compares the recent latency (about the last 5 successes)
	// with the long-term latency (about the last 100): while the recent
	// one stays within Adaptive.Tolerance of the long-term one, the limit
	// grows by about its square root times Adaptive.Smoothing per success;
	// as latency rises beyond it, the limit shrinks in proportion (at most
	// by half per step, smoothed the same way). A 429, an overload or a
	// timeout multiplies it by Adaptive.Backoff, as with AIMD. Only
	// successes with a Latency count.
	Gradient
)

// String returns "aimd" or "gradient".
func (r AdaptiveRule) String() string {
	switch r {
	case AIMD:
		return "aimd"
	case Gradient:
		return "gradient"
	}
	return "rule(" + itoa(int64(r)) + ")"
}

// MarshalText encodes the rule as "aimd" or "gradient".
func (r AdaptiveRule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Outcome is what the provider answered one call.
type Outcome uint8

// The outcomes.
const (
	// OutcomeSuccess is an answer (a 2xx).
	OutcomeSuccess Outcome = iota
	// OutcomeRateLimited is a 429.
	OutcomeRateLimited
	// OutcomeOverloaded is an overloaded provider: a 503 or a 529.
	OutcomeOverloaded
	// OutcomeTimeout is a call that got no answer in time.
	OutcomeTimeout
	// OutcomeFailed is any other error; the rules ignore it.
	OutcomeFailed
	numOutcomes
)

// String returns "success", "rate_limited", "overloaded", "timeout" or
// "failed".
func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case OutcomeRateLimited:
		return "rate_limited"
	case OutcomeOverloaded:
		return "overloaded"
	case OutcomeTimeout:
		return "timeout"
	case OutcomeFailed:
		return "failed"
	}
	return "outcome(" + itoa(int64(o)) + ")"
}

// MarshalText encodes the outcome as its String.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Feedback is what the provider answered one call.
type Feedback struct {
	// Model is the call's model; "" means Config.Model.
	Model string
	// Outcome is the answer.
	Outcome Outcome
	// Latency is the time from the call's admission to the answer (or to
	// its first byte, for a stream); zero when unknown. The Gradient rule
	// reads it.
	Latency time.Duration
	// RetryAfter is the provider's Retry-After on a 429 or an overload:
	// when positive, the model cools down until that much time from now
	// (a longer cool-down already running stands). At most MaxRetryAfter.
	RetryAfter time.Duration
	// Headroom is what the provider said is left of its rate limits with
	// this answer, of any outcome; nil says nothing. It replaces the
	// model's earlier report (see Headroom).
	Headroom *Headroom
}

// Feedback reports what the provider answered a call. A positive
// RetryAfter starts its model's cool-down, with or without Config.Adaptive:
// until it ends, calls for that model are held or shed (Adaptive.Cooldown)
// instead of being sent into another 429. With Config.Adaptive, the
// feedback also moves the limits (see Adaptive). A Headroom becomes the
// model's latest report of the provider's rate limits, from which calls
// then spend (see Headroom). Invalid feedback (an unknown Outcome, a
// negative Latency or RetryAfter, a RetryAfter above MaxRetryAfter or on
// an outcome other than OutcomeRateLimited or OutcomeOverloaded, an
// invalid Headroom) is a *ConfigError and changes nothing.
//
// Feedback does not know how many calls were in flight when the reported
// one was admitted, so for AIMD every success counts as finding the limit
// in use. Permit.Feedback is the same for an admitted call, and knows:
// prefer it. It also measures the call's latency. A stream.Transport (and
// so the gateway) reports every call it sends that way.
func (b *Bulkhead) Feedback(f Feedback) error { return b.feedback(f, nil) }

// feedback hands f, about admission l (nil for none), to the engine.
func (b *Bulkhead) feedback(f Feedback, l *actor.Lease) error {
	if err := f.validate(); err != nil {
		return err
	}
	b.eng.Feedback(actor.Feedback{Model: f.Model, Outcome: adaptive.Outcome(f.Outcome), Latency: f.Latency,
		RetryAfter: f.RetryAfter, Headroom: (*admission.Headroom)(f.Headroom), Lease: l})
	return nil
}

// The outcomes are the rules', value for value.
var _ = [1]struct{}{}[int(numOutcomes)-int(adaptive.Failed)-1]

func (f *Feedback) validate() error {
	switch {
	case f.Outcome >= numOutcomes:
		return invalidf("Feedback.Outcome", "must be one of the Outcome constants, got %d", f.Outcome)
	case f.Latency < 0:
		return invalidf("Feedback.Latency", "must be >= 0, got %v", f.Latency)
	case f.RetryAfter < 0 || f.RetryAfter > MaxRetryAfter:
		return invalidf("Feedback.RetryAfter", "must be in [0, %v], got %v", MaxRetryAfter, f.RetryAfter)
	case f.RetryAfter > 0 && f.Outcome != OutcomeRateLimited && f.Outcome != OutcomeOverloaded:
		return invalidf("Feedback.RetryAfter", "applies only to OutcomeRateLimited and OutcomeOverloaded, not %v", f.Outcome)
	case f.Headroom != nil:
		return f.Headroom.validate()
	}
	return nil
}

// Feedback reports what the provider answered this call; see
// Bulkhead.Feedback. The model is the call's (its Request's Model, or
// Config.Model). With the Gradient rule, the latency is measured from the
// admission to now on the bulkhead's clock (unknown for a call Observe
// mode bypassed). Only the first call on a permit counts: later ones
// change nothing and return nil. It may be called before or after Release.
// A nil *Permit returns a *ConfigError.
func (p *Permit) Feedback(o Outcome, retryAfter time.Duration) error {
	return p.FeedbackHeadroom(o, retryAfter, nil)
}

// FeedbackHeadroom is Feedback with what the provider said is left of its
// rate limits with this answer, h (nil says nothing): it becomes the
// model's latest report, from which later calls for the model spend (see
// Headroom). An invalid h is a *ConfigError and changes nothing.
func (p *Permit) FeedbackHeadroom(o Outcome, retryAfter time.Duration, h *Headroom) error {
	if p == nil {
		return invalidf("Permit", "must not be nil")
	}
	req, _ := callOf(p.l.Request)
	f := Feedback{Model: req.model(), Outcome: o, RetryAfter: retryAfter, Headroom: h}
	if err := f.validate(); err != nil {
		return err
	}
	if !p.fed.CompareAndSwap(false, true) {
		return nil
	}
	return p.b.feedback(f, &p.l)
}

// AdaptiveStats is the adaptive limits' state (see Config.Adaptive).
type AdaptiveStats struct {
	// Rule is the rule moving the limits.
	Rule AdaptiveRule
	// MaxConcurrent is the current concurrency limit, and MinConcurrent
	// and MaxConcurrentBound its bounds.
	MaxConcurrent      int
	MinConcurrent      int
	MaxConcurrentBound int
	// Budget is the current token budget, and MinBudget and MaxBudget its
	// bounds; all zero without a token budget.
	Budget, MinBudget, MaxBudget int64
	// Samples counts the feedback reports the rule has seen; Increases and
	// Decreases count the changes it applied.
	Samples, Increases, Decreases int64
	// LastChange is when it last changed the limits; zero before the
	// first change.
	LastChange time.Time
}
