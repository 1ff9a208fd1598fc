package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// openaiHeaders sets OpenAI's request ID, processing time and rate-limit
// headers: requests, and tokens (the account's TPM, else the tighter of
// its input and output token limits: OpenAI has one token limit).
func openaiHeaders(x *exchange, h http.Header, hr simprovider.Headroom, now time.Time) {
	h.Set("X-Request-Id", x.reqID)
	h.Set("Openai-Processing-Ms", itoa(now.Sub(x.start).Milliseconds()))
	set := func(kind string, w simprovider.Window) {
		if w.Limit == 0 {
			return
		}
		h.Set("X-Ratelimit-Limit-"+kind, itoa(w.Limit))
		h.Set("X-Ratelimit-Remaining-"+kind, itoa(w.Remaining))
		h.Set("X-Ratelimit-Reset-"+kind, max(w.Reset, 0).Round(time.Millisecond).String())
	}
	set("Requests", hr.Requests)
	tokens := hr.Tokens
	if tokens.Limit == 0 {
		tokens = tightest(hr.InputTokens, hr.OutputTokens)
	}
	set("Tokens", tokens)
}

type openaiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func openaiErrorBody(status int, e *apiError) []byte {
	var b openaiError
	b.Error.Message = e.msg
	b.Error.Type = "invalid_request_error"
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code != "" {
		b.Error.Code = &e.code
	}
	switch e.kind {
	case rateLimited:
		b.Error.Type = "tokens"
		if e.limit == simprovider.RequestLimit {
			b.Error.Type = "requests"
		}
		code := "rate_limit_exceeded"
		b.Error.Code = &code
	case overloaded:
		b.Error.Type = "service_unavailable_error"
		code := "server_is_overloaded"
		b.Error.Code = &code
	case internal:
		b.Error.Type = "server_error"
	}
	return mustJSON(b)
}

func openaiLimitMessage(model string, e *apiError) string {
	if e.kind == overloaded {
		return fmt.Sprintf("The server is overloaded: the simulated account has %d of its %d concurrent requests in flight. Please try again later.", e.used, e.max)
	}
	return fmt.Sprintf("Rate limit reached for %s in organization org-simulated on %s: Limit %d, Used %d, Requested %d. Please try again in %v.",
		model, limitNames[e.limit].openai, e.max, e.used, e.requested, e.retryAfter.Round(time.Millisecond))
}

type chatUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
		AudioTokens  int64 `json:"audio_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens          int64 `json:"reasoning_tokens"`
		AudioTokens              int64 `json:"audio_tokens"`
		AcceptedPredictionTokens int64 `json:"accepted_prediction_tokens"`
		RejectedPredictionTokens int64 `json:"rejected_prediction_tokens"`
	} `json:"completion_tokens_details"`
}

func newChatUsage(u simprovider.Usage) *chatUsage {
	return &chatUsage{PromptTokens: u.Input, CompletionTokens: u.Output, TotalTokens: u.Input + u.Output}
}

type chatMessage struct {
	Role        string  `json:"role"`
	Content     string  `json:"content"`
	Refusal     *string `json:"refusal"`
	Annotations []any   `json:"annotations"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             *chatUsage   `json:"usage"`
	ServiceTier       string       `json:"service_tier"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chunkDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	Logprobs     *struct{}  `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type chatChunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	ServiceTier       string        `json:"service_tier"`
	SystemFingerprint string        `json:"system_fingerprint"`
	Choices           []chunkChoice `json:"choices"`
	// Usage is omitted without stream_options.include_usage; with it, it
	// is null on every chunk but the last.
	Usage any `json:"usage,omitempty"`
}

// chatFinish is OpenAI's finish_reason for a stop reason.
func chatFinish(stop string) string {
	if stop == "max_tokens" {
		return "length"
	}
	return "stop"
}

// openaiDialect is what OpenAI's two APIs share: headers and errors.
type openaiDialect struct{}

func (openaiDialect) headers(x *exchange, h http.Header, hr simprovider.Headroom, now time.Time) {
	openaiHeaders(x, h, hr, now)
}

func (openaiDialect) errorBody(status int, e *apiError, _ string) []byte {
	return openaiErrorBody(status, e)
}

func (openaiDialect) limitMessage(model string, e *apiError) string {
	return openaiLimitMessage(model, e)
}

type chatDialect struct{ openaiDialect }

func (chatDialect) api() api         { return chatAPI }
func (chatDialect) idPrefix() string { return "chatcmpl-sim" }

func (chatDialect) complete(x *exchange, resp simprovider.Response) []byte {
	return mustJSON(chatCompletion{
		ID: x.id, Object: "chat.completion", Created: x.start.Unix(), Model: x.call.model,
		Choices: []chatChoice{{Message: chatMessage{Role: "assistant", Content: words(0, resp.Usage.Output), Annotations: []any{}},
			FinishReason: chatFinish(resp.StopReason)}},
		Usage: newChatUsage(resp.Usage), ServiceTier: "default", SystemFingerprint: "fp_simulated",
	})
}

func (chatDialect) chunkOf(x *exchange, choices ...chunkChoice) chatChunk {
	c := chatChunk{ID: x.id, Object: "chat.completion.chunk", Created: x.start.Unix(), Model: x.call.model,
		ServiceTier: "default", SystemFingerprint: "fp_simulated", Choices: choices}
	if x.call.includeUsage {
		c.Usage = json.RawMessage("null")
	}
	return c
}

