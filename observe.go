package bulkhead

import (
	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Mode is how Run treats a call that its limits would turn away.
type Mode uint8

// The modes. Enforce is the zero value.
const (
	// Enforce rejects such a call: Run returns the *RejectedError and does
	// not call fn.
	Enforce Mode = iota
	// Observe runs such a call anyway, without holding any capacity, when
	// the rejection is one of its shadow reasons (see WithShadowReasons):
	// the call is bypassed. Use it to try limits out on live traffic
	// before enforcing them, and watch what they would have done in the
	// bypass events and Stats().Observe.
	Observe
)

// String returns "enforce" or "observe".
func (m Mode) String() string {
	switch m {
	case Enforce:
		return "enforce"
	case Observe:
		return "observe"
	}
	return "mode(" + itoa(int64(m)) + ")"
}

// MarshalText encodes the mode as "enforce" or "observe".
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// shadowable is the default set of shadow reasons, and the only reasons
// that can be shadowed: the capacity reasons.
var shadowable = reasonSet([]Reason{BudgetLimit, ConcurrencyLimit, QueueLimit, Timeout})

func reasonSet(reasons []Reason) admission.ReasonSet {
	var s admission.ReasonSet
	for _, r := range reasons {
		s = s.With(admission.Reason(r))
	}
	return s
}

type modeOption Mode

func (m modeOption) apply(o callOptions) callOptions {
	o.mode, o.hasMode = Mode(m), true
	return o
}

// WithMode sets how Run treats a call its limits would turn away; the
// default is Enforce.
//
// In Observe mode the call goes through admission as usual, and is
// admitted, queued and released like any other when it fits. When
// admission would reject it for one of its shadow reasons, fn runs anyway,
// bypassed: it holds no slot, no tokens, no class use and no queue
// position, so it changes no capacity counter and never delays or turns
// away another call. A call refused on arrival is bypassed at once, with no
// RejectEvent. A call refused only after it queued (its queue timeout
// expired, or capacity changed while it waited) gets its RejectEvent and
// rejection counts as usual, and is then bypassed: a race bypass. A
// context that has ended, a closed bulkhead and invalid input are never
// bypassed: Run returns their error as in Enforce mode.
//
// A bypassed call's RunContext says so (RunContext.Bypass), has an ID of
// its own, and records usage without holding anything: each change is a
// BypassUsageEvent, and the end of fn a BypassReleaseEvent with the final
// usage, settled as for an admission. Stats().Observe counts bypasses and
// their usage, and Drain waits for bypassed calls too. Run only.
func WithMode(m Mode) Option { return modeOption(m) }

type shadowOption []Reason

func (s shadowOption) apply(o callOptions) callOptions {
	o.shadow, o.hasShadow = []Reason(s), true
	return o
}

// WithShadowReasons narrows which rejections Observe mode bypasses. The
// default, and the only reasons that can be shadowed, are the capacity
// reasons: BudgetLimit, ConcurrencyLimit, QueueLimit and Timeout; any
// other reason is a *ConfigError. With no reasons nothing is bypassed: the
// call is enforced, and its RunContext tells it was admitted like any
// other. Run only, with WithMode(Observe).
func WithShadowReasons(reasons ...Reason) Option {
	return shadowOption(append([]Reason(nil), reasons...))
}

// validateMode checks the options of observe mode and returns the set of
// reasons the call may be bypassed for, empty in Enforce mode.
func (o *callOptions) validateMode(method string) (admission.ReasonSet, error) {
	if o.hasMode && method != "Run" {
		return 0, invalidf("WithMode", "applies to Run only, not %s", method)
	}
	if o.hasShadow && method != "Run" {
		return 0, invalidf("WithShadowReasons", "applies to Run only, not %s", method)
	}
	switch o.mode {
	case Enforce:
		if o.hasShadow {
			return 0, invalidf("WithShadowReasons", "applies only with WithMode(Observe)")
		}
		return 0, nil
	case Observe:
	default:
		return 0, invalidf("WithMode", "unknown mode %d", o.mode)
	}
	if !o.hasShadow {
		return shadowable, nil
	}
	for _, r := range o.shadow {
		if !shadowable.Has(admission.Reason(r)) {
			return 0, invalidf("WithShadowReasons", "%v cannot be shadowed: only budget_limit, concurrency_limit, queue_limit and timeout can", r)
		}
	}
	return reasonSet(o.shadow), nil
}

// Bypass is what Observe mode tells of a call it ran without admitting it.
type Bypass struct {
	// Reason is the rejection the call was spared.
	Reason Reason
	// Race is true when the call was refused only after it had queued (its
	// queue timeout expired, or capacity changed while it waited) or after
	// the bulkhead's own checks had passed (by the fleet pool). Its
	// RejectEvent came first.
	Race bool
	// Detail is the capacity snapshot of the refusal, as a rejection
	// carries it.
	Detail *RejectDetail
}

// bypassOf converts the engine's record of a bypass.
func bypassOf(b *actor.Bypass) Bypass {
	why := Reason(b.Reason)
	return Bypass{Reason: why, Race: b.Race, Detail: rejectDetailFor(b.Detail, why)}
}

// Bypass returns how Observe mode bypassed the call, nil when the call was
// admitted. A bypassed call holds nothing: its Resources are zero, its
// usage reports hold 0 tokens, and AbandonBorrowedConcurrency returns
// false. Its ID is its own, formatted with the prefix "shadow-", and its
// LimitRevision is the revision it was refused under.
func (rc *RunContext) Bypass() *Bypass {
	if rc.p.l.Bypass == nil {
		return nil
	}
	b := bypassOf(rc.p.l.Bypass)
	return &b
}
