package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

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
	defer b.Shutdown(context.Background())

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
	defer b.Shutdown(context.Background())

	request := &bulkhead.Request{
		System:    "You are terse.",
		Messages:  []bulkhead.Message{{Role: "user", Content: "Summarise the plot of Hamlet."}},
		MaxTokens: 500,
	}
	permit, err := b.Acquire(context.Background(), request)
	if err != nil {
		panic(err)
	}
	fmt.Println("reserved:", permit.Reservation().Reserved)

	// The only slot is taken: a second call is shed at once.
	_, err = b.Acquire(context.Background(), request)
	var rejected *bulkhead.RejectedError
	if errors.As(err, &rejected) {
		fmt.Println("rejected:", rejected.Reason, "in flight:", rejected.Detail.InFlight)
	}

	// Release with the provider's usage: the unused reservation is refunded.
	_ = permit.Release(&bulkhead.Usage{Input: 12, Output: 180})
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
	defer b.Shutdown(context.Background())

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
	defer b.Shutdown(context.Background())

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
	permit, _ := b.Acquire(context.Background(), &bulkhead.Request{})
	_, _ = b.Acquire(context.Background(), &bulkhead.Request{})
	_ = permit.Release(nil)

	// Shutdown delivers every pending event and ends the goroutines.
	_, _ = b.Shutdown(context.Background())
	// Output:
	// admit, revision 0
	// reject: concurrency_limit
	// release
}

func ExampleNew() {
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: 16,
		MaxQueue:      64,
		QueueTimeout:  2 * time.Second,
		TokenBudget:   &bulkhead.TokenBudget{Budget: 400_000, HighPriorityReserve: 50_000},
	})
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())
	fmt.Println(b.Limits().MaxConcurrent, b.Limits().TokenBudget.Budget)

	_, err = bulkhead.New(bulkhead.Config{MaxConcurrent: -1})
	fmt.Println(err)
	// Output:
	// 16 400000
	// bulkhead: invalid Config.MaxConcurrent: must be >= 0, got -1
}

func ExampleBulkhead_Estimate() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	b, _ := bulkhead.New(cfg)
	defer b.Shutdown(context.Background())

	request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: strings.Repeat("a", 37)}}, MaxTokens: 100}
	r, _ := b.Estimate(request)
	fmt.Printf("%+v\n", *r)

	// The estimate round-trips as a per-call override.
	permit, _ := b.Acquire(context.Background(), request, bulkhead.WithReservation(*r))
	fmt.Println(permit.Reservation().Reserved)
	_ = permit.Release(nil)
	// Output:
	// {Input:10 MaxOutput:100 Reserved:110}
	// 110
}

func ExampleBulkhead_SetBudget() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	b, _ := bulkhead.New(cfg)
	defer b.Shutdown(context.Background())

	res, _ := b.SetBudget(0) // a kill switch for token-bearing calls
	fmt.Println(res.Applied, res.Current.Revision, res.Current.TokenBudget.Budget)
	_, err := b.Acquire(context.Background(), &bulkhead.Request{MaxTokens: 10})
	fmt.Println(err)
	// Output:
	// true 1 0
	// bulkhead: rejected: budget_limit: 10 tokens requested, 0 of 0 available (never fits)
}

func ExampleBulkhead_Shutdown() {
	b, _ := bulkhead.New(bulkhead.Interactive("gpt-4o", 4))
	permit, _ := b.Acquire(context.Background(), &bulkhead.Request{})
	go func() { _ = permit.Release(nil) }() // work in flight finishes

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := b.Shutdown(ctx)
	fmt.Println(res.Drained, err)
	_, err = b.Acquire(context.Background(), &bulkhead.Request{})
	fmt.Println(errors.Is(err, bulkhead.ErrShutdown))
	// Output:
	// true <nil>
	// true
}

func ExamplePermit_ReportUsage() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	b, _ := bulkhead.New(cfg)
	defer b.Shutdown(context.Background())

	permit, _ := b.Acquire(context.Background(), &bulkhead.Request{MaxTokens: 1000},
		bulkhead.WithReservation(bulkhead.Reservation{Input: 200, MaxOutput: 1000}))
	// A stream reports as it goes; a progressive hold keeps only what the
	// stream may still produce.
	rep, _ := permit.ReportUsage(bulkhead.Usage{Input: 200, Output: 300}, &bulkhead.Progressive{RemainingOutput: 700})
	fmt.Println(rep.Sequence, rep.Held, b.Stats().TokenBudget.InFlightTokens)
	_ = permit.Release(&bulkhead.Usage{Input: 200, Output: 420})
	fmt.Println(b.Stats().TokenBudget.TotalConsumed)
	// Output:
	// 1 700 700
	// 620
}

