package actor

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// fleetStage is the bulkhead's fleet pool: a remote stage. Its reserve runs
// on a worker, never inside the actor; its adjustments and releases are
// sent to the pool's background batches, which never block.
type fleetStage struct {
	pool                      *fleet.Pool
	checked, admitted, policy atomic.Int64
	view                      atomic.Pointer[fleet.View]
}

func fleetID(l *Lease) fleet.ID { return fleet.ID(l.ID) }

// reserve takes provisional admission l's hold in the pool, on a worker:
// NoReason when it holds, else why it is turned away, the detail and the
// cause.
func (f *fleetStage) reserve(ctx context.Context, l *Lease) (admission.Reason, *admission.External, error) {
	f.checked.Add(1)
	reserved := l.Reservation.Reserved
	res, err := f.pool.Reserve(ctx, fleetID(l), fleet.Hold{Slots: 1, Tokens: reserved}, l.Priority == admission.High)
	if res.View.Gen != "" {
		v := res.View
		f.view.Store(&v)
	}
	d := &admission.FleetDetail{Pool: f.pool.Name(), InFlight: res.View.Slots, InFlightTokens: res.View.Tokens,
		MaxConcurrent: res.View.MaxConcurrent, TokenBudget: res.View.TokenBudget, Generation: res.View.Gen, Fallback: res.Fallback}
	switch {
	case err != nil && ctx.Err() != nil:
		return admission.Aborted, nil, context.Cause(ctx)
	case errors.Is(err, fleet.ErrClosed):
		d.Fallback = err
		return admission.FleetUnavailable, &admission.External{Fleet: d}, nil
	case err != nil:
		d.Fallback = err // invalid input: a bug of ours
		return admission.FleetUnavailable, &admission.External{Fleet: d}, err
	case res.Admitted:
		f.admitted.Add(1)
		if res.Fallback != nil {
			f.policy.Add(1)
		}
		return admission.NoReason, nil, nil
	}
	ext := &admission.External{Constraint: admission.ConstraintFleet, Fleet: d}
	switch res.Reason {
	case fleet.Slots:
		return admission.ConcurrencyLimit, ext, res.Fallback
	case fleet.Tokens:
		// A decision of Redis's own names the fleet's budget; one of the
		// failure policy's (a full local share) says nothing of it.
		budget := res.View.TokenBudget
		ext.NeverFits = res.Fallback == nil && budget >= 0 && reserved > budget
		return admission.BudgetLimit, ext, res.Fallback
	}
	ext.Constraint = ""
	return admission.FleetUnavailable, ext, res.Fallback
}

// adjust moves l's hold to held: the hold a usage report left it with.
// Sequences are twice the usage sequence, and an abandoned slot the odd one
// after, so the pool applies them in order.
func (f *fleetStage) adjust(l *Lease, held, seq int64, abandoned bool) {
	slots := int64(1)
	fseq := uint64(seq) * 2
	if abandoned {
		slots, fseq = 0, fseq+1
	}
	f.pool.Adjust(fleetID(l), fleet.Hold{Slots: slots, Tokens: held}, fseq)
}

func (f *fleetStage) stats() *admission.FleetStats {
	if f == nil {
		return nil
	}
	st := &admission.FleetStats{Checked: f.checked.Load(), Admitted: f.admitted.Load(), PolicyAdmitted: f.policy.Load()}
	if v := f.view.Load(); v != nil {
		st.InFlight, st.InFlightTokens, st.MaxConcurrent, st.TokenBudget = v.Slots, v.Tokens, v.MaxConcurrent, v.TokenBudget
	}
	return st
}
