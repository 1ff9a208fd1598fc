// Package seam holds the engine's test seams: hooks that only tests set, so
// that no public configuration carries them. In production they are unset,
// and the engine finds them so with one atomic load.
package seam

import (
	"sync/atomic"
	"time"
)

var park atomic.Pointer[func(time.Duration)]

// SetPark makes f the hook the admission actor calls each time a paced call
// starts to wait outside the queue, once its timer is armed (its own for
// its turn, the hold timer for a cool-down before it), with the time it
// will wait: for tests that move a mock clock. It applies to every engine;
// nil removes it.
func SetPark(f func(time.Duration)) {
	if f == nil {
		park.Store(nil)
		return
	}
	park.Store(&f)
}

// Parked calls the hook SetPark set, if any, with d.
func Parked(d time.Duration) {
	if f := park.Load(); f != nil {
		(*f)(d)
	}
}
