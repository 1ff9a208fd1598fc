package bulkhead

import (
	"fmt"
	"time"
)

// CooldownMode says what a call does while its model is cooling down: the
// provider answered a call for that model with a 429 and a Retry-After
// that has not passed yet (see Bulkhead.Feedback).
type CooldownMode uint8

// The cool-down modes.
const (
	// HoldCooldown makes the call wait in the queue until the cool-down
	// ends, bounded by its context and its queue timeout, holding back the
	// calls of its class behind it; then the queue is served in its order
	// again (class by class with a fair queue). A call already waiting for
	// a slot when the cool-down begins is held the same way. Holding needs
	// room in the queue: a call that finds none (MaxQueue 0, or a full
	// queue), or whose cool-down ends after what is left of its queue
	// timeout or its context's deadline, is rejected Cooldown, as with
	// ShedCooldown. In pace mode (RateLimits.Pace) a call waits the
	// cool-down out before it takes its rate turn, so paced calls stay
	// spaced when it ends; calls that hold turns when it begins give them
	// back and take new ones after it, in the order they came, spaced by
	// the rate (one that may not wait it out is rejected Cooldown at once,
	// and one whose new turn comes after its queue timeout or deadline is
	// rejected RateLimit then).
	HoldCooldown CooldownMode = iota
	// ShedCooldown rejects the call Cooldown at once, with the time left
	// as its retry-after. In pace mode, the calls whose turns fall inside
	// a cool-down are rejected so as it begins.
	ShedCooldown
)

// String returns "hold" or "shed".
func (m CooldownMode) String() string {
	switch m {
	case HoldCooldown:
		return "hold"
	case ShedCooldown:
		return "shed"
	}
	return "cooldown_mode(" + itoa(int64(m)) + ")"
}

// MarshalText encodes the mode as "hold" or "shed".
func (m CooldownMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// CooldownDetail describes the cool-down that decided a Cooldown rejection.
type CooldownDetail struct {
	// Model is the model cooling down.
	Model string
	// Until is when the cool-down ends, on the bulkhead's clock.
	Until time.Time
	// RetryAfter is the time that was left of it at the decision.
	RetryAfter time.Duration
	// Headroom is set when the provider's reported headroom decided it
	// (the call did not fit what the provider said was left, see
	// Headroom) rather than a 429's Retry-After.
	Headroom bool
}

func (d *CooldownDetail) explain() string {
	if d.Headroom {
		return fmt.Sprintf("model %q has no headroom left at the provider for this call, retry after %v", d.Model, d.RetryAfter)
	}
	return fmt.Sprintf("model %q is cooling down after the provider's 429, retry after %v", d.Model, d.RetryAfter)
}

// CooldownStats is the state of the cool-downs.
type CooldownStats struct {
	// Active maps each model cooling down to the end of its cool-down;
	// nil when none is.
	Active map[string]time.Time
	// Started counts the cool-downs started or extended by feedback.
	Started int64
	// Held counts the calls held back in the queue for a cool-down to end
	// (HoldCooldown), each once; they wait there as Gate.Pending. The calls
	// turned away are in Calls.RejectedByReason, as Cooldown.
	Held int64
	// Headroom maps each model with a provider headroom report in force
	// to what is left of it now (see Headroom); nil when none is. The
	// calls it held are in Held, and those it turned away in
	// Calls.RejectedByReason, as Cooldown.
	Headroom map[string]HeadroomStats
	// HeadroomReports counts the headroom reports received.
	HeadroomReports int64
}

// MaxRetryAfter is the longest cool-down a Feedback may start.
const MaxRetryAfter = 24 * time.Hour
