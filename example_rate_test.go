package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// ExampleRateLimits caps a model at 60 calls a minute. As a provider's
// bucket does, it lets a minute's worth of calls through at once; the next
// call is turned away with the exact time its turn comes (the bucket
// refills a call a second).
func ExampleRateLimits() {
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 100,
		Clock:         clock.NewMock(), // so the printed times are exact
		RateLimits:    &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}

	for i := 0; i < 60; i++ {
		p, err := b.Acquire(context.Background(), req)
		if err != nil {
			log.Fatal(err)
		}
		_ = p.Release(nil)
	}
	fmt.Println("60 calls went at once")
	_, err = b.Acquire(context.Background(), req)
	var rejected *bulkhead.RejectedError
	if errors.As(err, &rejected) && rejected.Reason == bulkhead.RateLimit {
		retry, _ := rejected.RetryAfter()
		fmt.Printf("the 61st: over the %s rate, retry in %v\n", rejected.Detail.Rate.Limit, retry)
	}
	// Output:
	// 60 calls went at once
	// the 61st: over the requests rate, retry in 1s
}

// ExampleNoBurst spaces calls evenly instead: one a second at 60 a minute.
func ExampleNoBurst() {
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 8,
		Clock:         clock.NewMock(),
		RateLimits:    &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}},
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
	defer p.Release(nil)
	_, err = b.Acquire(context.Background(), req)
	retry, _ := err.(*bulkhead.RejectedError).RetryAfter()
	fmt.Println("the second call: retry in", retry)
	// Output:
	// the second call: retry in 1s
}

// This example shares a provider account's limits between the replicas
// of a service: each replica builds its own pool handle on the same pool.
// (It needs a Redis server, so it is compiled but not run.)
func ExampleConfig_fleet() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "openai-prod", MaxConcurrent: 64, TokenBudget: 400_000})
	if err != nil {
		log.Fatal(err)
	}
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 16, // this replica's own limit
		TokenBudget:   &bulkhead.TokenBudget{Budget: 100_000},
		Fleet:         pool, // and the fleet's
	})
	if err != nil {
		log.Fatal(err)
	}
	req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}, MaxTokens: 512}
	_, err = b.Acquire(context.Background(), req)
	var rej *bulkhead.RejectedError
	if errors.As(err, &rej) && rej.Detail != nil && rej.Detail.Constraint == bulkhead.ConstraintFleet {
		fmt.Println("the fleet is full:", rej.Detail.Fleet.InFlight, "calls in flight across replicas")
	}

	_, _ = b.Shutdown(context.Background())
	_ = pool.Close(context.Background()) // releases what this replica still holds
}
