package bulkhead

import (
	"context"
	"fmt"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// admit sends r, prepared with its permit p, for admission, through the
// bulkhead's checks outside the engine when it has any. The order is the
// documented one: the capacity checks and the slot (in the engine), then
// the fleet pool, then the rate limits, so that a call the fleet turns away
// spends no rate (a rate turn cannot be given back; a fleet hold can).
//
// A rate limit on an in-process store without a fleet pool is checked by
// the engine itself as it grants the slot. Otherwise the engine grants a
// provisional admission, the checks run here, on the caller's goroutine
// (never inside the engine: they may wait for Redis), and the admission is
// confirmed or rolled back, which gives the slot to the next waiter.
//
// A call whose model is cooling down and that may not wait for it is
// refused first, before it books a rate turn or asks for a slot; one that
// may wait is held by the engine in the queue, or in pace mode waits the
// cool-down out here, before it takes its rate turn.
func (b *Bulkhead) admit(ctx context.Context, r *actor.AcquireRequest, p *Permit, o *callOptions) (*Permit, error) {
	if b.cool.armed.Load() {
		b.cooldown(ctx, r)
	}
	p, err := b.admitChecked(ctx, r, p, o)
	if err == nil && b.adapt != nil {
		b.adapt.admitted(p)
	}
	return p, err
}

// admitChecked is admit after the cool-down.
func (b *Bulkhead) admitChecked(ctx context.Context, r *actor.AcquireRequest, p *Permit, o *callOptions) (*Permit, error) {
	var set *rateSet
	if b.rate != nil {
		var err error
		if set, err = b.rateOf(r); err != nil {
			b.eng.PutRequest(r)
			return nil, publicError(err)
		}
	}
	postRate := false
	switch {
	case set != nil && b.rate.pace && r.Refuse == admission.NoReason:
		if b.cool.armed.Load() && !b.cool.shed {
			b.holdOut(ctx, r) // before the rate turn, not after it
		}
		if r.Refuse == admission.NoReason {
			b.pace(ctx, r, set)
		}
	case set != nil && b.rate.local && b.fleet == nil:
		r.CheckArg = set
	case set != nil:
		postRate = true
	}
	confirm := postRate || b.fleet != nil
	r.Confirm = confirm
	p, err := b.send(r, p, o.tag)
	if err != nil || !confirm || p.l.Bypass != nil {
		return p, err // a bypassed call holds nothing and books nothing
	}
	why, ext, cause := admission.NoReason, (*admission.External)(nil), error(nil)
	held, settled := false, false
	defer func() {
		if settled {
			return
		}
		// A panic on this goroutine (a context or a Redis hook of the
		// caller's) between the grant and the verdict: give everything back
		// before it goes on.
		pv := recover()
		if held {
			b.fleet.Release(fleetID(p))
		}
		b.cool.refund(p.headModel, p.l.Reservation.Reserved, p.headGen)
		_ = b.eng.Rollback(&p.l, admission.Aborted, nil, fmt.Errorf("bulkhead: panic during the admission's checks: %v", pv))
		if pv != nil {
			panic(pv)
		} // else runtime.Goexit, which goes on by itself
	}()
	if b.fleet != nil {
		why, ext, cause = b.fleetReserve(ctx, p)
		held = why == admission.NoReason
	}
	if why == admission.NoReason && postRate {
		why, ext, cause = b.rate.decide(ctx, set, p.l.Reservation.Reserved)
	}
	settled = true
	if why == admission.NoReason {
		b.eng.Confirm(&p.l)
		return p, nil
	}
	if held {
		b.fleet.Release(fleetID(p))
	}
	if err = b.eng.Rollback(&p.l, why, ext, cause); err == nil {
		return p, nil // observe mode: bypassed, as the call's mode shadows why
	}
	b.cool.refund(p.headModel, p.l.Reservation.Reserved, p.headGen)
	return nil, withTag(publicError(err), o.tag)
}
