package classes

import (
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

// LeaseActor is the child actor of one admission class: it owns the class's
// leases that carry a borrowed-slot deadline and their timers.
// The admission actor spawns one per class, tells it when a deadline lease
// starts and when it ends early, and hears back, as a DeadlineExpired
// message, when a deadline fires first. It decides nothing about capacity:
// the accounting stays with the parent.
//
// K identifies a lease; the parent's own lease pointer is the usual choice.
type LeaseActor[K comparable] struct {
	class  string
	clk    clock.Clock
	timers map[K]*leaseTimer
	tel    *Telemetry
}

// Telemetry is a class actor's count of its deadlines. The actor writes it;
// anyone may read it at any time.
type Telemetry struct {
	started, expired, ended atomic.Int64
	active                  atomic.Int64
}

// Snapshot returns the counts.
func (t *Telemetry) Snapshot() admission.DeadlineStats {
	return admission.DeadlineStats{
		Active:  t.active.Load(),
		Started: t.started.Load(),
		Expired: t.expired.Load(),
		Ended:   t.ended.Load(),
	}
}

type leaseTimer struct {
	timer clock.Timer // nil when the lease was due on arrival
	gen   uint64
}

func (t *leaseTimer) stop() {
	if t.timer != nil {
		t.timer.Stop()
	}
}

// StartDeadline asks the class actor to expire Lease at At. The deadline is
// an instant, read from the clock when the lease was admitted, so it does
// not depend on when the class actor gets to the message.
type StartDeadline[K comparable] struct {
	Lease K
	At    time.Time
}

// EndDeadline tells the class actor that Lease settled (released or
// abandoned) before its deadline: the timer is stopped.
type EndDeadline[K comparable] struct{ Lease K }

// DeadlineExpired is what a class actor sends its parent when a lease's
// deadline fires before the lease ended.
type DeadlineExpired[K comparable] struct {
	Class string
	Lease K
}

type fired[K comparable] struct {
	lease K
	gen   uint64
}

// NewLeaseActor returns the props of a class actor for class, with timers
// from clk.
//
// The actor runs on a synchronized dispatcher: when its parent tells it of
// a new deadline and it is idle, it handles the message at once, on the
// parent's goroutine, so the timer is armed before the admission is
// answered. A test that moves a mock clock after the call was admitted then
// always finds the deadline's timer in place.
func NewLeaseActor[K comparable](class string, clk clock.Clock) (*actor.Props, *Telemetry) {
	tel := new(Telemetry)
	return actor.PropsFromProducer(func() actor.Actor {
		return &LeaseActor[K]{class: class, clk: clock.OrReal(clk), timers: make(map[K]*leaseTimer), tel: tel}
	}, actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))), tel
}

// Receive handles one message.
func (a *LeaseActor[K]) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *StartDeadline[K]:
		a.start(ctx, m)
	case *EndDeadline[K]:
		if t, ok := a.timers[m.Lease]; ok {
			t.stop()
			delete(a.timers, m.Lease)
			a.tel.ended.Add(1)
			a.tel.active.Add(-1)
		}
	case *fired[K]:
		t, ok := a.timers[m.lease]
		if !ok || t.gen != m.gen {
			return // ended, or restarted, before this firing arrived
		}
		delete(a.timers, m.lease)
		a.tel.expired.Add(1)
		a.tel.active.Add(-1)
		ctx.Send(ctx.Parent(), &DeadlineExpired[K]{Class: a.class, Lease: m.lease})
	case *actor.Stopping:
		for k, t := range a.timers {
			t.stop()
			delete(a.timers, k)
		}
		a.tel.active.Store(0)
	}
}

func (a *LeaseActor[K]) start(ctx actor.Context, m *StartDeadline[K]) {
	gen := uint64(1)
	if old, ok := a.timers[m.Lease]; ok {
		old.stop()
		gen = old.gen + 1
	} else {
		a.tel.active.Add(1)
	}
	a.tel.started.Add(1)
	msg := &fired[K]{lease: m.Lease, gen: gen}
	reg := &leaseTimer{gen: gen}
	a.timers[m.Lease] = reg
	if after := m.At.Sub(a.clk.Now()); after > 0 {
		root, self := ctx.ActorSystem().Root, ctx.Self()
		reg.timer = a.clk.AfterFunc(after, func() { root.Send(self, msg) })
		// A timer runs for a duration, not to an instant: if the clock
		// reached the deadline while the timer was being armed, it would
		// fire late. Expire now then; the timer's own message is ignored.
		if a.clk.Now().Before(m.At) {
			return
		}
	}
	// Already due: a mock clock would not fire a timer for the present
	// until it is moved again, so expire now.
	ctx.Send(ctx.Self(), msg)
}
