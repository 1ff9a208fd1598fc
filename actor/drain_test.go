package actor

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/dedup"
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
	e.Subscribe(Kinds{admission.EventAdmit: true}, func(*admission.Event) {
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
	e.Subscribe(Kinds{admission.EventAdmit: true}, func(*admission.Event) {
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

// TestDrainWaitsForDedupLeaderRejectedInQueue: a dedup leader rejected
// Shutdown in the queue releases nothing, so the engine is idle before the
// leader's entry settles, while its follower still waits. Drain waits for
// the entry too: until it settles, Drain has not drained (and says how many
// keys are in flight); once it has, the follower has its outcome and Drain
// drains.
func TestDrainWaitsForDedupLeaderRejectedInQueue(t *testing.T) {
	e, err := Start(Config{Limits: admission.Limits{MaxConcurrent: 1, MaxQueue: 1}, Dedup: true})
	if err != nil {
		t.Fatal(err)
	}
	hold := acquire(t, e)
	key := dedup.Key{Canon: "same"}
	leader, follower := e.NewJoin(), e.NewJoin()
	for _, j := range []*dedup.Join{leader, follower} {
		j.Key, j.Digest = key, 1
		e.Join(j)
	}
	if leader.Role != dedup.Leader || follower.Role != dedup.Follower {
		t.Fatalf("roles %v, %v", leader.Role, follower.Role)
	}
	r := e.NewAsyncRequest()
	r.Ctx, r.Request, r.Lease = context.Background(), "leader", &Lease{}
	done, stop := e.AcquireAsync(r) // queued: the slot is held
	e.Close()                       // ordered behind it: rejects it Shutdown
	<-done
	stop()
	if reasonOf(r.Err) != admission.Shutdown {
		t.Fatalf("leader: %v, want Shutdown", r.Err)
	}
	hold.Release(nil)

	// The engine is idle; the leader has not settled its entry yet.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if res := e.Drain(gone); res.Drained || res.DedupActive != 1 || res.InFlight != 0 || res.Pending != 0 {
		t.Fatalf("Drain before the leader settled = %+v, want not drained with 1 key in flight", res)
	}
	select {
	case <-follower.Answered():
		t.Fatal("the follower was answered before its leader settled")
	default:
	}

	waiting := make(chan admission.DrainResult, 1)
	go func() { waiting <- e.Drain(context.Background()) }()
	// Either Drain returns (too early) or it waits for the entry.
	for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		if len(waiting) > 0 {
			t.Fatalf("Drain = %+v before the leader settled its entry", <-waiting)
		}
		q := dedup.NewStatsRequest()
		e.root.Send(e.dedup, q)
		if q.Await(); q.Draining == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Drain neither returned nor waited for the dedup table")
		}
	}
	e.Settle(leader, "shared")
	if res := <-waiting; !res.Drained || res.DedupActive != 0 {
		t.Fatalf("Drain after the leader settled = %+v", res)
	}
	select {
	case <-follower.Answered():
	default:
		t.Fatal("Drain drained before the follower had its outcome")
	}
	if follower.Outcome != "shared" {
		t.Fatalf("follower outcome %v", follower.Outcome)
	}
	// Once drained and stopped, the engine and its dedup actor still answer.
	if res := e.Drain(context.Background()); !res.Drained {
		t.Fatalf("a later Drain = %+v", res)
	}
	if d := e.Stats().Dedup; d == nil || d.Active != 0 || d.Hits != 1 {
		t.Fatalf("dedup stats %+v", d)
	}
}
