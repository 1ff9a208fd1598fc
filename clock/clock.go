// Package clock is the one place bulkhead's time comes from: the wall clock
// in production and a mock clock in tests, behind one small interface of
// ours, so every timer in the engine, the pacer and the tests is
// deterministic under a mock.
//
// The mock is github.com/benbjohnson/clock's, adapted: tests move time with
// Mock.Add and Mock.Set, and every timer due by then fires.
package clock

import (
	"context"
	"time"

	bclock "github.com/benbjohnson/clock"
)

// Clock tells the time and starts timers. Implementations must be safe for
// concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once d
	// has passed.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f on its own goroutine once d has passed, unless the
	// returned timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending timer from a Clock.
type Timer interface {
	// C returns the channel the time is sent on when the timer fires; nil
	// for a timer from AfterFunc.
	C() <-chan time.Time
	// Stop prevents the timer from firing. It returns false when the timer
	// had already fired or been stopped.
	Stop() bool
}

// New returns the wall clock.
func New() Clock { return real{} }

// OrReal returns c, or the wall clock when c is nil.
func OrReal(c Clock) Clock {
	if c == nil {
		return New()
	}
	return c
}

type real struct{}

func (real) Now() time.Time { return time.Now() }

func (real) NewTimer(d time.Duration) Timer { return realTimer{t: time.NewTimer(d)} }

func (real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{t: time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// Mock is a clock that moves only when told to. Its zero time is the Unix
// epoch; NewMockAt starts it elsewhere.
type Mock struct{ m *bclock.Mock }

// NewMock returns a mock clock at the Unix epoch.
func NewMock() *Mock { return &Mock{m: bclock.NewMock()} }

// NewMockAt returns a mock clock at t.
func NewMockAt(t time.Time) *Mock {
	m := NewMock()
	m.m.Set(t)
	return m
}

// Now returns the mock's current time.
func (m *Mock) Now() time.Time { return m.m.Now() }

// Add moves the mock forward by d, firing every timer due by then, in
// order.
func (m *Mock) Add(d time.Duration) { m.m.Add(d) }

// Set moves the mock to t, firing every timer due by then, in order.
func (m *Mock) Set(t time.Time) { m.m.Set(t) }

// NewTimer returns a timer that fires once the mock has moved d forward.
func (m *Mock) NewTimer(d time.Duration) Timer { return mockTimer{t: m.m.Timer(d)} }

// AfterFunc calls f once the mock has moved d forward.
func (m *Mock) AfterFunc(d time.Duration, f func()) Timer {
	return mockTimer{t: m.m.AfterFunc(d, f)}
}

type mockTimer struct{ t *bclock.Timer }

func (t mockTimer) C() <-chan time.Time { return t.t.C }
func (t mockTimer) Stop() bool          { return t.t.Stop() }

// WithDeadline returns a copy of parent that is cancelled once the mock
// reaches d, with context.DeadlineExceeded, or when parent ends.
func (m *Mock) WithDeadline(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	return m.m.WithDeadline(parent, d)
}

// WithTimeout is WithDeadline(parent, m.Now().Add(d)).
func (m *Mock) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return m.m.WithTimeout(parent, d)
}
