package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// This example lets the provider's answers move the limits: a 429 lowers
// MaxConcurrent (and the token budget with it), and successes that find
// the limit in use raise it again, never beyond the configured bounds.
func ExampleAdaptive() {
	clk := clock.NewMock() // so the example is exact; leave it nil in production
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 16,
		TokenBudget:   &bulkhead.TokenBudget{Budget: 160_000},
		Clock:         clk,
		Adaptive:      &bulkhead.Adaptive{MinConcurrent: 4, Backoff: 0.5},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())

	clk.Add(time.Second)
	_ = b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited})
	l := b.Limits()
	fmt.Println("after a 429:", l.MaxConcurrent, "slots,", l.TokenBudget.Budget, "tokens, revision", l.Revision)

	clk.Add(time.Second)
	_ = b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess})
	st := b.Stats().Adaptive
	fmt.Println("after a success:", st.MaxConcurrent, "slots; bounds", st.MinConcurrent, "to", st.MaxConcurrentBound)
	// Output:
	// after a 429: 8 slots, 80000 tokens, revision 1
	// after a success: 9 slots; bounds 4 to 16
}

// This example reports a provider's 429 with a Retry-After of two seconds:
// until it has passed, calls for that model are turned away (ShedCooldown)
// with the exact time left, instead of being sent into another 429. With
// the default HoldCooldown they would wait for it instead.
func ExampleBulkhead_Feedback() {
	clk := clock.NewMock()
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 8,
		Clock:         clk,
		Adaptive:      &bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}

	p, err := b.Acquire(context.Background(), req)
	if err != nil {
		log.Fatal(err)
	}
	// ... the provider answers 429 with retry-after: 2 ...
	_ = p.Feedback(bulkhead.OutcomeRateLimited, 2*time.Second)
	_ = p.Release(nil)

	clk.Add(500 * time.Millisecond)
	_, err = b.Acquire(context.Background(), req)
	var rej *bulkhead.RejectedError
	if errors.As(err, &rej) {
		retry, _ := rej.RetryAfter()
		fmt.Println(rej.Reason, "retry after", retry)
	}
	clk.Add(1500 * time.Millisecond)
	p, err = b.Acquire(context.Background(), req)
	fmt.Println("after the cool-down:", err)
	_ = p.Release(nil)
	// Output:
	// cooldown retry after 1.5s
	// after the cool-down: <nil>
}
