package bulkhead

import (
	"sync"
	"sync/atomic"
	"time"

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
	// used is the largest cumulative usage (Input + Output) reported, for
	// the rate limits' overrun booking at release.
	used atomic.Int64
	// The fleet hold's state, with Config.Fleet: the last hold and usage
	// sequence sent, and whether the slot was abandoned.
	fleetMu        sync.Mutex
	fleetSeq       int64
	fleetHeld      int64
	fleetAbandoned bool
	// With Config.Adaptive: counted is set when the admission is counted
	// in flight, with the count then (itself included), the controller's
	// epoch and, for the Gradient rule, the time.
	counted    bool
	inFlight   int
	epoch      uint64
	admittedAt time.Time
	// granted is set when the engine's grant check noted epoch (and
	// admittedAt) as it granted the slot: the moment of admission, which an
	// AcquireAsync caller may read much later.
	granted bool
	// held is set once the engine held the call back for a cool-down.
	held bool
	// fed is set by the first Feedback.
	fed atomic.Bool
	// headGen is the headroom report of headModel the admission spent
	// from, 0 for none (set by the engine's grant check).
	headGen   uint64
	headModel string
}

// fleetReport sends the hold a usage report left the admission with to the
// fleet pool, when the report changed it.
func (p *Permit) fleetReport(rep admission.UsageReport) {
	p.fleetMu.Lock()
	defer p.fleetMu.Unlock()
	if rep.Sequence <= p.fleetSeq {
		return
	}
	p.fleetSeq, p.fleetHeld = rep.Sequence, rep.Held
	p.b.fleetAdjust(p, p.fleetHeld, p.fleetSeq, p.fleetAbandoned)
}

// fleetAbandon tells the fleet pool that the admission gave its slot back.
func (p *Permit) fleetAbandon() {
	p.fleetMu.Lock()
	defer p.fleetMu.Unlock()
	if p.fleetAbandoned {
		return
	}
	p.fleetAbandoned = true
	held := p.fleetHeld
	if p.fleetSeq == 0 {
		held = p.l.Reservation.Reserved
	}
	p.b.fleetAdjust(p, held, p.fleetSeq, true)
}

// release settles the admission with usage u (nil: the last report) and
// books, on a tokens-per-minute rate, what it used beyond its reservation.
// It reports whether this was the first release.
func (p *Permit) release(u *admission.Usage) bool {
	if u != nil {
		c := *u
		u = &c
		p.b.clampUsage(p, u)
	}
	if !p.l.Release(u) {
		return false
	}
	p.b.fleetRelease(p)
	if p.counted {
		p.b.adapt.inFlight.Add(-1)
	}
	if p.b.rate != nil {
		used := p.used.Load()
		if u != nil && u.Valid() {
			used = u.Total()
		}
		p.b.bookOverrun(p, used)
	}
	return true
}

// ID returns the admission's unique ID.
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
	if !p.l.Abandon() {
		return false
	}
	if p.b.fleet != nil {
		p.fleetAbandon()
	}
	return true
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
	for prev := p.used.Load(); rep.Consumed > prev && !p.used.CompareAndSwap(prev, rep.Consumed); prev = p.used.Load() {
	}
	if p.b.fleet != nil && !p.l.Released() {
		p.fleetReport(rep)
	}
	return usageReport(rep), nil
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
