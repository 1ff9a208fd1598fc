package pacer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// Pace spaces calls weight/QPS apart: the caller waits the delay, then acts.
func ExamplePacer_Pace() {
	// A mock clock makes the example deterministic; production code leaves
	// Clock nil for the wall clock.
	store := pacer.NewLocal(pacer.LocalOptions{Clock: clock.NewMockAt(time.Unix(1723075200, 0))})
	p, err := pacer.New(store, pacer.Options{Name: "openai", QPS: 10})
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		out, err := p.Pace(context.Background(), "gpt-4o", 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Delay) // time.Sleep(out.Delay), then call the API
	}
	// Output:
	// 0s
	// 100ms
	// 200ms
}

// Book records tokens a call used beyond what it was rate-limited for, so
// that the calls after it wait for them, but never further than a window
// ahead: a usage figure of a billion tokens holds the key back a minute.
func ExamplePacer_Book() {
	store := pacer.NewLocal(pacer.LocalOptions{Clock: clock.NewMockAt(time.Unix(1723075200, 0))})
	tpm, err := pacer.New(store, pacer.Options{Name: "tpm", QPS: 60000.0 / 60})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	out, err := tpm.Book(ctx, "gpt-4o", time.Minute, 1e9)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("booked %.0f of %.0f tokens\n", out.Booked, out.Weight)
	next, _ := tpm.RateLimit(ctx, "gpt-4o", 1000)
	fmt.Println("next call in", next.Delay)
	// Output:
	// booked 60000 of 1000000000 tokens
	// next call in 1m0s
}

// PaceWait waits itself, and gives up at once when the context's deadline
// comes before the call's slot.
func ExamplePacer_PaceWait() {
	store := pacer.NewLocal(pacer.LocalOptions{})
	p, err := pacer.New(store, pacer.Options{Name: "crawler", QPS: 200})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if _, err := p.PaceWait(ctx, "example.com", 1); err != nil {
			log.Fatal(err) // ctx ended, or pacer.ErrTooLong: the deadline comes first
		}
		// fetch the page
	}
	fmt.Println("3 pages, 5 ms apart")
	// Output: 3 pages, 5 ms apart
}

// RateLimit admits a call or rejects it with the exact retry-after, and
// records only admitted calls.
func ExamplePacer_RateLimit() {
	clk := clock.NewMockAt(time.Unix(1723075200, 0))
	store := pacer.NewLocal(pacer.LocalOptions{Clock: clk})
	// 600 requests per minute per tenant, bursts of 2 on top.
	p, err := pacer.New(store, pacer.Options{Name: "api", QPS: 600.0 / 60, MaxBurst: 2})
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		out, err := p.RateLimit(context.Background(), "tenant-1", 1)
		if err != nil {
			log.Fatal(err)
		}
		if out.Delay > 0 {
			fmt.Printf("429, Retry-After %v\n", out.Delay)
			continue
		}
		fmt.Println("200")
	}
	clk.Add(100 * time.Millisecond)
	out, _ := p.RateLimit(context.Background(), "tenant-1", 1)
	fmt.Println("after 100ms:", out.Delay)
	// Output:
	// 200
	// 200
	// 200
	// 429, Retry-After 100ms
	// after 100ms: 0s
}

// A Composite enforces requests per minute and tokens per minute together,
// and names the limit that said no.
func ExampleComposite() {
	store := pacer.NewLocal(pacer.LocalOptions{Clock: clock.NewMockAt(time.Unix(1723075200, 0))})
	rpm, err := pacer.New(store, pacer.Options{Name: "rpm", QPS: 500.0 / 60, MaxBurst: 10})
	if err != nil {
		log.Fatal(err)
	}
	tpm, err := pacer.New(store, pacer.Options{Name: "tpm", QPS: 30000.0 / 60, MaxBurst: 2000})
	if err != nil {
		log.Fatal(err)
	}
	limits, err := pacer.NewComposite(rpm, tpm)
	if err != nil {
		log.Fatal(err)
	}
	for _, tokens := range []float64{1500, 1500, 400} {
		// One request of that many tokens: weight 1 for rpm, tokens for tpm.
		out, err := limits.RateLimit(context.Background(), "gpt-4o", 1, tokens)
		if err != nil {
			log.Fatal(err)
		}
		if out.Delay > 0 {
			fmt.Printf("%v tokens: rejected by %s, retry after %v\n", tokens, out.Pacer.Name(), out.Delay)
			continue
		}
		fmt.Printf("%v tokens: admitted\n", tokens)
	}
	// Output:
	// 1500 tokens: admitted
	// 1500 tokens: admitted
	// 400 tokens: rejected by tpm, retry after 3s
}

// The Redis store shares the rates of every process that uses the same
// Redis. (This example needs a Redis server, so it is compiled, not run.)
func ExampleNewRedis() {
	client := redis.NewClient(&redis.Options{
		Addr: "localhost:6379",
		// A pacer decision should fail fast when Redis is away.
		MaxRetries:            -1,                    // no retries: a failed command fails at once (decisions are never retried anyway)
		DialTimeout:           50 * time.Millisecond, // a dial to a host that does not answer gives up quickly
		DialerRetries:         1,                     // one dial per command, not five 100 ms apart (go-redis's default)
		ReadTimeout:           50 * time.Millisecond, // a server that stops answering costs at most this
		WriteTimeout:          50 * time.Millisecond, // the same for sending
		PoolTimeout:           50 * time.Millisecond, // a pool whose connections are all busy fails fast, not after ReadTimeout + 1 s
		ContextTimeoutEnabled: true,                  // the client gives up at the store's per-decision deadline too (RedisOptions.Timeout)
	})
	defer client.Close()

	store, err := pacer.NewRedis(client, pacer.RedisOptions{
		OnFailure:    pacer.FailClosed, // reject (429) while Redis is down
		FailureDelay: time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Preload(context.Background()); err != nil {
		log.Print(err) // optional: the first decision loads the script anyway
	}
	p, err := pacer.New(store, pacer.Options{Name: "api", QPS: 100, MaxBurst: 20})
	if err != nil {
		log.Fatal(err)
	}

	// The store gives up on Redis after RedisOptions.Timeout (50 ms) and
	// applies OnFailure; a caller's deadline shorter than that would make
	// the call an error instead.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	out, err := p.RateLimit(ctx, "tenant-1", 1)
	switch {
	case err != nil:
		log.Print(err) // invalid input, or ctx ended
	case out.Fallback != nil:
		log.Printf("Redis down (%v): retry after %v", out.Fallback, out.Delay)
	case out.Delay > 0:
		fmt.Println("429, retry after", out.Delay)
	default:
		fmt.Println("admitted")
	}
	if errors.Is(out.Fallback, pacer.ErrUnavailable) {
		fmt.Println("counted as an outage")
	}
}
