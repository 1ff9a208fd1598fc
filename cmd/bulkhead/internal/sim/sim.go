// Package sim is a discrete-event simulation that runs on one goroutine: a
// virtual clock, implementing clock.Clock, whose timers are events in a
// heap. A driver pops the events in order, sets the virtual time to each
// and runs it; nothing sleeps, so a simulated hour takes as long as its
// events take to handle, and a run is the same on every machine.
//
// Events are ordered by (time, sequence number): two events due at the
// same instant run in the order they were scheduled. AfterFunc callbacks
// run synchronously on the driver's goroutine, not on goroutines of their
// own as clock.Clock describes; a Sim is therefore not safe for concurrent
// use: everything that touches it, the code under test included, must run
// on the driver's goroutine. The bulkhead's engine is such code: its
// admission actor runs on the goroutine that sends it a message
// (protoactor's synchronized dispatcher), and its timers only send the
// actor a message.
package sim

import (
	"container/heap"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// Sim is a virtual clock and its event queue. The zero value is not
// usable; call New.
type Sim struct {
	now    time.Time
	seq    uint64
	events eventHeap
	steps  int64
}

// New returns a simulation whose clock reads start.
func New(start time.Time) *Sim { return &Sim{now: start} }

var _ clock.Clock = (*Sim)(nil)

// Now returns the virtual time: that of the event being run, or the start.
func (s *Sim) Now() time.Time { return s.now }

// Steps returns how many events have run.
func (s *Sim) Steps() int64 { return s.steps }

// Pending returns how many events are scheduled.
func (s *Sim) Pending() int { return len(s.events) }

// NewTimer returns a timer that sends the virtual time on its channel once
// the simulation reaches d from now. The channel has a buffer of one, so
// the send never blocks the driver.
func (s *Sim) NewTimer(d time.Duration) clock.Timer {
	ch := make(chan time.Time, 1)
	return s.schedule(d, nil, ch)
}

// AfterFunc calls f on the driver's goroutine once the simulation reaches
// d from now, unless the timer is stopped first.
func (s *Sim) AfterFunc(d time.Duration, f func()) clock.Timer {
	return s.schedule(d, f, nil)
}

// At runs f once the simulation reaches t (at once, in order, when t is
// not after now).
func (s *Sim) At(t time.Time, f func()) { s.schedule(t.Sub(s.now), f, nil) }

func (s *Sim) schedule(d time.Duration, f func(), ch chan time.Time) *timer {
	s.seq++
	t := &timer{s: s, at: s.now.Add(max(d, 0)), seq: s.seq, f: f, ch: ch}
	heap.Push(&s.events, t)
	return t
}

// Step runs the next event: it sets the clock to the event's time and
// fires it. It returns false when no event is left.
func (s *Sim) Step() bool {
	if len(s.events) == 0 {
		return false
	}
	t := heap.Pop(&s.events).(*timer)
	s.now = t.at
	s.steps++
	if t.f != nil {
		t.f()
	} else {
		t.ch <- t.at
	}
	return true
}

// Run runs events until none is left, calling after (when not nil) after
// each one.
func (s *Sim) Run(after func()) {
	for s.Step() {
		if after != nil {
			after()
		}
	}
}

// Discard drops every scheduled event, as if each timer had been stopped:
// Run returns after the event it is running.
func (s *Sim) Discard() {
	for _, t := range s.events {
		t.idx = -1
	}
	clear(s.events)
	s.events = s.events[:0]
}

// timer is a scheduled event; idx is its place in the heap, -1 once it has
// fired or been stopped.
type timer struct {
	s   *Sim
	at  time.Time
	seq uint64
	f   func()
	ch  chan time.Time
	idx int
}

// C returns the timer's channel, nil for one from AfterFunc or At.
func (t *timer) C() <-chan time.Time {
	if t.ch == nil {
		return nil
	}
	return t.ch
}

// Stop removes the timer from the queue. It returns false when the timer
// had already fired or been stopped.
func (t *timer) Stop() bool {
	if t.idx < 0 {
		return false
	}
	heap.Remove(&t.s.events, t.idx)
	return true
}

// eventHeap orders timers by (time, sequence number).
type eventHeap []*timer

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *eventHeap) Push(x any) {
	t := x.(*timer)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *eventHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.idx = -1
	*h = old[:len(old)-1]
	return t
}
