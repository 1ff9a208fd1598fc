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

// Release returns the slot and the token hold. When usage is not nil it is
// the call's final usage: what it consumed below the hold is counted as
// refunded. Only the first call has an effect; later ones return nil.
//
// Invalid usage (a negative count) still releases everything, without the
// usage, and then returns a *ConfigError.
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

func validateUsage(u *Usage) error {
	if u == nil {
		return nil
	}
	if err := admission.CheckNonNegative("Usage.Input", u.Input); err != nil {
		return err
	}
	return admission.CheckNonNegative("Usage.Output", u.Output)
}
