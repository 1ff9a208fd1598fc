package bulkhead

import (
	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/admission"
)

// Token is one admission: it holds a slot and the token reservation until
// Release. Its accessors never change after admission.
type Token struct {
	l   actor.Lease
	b   *Bulkhead
	run RunContext
}

// AdmissionID returns the admission's unique ID.
func (t *Token) AdmissionID() ID { return t.l.ID }

// LimitRevision returns the revision of the limits the call was admitted
// under. It never changes, even when limits change later.
func (t *Token) LimitRevision() int64 { return t.l.Revision }

// Priority returns the call's priority.
func (t *Token) Priority() Priority { return t.l.Priority }

// Class returns the call's admission class, "" without classes.
func (t *Token) Class() string { return t.l.Class }

// Reservation returns what the call reserved against the token budget, or
// nil without a budget.
func (t *Token) Reservation() *Reservation {
	if !t.b.hasBudget {
		return nil
	}
	r := t.l.Reservation
	return &r
}

// Resources returns what shared capacity the admission borrowed.
func (t *Token) Resources() Resources { return t.l.Resources }

// AbandonBorrowedConcurrency gives back early the slot this admission
// borrowed from the classes' shared pool (SPEC F19), so a waiter can have
// it while this call finishes some work that no longer needs the provider.
// The token hold stays until Release, and the admission stays in flight
// (Drain waits for it). It returns true only on the first effective call,
// and only for an admission that borrowed its slot and is not released.
func (t *Token) AbandonBorrowedConcurrency() bool { return t.l.Abandon() }

// Release returns the slot and the token hold. When usage is not nil it is
// the call's final usage: what it consumed below the hold is counted as
// refunded. With nil usage the last ReportUsage, if any, is the final
// usage. Only the first call has an effect; later ones return nil.
//
// Invalid usage (a negative count) still releases everything, as if usage
// were nil (the last ReportUsage, if any, is the final usage), and then
// returns a *ConfigError.
func (t *Token) Release(usage *Usage) error {
	err := validateUsage(usage)
	if err != nil {
		usage = nil
	}
	if !t.l.Release(usage) {
		return nil
	}
	return err
}

// ReportUsage records the call's cumulative usage so far, as a streaming
// response reports it, and returns the resulting hold (SPEC F12-F14).
//
// Each field only rises: a lower value than reported before is raised to
// it. With a budget the hold becomes input + max(reserved max output,
// output); a rise is an overrun (it counts against the budget until
// release), a fall is refunded at once. With p, the hold becomes
// p.RemainingOutput + p.SafetyMargin + any output beyond the reserved max
// output, freeing what the stream has already processed. A report that
// changes nothing is stale: it changes no sequence and emits nothing.
// After release it is validated and clamped, holds 0 and records nothing.
// Invalid input is a *ConfigError and records nothing.
func (t *Token) ReportUsage(u Usage, p *Progressive) (UsageReport, error) {
	if err := validateUsage(&u); err != nil {
		return UsageReport{}, err
	}
	if p != nil {
		if err := admission.CheckNonNegative("Progressive.RemainingOutput", p.RemainingOutput); err != nil {
			return UsageReport{}, err
		}
		if err := admission.CheckNonNegative("Progressive.SafetyMargin", p.SafetyMargin); err != nil {
			return UsageReport{}, err
		}
	}
	return t.b.eng.ReportUsage(&t.l, u, p)
}

func validateUsage(u *Usage) error {
	if u == nil {
		return nil
	}
	if err := admission.CheckNonNegative("Usage.Input", u.Input); err != nil {
		return err
	}
	return admission.CheckNonNegative("Usage.Output", u.Output)
}
