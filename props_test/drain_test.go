package props_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// TestDrainDoneCtxOnClosedIdleKeepsEvents: every admission produces exactly
// one release event (F5, I2), and Drain cancels nothing when its ctx ends
// first (F33). A Drain whose ctx has already ended, on a closed bulkhead
// that is idle but whose listener has not yet seen every event, must not
// throw the undelivered events away while reporting Drained true: either it
// reports not drained (and a later Drain finishes the job), or the events
// still arrive.
func TestDrainDoneCtxOnClosedIdleKeepsEvents(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 1))
	if err != nil {
		t.Fatal(err)
	}
	unblock := make(chan struct{})
	released := make(chan bulkhead.ID, 1)
	b.Subscribe(bulkhead.Hooks{
		// A slow listener: it holds the events goroutine until unblocked.
		Admit:   func(bulkhead.AdmitEvent) { <-unblock },
		Release: func(e bulkhead.ReleaseEvent) { released <- e.ID },
	})
	tok, err := b.Acquire(context.Background(), &bulkhead.Request{Messages: []bulkhead.Message{{Content: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tok.Release(nil); err != nil {
		t.Fatal(err)
	}
	b.Close()

	done, cancel := context.WithCancel(context.Background())
	cancel()
	res, derr := b.Drain(done)
	close(unblock)

	// A later Drain with all the time it needs.
	ctx, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	res2, err2 := b.Drain(ctx)
	if !res2.Drained || err2 != nil {
		t.Fatalf("second Drain = %+v, %v", res2, err2)
	}
	select {
	case id := <-released:
		if id != tok.ID() {
			t.Fatalf("release event for %s, want %s", id, tok.ID())
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("the release event was never delivered: Drain(done ctx) returned %+v, %v on a closed, idle "+
			"bulkhead and stopped event delivery without flushing; a later Drain(%+v) cannot bring it back", res, derr, res2)
	}
}
