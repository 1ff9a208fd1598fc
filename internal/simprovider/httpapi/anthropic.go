package httpapi

import (
	"fmt"
	"net/http"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

type anthropicUsage struct {
	InputTokens              int64  `json:"input_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
	OutputTokens             int64  `json:"output_tokens"`
	ServiceTier              string `json:"service_tier"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicMessage struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []textBlock    `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

type anthropicError struct {
	Type      string               `json:"type"`
	Error     anthropicErrorDetail `json:"error"`
	RequestID string               `json:"request_id"`
}

type textDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type stopDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type anthropicDialect struct{}

func (anthropicDialect) api() api         { return messagesAPI }
func (anthropicDialect) idPrefix() string { return "msg_sim" }

// headers sets Anthropic's request ID and rate-limit headers, the resets
// as RFC 3339 times (rounded up to the second): requests, input tokens,
// output tokens, and tokens (the account's TPM, else the tighter of its
// input and output token limits, as Anthropic's says the most restrictive
// limit in effect).
func (anthropicDialect) headers(x *exchange, h http.Header, hr simprovider.Headroom, now time.Time) {
	h.Set("Request-Id", x.reqID)
	set := func(kind string, w simprovider.Window) {
		if w.Limit == 0 {
			return
		}
		at := now.Add(max(w.Reset, 0))
		if t := at.Truncate(time.Second); t.Before(at) {
			at = t.Add(time.Second)
		}
		h.Set("Anthropic-Ratelimit-"+kind+"-Limit", itoa(w.Limit))
		h.Set("Anthropic-Ratelimit-"+kind+"-Remaining", itoa(w.Remaining))
		h.Set("Anthropic-Ratelimit-"+kind+"-Reset", at.UTC().Format(time.RFC3339))
	}
	set("Requests", hr.Requests)
	tokens := hr.Tokens
	if tokens.Limit == 0 {
		tokens = tightest(hr.InputTokens, hr.OutputTokens)
	}
	set("Tokens", tokens)
	set("Input-Tokens", hr.InputTokens)
	set("Output-Tokens", hr.OutputTokens)
}

func (anthropicDialect) errorBody(status int, e *apiError, reqID string) []byte {
	typ := map[errKind]string{badRequest: "invalid_request_error", notFound: "not_found_error", methodNotAllowed: "invalid_request_error",
		tooLarge: "request_too_large", rateLimited: "rate_limit_error", overloaded: "overloaded_error", internal: "api_error"}[e.kind]
	return mustJSON(anthropicError{Type: "error", Error: anthropicErrorDetail{Type: typ, Message: e.msg}, RequestID: reqID})
}

func (anthropicDialect) limitMessage(_ string, e *apiError) string {
	if e.kind == overloaded {
		return "Overloaded"
	}
	return fmt.Sprintf("This request would exceed the rate limit for your organization of %d %s per minute (%d used, %d requested). Please try again later.",
		e.max, limitNames[e.limit].unit, e.used, e.requested)
}

func (anthropicDialect) message(x *exchange, text string, stop *string, u anthropicUsage) anthropicMessage {
	m := anthropicMessage{ID: x.id, Type: "message", Role: "assistant", Model: x.call.model, Content: []textBlock{}, StopReason: stop, Usage: u}
	if stop != nil {
		m.Content = []textBlock{{Type: "text", Text: text}}
	}
	return m
}

func (d anthropicDialect) complete(x *exchange, resp simprovider.Response) []byte {
	stop := resp.StopReason
	return mustJSON(d.message(x, words(0, resp.Usage.Output), &stop,
		anthropicUsage{InputTokens: resp.Usage.Input, OutputTokens: resp.Usage.Output, ServiceTier: "standard"}))
}

func (d anthropicDialect) open(x *exchange) {
	x.typed("message_start", map[string]any{
		"message": d.message(x, "", nil, anthropicUsage{InputTokens: x.req.InputTokens, OutputTokens: 1, ServiceTier: "standard"})})
	x.typed("content_block_start", map[string]any{"index": 0, "content_block": textBlock{Type: "text"}})
	x.typed("ping", nil)
}

func (anthropicDialect) chunk(x *exchange, text string, _ simprovider.Usage) {
	x.typed("content_block_delta", map[string]any{"index": 0, "delta": textDelta{Type: "text_delta", Text: text}})
}

func (anthropicDialect) finish(x *exchange, resp simprovider.Response) {
	x.typed("content_block_stop", map[string]any{"index": 0})
	x.typed("message_delta", map[string]any{
		"delta": stopDelta{StopReason: resp.StopReason},
		"usage": map[string]int64{"output_tokens": resp.Usage.Output}})
	x.typed("message_stop", nil)
}
