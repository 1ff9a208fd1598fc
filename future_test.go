package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func TestAcquireAsync(t *testing.T) {
	b := newBulkhead(t, bulkhead.Batch("gpt-4o", 1))
	first := b.AcquireAsync(context.Background(), req("a", 0))
	<-first.Done()
	tok, err := first.Result()
	if err != nil || tok == nil {
		t.Fatalf("first = %v, %v", tok, err)
	}
	if again, _ := first.Result(); again != tok {
		t.Fatal("Result is not stable")
	}

	// A queued call's future completes when a slot frees.
	queued := b.AcquireAsync(context.Background(), req("w", 0))
	testutil.WaitFor(t, "the async call to queue", pending(b))
	select {
	case <-queued.Done():
		t.Fatal("queued future done before a slot freed")
	default:
	}
	_ = tok.Release(nil)
	<-queued.Done()
	second, err := queued.Result()
	if err != nil {
		t.Fatal(err)
	}

	// Cancelling the context withdraws a queued call.
	ctx, cancel := context.WithCancel(context.Background())
	withdrawn := b.AcquireAsync(ctx, req("x", 0))
	testutil.WaitFor(t, "the async call to queue", pending(b))
	cancel()
	if _, err := withdrawn.Result(); !errors.Is(err, bulkhead.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("withdrawn = %v", err)
	}
	_ = second.Release(nil)

	// Invalid input: a future that is already done with the error.
	bad := b.AcquireAsync(context.Background(), req("x", -1))
	<-bad.Done()
	if tok, err := bad.Result(); tok != nil || !errors.Is(err, bulkhead.ErrInvalid) {
		t.Fatalf("bad = %v, %v", tok, err)
	}
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.Admitted != 2 || st.Gate.Aborted != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func ExampleBulkhead_AcquireAsync() {
	b, err := bulkhead.New(bulkhead.Batch("gpt-4o", 1))
	if err != nil {
		panic(err)
	}
	defer func() {
		b.Close()
		_, _ = b.Drain(context.Background())
	}()

	held, _ := b.Acquire(context.Background(), &bulkhead.Request{})
	future := b.AcquireAsync(context.Background(), &bulkhead.Request{})
	// An event loop selects on Done with its other work.
	select {
	case <-future.Done():
		fmt.Println("admitted at once?")
	default:
		fmt.Println("waiting for a slot")
	}
	_ = held.Release(nil)
	<-future.Done()
	tok, err := future.Result()
	fmt.Println(err == nil)
	_ = tok.Release(nil)
	// Output:
	// waiting for a slot
	// true
}

// endsOnSecondDone is a context whose Done channel closes when Done is
// called the second time: after AcquireAsync has read it (and found it
// open), as it registers its watch on it.
type endsOnSecondDone struct {
	context.Context
	mu   sync.Mutex
	n    int
	done chan struct{}
}

func (c *endsOnSecondDone) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n++; c.n == 2 {
		close(c.done)
	}
	return c.done
}

func (c *endsOnSecondDone) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

// TestAcquireAsyncContextEndingAsItIsSentIsAnswered checks that a call of
// AcquireAsync whose context ends as it is sent is answered. AcquireAsync
// reads its context's Done channel, then registers the watch that sends the
// cancel message, then sends the request. A context that ends in between
// fires the watch at once, on a goroutine of its own, whose cancel message
// may reach the engine before the request: the engine ignored it (nothing to
// withdraw yet) and queued the request (or parked it, paced), where the pump
// passes over a waiter whose context has ended, "its cancel message is on its
// way". Without a queue timeout the call was never answered. The race is
// narrow: the test tries many times.
func TestAcquireAsyncContextEndingAsItIsSentIsAnswered(t *testing.T) {
	cfg := bulkhead.Batch("m", 1)
	cfg.QueueTimeout = 0
	b := newBulkhead(t, cfg)
	hold := mustAcquire(t, b, req("hold", 1))
	defer func() { _ = hold.Release(nil) }()
	for i := range 20000 {
		ctx := &endsOnSecondDone{Context: context.Background(), done: make(chan struct{})}
		f := b.AcquireAsync(ctx, req("x", 1))
		select {
		case <-f.Done():
		case <-time.After(testutil.Settle):
			t.Fatalf("call %d, whose context ended as it was sent, is never answered (stats %+v)", i, b.Stats().Gate)
		}
		if _, err := f.Result(); err == nil {
			t.Fatal("admitted")
		}
	}
}
