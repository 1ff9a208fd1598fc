package bulkhead_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/llmbulkhead/bulkhead"
)

// callProvider stands in for a real LLM client call.
func callProvider(ctx context.Context, r *bulkhead.Request) (string, bulkhead.Usage, error) {
	return "hello!", bulkhead.Usage{Input: 12, Output: 3}, nil
}

func ExampleRun() {
	b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 8))
	if err != nil {
		panic(err)
	}
	defer func() {
		b.Close()
		_, _ = b.Drain(context.Background())
	}()

	request := &bulkhead.Request{
		Messages:  []bulkhead.Message{{Role: "user", Content: "Say hello."}},
		MaxTokens: 64,
	}
	reply, err := bulkhead.Run(context.Background(), b, request,
		func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
			text, usage, err := callProvider(ctx, request)
			if err != nil {
				return "", err
			}
			return text, rc.SetUsage(usage)
		})
	if errors.Is(err, bulkhead.ErrRejected) {
		fmt.Println("shed:", err)
		return
	}
	fmt.Println(reply)
	// Output: hello!
}

func ExampleBulkhead_Acquire() {
	cfg := bulkhead.Interactive("claude-sonnet-4-5", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer func() {
		b.Close()
		_, _ = b.Drain(context.Background())
	}()

	request := &bulkhead.Request{
		System:    "You are terse.",
		Messages:  []bulkhead.Message{{Role: "user", Content: "Summarise the plot of Hamlet."}},
		MaxTokens: 500,
	}
	tok, err := b.Acquire(context.Background(), request)
	if err != nil {
		panic(err)
	}
	fmt.Println("reserved:", tok.Reservation().Reserved)

	// The only slot is taken: a second call is shed at once.
	_, err = b.Acquire(context.Background(), request)
	var rejected *bulkhead.RejectedError
	if errors.As(err, &rejected) {
		fmt.Println("rejected:", rejected.Reason, "in flight:", rejected.Detail.InFlight)
	}

	// Release with the provider's usage: the unused reservation is refunded.
	_ = tok.Release(&bulkhead.Usage{Input: 12, Output: 180})
	fmt.Println("refunded:", b.Stats().TokenBudget.TotalRefunded)
	// Output:
	// reserved: 512
	// rejected: concurrency_limit in flight: 1
	// refunded: 320
}

func ExampleBulkhead_WouldAdmit() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000, HighPriorityReserve: 200}
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer func() {
		b.Close()
		_, _ = b.Drain(context.Background())
	}()

	big := &bulkhead.Request{Messages: []bulkhead.Message{{Content: "..."}}, MaxTokens: 899}
	d, _ := b.WouldAdmit(big, bulkhead.WithDetail())
	fmt.Println(d.Admit, d.Reason, d.Detail.TokenBudget.EffectiveBudget)
	d, _ = b.WouldAdmit(big, bulkhead.WithPriority(bulkhead.High))
	fmt.Println(d.Admit)
	// Output:
	// false budget_limit 800
	// true
}

func ExampleBulkhead_ApplyLimits() {
	// Start closed (fail-closed), then open from a control plane.
	cfg := bulkhead.Batch("gpt-4o", 0)
	cfg.InitialRevision = 41
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer func() {
		b.Close()
		_, _ = b.Drain(context.Background())
	}()

	res, err := b.ApplyLimits(bulkhead.Limits{Revision: 42, MaxConcurrent: 16, MaxQueue: 32})
	fmt.Println(res.Applied, res.Current.MaxConcurrent, err)
	res, _ = b.ApplyLimits(bulkhead.Limits{Revision: 40, MaxConcurrent: 1})
	fmt.Println(res.Applied, res.Reason)
	// Output:
	// true 16 <nil>
	// false stale_revision
}

func ExampleBulkhead_Subscribe() {
	b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 1))
	if err != nil {
		panic(err)
	}
	b.Subscribe(bulkhead.Hooks{
		Admit:  func(e bulkhead.AdmitEvent) { fmt.Println("admit, revision", e.LimitRevision) },
		Reject: func(e bulkhead.RejectEvent) { fmt.Println("reject:", e.Reason) },
		Release: func(e bulkhead.ReleaseEvent) {
			fmt.Println("release")
		},
	})
	tok, _ := b.Acquire(context.Background(), &bulkhead.Request{})
	_, _ = b.Acquire(context.Background(), &bulkhead.Request{})
	_ = tok.Release(nil)

	// Close and Drain deliver every pending event and end the goroutines.
	b.Close()
	_, _ = b.Drain(context.Background())
	// Output:
	// admit, revision 0
	// reject: concurrency_limit
	// release
}
