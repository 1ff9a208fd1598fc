package actor

import (
	"context"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/dedup"
)

// Close and Drain: the engine closes to new work, and Drains wait until
// nothing is in flight, queued or being decided.

// close rejects every waiter and every later call with Shutdown.
func (s *state) close() {
	if s.closed {
		return
	}
	s.closed = true
	s.q.each(func(w *AcquireRequest) {
		s.dequeue(w)
		s.reject(w, admission.Shutdown, true, nil, "")
	})
	s.closeStages()
	s.fx.stopHold() // nothing is held any more
	s.checkDrains()
}

func (s *state) idle() bool {
	return s.calls == 0 && s.provisional == 0 && s.pending == 0 && s.observe.InFlight == 0 && s.nparked == 0 && s.checking == 0 && s.booking == 0
}

func (s *state) drainResult() admission.DrainResult {
	return admission.DrainResult{Drained: s.idle(), InFlight: int(s.calls+s.provisional) + s.booking, Pending: s.pending + s.nparked + s.checking, Bypassed: int(s.observe.InFlight)}
}

// answerDrain replies to d with the current result.
func (s *state) answerDrain(d *drainRequest) {
	d.result, d.closed = s.drainResult(), s.closed
	s.fx.answerDrain(d)
}

func (s *state) drain(d *drainRequest) {
	if s.idle() {
		s.answerDrain(d)
		return
	}
	s.drains = append(s.drains, d)
}

func (s *state) cancelDrain(d *drainRequest) {
	for i, w := range s.drains {
		if w == d {
			s.drains = append(s.drains[:i], s.drains[i+1:]...)
			s.answerDrain(d)
			return
		}
	}
}

func (s *state) checkDrains() {
	if len(s.drains) == 0 || !s.idle() {
		return
	}
	for _, d := range s.drains {
		s.answerDrain(d)
	}
	s.drains = nil
}

// Close closes the engine to new work, deduplication included. It is
// idempotent.
// Every call waits until the close has taken effect.
func (e *Engine) Close() {
	q := &closeRequest{done: make(chan struct{}, 1)}
	e.call(q, q.done)
	if e.dedup != nil {
		// Every join sent after Close returns is ordered behind this, so
		// none joins a call in flight: it is rejected Shutdown instead.
		e.root.Send(e.dedup, dedupClose)
	}
}

var dedupClose = &dedup.Close{}

// Drain waits until nothing is in flight or queued and every admission has
// been released, or until ctx ends. When the engine is closed and drained
// it also stops event delivery, so no goroutine of the engine remains.
//
// Drain returns when ctx ends, whatever the listeners do: a Drain that
// gives up while a listener still holds an event leaves the rest of the
// shutdown to a later Drain. A listener that calls Drain waits for itself
// (the events behind the one it is handling cannot be delivered until it
// returns), so its Drain ends only with its ctx; other Drains are not held
// up by it and keep their own deadlines.
//
// With deduplication on, Drain also waits until no deduplicated key is in
// flight: a leader rejected in the queue (by Close, say) releases
// nothing, and its followers wait until its entry settles.
func (e *Engine) Drain(ctx context.Context) admission.DrainResult {
	var d *drainRequest
	for {
		d = &drainRequest{done: make(chan struct{}, 1)}
		e.send(d)
		select {
		case <-d.done:
		case <-ctx.Done():
			e.send(&drainCancel{d: d})
			<-d.done
		}
		if e.dedup == nil {
			break
		}
		if !d.result.Drained {
			d.result.DedupActive = int(e.dedupActive())
			return d.result
		}
		active, waited := e.drainDedup(ctx)
		if active > 0 {
			d.result.Drained, d.result.DedupActive = false, int(active)
			return d.result
		}
		if !waited {
			// The table was empty right behind the engine's idle answer:
			// after Close neither can fill again.
			break
		}
		// The table emptied while Drain waited: check the engine again.
	}
	if d.result.Drained && d.closed && !e.stop(ctx) {
		// The work has drained but listeners are still being handed
		// events: not a complete drain yet.
		d.result.Drained = false
	}
	return d.result
}

// stop ends event delivery and reports whether it has: the admission actor
// stops emitting (and its class actors stop), the events actor delivers
// what it holds, then it stops and the actor system shuts down. When ctx
// ends before the last event is delivered, stop returns false and a later
// call picks up where it left off. Concurrent calls wait together, each
// until its own ctx ends; no lock is held while they wait. The admission
// actor, which owns no goroutine, keeps answering.
func (e *Engine) stop(ctx context.Context) bool {
	flushed := e.stopEvents()
	if e.backlog.Load() == 0 {
		// Every event emitted has been delivered: the flush is a message
		// away and runs no listener, so an idle bulkhead drains whatever
		// the context says (a context that has already ended included).
		<-flushed
	} else {
		select {
		case <-flushed:
		case <-ctx.Done():
			return false
		}
	}
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if !e.stopped {
		e.root.Stop(e.events)
		e.sys.Shutdown()
		e.stopped = true
	}
	return true
}

// stopEvents stops the emission of events, the first time it is called,
// and returns the channel closed once every event emitted before that has
// been delivered.
func (e *Engine) stopEvents() <-chan struct{} {
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if e.flushed == nil {
		// The admission actor answers at once: it runs no user code.
		q := &eventsOffRequest{done: make(chan struct{}, 1)}
		e.call(q, q.done)
		e.flushed = q.flushed
	}
	return e.flushed
}
