package stream_test

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// A streamed Anthropic response metered against a permit: the caller copies
// the body on (here to io.Discard), and the meter releases the permit with
// the provider's own usage when the stream ends.
func ExampleNewMeter() {
	cfg := bulkhead.Interactive("claude-sonnet-4-5", 10)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100_000}
	b, err := bulkhead.New(cfg)
	if err != nil {
		panic(err)
	}
	defer b.Shutdown(context.Background())

	p, err := b.Acquire(context.Background(), &bulkhead.Request{
		Messages:  []bulkhead.Message{{Role: "user", Content: "Say hello."}},
		MaxTokens: 1024,
	})
	if err != nil {
		panic(err)
	}

	body := io.NopCloser(strings.NewReader(`event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}

event: message_stop
data: {"type":"message_stop"}

`))
	m, err := stream.NewMeter(body, p, stream.MeterOptions{Format: stream.AnthropicMessages, SSE: true, Model: "claude-sonnet-4-5"})
	if err != nil {
		panic(err)
	}
	defer m.Close()

	if _, err := io.Copy(io.Discard, m); err != nil {
		panic(err)
	}
	u, exact := m.Usage()
	fmt.Printf("settled: %v, input %d, output %d, exact: %v\n", m.Settled(), u.Input, u.Output, exact)
	// Output: settled: true, input 12, output 5, exact: true
}
