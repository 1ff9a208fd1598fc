// Package testutil holds the helpers the project's tests share.
package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
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

// Sentinel is each reason's sentinel error.
var Sentinel = map[bulkhead.Reason]error{
	bulkhead.ConcurrencyLimit:  bulkhead.ErrConcurrencyLimit,
	bulkhead.QueueLimit:        bulkhead.ErrQueueLimit,
	bulkhead.Timeout:           bulkhead.ErrTimeout,
	bulkhead.Aborted:           bulkhead.ErrAborted,
	bulkhead.Shutdown:          bulkhead.ErrShutdown,
	bulkhead.BudgetLimit:       bulkhead.ErrBudgetLimit,
	bulkhead.UnshareableResult: bulkhead.ErrUnshareableResult,
	bulkhead.RateLimit:         bulkhead.ErrRateLimit,
	bulkhead.RateUnavailable:   bulkhead.ErrRateUnavailable,
	bulkhead.FleetUnavailable:  bulkhead.ErrFleetUnavailable,
	bulkhead.Cooldown:          bulkhead.ErrCooldown,
	bulkhead.RetryBudget:       bulkhead.ErrRetryBudget,
}

// Fataler is what WantReason needs of a *testing.T or a *rapid.T.
type Fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// WantReason checks that err is a rejection for reason why, matching
// ErrRejected and the reason's sentinel, and returns it.
func WantReason(t Fataler, err error, why bulkhead.Reason) *bulkhead.RejectedError {
	t.Helper()
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("error = %v, want a rejection %v", err, why)
	}
	if rej.Reason != why {
		t.Fatalf("reason = %v, want %v (err %v)", rej.Reason, why, err)
	}
	if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, Sentinel[why]) {
		t.Fatalf("errors.Is fails for %v", err)
	}
	return rej
}

// Buffer is a bytes.Buffer safe for concurrent writers and readers: a log
// or a command's output read while it is written.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Fence counts the admit, reject and release events a listener subscribed
// after the ones under test sees. Listeners get each event in the order
// they subscribed, so once the fence has seen n events, so has every
// listener subscribed before it.
type Fence struct {
	seen chan struct{}
	n    int
}

// NewFence subscribes a Fence to b until the test ends.
func NewFence(tb testing.TB, b *bulkhead.Bulkhead) *Fence {
	f := &Fence{seen: make(chan struct{}, 1024)}
	mark := func() { f.seen <- struct{}{} }
	tb.Cleanup(b.Subscribe(bulkhead.Hooks{
		Admit:   func(bulkhead.AdmitEvent) { mark() },
		Reject:  func(bulkhead.RejectEvent) { mark() },
		Release: func(bulkhead.ReleaseEvent) { mark() },
	}))
	return f
}

// Wait waits until the fence has seen n events in all, failing the test if
// it does not within Settle.
func (f *Fence) Wait(tb testing.TB, n int) {
	tb.Helper()
	timeout := time.After(Settle)
	for f.n < n {
		select {
		case <-f.seen:
			f.n++
		case <-timeout:
			tb.Fatalf("fence: %d events seen, want %d", f.n, n)
		}
	}
}