func ExampleWithTag() {
	b, _ := bulkhead.New(bulkhead.Interactive("gpt-4o", 0)) // closed to new calls
	defer b.Shutdown(context.Background())

	_, err := b.Acquire(context.Background(), &bulkhead.Request{}, bulkhead.WithTag("req-42"))
	fmt.Println(err)
	// Output:
	// bulkhead: rejected: concurrency_limit: MaxConcurrent is 0: closed to new calls (tag "req-42")
}

func ExampleRejectedError_NeverFits() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1000}
	b, _ := bulkhead.New(cfg)
	defer b.Shutdown(context.Background())

	huge := &bulkhead.Request{MaxTokens: 5000}
	_, err := b.Acquire(context.Background(), huge)
	var rej *bulkhead.RejectedError
	if errors.As(err, &rej) && rej.NeverFits() {
		fmt.Println("413: too large for this budget") // not worth retrying
	}
	// Output:
	// 413: too large for this budget
}

func ExampleWithMode() {
	b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 1))
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())
	busy, _ := b.Acquire(context.Background(), &bulkhead.Request{}) // the only slot
	defer busy.Release(nil)

	request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "Say hello."}}}
	reply, err := bulkhead.Run(context.Background(), b, request,
		func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
			if bp := rc.Bypass(); bp != nil {
				fmt.Println("would have been rejected:", bp.Reason)
			}
			text, usage, err := callProvider(ctx, request)
			if err != nil {
				return "", err
			}
			return text, rc.SetUsage(usage)
		}, bulkhead.WithMode(bulkhead.Observe))
	fmt.Println(reply, err)
	o := b.Stats().Observe
	fmt.Println("bypassed:", o.Bypassed, "tokens:", o.InputTokens, o.OutputTokens)
	// Output:
	// would have been rejected: concurrency_limit
	// hello! <nil>
	// bypassed: 1 tokens: 12 3
}

func ExampleDedupConfig() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.Dedup = &bulkhead.DedupConfig{} // the default key: the whole request
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())

	request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "Say hello."}}}
	started, release := make(chan struct{}), make(chan struct{})
	leader := make(chan string)
	go func() {
		reply, _ := bulkhead.Run(context.Background(), b, request, func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
			close(started)
			<-release // the provider takes its time
			return "hello!", nil
		})
		leader <- reply
	}()
	<-started
	// An identical call while the first is in flight shares its answer.
	follower := make(chan string)
	go func() {
		reply, _ := bulkhead.Run(context.Background(), b, &bulkhead.Request{Messages: request.Messages},
			func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
				return "", errors.New("not called: it shares the first call's result")
			})
		follower <- reply
	}()
	for b.Stats().Dedup.Hits == 0 {
		runtime.Gosched()
	}
	close(release)
	fmt.Println(<-leader, <-follower)
	st := b.Stats()
	fmt.Println("admitted:", st.Calls.Admitted, "shared:", st.Dedup.Hits)
	// Output:
	// hello! hello!
	// admitted: 1 shared: 1
}

func ExampleWithDedupScope() {
	cfg := bulkhead.Interactive("gpt-4o", 4)
	cfg.Dedup = &bulkhead.DedupConfig{
		// Share only answers to the same question, whatever else differs.
		KeyFunc: func(r *bulkhead.Request) string { return r.Messages[len(r.Messages)-1].Content },
		// Each caller gets a stream of its own.
		ShareResult: func(v any) (any, error) {
			text, err := io.ReadAll(v.(io.Reader))
			return strings.NewReader(string(text)), err
		},
	}
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())

	ask := func(tenant string) (io.Reader, error) {
		request := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "What is a bulkhead?"}}}
		return bulkhead.Run(context.Background(), b, request, func(ctx context.Context, rc *bulkhead.RunContext) (io.Reader, error) {
			return strings.NewReader("a partition that keeps a leak in one compartment"), nil
		}, bulkhead.WithDedupScope(tenant)) // tenants never share
	}
	body, err := ask("tenant-a")
	if err != nil {
		panic(err)
	}
	text, _ := io.ReadAll(body)
	fmt.Println(string(text))
	// Output:
	// a partition that keeps a leak in one compartment
}
