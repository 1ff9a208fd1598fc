package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// provider is a fake LLM provider on loopback. Its handler answers each
// request; it records every body it receives.
type provider struct {
	srv    *httptest.Server
	hits   atomic.Int64
	mu     sync.Mutex
	bodies []map[string]any
}

func newProvider(t *testing.T, h func(w http.ResponseWriter, body map[string]any)) *provider {
	t.Helper()
	p := &provider{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		var body map[string]any
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.bodies = append(p.bodies, body)
		p.mu.Unlock()
		h(w, body)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) lastBody() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bodies[len(p.bodies)-1]
}

// sse writes events as a server-sent event stream, flushing each.
func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, e := range events {
		io.WriteString(w, e)
		w.(http.Flusher).Flush()
	}
}

// rig is a bulkhead with a token budget, a client transport over it, and a
// channel of its release events.
type rig struct {
	b        *bulkhead.Bulkhead
	client   *http.Client
	releases chan bulkhead.ReleaseEvent
}

func newRig(t *testing.T, cfg bulkhead.Config) *rig {
	t.Helper()
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	r := &rig{b: b, releases: make(chan bulkhead.ReleaseEvent, 16)}
	unsub := b.Subscribe(bulkhead.Hooks{
		Release: func(e bulkhead.ReleaseEvent) { r.releases <- e },
	})
	r.client = &http.Client{Transport: &stream.Transport{
		Bulkhead: b,
		Base:     base,
		Options: func(req *http.Request, _ *stream.Call) []bulkhead.Option {
			if tag := req.Header.Get("X-Tag"); tag != "" {
				return []bulkhead.Option{bulkhead.WithTag(tag)}
			}
			return nil
		},
	}}
	t.Cleanup(func() {
		unsub()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
			t.Errorf("Shutdown = %+v, %v: an admission leaked", res, err)
		}
		base.CloseIdleConnections()
	})
	return r
}

func budgetConfig(model string, concurrent int, budget int64) bulkhead.Config {
	return bulkhead.Config{
		Model:         model,
		MaxConcurrent: concurrent,
		TokenBudget:   &bulkhead.TokenBudget{Budget: budget},
	}
}

// release waits for the next release event.
func (r *rig) release(t *testing.T) bulkhead.ReleaseEvent {
	t.Helper()
	select {
	case e := <-r.releases:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no release event")
		return bulkhead.ReleaseEvent{}
	}
}

// idle checks that nothing is held once the call has been released.
func (r *rig) idle(t *testing.T) {
	t.Helper()
	s := r.b.Stats()
	if s.Calls.InFlight != 0 || s.TokenBudget.InFlightTokens != 0 {
		t.Errorf("after release: %d in flight, %d tokens held", s.Calls.InFlight, s.TokenBudget.InFlightTokens)
	}
	if s.Calls.Released != s.Calls.Admitted {
		t.Errorf("admitted %d, released %d", s.Calls.Admitted, s.Calls.Released)
	}
	select {
	case e := <-r.releases:
		t.Errorf("a second release: %v", e)
	default:
	}
}

func wantUsage(t *testing.T, e bulkhead.ReleaseEvent, want bulkhead.Usage) {
	t.Helper()
	if e.Usage == nil || *e.Usage != want {
		t.Errorf("released with usage %v, want %+v", e.Usage, want)
	}
}

func openaiClient(r *rig, p *provider, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(p.srv.URL + "/v1"),
		option.WithAPIKey("test"),
		option.WithHTTPClient(r.client),
	}, opts...)...)
}

func anthropicClient(r *rig, p *provider, opts ...aoption.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]aoption.RequestOption{
		aoption.WithBaseURL(p.srv.URL),
		aoption.WithAPIKey("test"),
		aoption.WithHTTPClient(r.client),
	}, opts...)...)
}

var chatParams = openai.ChatCompletionNewParams{
	Model:               "gpt-4o",
	Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello in five words.")},
	MaxCompletionTokens: openai.Int(100),
}

func TestOpenAIChat(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o",
			"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?"},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":14,"completion_tokens":7,"total_tokens":21,
				"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`)
	})
	r := newRig(t, budgetConfig("gpt-4o", 4, 10_000))
	c := openaiClient(r, p)
	res, err := c.Chat.Completions.New(context.Background(), chatParams, option.WithHeader("X-Tag", "req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Message.Content != "Hello there, how are you?" {
		t.Errorf("content = %q", res.Choices[0].Message.Content)
	}
	e := r.release(t)
	wantUsage(t, e, bulkhead.Usage{Input: 14, Output: 7, CachedInput: 4, Reasoning: 2})
	if e.Tag != "req-1" {
		t.Errorf("tag = %q", e.Tag)
	}
	if e.Reserved != 107 { // 24 characters at 3.7 per token, plus 100
		t.Errorf("reserved %d", e.Reserved)
	}
	r.idle(t)
}

