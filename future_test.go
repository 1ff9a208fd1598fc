package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
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
