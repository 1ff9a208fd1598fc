package estimate_test

import (
	"fmt"
	"strings"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

func ExampleNaive() {
	req := &bulkhead.Request{
		Messages: []bulkhead.Message{{Role: "user", Content: "abcd"}},
	}
	r, err := estimate.Naive{}.Estimate(req)
	if err != nil {
		panic(err)
	}
	fmt.Printf("input %d, max output %d, reserved %d\n", r.Input, r.MaxOutput, r.Reserved)
	// Output:
	// input 1, max output 2048, reserved 2049
}

func ExampleNewModelAware() {
	est, err := estimate.NewModelAware(estimate.ModelAwareOptions{
		DefaultModel: "gpt-4o",                               // the bulkhead's Config.Model
		Overrides:    map[string]float64{"my-finetune": 3.2}, // characters per token
		OpaqueBlockTokens: estimate.OpaqueSurcharge{
			Default: 100,                             // any opaque block
			ByType:  map[string]int64{"image": 1500}, // images cost more
		},
		OnUnknownModel: func(model string) { fmt.Printf("unknown model %q: ratio 4\n", model) },
	})
	if err != nil {
		panic(err)
	}
	for _, req := range []*bulkhead.Request{
		{ // 37 characters at 3.7 for gpt-4o: 10 tokens
			Messages:  []bulkhead.Message{{Role: "user", Content: strings.Repeat("a", 37)}},
			MaxTokens: 100,
		},
		{ // a request's own model wins; MaxTokens 0 means the 2048 output cap
			Model:    "claude-sonnet-4-5-20250929",
			Messages: []bulkhead.Message{{Role: "user", Content: strings.Repeat("a", 39)}},
		},
		{ // an image and a tool call are charged, the text block is counted
			Messages: []bulkhead.Message{{Role: "user", Blocks: []bulkhead.Block{
				{Type: "image"}, {Type: "tool_use"}, {Type: "text", Text: strings.Repeat("a", 37)},
			}}},
			MaxTokens: 50,
		},
		{Model: "llama-3", System: "abcdefgh", MaxTokens: 10},
	} {
		r, err := est.Estimate(req)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%+v\n", r)
	}
	// Output:
	// {Input:10 MaxOutput:100 Reserved:110}
	// {Input:10 MaxOutput:2048 Reserved:2058}
	// {Input:1610 MaxOutput:50 Reserved:1660}
	// unknown model "llama-3": ratio 4
	// {Input:2 MaxOutput:10 Reserved:12}
}

func ExampleNewAdaptive() {
	est, err := estimate.NewAdaptive(estimate.AdaptiveOptions{
		Base:       estimate.ModelAwareOptions{DefaultModel: "gpt-4o"},
		MinSamples: 3,
	})
	if err != nil {
		panic(err)
	}
	req := &bulkhead.Request{
		Messages:  []bulkhead.Message{{Role: "user", Content: strings.Repeat("a", 37)}},
		MaxTokens: 100,
	}
	// In a bulkhead, Observe is wired to release events:
	//
	//	b.Subscribe(bulkhead.Hooks{Release: func(e bulkhead.ReleaseEvent) {
	//		if e.Usage != nil {
	//			_ = est.Observe(e.Request, *e.Usage)
	//		}
	//	}})
	for i := 1; i <= 3; i++ {
		// The provider reports 13 input tokens where we estimated 10.
		if err := est.Observe(req, bulkhead.Usage{Input: 13, Output: 40}); err != nil {
			panic(err)
		}
		r, _ := est.Estimate(req)
		fmt.Printf("after %d observations: input %d, max output %d\n", i, r.Input, r.MaxOutput)
	}
	for _, c := range est.Corrections() {
		fmt.Printf("%s: %d samples, factor %.2f, applied %.2f\n", c.Model, c.Samples, c.Factor, c.Applied)
	}
	est.Reset("gpt-4o")
	r, _ := est.Estimate(req)
	fmt.Printf("after Reset: input %d\n", r.Input)
	// Output:
	// after 1 observations: input 10, max output 100
	// after 2 observations: input 10, max output 100
	// after 3 observations: input 13, max output 100
	// gpt-4o: 3 samples, factor 1.30, applied 1.30
	// after Reset: input 10
}

func ExampleUTF16Len() {
	fmt.Println(estimate.UTF16Len("abcd"), estimate.UTF16Len("漢字"), estimate.UTF16Len("😀"), estimate.UTF16Len("e\u0301"))
	// Output:
	// 4 2 2 2
}