// chatStream is a chat completion stream: three deltas, then the usage chunk
// when the request asked for it.
func chatStream(w http.ResponseWriter, body map[string]any) {
	chunk := func(delta, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return fmt.Sprintf(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":%q},"finish_reason":%s}]}`+"\n\n", delta, f)
	}
	events := []string{chunk("Hello", ""), chunk(" there, ", ""), chunk("friend.", "stop")}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
		events = append(events, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":5,"total_tokens":19}}`+"\n\n")
	}
	sse(w, append(events, "data: [DONE]\n\n")...)
}

func TestOpenAIChatStream(t *testing.T) {
	for _, asked := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", asked), func(t *testing.T) {
			p := newProvider(t, chatStream)
			r := newRig(t, budgetConfig("gpt-4o", 4, 10_000))
			c := openaiClient(r, p)
			params := chatParams
			if asked {
				params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			}
			s := c.Chat.Completions.NewStreaming(context.Background(), params)
			var text strings.Builder
			usageChunks := 0
			for s.Next() {
				ch := s.Current()
				if len(ch.Choices) == 0 {
					usageChunks++
					continue
				}
				text.WriteString(ch.Choices[0].Delta.Content)
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if text.String() != "Hello there, friend." {
				t.Errorf("text = %q", text.String())
			}
			// The provider was always asked for usage; the caller sees the
			// usage chunk only when it asked for it.
			if so, _ := p.lastBody()["stream_options"].(map[string]any); so["include_usage"] != true {
				t.Errorf("upstream body stream_options = %v, want include_usage", p.lastBody()["stream_options"])
			}
			if want := map[bool]int{false: 0, true: 1}[asked]; usageChunks != want {
				t.Errorf("caller saw %d usage chunks, want %d", usageChunks, want)
			}
			wantUsage(t, r.release(t), bulkhead.Usage{Input: 14, Output: 5})
			r.idle(t)
		})
	}
}

func TestOpenAIChatStreamErrorMidStream(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, _ map[string]any) {
		sse(w,
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hello there"},"finish_reason":null}]}`+"\n\n",
			`data: {"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}`+"\n\n")
	})
	r := newRig(t, budgetConfig("gpt-4o", 4, 10_000))
	c := openaiClient(r, p)
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams)
	for s.Next() {
	}
	if s.Err() == nil {
		t.Fatal("no error from a stream that failed")
	}
	s.Close()
	e := r.release(t)
	if e.Usage == nil || e.Usage.Output == 0 {
		t.Errorf("released with usage %v, want the estimate of what was streamed", e.Usage)
	}
	r.idle(t)
}

// TestOpenAIRejected: a rejection is the bulkhead's error through the SDK,
// nothing reaches the provider, and the SDK's retries are bounded admission
// decisions.
func TestOpenAIRejected(t *testing.T) {
	p := newProvider(t, chatStream)
	r := newRig(t, budgetConfig("gpt-4o", 4, 50)) // 107 tokens never fit
	c := openaiClient(r, p, option.WithMaxRetries(0))
	_, err := c.Chat.Completions.New(context.Background(), chatParams)
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || rej.Reason != bulkhead.BudgetLimit || !rej.NeverFits() {
		t.Fatalf("error = %v, want a budget_limit *bulkhead.RejectedError", err)
	}
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams)
	if s.Next() || !errors.As(s.Err(), &rej) {
		t.Fatalf("stream error = %v, want a *bulkhead.RejectedError", s.Err())
	}
	s.Close()
	if p.hits.Load() != 0 {
		t.Errorf("the provider saw %d requests", p.hits.Load())
	}
	if n := r.b.Stats().Calls.Rejected; n != 2 {
		t.Errorf("%d rejections, want 2 (no retries)", n)
	}
}

func TestOpenAIRejectedRetriesAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the SDK's backoff (about 1.5 s)")
	}
	p := newProvider(t, chatStream)
	r := newRig(t, budgetConfig("gpt-4o", 4, 50))
	c := openaiClient(r, p) // the SDK's default: 2 retries
	_, err := c.Chat.Completions.New(context.Background(), chatParams)
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("error = %v, want a *bulkhead.RejectedError", err)
	}
	if n := r.b.Stats().Calls.Rejected; n != 3 {
		t.Errorf("%d admission attempts, want 3 (the first and 2 retries)", n)
	}
	if p.hits.Load() != 0 {
		t.Errorf("the provider saw %d requests", p.hits.Load())
	}
}

