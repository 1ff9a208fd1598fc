package fleet_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/fleet"
)

// The examples that talk to Redis expect one on localhost:6379; they are
// compiled, not run, by go test.
const redisAddr = "localhost:6379"

func newID() fleet.ID {
	var id fleet.ID
	_, _ = rand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // variant
	return id
}

// This example takes one fleet-wide hold for a call, reports its usage and
// releases it.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()

	pool, err := fleet.New(fleet.Config{
		Client:        client,
		Pool:          "openai-prod",
		MaxConcurrent: 64,
		TokenBudget:   400_000,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(context.Background())

	id := newID()
	// The reservation: the input estimate plus the maximum output.
	res, err := pool.Reserve(context.Background(), id, fleet.Hold{Slots: 1, Tokens: 12_000}, false)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("admitted:", res.Admitted, "fleet tokens held:", res.View.Tokens)

	// The provider reported the real usage: give the rest back.
	pool.Adjust(id, fleet.Hold{Slots: 1, Tokens: 3_500}, 1)
	// The call is over.
	pool.Release(id)
}

// This example shows a rejection: the fleet's concurrency limit is
// reached.
func ExamplePool_Reserve() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "tiny", MaxConcurrent: 1, TokenBudget: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(context.Background())

	ctx := context.Background()
	first, _ := pool.Reserve(ctx, newID(), fleet.Hold{Slots: 1}, false)
	second, _ := pool.Reserve(ctx, newID(), fleet.Hold{Slots: 1}, false)
	fmt.Println(first.Admitted, second.Admitted, second.Reason)
	// With no other holds in the pool, this prints:
	// true false slots
}

// This example releases a hold and shows that a late retry of its reserve
// is refused.
func ExamplePool_Release() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	pool, err := fleet.New(fleet.Config{Client: client, Pool: "retries", MaxConcurrent: -1, TokenBudget: -1})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	id := newID()
	_, _ = pool.Reserve(ctx, id, fleet.Hold{Slots: 1, Tokens: 100}, false)
	pool.Release(id)
	// Close sends every queued release before it returns.
	if err := pool.Close(ctx); err != nil {
		log.Fatal(err)
	}

	again, err := fleet.New(fleet.Config{Client: client, Pool: "retries", MaxConcurrent: -1, TokenBudget: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer again.Close(ctx)
	res, _ := again.Reserve(ctx, id, fleet.Hold{Slots: 1, Tokens: 100}, false)
	fmt.Println(res.Admitted, res.Reason)
	// This prints:
	// false released
}

// This example configures a pool for a fleet of four replicas that keep
// admitting within a quarter of the limits each while Redis is down. New
// does not talk to Redis yet: the first Reserve does.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	pool, err := fleet.New(fleet.Config{
		Client:              client,
		Pool:                "anthropic-prod",
		MaxConcurrent:       64,
		TokenBudget:         400_000,
		HighPriorityReserve: 40_000,
		OnFailure:           fleet.FailLocalShare,
		LocalShare:          fleet.Share{Slots: 16, Tokens: 100_000},
		LeaseTTL:            30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(context.Background())
	fmt.Println(fleet.FailLocalShare)
	// Output:
	// local_share
}
