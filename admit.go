package bulkhead

import (
	"context"

	"github.com/llmbulkhead/bulkhead/actor"
)

// admit sends r, prepared with its permit p, for admission and returns the
// admission or the rejection. Every stage is the engine's: the cool-down,
// the capacity checks and the slot, a paced turn, and the remote stages (a
// fleet pool, rates in Redis), which a worker of the engine's runs while
// the admission is provisional. A panic in code those run for the call
// (its context, a Redis hook) is raised again here, on the caller's
// goroutine, once everything the call held is given back.
func (b *Bulkhead) admit(_ context.Context, r *actor.AcquireRequest, p *Permit, o *callOptions) (*Permit, error) {
	p, pv, err := b.send(r, p, o.tag)
	if pv != nil {
		panic(pv)
	}
	return p, err
}
