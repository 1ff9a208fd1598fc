package actor

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/admission"
)

// waitStopping waits until some Drain has stopped the emission of events
// and then holds no lock: stop must never wait for listeners under it.
func waitStopping(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if e.stopMu.TryLock() {
			started := e.flushed != nil
			e.stopMu.Unlock()
			if started {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no Drain reached the event flush, or one holds the stop lock while it waits")
		}
		runtime.Gosched()
	}
}

// shortDrain drains with a 50 ms deadline and checks it gave up.
func shortDrain(t *testing.T, e *Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if res := e.Drain(ctx); res.Drained {
		t.Fatalf("Drain = %+v with a listener still holding an event", res)
	}
}

// TestDrainKeepsItsDeadlineBehindABlockedListener: while a listener holds
// an event, a Drain waiting for the flush does not hold up another one
// with a short deadline; once the listener returns, both complete.
func TestDrainKeepsItsDeadlineBehindABlockedListener(t *testing.T) {
	e := startEngine(t, admission.Limits{MaxConcurrent: 1})
	holding, unblock := make(chan struct{}), make(chan struct{})
	e.Subscribe(Kinds{KindAdmit: true}, func(any) {
		close(holding)
		<-unblock
	})
	acquire(t, e).Release(nil)
	<-holding
	e.Close()
	long := make(chan admission.DrainResult, 1)
	go func() { long <- e.Drain(context.Background()) }()
	waitStopping(t, e)
	shortDrain(t, e)
	shortDrain(t, e) // and again: giving up changed nothing
	close(unblock)
	if res := <-long; !res.Drained {
		t.Fatalf("the long Drain = %+v", res)
	}
	if res := e.Drain(context.Background()); !res.Drained {
		t.Fatalf("a later Drain = %+v", res)
	}
}

// TestListenerDrainDoesNotPoisonOthers: a listener that calls Drain on an
// open engine waits for itself once the engine is closed and idle (its own
// event blocks the flush) until its context ends, but every other Drain
// keeps its deadline meanwhile, and one after it completes.
func TestListenerDrainDoesNotPoisonOthers(t *testing.T) {
	e := startEngine(t, admission.Limits{MaxConcurrent: 1})
	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	draining, inner := make(chan struct{}), make(chan admission.DrainResult, 1)
	e.Subscribe(Kinds{KindAdmit: true}, func(any) {
		close(draining)
		inner <- e.Drain(lctx)
	})
	l := acquire(t, e)
	<-draining // the listener's Drain waits for l
	e.Close()
	l.Release(nil)
	waitStopping(t, e) // the listener's Drain now waits for itself
	shortDrain(t, e)
	shortDrain(t, e)
	lcancel()
	if res := <-inner; res.Drained {
		t.Fatalf("the listener's own Drain = %+v", res)
	}
	if res := e.Drain(context.Background()); !res.Drained {
		t.Fatalf("a Drain after the listener returned = %+v", res)
	}
}