var messageParams = anthropic.MessageNewParams{
	Model:     "claude-sonnet-4-5",
	MaxTokens: 200,
	Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is a quaternion?"))},
}

func TestAnthropicMessages(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",
			"content":[{"type":"text","text":"A number system."}],"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":10,"cache_creation_input_tokens":2,"cache_read_input_tokens":5,"output_tokens":6}}`)
	})
	r := newRig(t, budgetConfig("claude-sonnet-4-5", 4, 10_000))
	c := anthropicClient(r, p)
	msg, err := c.Messages.New(context.Background(), messageParams)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != "A number system." {
		t.Errorf("content = %+v", msg.Content)
	}
	wantUsage(t, r.release(t), bulkhead.Usage{Input: 17, Output: 6, CachedInput: 5, CacheCreation: 2})
	r.idle(t)
}

func anthropicStream(w http.ResponseWriter, _ map[string]any) {
	sse(w,
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
		"event: ping\ndata: {\"type\": \"ping\"}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"A number \"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"system.\"}}\n\n",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":6}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

func TestAnthropicMessagesStream(t *testing.T) {
	p := newProvider(t, anthropicStream)
	r := newRig(t, budgetConfig("claude-sonnet-4-5", 4, 10_000))
	c := anthropicClient(r, p)
	msg := accumulate(t, c.Messages.NewStreaming(context.Background(), messageParams))
	if len(msg.Content) != 1 || msg.Content[0].Text != "A number system." || msg.Usage.OutputTokens != 6 {
		t.Errorf("accumulated %+v", msg)
	}
	wantUsage(t, r.release(t), bulkhead.Usage{Input: 17, Output: 6, CachedInput: 5, CacheCreation: 2})
	r.idle(t)
}

func TestAnthropicStreamErrorMidStream(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, _ map[string]any) {
		sse(w,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	})
	r := newRig(t, budgetConfig("claude-sonnet-4-5", 4, 10_000))
	c := anthropicClient(r, p)
	s := c.Messages.NewStreaming(context.Background(), messageParams)
	for s.Next() {
	}
	if s.Err() == nil {
		t.Fatal("no error from a stream that failed")
	}
	s.Close()
	e := r.release(t)
	if e.Usage == nil || e.Usage.Input != 10 {
		t.Errorf("released with usage %v, want the provider's input of 10", e.Usage)
	}
	r.idle(t)
}

func TestAnthropicRejected(t *testing.T) {
	p := newProvider(t, anthropicStream)
	r := newRig(t, budgetConfig("claude-sonnet-4-5", 0, 10_000)) // kill switch: no slot
	c := anthropicClient(r, p, aoption.WithMaxRetries(0))
	_, err := c.Messages.New(context.Background(), messageParams)
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || rej.Reason != bulkhead.ConcurrencyLimit {
		t.Fatalf("error = %v, want a concurrency_limit *bulkhead.RejectedError", err)
	}
	s := c.Messages.NewStreaming(context.Background(), messageParams)
	if s.Next() || !errors.As(s.Err(), &rej) {
		t.Fatalf("stream error = %v, want a *bulkhead.RejectedError", s.Err())
	}
	s.Close()
	if p.hits.Load() != 0 {
		t.Errorf("the provider saw %d requests", p.hits.Load())
	}
}

// TestClientGivesUp: a caller that stops reading and closes the stream
// releases at once, with the estimate of what it read.
func TestClientGivesUp(t *testing.T) {
	unblock := make(chan struct{})
	p := newProvider(t, func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hello there"},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-unblock // the provider would go on
	})
	defer close(unblock)
	r := newRig(t, budgetConfig("gpt-4o", 4, 10_000))
	c := openaiClient(r, p)
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams)
	if !s.Next() {
		t.Fatal(s.Err())
	}
	s.Close()
	e := r.release(t)
	if e.Usage == nil || e.Usage.Output == 0 {
		t.Errorf("released with usage %v, want the estimate of what was streamed", e.Usage)
	}
	r.idle(t)
}

// accumulate reads an Anthropic message stream to its end into a message.
func accumulate(t *testing.T, s *ssestream.Stream[anthropic.MessageStreamEventUnion]) anthropic.Message {
	t.Helper()
	msg := anthropic.Message{}
	for s.Next() {
		if err := msg.Accumulate(s.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	return msg
}
