package bulkhead

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/admission"
)

// FleetDetail is the fleet pool's state when it turned a call away.
type FleetDetail struct {
	// Pool is the pool's name.
	Pool string
	// InFlight and InFlightTokens are what every replica's admissions held
	// in the pool, fleet-wide, when it decided.
	InFlight, InFlightTokens int64
	// MaxConcurrent and TokenBudget are the pool's limits (-1: not
	// enforced); for a normal-priority call the token limit applied was
	// TokenBudget less the pool's high-priority reserve.
	MaxConcurrent, TokenBudget int64
	// Generation is the pool's generation: it changes when Redis loses the
	// pool's state or comes back with an older one, and when leases ran
	// out while no replica could renew them.
	Generation string
	// Fallback is the Redis error when the pool could not decide.
	Fallback error
}

// explain says, with numbers, why the fleet pool rejected a call for why.
func (d *FleetDetail) explain(why Reason, reserved int64) string {
	pool := fmt.Sprintf("fleet pool %q: ", d.Pool)
	switch {
	case errors.Is(d.Fallback, fleet.ErrClosed):
		return pool + "the pool is closed"
	case d.Fallback != nil && (why == ConcurrencyLimit || why == BudgetLimit):
		return pool + "Redis failed, and this replica's local share is full" // the error follows, as the cause
	case why == ConcurrencyLimit:
		return fmt.Sprintf("%s%d of %d in flight across the fleet", pool, d.InFlight, d.MaxConcurrent)
	case why == BudgetLimit:
		return fmt.Sprintf("%s%d tokens requested, %d of %d in flight across the fleet", pool, reserved, d.InFlightTokens, d.TokenBudget)
	case d.Fallback != nil:
		return pool + "Redis failed" // the error follows, as the cause
	}
	return pool + "relearning: running calls are registering their holds again (the pool's state in Redis is new, lost or rewound, or this replica's leases ran out)"
}

// FleetStats counts what the fleet pool decided for this bulkhead. The
// pool's own statistics (renewals, Redis errors, releases waiting) are in
// fleet.Pool.Stats.
type FleetStats struct {
	// Checked counts the admissions that asked the pool; Admitted those it
	// let through, PolicyAdmitted among them those its failure policy let
	// through while Redis failed. The calls it turned away are in
	// Calls.RejectedByReason (ConcurrencyLimit and BudgetLimit, with
	// Constraint ConstraintFleet, and FleetUnavailable).
	Checked, Admitted, PolicyAdmitted int64
	// View is the pool's fleet-wide state as the last reply showed it.
	InFlight, InFlightTokens   int64
	MaxConcurrent, TokenBudget int64
}

// fleetPool is a bulkhead's fleet pool and its counters.
type fleetPool struct {
	*fleet.Pool
	checked, admitted, policy atomic.Int64
	mu                        sync.Mutex
	view                      fleet.View
}

func fleetID(p *Permit) fleet.ID { return fleet.ID(p.l.ID) }

// fleetReserve takes provisional admission p's hold in the fleet pool, on
// the caller's goroutine: NoReason when it holds, else why it is turned
// away, the detail and the cause.
func (b *Bulkhead) fleetReserve(ctx context.Context, p *Permit) (admission.Reason, *admission.External, error) {
	f := b.fleet
	f.checked.Add(1)
	reserved := p.l.Reservation.Reserved
	res, err := f.Reserve(ctx, fleetID(p), fleet.Hold{Slots: 1, Tokens: reserved}, p.l.Priority == admission.High)
	if res.View.Gen != "" {
		f.mu.Lock()
		f.view = res.View
		f.mu.Unlock()
	}
	d := &admission.FleetDetail{Pool: f.Name(), InFlight: res.View.Slots, InFlightTokens: res.View.Tokens,
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

// fleetRelease ends p's fleet hold, in the background.
func (b *Bulkhead) fleetRelease(p *Permit) {
	if b.fleet != nil && p.l.Bypass == nil {
		b.fleet.Release(fleetID(p))
	}
}

// fleetAdjust moves p's fleet hold to the hold a usage report left it
// with, in the background. Sequences are twice the usage sequence, and an
// abandoned slot the odd one after, so the pool applies them in order.
func (b *Bulkhead) fleetAdjust(p *Permit, held int64, seq int64, abandoned bool) {
	if b.fleet == nil || p.l.Bypass != nil {
		return
	}
	slots := int64(1)
	fseq := uint64(seq) * 2
	if abandoned {
		slots, fseq = 0, fseq+1
	}
	b.fleet.Adjust(fleetID(p), fleet.Hold{Slots: slots, Tokens: held}, fseq)
}

// stats returns the fleet counters, nil without a pool.
func (f *fleetPool) stats() *FleetStats {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	v := f.view
	f.mu.Unlock()
	return &FleetStats{
		Checked: f.checked.Load(), Admitted: f.admitted.Load(), PolicyAdmitted: f.policy.Load(),
		InFlight: v.Slots, InFlightTokens: v.Tokens, MaxConcurrent: v.MaxConcurrent, TokenBudget: v.TokenBudget,
	}
}
