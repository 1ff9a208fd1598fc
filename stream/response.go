package stream

import (
	"slices"

	"github.com/llmbulkhead/bulkhead/internal/jsondom"
)

// ResponseInfo is what a response says of itself, as a Meter with
// MeterOptions.RecordResponse reads it: for traces and logs.
type ResponseInfo struct {
	// ID is the provider's ID of the response (OpenAI's "chatcmpl-..." or
	// "resp_...", Anthropic's "msg_...", Gemini's responseId); "" when it
	// gave none.
	ID string
	// Model is the model that answered, as the provider names it (often
	// more precise than the model asked for, such as
	// "gpt-4o-2024-08-06"); "" when it gave none.
	Model string
	// FinishReasons are the reasons generation stopped, one for each
	// choice or candidate that said, in the order they came: OpenAI chat's
	// finish_reason ("stop", "length", "tool_calls"...), Anthropic's
	// stop_reason ("end_turn", "max_tokens"...), Gemini's finishReason
	// ("STOP", "MAX_TOKENS"...) and, for the Responses API, the reason of
	// an incomplete response ("max_output_tokens"...) or else its status
	// ("completed", "failed").
	FinishReasons []string
}

// maxFinishReasons bounds the finish reasons a Meter keeps, whatever a
// response holds.
const maxFinishReasons = 64

// Response returns what the response has said of itself so far (see
// ResponseInfo): complete once the meter has settled. It is empty unless
// the meter was made with MeterOptions.RecordResponse.
func (m *Meter) Response() ResponseInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resp
	r.FinishReasons = slices.Clone(r.FinishReasons)
	return r
}

// describe records in r what one event (or JSON document) of format f
// says of the response: its ID and model the first time they appear, and
// every finish reason.
func describe(f Format, name []byte, root jsondom.Value, r *ResponseInfo) {
	if root.Kind() != jsondom.Object {
		return
	}
	switch f {
	case OpenAIChat:
		r.identify(root.Get("id"), root.Get("model"))
		for c := root.Get("choices").First(); c.Exists(); c = c.Next() {
			r.finish(c.Get("finish_reason"))
		}
	case OpenAIResponses:
		resp := root
		if inner := root.Get("response"); inner.Kind() == jsondom.Object { // a stream's event
			resp = inner
		}
		r.identify(resp.Get("id"), resp.Get("model"))
		if kind := kindOf(name, root); kind != nil && !kindIs(kind, "response.completed") &&
			!kindIs(kind, "response.incomplete") && !kindIs(kind, "response.failed") {
			return // the status of a response still in progress
		}
		if !r.finish(resp.Get("incomplete_details").Get("reason")) {
			r.finish(resp.Get("status"))
		}
	case AnthropicMessages:
		msg := root
		if inner := root.Get("message"); inner.Kind() == jsondom.Object { // message_start
			msg = inner
		}
		r.identify(msg.Get("id"), msg.Get("model"))
		r.finish(msg.Get("stop_reason"))
		r.finish(root.Get("delta").Get("stop_reason")) // message_delta
	case Gemini:
		r.identify(root.Get("responseId"), root.Get("modelVersion"))
		for c := root.Get("candidates").First(); c.Exists(); c = c.Next() {
			r.finish(c.Get("finishReason"))
		}
	}
}

// identify records the response's ID and model from id and model, when
// they are strings and none was recorded yet.
func (r *ResponseInfo) identify(id, model jsondom.Value) {
	if r.ID == "" {
		r.ID, _ = id.Str()
	}
	if r.Model == "" {
		r.Model, _ = model.Str()
	}
}

// finish records v as a finish reason, when it is a string other than "",
// and reports whether it did.
func (r *ResponseInfo) finish(v jsondom.Value) bool {
	if !nonEmpty(v) || len(r.FinishReasons) >= maxFinishReasons {
		return false
	}
	s, _ := v.Str()
	r.FinishReasons = append(r.FinishReasons, s)
	return true
}
