package actor

import "github.com/llmbulkhead/bulkhead/actor/admission"

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
