package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// A reservation override is used verbatim with a token budget, and checked
// even without one.
func ExampleWithReservation() {
	ctx := context.Background()
	request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}

	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	withBudget, _ := bulkhead.New(cfg)
	defer withBudget.Shutdown(ctx)
	p, _ := withBudget.Acquire(ctx, request, bulkhead.WithReservation(bulkhead.Reservation{Input: 200, MaxOutput: 800}))
	fmt.Println(p.Reservation().Reserved)
	_ = p.Release(nil)

	noBudget, _ := bulkhead.New(bulkhead.Interactive("gpt-4o", 4))
	defer noBudget.Shutdown(ctx)
	_, err := noBudget.Acquire(ctx, request, bulkhead.WithReservation(bulkhead.Reservation{Input: 1, MaxOutput: 2, Reserved: 5}))
	fmt.Println(errors.Is(err, bulkhead.ErrInvalid), err)
	// Output:
	// 1000
	// true bulkhead: invalid Reservation.Reserved: must be 0 or Input + MaxOutput = 3, got 5
}

// Checks come in one order: the call is validated first, then a closed
// bulkhead answers shutdown, then a context already done answers aborted.
func ExampleInteractive() {
	ctx := context.Background()
	b, _ := bulkhead.New(bulkhead.Interactive("gpt-4o", 1)) // no queue: fail fast
	request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}

	p, _ := b.Acquire(ctx, request)
	_, err := b.Acquire(ctx, request) // the one slot is taken
	fmt.Println(err)
	_ = p.Release(nil)

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Acquire(done, request) // a slot is free, but the caller has given up
	fmt.Println(err)

	b.Close()
	_, err = b.Acquire(done, &bulkhead.Request{MaxTokens: -1})
	fmt.Println(err)
	_, err = b.Acquire(done, request)
	fmt.Println(err)
	_, _ = b.Drain(ctx)
	// Output:
	// bulkhead: rejected: concurrency_limit: 1 of 1 in flight, no queue
	// bulkhead: rejected: aborted: the context ended before admission: context canceled
	// bulkhead: invalid Request.MaxTokens: must be >= 0, got -1
	// bulkhead: rejected: shutdown: the bulkhead is closed
}

// A Batch bulkhead queues the calls that find every slot taken, each for at
// most its queue timeout.
func ExampleBatch() {
	ctx := context.Background()
	cfg := bulkhead.Batch("gpt-4o", 1) // 20 waiting calls, 30 s each
	cfg.QueueTimeout = 10 * time.Millisecond
	b, _ := bulkhead.New(cfg)
	defer b.Shutdown(ctx)
	request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}

	p, _ := b.Acquire(ctx, request)
	waiting := b.AcquireAsync(ctx, request) // queues behind p
	_ = p.Release(nil)                      // p's slot goes to the waiter
	q, err := waiting.Result()
	fmt.Println(err, b.Stats().Gate.InFlight)
	_ = q.Release(nil)
	// Output: <nil> 1
}
