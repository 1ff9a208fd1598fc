package bulkhead

import (
	"context"

	"github.com/llmbulkhead/bulkhead/admission"
)

// Admission says how a Run callback came to run.
type Admission uint8

// The admission kinds.
const (
	// Admitted: the call holds a slot and its reservation.
	Admitted Admission = iota
	// Bypassed: observe mode ran the call without holding capacity.
	Bypassed
)

// String returns "admitted" or "bypassed".
func (a Admission) String() string {
	if a == Bypassed {
		return "bypassed"
	}
	return "admitted"
}

// RunContext is what a Run callback knows about its admission, and how it
// reports usage. It is valid only during the callback.
type RunContext struct {
	t         *Token
	usage     Usage
	hasUsage  bool
	admission Admission
}

// AdmissionID returns the admission's unique ID.
func (rc *RunContext) AdmissionID() ID { return rc.t.AdmissionID() }

// LimitRevision returns the revision the call was admitted under.
func (rc *RunContext) LimitRevision() int64 { return rc.t.LimitRevision() }

// Priority returns the call's priority.
func (rc *RunContext) Priority() Priority { return rc.t.Priority() }

// Class returns the call's admission class, "" without classes.
func (rc *RunContext) Class() string { return rc.t.Class() }

// Reservation returns the call's reservation, nil without a budget.
func (rc *RunContext) Reservation() *Reservation { return rc.t.Reservation() }

// Resources returns what shared capacity the admission borrowed.
func (rc *RunContext) Resources() Resources { return rc.t.Resources() }

// Admission says whether the call was admitted or bypassed.
func (rc *RunContext) Admission() Admission { return rc.admission }

// ReportUsage records the call's cumulative usage so far; see
// Token.ReportUsage. The last report is the final usage when fn fails or
// never calls SetUsage.
func (rc *RunContext) ReportUsage(u Usage, p *Progressive) (UsageReport, error) {
	return rc.t.ReportUsage(u, p)
}

// SetUsage records the call's final usage, settled when the callback
// returns without an error. Invalid usage is a *ConfigError and records
// nothing.
func (rc *RunContext) SetUsage(u Usage) error {
	if err := validateUsage(&u); err != nil {
		return err
	}
	rc.usage, rc.hasUsage = u, true
	return nil
}

// Run waits for admission, calls fn, and releases afterwards whatever fn
// does: returns, fails or panics (the panic then propagates). fn runs only
// after admission, with the caller's ctx; the bulkhead never cancels
// admitted work.
//
// The usage settled at release is what fn recorded with RunContext.SetUsage,
// or else the last RunContext.ReportUsage; when fn returns an error, only the
// last report counts. A rejection is a *RejectedError and fn is not
// called. Options are those of Acquire.
func Run[T any](ctx context.Context, b *Bulkhead, req *Request, fn func(context.Context, *RunContext) (T, error), opts ...Option) (T, error) {
	var zero T
	if fn == nil {
		return zero, admission.Invalidf("fn", "must not be nil")
	}
	o := resolve(opts)
	t, err := b.acquire(ctx, req, &o, "Run")
	if err != nil {
		return zero, err
	}
	rc := &t.run
	rc.t = t
	failed := true
	defer func() {
		var u *Usage
		if !failed && rc.hasUsage {
			u = &rc.usage
		}
		t.l.Release(u)
	}()
	v, err := fn(ctx, rc)
	failed = err != nil
	return v, err
}
