package httpapi

import (
	"fmt"
	"net/http"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

type geminiPart struct {
	Text string `json:"text"`
}

type geminiContent struct {
	Parts []geminiPart `json:"parts"`
	Role  string       `json:"role"`
}

type geminiCandidate struct {
	Content      geminiContent `json:"content"`
	FinishReason string        `json:"finishReason,omitempty"`
	Index        int           `json:"index"`
}

type geminiModality struct {
	Modality   string `json:"modality"`
	TokenCount int64  `json:"tokenCount"`
}

type geminiUsage struct {
	PromptTokenCount     int64            `json:"promptTokenCount"`
	CandidatesTokenCount int64            `json:"candidatesTokenCount"`
	TotalTokenCount      int64            `json:"totalTokenCount"`
	PromptTokensDetails  []geminiModality `json:"promptTokensDetails"`
}

type geminiResponse struct {
	Candidates    []geminiCandidate `json:"candidates"`
	UsageMetadata geminiUsage       `json:"usageMetadata"`
	ModelVersion  string            `json:"modelVersion"`
	ResponseID    string            `json:"responseId"`
}

type geminiError struct {
	Error struct {
		Code    int                 `json:"code"`
		Message string              `json:"message"`
		Status  string              `json:"status"`
		Details []map[string]string `json:"details,omitempty"`
	} `json:"error"`
}

type geminiDialect struct{}

func (geminiDialect) api() api         { return geminiAPI }
func (geminiDialect) idPrefix() string { return "sim" }

// headers sets nothing: Gemini sends no rate-limit headers.
func (geminiDialect) headers(*exchange, http.Header, simprovider.Headroom, time.Time) {}

func (geminiDialect) errorBody(status int, e *apiError, _ string) []byte {
	st := map[errKind]string{badRequest: "INVALID_ARGUMENT", notFound: "NOT_FOUND", methodNotAllowed: "INVALID_ARGUMENT",
		tooLarge: "INVALID_ARGUMENT", rateLimited: "RESOURCE_EXHAUSTED", overloaded: "UNAVAILABLE", internal: "INTERNAL"}[e.kind]
	var b geminiError
	b.Error.Code, b.Error.Message, b.Error.Status = status, e.msg, st
	if e.kind == rateLimited || e.kind == overloaded {
		b.Error.Details = []map[string]string{{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": fmt.Sprintf("%.3fs", e.retryAfter.Seconds())}}
	}
	return mustJSON(b)
}

func (geminiDialect) limitMessage(_ string, e *apiError) string {
	if e.kind == overloaded {
		return "The model is overloaded. Please try again later."
	}
	return fmt.Sprintf("You exceeded your current quota: %d %s per minute (%d used, %d requested). Please retry in %v.",
		e.max, limitNames[e.limit].unit, e.used, e.requested, e.retryAfter.Round(time.Millisecond))
}

// response is one response or chunk: its text, its finish reason ("" for
// none yet) and the usage so far.
func (geminiDialect) response(x *exchange, text, finish string, u simprovider.Usage) geminiResponse {
	return geminiResponse{
		Candidates: []geminiCandidate{{Content: geminiContent{Parts: []geminiPart{{Text: text}}, Role: "model"}, FinishReason: finish}},
		UsageMetadata: geminiUsage{PromptTokenCount: u.Input, CandidatesTokenCount: u.Output, TotalTokenCount: u.Input + u.Output,
			PromptTokensDetails: []geminiModality{{Modality: "TEXT", TokenCount: u.Input}}},
		ModelVersion: x.call.model, ResponseID: x.id,
	}
}

// geminiFinish is Gemini's finishReason for a stop reason.
func geminiFinish(stop string) string {
	if stop == "max_tokens" {
		return "MAX_TOKENS"
	}
	return "STOP"
}

func (d geminiDialect) complete(x *exchange, resp simprovider.Response) []byte {
	return mustJSON(d.response(x, words(0, resp.Usage.Output), geminiFinish(resp.StopReason), resp.Usage))
}

// open starts a stream that is not server-sent events: a JSON array.
func (geminiDialect) open(x *exchange) {
	if !x.call.sse {
		x.write([]byte("["))
	}
}

// element writes one chunk of the stream: an event, or an element of the
// array.
func (geminiDialect) element(x *exchange, r geminiResponse) {
	if x.call.sse {
		x.event("", r)
		return
	}
	if x.seq > 0 {
		x.write([]byte(",\r\n"))
	}
	x.seq++
	x.write(mustJSON(r))
}

func (d geminiDialect) chunk(x *exchange, text string, u simprovider.Usage) {
	d.element(x, d.response(x, text, "", u))
}

func (d geminiDialect) finish(x *exchange, resp simprovider.Response) {
	d.element(x, d.response(x, "", geminiFinish(resp.StopReason), resp.Usage))
	if !x.call.sse {
		x.write([]byte("]\n"))
	}
}