func (d chatDialect) open(x *exchange) {
	empty := ""
	x.event("", d.chunkOf(x, chunkChoice{Delta: chunkDelta{Role: "assistant", Content: &empty}}))
}

func (d chatDialect) chunk(x *exchange, text string, _ simprovider.Usage) {
	x.event("", d.chunkOf(x, chunkChoice{Delta: chunkDelta{Content: &text}}))
}

func (d chatDialect) finish(x *exchange, resp simprovider.Response) {
	reason := chatFinish(resp.StopReason)
	x.event("", d.chunkOf(x, chunkChoice{FinishReason: &reason}))
	if x.call.includeUsage {
		c := d.chunkOf(x)
		c.Choices = []chunkChoice{}
		c.Usage = newChatUsage(resp.Usage)
		x.event("", c)
	}
	x.write([]byte("data: [DONE]\n\n"))
}

type responsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

type outputItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Background         bool            `json:"background"`
	Error              *struct{}       `json:"error"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	Model              string          `json:"model"`
	Output             []outputItem    `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Reasoning          map[string]any  `json:"reasoning"`
	ServiceTier        string          `json:"service_tier"`
	Temperature        float64         `json:"temperature"`
	Text               map[string]any  `json:"text"`
	ToolChoice         string          `json:"tool_choice"`
	Tools              []any           `json:"tools"`
	TopP               float64         `json:"top_p"`
	Truncation         string          `json:"truncation"`
	Usage              *responsesUsage `json:"usage"`
	User               *string         `json:"user"`
	Metadata           map[string]any  `json:"metadata"`
}

type responsesDialect struct{ openaiDialect }

func (responsesDialect) api() api         { return responsesAPI }
func (responsesDialect) idPrefix() string { return "resp_sim" }

// itemID is the ID of the response's one output message.
func (responsesDialect) itemID(x *exchange) string { return "msg_sim" + x.id[len("resp_sim"):] }

// object is the response: in progress (resp nil), or done.
func (d responsesDialect) object(x *exchange, resp *simprovider.Response) *responseObject {
	o := &responseObject{
		ID: x.id, Object: "response", CreatedAt: x.start.Unix(), Status: "in_progress", Model: x.call.model,
		Output: []outputItem{}, ParallelToolCalls: true, Reasoning: map[string]any{"effort": nil, "summary": nil},
		ServiceTier: "default", Temperature: 1, Text: map[string]any{"format": map[string]any{"type": "text"}},
		ToolChoice: "auto", Tools: []any{}, TopP: 1, Truncation: "disabled", Metadata: map[string]any{},
	}
	if x.call.maxTokens > 0 {
		o.MaxOutputTokens = &x.call.maxTokens
	}
	if resp == nil {
		return o
	}
	o.Status = "completed"
	item := d.item(x, "completed", words(0, resp.Usage.Output))
	if resp.StopReason == "max_tokens" {
		o.Status, item.Status = "incomplete", "incomplete"
		o.IncompleteDetails = map[string]string{"reason": "max_output_tokens"}
	}
	o.Output = []outputItem{item}
	o.Usage = &responsesUsage{InputTokens: resp.Usage.Input, OutputTokens: resp.Usage.Output, TotalTokens: resp.Usage.Input + resp.Usage.Output}
	return o
}

func (d responsesDialect) item(x *exchange, status, text string) outputItem {
	it := outputItem{Type: "message", ID: d.itemID(x), Status: status, Role: "assistant", Content: []outputText{}}
	if status != "in_progress" {
		it.Content = []outputText{textPart(text)}
	}
	return it
}

func textPart(text string) outputText {
	return outputText{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

func (d responsesDialect) complete(x *exchange, resp simprovider.Response) []byte {
	return mustJSON(d.object(x, &resp))
}

// send writes one event of the stream, numbered.
func (responsesDialect) send(x *exchange, fields map[string]any) {
	typ := fields["type"].(string)
	delete(fields, "type")
	fields["sequence_number"] = x.seq
	x.seq++
	x.typed(typ, fields)
}

func (d responsesDialect) open(x *exchange) {
	d.send(x, map[string]any{"type": "response.created", "response": d.object(x, nil)})
	d.send(x, map[string]any{"type": "response.in_progress", "response": d.object(x, nil)})
	d.send(x, map[string]any{"type": "response.output_item.added", "output_index": 0, "item": d.item(x, "in_progress", "")})
	d.send(x, map[string]any{"type": "response.content_part.added", "item_id": d.itemID(x), "output_index": 0, "content_index": 0,
		"part": textPart("")})
}

func (d responsesDialect) chunk(x *exchange, text string, _ simprovider.Usage) {
	d.send(x, map[string]any{"type": "response.output_text.delta", "item_id": d.itemID(x), "output_index": 0, "content_index": 0,
		"delta": text, "logprobs": []any{}})
}

func (d responsesDialect) finish(x *exchange, resp simprovider.Response) {
	o := d.object(x, &resp)
	item := o.Output[0]
	text := item.Content[0].Text
	d.send(x, map[string]any{"type": "response.output_text.done", "item_id": item.ID, "output_index": 0, "content_index": 0,
		"text": text, "logprobs": []any{}})
	d.send(x, map[string]any{"type": "response.content_part.done", "item_id": item.ID, "output_index": 0, "content_index": 0,
		"part": item.Content[0]})
	d.send(x, map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item})
	d.send(x, map[string]any{"type": "response." + o.Status, "response": o})
}
