// Package testutil holds the helpers the project's tests share.
package testutil

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Settle bounds every wait for something the engine's own goroutines do.
// It is generous: a correct engine answers in microseconds.
const Settle = 10 * time.Second

// Poll calls done until it reports true or an error, yielding the processor
// between calls; it never sleeps. After Settle it gives up with an error
// naming what.
func Poll(what string, done func() (bool, error)) error {
	deadline := time.Now().Add(Settle)
	for {
		ok, err := done()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%s: not within %v", what, Settle)
		}
		runtime.Gosched()
	}
}

// WaitFor polls cond until it holds (see Poll), failing the test if it does
// not within Settle.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if err := Poll("timed out waiting for "+what, func() (bool, error) { return cond(), nil }); err != nil {
		tb.Fatal(err)
	}
}
