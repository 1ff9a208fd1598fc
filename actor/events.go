package actor

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Kinds says which kinds of event a subscription listens for, so that the
// engine builds events only for kinds someone listens for.
type Kinds [admission.NumEventKinds]bool

// subscription is one subscriber: deliver is called with each event of a
// kind it listens for, on the events actor's goroutine.
type subscription struct {
	kinds   Kinds
	deliver func(ev *admission.Event)
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
	case *admission.Event:
		for _, s := range a.subs {
			if s.kinds[m.Kind] && !s.gone.Load() {
				a.call(s, m)
			}
		}
		a.engine.backlog.Add(-1)
		*m = admission.Event{}
		eventPool.Put(m)
	}
}

// call runs one listener, recovering and counting a panic. The warning is
// logged through the engine's guarded logger, so a logger that panics too
// cannot end event delivery.
func (a *eventsActor) call(s *subscription, ev *admission.Event) {
	defer func() {
		if p := recover(); p != nil {
			a.engine.listenerPanics.Add(1)
			a.engine.log(slog.LevelWarn, "bulkhead: event listener panicked", "panic", p)
		}
	}()
	s.deliver(ev)
}

// Subscribe adds a listener for the kinds of event in kinds and returns the
// function that removes it. The listener sees every event of a change made
// after Subscribe returns. An event is valid only during the call: the
// engine reuses it.
func (e *Engine) Subscribe(kinds Kinds, deliver func(ev *admission.Event)) (unsubscribe func()) {
	sub := &subscription{kinds: kinds, deliver: deliver}
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

// eventPool recycles event records: the events actor puts each back once
// every listener has seen it, so a listener must not keep one.
var eventPool = sync.Pool{New: func() any { return new(admission.Event) }}

// newEvent returns an event record, from the pool, set to e.
func newEvent(e admission.Event) *admission.Event {
	ev := eventPool.Get().(*admission.Event)
	*ev = e
	return ev
}

// leaseEvent returns an event of kind k about admission (or bypass) l, its
// header filled from l.
func leaseEvent(k admission.EventKind, l *Lease) *admission.Event {
	return newEvent(admission.Event{Kind: k, Request: l.Request, ID: l.ID, Revision: l.Revision, Priority: l.Priority,
		Class: l.Class, Reservation: l.Reservation, Resources: l.Resources})
}

// listen adds delta to the listener count of each kind in kinds, so that
// events are built only for kinds someone listens for, and reports whether
// anyone listens for admit or reject events (which carry decision timing).
func (s *state) listen(kinds Kinds, delta int) (timing bool) {
	for kind, set := range kinds {
		if set {
			s.listeners[kind] += delta
		}
	}
	return s.listeners[admission.EventAdmit]+s.listeners[admission.EventReject] > 0
}

// silence stops the emission of events for good: event delivery is over.
func (s *state) silence() { s.listeners = [admission.NumEventKinds]int{} }
