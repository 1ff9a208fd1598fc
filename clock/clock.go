// Package clock is the one place bulkhead takes time from.
//
// Every timer in the library (queue timeouts, borrowed-slot deadlines, drain
// deadlines, pacing waits) and every timestamp (decision timing) goes through
// a Clock, so tests can swap the wall clock for a Mock and move time by hand:
// deterministic, fast, and with no time.Sleep.
//
// The implementation is github.com/benbjohnson/clock; this package names the
// parts bulkhead relies on so callers need not import it themselves.
package clock

import (
	"time"

	bclock "github.com/benbjohnson/clock"
)

// Clock is a source of time and timers. New returns the wall clock; NewMock
// returns a clock that moves only when told to.
type Clock = bclock.Clock

// Mock is a Clock whose time moves only through Add and Set. Timers created
// with AfterFunc fire, on their own goroutine, when Add or Set moves the time
// past their deadline.
type Mock = bclock.Mock

// Timer is a timer created by a Clock's AfterFunc or Timer method.
type Timer = bclock.Timer

// New returns the wall clock: time.Now, monotonic, and runtime timers.
func New() Clock { return bclock.New() }

// NewMock returns a Mock set to the Unix epoch.
func NewMock() *Mock { return bclock.NewMock() }

// NewMockAt returns a Mock set to t.
func NewMockAt(t time.Time) *Mock {
	m := bclock.NewMock()
	m.Set(t)
	return m
}

// OrReal returns c, or the wall clock when c is nil. It is how a zero-valued
// configuration field means "real time".
func OrReal(c Clock) Clock {
	if c == nil {
		return New()
	}
	return c
}
