// Package testutil holds the helpers the project's tests share.
package testutil

import (
	"runtime"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, yielding the processor between polls.
// It fails the test after a generous bound (cond is about the engine's own
// goroutines, which answer in microseconds); it never sleeps.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}
