package bulkhead

import (
	"context"
	"time"

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

// AbandonBorrowedConcurrency gives back early the slot the call borrowed
// from the classes' shared pool; see Token.AbandonBorrowedConcurrency.
func (rc *RunContext) AbandonBorrowedConcurrency() bool {
	return rc.admission == Admitted && rc.t.AbandonBorrowedConcurrency()
}

// Run waits for admission, calls fn, and releases afterwards whatever fn
// does: returns, fails or panics (the panic then propagates). fn runs only
// after admission, with the caller's ctx; the bulkhead never cancels
// admitted work, except through WithBorrowedDeadline.
//
// The usage settled at release is what fn recorded with RunContext.SetUsage,
// or else the last RunContext.ReportUsage; when fn returns an error, only the
// last report counts. A rejection is a *RejectedError and fn is not called.
// Options are those of Acquire, plus WithBorrowedDeadline.
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
	if _, expired := t.l.Deadline(); expired != nil {
		return runWithDeadline(ctx, t, fn)
	}
	return runAdmitted(ctx, t, fn)
}

// runAdmitted calls fn for admission t and releases t afterwards.
func runAdmitted[T any](ctx context.Context, t *Token, fn func(context.Context, *RunContext) (T, error)) (T, error) {
	rc := &t.run
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

type runResult[T any] struct {
	v     T
	err   error
	panic any
}

// runWithDeadline runs fn on its own goroutine, so that Run can return as
// soon as the admission's borrowed-slot deadline expires. fn's context is
// then cancelled with the *BorrowedDeadlineError as its cause; fn's result,
// when it comes, is discarded, but its release still settles the tokens.
// A panic in fn propagates to Run's caller while Run is still waiting;
// after the deadline it crashes fn's goroutine, as any unrecovered panic.
//
// Run's answer always agrees with the engine's books: when the engine
// abandoned the slot on the deadline before it settled fn's release, Run
// returns the deadline error even if fn's result is already in.
func runWithDeadline[T any](ctx context.Context, t *Token, fn func(context.Context, *RunContext) (T, error)) (T, error) {
	deadline, expired := t.l.Deadline()
	fnCtx, cancel := context.WithCancelCause(ctx)
	results := make(chan runResult[T])
	gone := make(chan struct{}) // closed when Run has returned on the deadline
	go func() {
		var res runResult[T]
		defer func() {
			if p := recover(); p != nil {
				res.panic = p
			}
			// The release is settled once this returns, so whether the
			// deadline expired first is known.
			t.l.Sync()
			select {
			case results <- res:
			case <-gone:
				if res.panic != nil {
					panic(res.panic)
				}
			}
			cancel(nil)
		}()
		res.v, res.err = runAdmitted(fnCtx, t, fn)
	}()
	select {
	case res := <-results:
		select {
		case <-expired:
			if res.panic == nil {
				return deadlineExpired[T](t, deadline, cancel)
			}
		default:
		}
		return res.unwrap()
	case <-expired:
		close(gone)
		return deadlineExpired[T](t, deadline, cancel)
	}
}

// deadlineExpired cancels fn's context with the deadline error and returns
// it.
func deadlineExpired[T any](t *Token, deadline time.Duration, cancel context.CancelCauseFunc) (T, error) {
	err := &BorrowedDeadlineError{Deadline: deadline, AdmissionID: t.AdmissionID(), Resources: t.Resources(), Class: t.Class()}
	cancel(err)
	var zero T
	return zero, err
}

func (r runResult[T]) unwrap() (T, error) {
	if r.panic != nil {
		panic(r.panic)
	}
	return r.v, r.err
}
