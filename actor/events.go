package actor

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/admission"
)

// subscription is one Hooks value subscribed to the engine.
type subscription struct {
	hooks admission.Hooks
	// gone is set by Unsubscribe, so no event reaches the listener after
	// Unsubscribe returns, even one already queued.
	gone atomic.Bool
}

// kinds reports which event kinds h listens for.
func (s *subscription) kinds() [numKinds]bool {
	h := &s.hooks
	return [numKinds]bool{
		kindAdmit:       h.Admit != nil,
		kindReject:      h.Reject != nil,
		kindRelease:     h.Release != nil,
		kindReconfigure: h.Reconfigure != nil,
		kindUsage:       h.Usage != nil,
		kindAbandon:     h.Abandon != nil,
	}
}

// flushMsg is answered once every event sent before it has been delivered.
type flushMsg struct{ done chan struct{} }

// eventsActor delivers events to listeners, one at a time, in the order the
// admission actor emitted them. It runs on protoactor's default dispatcher,
// so listeners never run on a caller's goroutine or inside the admission
// actor: a slow listener delays only later events.
type eventsActor struct {
	engine *Engine
	subs   []*subscription
}

func (a *eventsActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *subscription:
		a.subs = append(a.subs, m)
	case *unsubscribeMsg:
		for i, s := range a.subs {
			if s == m.sub {
				a.subs = append(a.subs[:i], a.subs[i+1:]...)
				break
			}
		}
	case *flushMsg:
		close(m.done)
	case *admission.AdmitEvent:
		deliver(a, m, func(h *admission.Hooks) func(admission.AdmitEvent) { return h.Admit })
	case *admission.RejectEvent:
		deliver(a, m, func(h *admission.Hooks) func(admission.RejectEvent) { return h.Reject })
	case *admission.ReleaseEvent:
		deliver(a, m, func(h *admission.Hooks) func(admission.ReleaseEvent) { return h.Release })
	case *admission.ReconfigureEvent:
		deliver(a, m, func(h *admission.Hooks) func(admission.ReconfigureEvent) { return h.Reconfigure })
	case *admission.UsageEvent:
		deliver(a, m, func(h *admission.Hooks) func(admission.UsageEvent) { return h.Usage })
	case *admission.AbandonEvent:
		deliver(a, m, func(h *admission.Hooks) func(admission.AbandonEvent) { return h.Abandon })
	}
}

// deliver hands ev to every live subscription's listener for its kind.
func deliver[E any](a *eventsActor, ev *E, listener func(*admission.Hooks) func(E)) {
	for _, s := range a.subs {
		if f := listener(&s.hooks); f != nil && !s.gone.Load() {
			call(a, f, *ev)
		}
	}
}

// call runs one listener, recovering and counting a panic.
func call[E any](a *eventsActor, f func(E), ev E) {
	defer func() {
		if p := recover(); p != nil {
			a.engine.listenerPanics.Add(1)
			a.engine.sys.Logger().Warn("bulkhead: event listener panicked", "panic", p)
		}
	}()
	f(ev)
}

// Subscribe adds hooks and returns the function that removes them. The
// listeners see every event of a change made after Subscribe returns.
func (e *Engine) Subscribe(h admission.Hooks) (unsubscribe func()) {
	sub := &subscription{hooks: h}
	q := &subscribeRequest{sub: sub, done: make(chan struct{}, 1)}
	e.call(q, q.done)
	var once atomic.Bool
	return func() {
		if once.Swap(true) {
			return
		}
		sub.gone.Store(true)
		e.send(&unsubscribeMsg{sub: sub})
	}
}
