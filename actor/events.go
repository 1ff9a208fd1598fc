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
		for _, s := range a.subs {
			if f := s.hooks.Admit; f != nil && !s.gone.Load() {
				a.call(func() { f(*m) })
			}
		}
	case *admission.RejectEvent:
		for _, s := range a.subs {
			if f := s.hooks.Reject; f != nil && !s.gone.Load() {
				a.call(func() { f(*m) })
			}
		}
	case *admission.ReleaseEvent:
		for _, s := range a.subs {
			if f := s.hooks.Release; f != nil && !s.gone.Load() {
				a.call(func() { f(*m) })
			}
		}
	case *admission.ReconfigureEvent:
		for _, s := range a.subs {
			if f := s.hooks.Reconfigure; f != nil && !s.gone.Load() {
				a.call(func() { f(*m) })
			}
		}
	}
}

// call runs one listener, recovering and counting a panic.
func (a *eventsActor) call(f func()) {
	defer func() {
		if p := recover(); p != nil {
			a.engine.listenerPanics.Add(1)
			a.engine.sys.Logger().Warn("bulkhead: event listener panicked", "panic", p)
		}
	}()
	f()
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
