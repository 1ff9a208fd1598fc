package bulkhead

import (
	"errors"
	"fmt"

	"github.com/llmbulkhead/bulkhead/fleet"
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
