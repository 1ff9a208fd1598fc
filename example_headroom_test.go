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

// This example reports what the provider said is left of its rate limits
// with an answer (stream.HeadroomOf reads it from the response headers,
// and a stream.Transport reports it by itself): later calls spend from it,
// and one that does not fit is shed with the time until it would, before
// the provider would answer 429.
func ExampleHeadroom() {
	clk := clock.NewMock() // so the example is exact; leave it nil in production
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 16,
		TokenBudget:   &bulkhead.TokenBudget{Budget: 100_000},
		Clock:         clk,
		Adaptive:      &bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())

	call := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "Summarise this."}}, MaxTokens: 1000}
	p, err := b.Acquire(context.Background(), call)
	if err != nil {
		log.Fatal(err)
	}
	// The answer's headers: 1,500 of 61,500 tokens left, the window full
	// again in a minute (1,000 tokens a second); requests not said.
	_ = p.FeedbackHeadroom(bulkhead.OutcomeSuccess, 0, &bulkhead.Headroom{
		Tokens: 1500, TokensLimit: 61_500, TokensReset: time.Minute, Requests: -1,
	})
	_ = p.Release(nil)

	p, err = b.Acquire(context.Background(), call) // spends about 1,005 of the 1,500
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Release(nil)
	fmt.Println("left:", b.Stats().Cooldown.Headroom["gpt-4o"].Tokens)

	_, err = b.Acquire(context.Background(), call)
	var rej *bulkhead.RejectedError
	if errors.As(err, &rej) {
		d, _ := rej.RetryAfter()
		fmt.Println(rej.Reason, "from headroom:", rej.Detail.Cooldown.Headroom, "retry after", d)
	}
	// Output:
	// left: 495
	// cooldown from headroom: true retry after 510ms
}
