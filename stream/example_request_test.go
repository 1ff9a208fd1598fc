package stream_test

import (
	"fmt"

	"github.com/llmbulkhead/bulkhead/stream"
)

func ExampleParseRequest() {
	body := []byte(`{
		"model": "claude-sonnet-4-5",
		"max_tokens": 1024,
		"stream": true,
		"system": "You answer in one sentence.",
		"messages": [
			{"role": "user", "content": "What is a bulkhead?"},
			{"role": "assistant", "content": "A wall that keeps a leak in one compartment."},
			{"role": "user", "content": [{"type": "text", "text": "And in software?"}]}
		]
	}`)
	call, err := stream.ParseRequest(stream.AnthropicMessages, body)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("model:", call.Request.Model)
	fmt.Println("max tokens:", call.Request.MaxTokens)
	fmt.Println("stream:", call.Stream)
	fmt.Println("messages:", len(call.Request.Messages))
	// Output:
	// model: claude-sonnet-4-5
	// max tokens: 1024
	// stream: true
	// messages: 3
}
