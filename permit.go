package bulkhead

import (
	"sync/atomic"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Permit is one admission: it holds a slot and the token reservation until
// Release. Its accessors never change after admission.
//
// The methods of a nil *Permit are safe: Release returns nil, so
// `defer p.Release(nil)` after a rejection (which returns a nil Permit) does
// nothing; ReportUsage returns a *ConfigError; the accessors return zero
// values and AbandonBorrowedConcurrency false.
type Permit struct {
	l   actor.Lease
	b   *Bulkhead
	run RunContext
	// fed is set by the first Feedback.
	fed atomic.Bool
}

// release settles the admission with usage u (nil: the last report),
// clamped to the usage ceiling. The engine ends its fleet hold and books
// on the rates what it used beyond its reservation. It reports whether
// this was the first release.
func (p *Permit) release(u *admission.Usage) bool {
	if u != nil {
		c := *u
		u = &c
		p.b.clampUsage(p, u)
	}
	if !p.l.Release(u) {
		return false
	}
	if p.b.remoteRates && p.l.Bypass == nil {
		// An overrun is booked in Redis before Release returns, as the
		// rates of the calls after it are.
		p.l.Settled()
	}
	return true
}

func (p *Permit) ID() ID {
	if p == nil {
		return ID{}
	}
	return ID(p.l.ID)
}

// LimitRevision returns the revision of the limits the call was admitted
// under. It never changes, even when limits change later.
func (p *Permit) LimitRevision() int64 {
	if p == nil {
		return 0
	}
	return p.l.Revision
}

// Priority returns the call's priority.
func (p *Permit) Priority() Priority {
	if p == nil {
		return Normal
	}
	return Priority(p.l.Priority)
}

// Class returns the call's admission class, "" without classes.
func (p *Permit) Class() string {
	if p == nil {
		return ""
	}
	return p.l.Class
}

// Tag returns the call's tag (see WithTag), "" for none.
func (p *Permit) Tag() string {
	if p == nil {
		return ""
	}
	_, tag := callOf(p.l.Request)
	return tag
}

// Reservation returns what the call reserved against the token budget, or
// nil without a budget.
func (p *Permit) Reservation() *Reservation {
	if p == nil || !p.b.hasBudget {
		return nil
	}
	r := Reservation(p.l.Reservation)
	return &r
}

// Resources returns what shared capacity the admission borrowed.
func (p *Permit) Resources() Resources {
	if p == nil {
		return Resources{}
	}
	return Resources(p.l.Resources)
}

// AbandonBorrowedConcurrency gives back early the slot this admission
// borrowed from the classes' shared pool, so a waiter can have it while this
// call finishes work that no longer needs the provider. The token hold
// stays until Release, and the admission stays in flight (Drain waits for
// it). It returns true only on the first effective call, and only for an
// admission that borrowed its slot and is not released.
func (p *Permit) AbandonBorrowedConcurrency() bool {
	if p == nil {
		return false
	}
	return p.l.Abandon()
}

// Release returns the slot and the token hold. When usage is not nil it is
// the call's final usage: what it consumed below the hold is counted as
// refunded. With nil usage the last ReportUsage, if any, is the final
// usage. Only the first call has an effect; later ones return nil (and are
// counted in Stats as double releases).
//
// Invalid usage (a negative count, a sum that overflows int64, or a
// breakdown larger than its total; see Usage) still releases everything,
// as if usage were nil, and then returns a *ConfigError.
func (p *Permit) Release(usage *Usage) error {
	if p == nil {
		return nil
	}
	err := usage.validate()
	if err != nil {
		usage = nil
	}
	if !p.release((*admission.Usage)(usage)) {
		return nil
	}
	return err
}

// ReportUsage records the call's cumulative usage so far, as a streaming
// response reports it, and returns the resulting hold.
//
// Each field only rises, the breakdown fields too: a lower value than
// reported before is raised to it. (So in odd report sequences the parts
// may end above their totals; nothing counts them.) With a budget the hold becomes input + max(reserved max output,
// output); a rise is an overrun (it counts against the budget until
// release), a fall is refunded at once. With prog, the hold becomes
// prog.RemainingOutput + prog.SafetyMargin + any output beyond the reserved
// max output, freeing what the stream has already processed. A report that
// changes nothing is stale: it changes no sequence and emits nothing. One
// that changes only the breakdown takes the next sequence and emits a
// UsageEvent with the hold unchanged.
// After release it is validated and clamped, holds 0 and records nothing.
// Invalid input (a negative count, a sum that overflows int64, a breakdown
// larger than its total, a remaining output above the reserved max output)
// is a *ConfigError and records nothing.
func (p *Permit) ReportUsage(u Usage, prog *Progressive) (UsageReport, error) {
	if p == nil {
		return UsageReport{}, invalidf("Permit", "must not be nil")
	}
	if err := u.validate(); err != nil {
		return UsageReport{}, err
	}
	if prog != nil {
		if err := checkNonNegative("Progressive.RemainingOutput", prog.RemainingOutput); err != nil {
			return UsageReport{}, err
		}
		if err := checkNonNegative("Progressive.SafetyMargin", prog.SafetyMargin); err != nil {
			return UsageReport{}, err
		}
	}
	au := admission.Usage(u)
	p.b.clampUsage(p, &au)
	rep, err := p.b.eng.ReportUsage(&p.l, au, (*admission.Progressive)(prog))
	if err != nil {
		return UsageReport{}, publicError(err)
	}
	return p.b.usageReport(&p.l, rep), nil
}

// RunContext is what a Run callback knows about its admission, and how it
// reports usage. It is valid only during the callback. In Observe mode the
// call may run bypassed instead of admitted (see WithMode): Bypass tells.
type RunContext struct {
	p        *Permit
	usage    Usage
	hasUsage bool
}

// ID returns the admission's unique ID, or a bypassed call's own.
func (rc *RunContext) ID() ID { return rc.p.ID() }

// LimitRevision returns the revision the call was admitted (or bypassed)
// under.
func (rc *RunContext) LimitRevision() int64 { return rc.p.LimitRevision() }

// Priority returns the call's priority.
func (rc *RunContext) Priority() Priority { return rc.p.Priority() }

// Class returns the call's admission class, "" without classes.
func (rc *RunContext) Class() string { return rc.p.Class() }

// Tag returns the call's tag (see WithTag), "" for none.
func (rc *RunContext) Tag() string { return rc.p.Tag() }

// Reservation returns the call's reservation, nil without a budget.
func (rc *RunContext) Reservation() *Reservation { return rc.p.Reservation() }

// Resources returns what shared capacity the admission borrowed.
func (rc *RunContext) Resources() Resources { return rc.p.Resources() }

// ReportUsage records the call's cumulative usage so far; see
// Permit.ReportUsage. The last report is the final usage when fn fails or
// never calls SetUsage. For a bypassed call it is validated and clamped
// the same way, but holds nothing (Held is 0) and changes only the observe
// statistics; each change is a BypassUsageEvent.
func (rc *RunContext) ReportUsage(u Usage, prog *Progressive) (UsageReport, error) {
	return rc.p.ReportUsage(u, prog)
}

// SetUsage records the call's final usage, settled when the callback
// returns without an error. Invalid usage is a *ConfigError and records
// nothing.
func (rc *RunContext) SetUsage(u Usage) error {
	if err := u.validate(); err != nil {
		return err
	}
	rc.usage, rc.hasUsage = u, true
	return nil
}

// AbandonBorrowedConcurrency gives back early the slot the call borrowed
// from the classes' shared pool; see Permit.AbandonBorrowedConcurrency.
func (rc *RunContext) AbandonBorrowedConcurrency() bool { return rc.p.AbandonBorrowedConcurrency() }

// clampUsage clamps a valid usage figure above the usage ceiling to it,
// and counts and logs it: a figure so large is an error of the provider
// or of its reader, and taken as it is it would hold the budget, or book a
// tokens-per-minute rate, for days. Input is kept up to the ceiling and
// Output gets what is left; the breakdown follows its totals.
func (b *Bulkhead) clampUsage(p *Permit, u *admission.Usage) {
	ceiling := b.usageCeiling
	if u.Input <= ceiling && u.Output <= ceiling-u.Input {
		return
	}
	b.suspect.Add(1)
	excess := u.Input - ceiling + u.Output // no overflow: Input + Output fits
	for prev := b.suspectTokens.Load(); !b.suspectTokens.CompareAndSwap(prev, admission.AddSat(prev, excess)); prev = b.suspectTokens.Load() {
	}
	b.log.Warn("bulkhead: usage above the ceiling, clamped to it",
		"admission", p.ID().String(), "input", u.Input, "output", u.Output, "ceiling", ceiling)
	u.Input = min(u.Input, ceiling)
	u.Output = min(u.Output, ceiling-u.Input)
	u.CachedInput = min(u.CachedInput, u.Input)
	u.CacheCreation = min(u.CacheCreation, u.Input-u.CachedInput)
	u.Reasoning = min(u.Reasoning, u.Output)
}
