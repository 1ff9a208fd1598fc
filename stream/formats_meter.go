package stream

import (
	"bytes"
	"fmt"
	"math"
	"strconv"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/jsondom"
)

// ProviderError is an error the provider reported inside a response: an
// error event in a stream that had started with status 200, or an error
// document in a successful plain JSON response. The meter settles when it
// sees one, and a caller reading the raw bytes gets it from Read where the
// body would have ended.
type ProviderError struct {
	// Format is the response's format.
	Format Format
	// Type is the provider's name for the error: its error type or code,
	// such as "overloaded_error", "server_error", "server_is_overloaded" or
	// "RESOURCE_EXHAUSTED"; "" when it gave none.
	Type string
	// Message is the provider's message.
	Message string
}

// Error returns "stream: <format> response: provider error <type>: <message>".
func (e *ProviderError) Error() string {
	if e.Type == "" {
		return fmt.Sprintf("stream: %s response: provider error: %s", e.Format, e.Message)
	}
	return fmt.Sprintf("stream: %s response: provider error %s: %s", e.Format, e.Type, e.Message)
}

// opt is a count the provider may or may not have reported.
type opt struct {
	v  int64
	ok bool
}

// set reads a non-negative integer count from v; anything else (absent,
// null, negative, fractional) leaves o as it was.
func (o *opt) set(v jsondom.Value) {
	if n, ok := v.Int(); ok && n >= 0 {
		*o = opt{n, true}
	}
}

// rawUsage is the provider's own token counts, in the provider's terms.
// Each report overwrites the counts it carries: every provider reports
// cumulative counts, never increments.
type rawUsage struct {
	in         opt // OpenAI prompt/input tokens (cache included); Anthropic uncached input; Gemini prompt
	inExtra    opt // Gemini tool-use prompt
	cacheRead  opt // tokens read from the prompt cache
	cacheWrite opt // tokens written to the prompt cache
	out        opt // OpenAI completion/output tokens (reasoning included); Anthropic output; Gemini candidates
	outExtra   opt // Gemini thoughts
	reasoning  opt // OpenAI reasoning tokens
}

// merge overwrites u's counts with those r carries.
func (u *rawUsage) merge(r *rawUsage) {
	for _, p := range [...]struct{ dst, src *opt }{
		{&u.in, &r.in}, {&u.inExtra, &r.inExtra}, {&u.cacheRead, &r.cacheRead},
		{&u.cacheWrite, &r.cacheWrite}, {&u.out, &r.out}, {&u.outExtra, &r.outExtra},
		{&u.reasoning, &r.reasoning},
	} {
		if p.src.ok {
			*p.dst = *p.src
		}
	}
}

// any reports whether r carries a count.
func (u *rawUsage) any() bool {
	return u.in.ok || u.inExtra.ok || u.cacheRead.ok || u.cacheWrite.ok || u.out.ok || u.outExtra.ok || u.reasoning.ok
}

// inputKnown and outputKnown report whether the provider gave its input
// and output counts.
func (u *rawUsage) inputKnown() bool  { return u.in.ok }
func (u *rawUsage) outputKnown() bool { return u.out.ok || u.outExtra.ok }

// tokenCounts is a usage in the bulkhead's terms: Input counts every input
// token, cache reads and writes included, and Output every output token,
// reasoning included; the other three are parts of those two.
type tokenCounts struct {
	input, cachedInput, cacheCreation int64
	output, reasoning                 int64
}

// counts normalises the provider's counts for format f.
func (u *rawUsage) counts(f Format) tokenCounts {
	var c tokenCounts
	switch f {
	case AnthropicMessages:
		// input_tokens counts only the uncached part.
		c.input = addSat(addSat(u.in.v, u.cacheWrite.v), u.cacheRead.v)
		c.cachedInput, c.cacheCreation = u.cacheRead.v, u.cacheWrite.v
		c.output = u.out.v
	case Gemini:
		c.input = addSat(u.in.v, u.inExtra.v)
		c.cachedInput = u.cacheRead.v
		c.output = addSat(u.out.v, u.outExtra.v)
		c.reasoning = u.outExtra.v
	default: // the OpenAI formats count cache and reasoning inside the totals
		c.input, c.cachedInput, c.cacheCreation = u.in.v, u.cacheRead.v, u.cacheWrite.v
		c.output, c.reasoning = u.out.v, u.reasoning.v
	}
	return c
}

// valid returns c cut to a valid usage: Input + Output fits an int64, the
// cache parts fit in Input and the reasoning part in Output (a provider
// that reports more has them cut to fit).
func (c tokenCounts) valid() tokenCounts {
	c.input, c.output = max(c.input, 0), max(c.output, 0)
	if c.output > math.MaxInt64-c.input {
		c.output = math.MaxInt64 - c.input
	}
	c.cachedInput = min(max(c.cachedInput, 0), c.input)
	c.cacheCreation = min(max(c.cacheCreation, 0), c.input-c.cachedInput)
	c.reasoning = min(max(c.reasoning, 0), c.output)
	return c
}

// toUsage turns counts into a valid bulkhead.Usage (see valid).
func toUsage(c tokenCounts) bulkhead.Usage {
	c = c.valid()
	return bulkhead.Usage{
		Input: c.input, Output: c.output,
		CachedInput: c.cachedInput, CacheCreation: c.cacheCreation, Reasoning: c.reasoning,
	}
}

// addSat returns a + b for non-negative a and b, saturating at MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// eventInfo is what one event (or one JSON document) says: parsing fills
// it without touching the meter, which then applies it.
type eventInfo struct {
	chars    int64          // UTF-16 units of generated text
	texts    int            // the number of string values counted
	hole     jsondom.Value  // the last string value counted
	rawText  bool           // text was counted from JSON other than a string
	started  bool           // the event shows that generation started
	terminal bool           // the response is complete
	finished bool           // generation ended: the provider's counts from here on are final (Gemini)
	usage    rawUsage       // the provider's counts, if any
	perr     *ProviderError // the provider's error, if any
	usageRow bool           // an OpenAI chat usage chunk: choices empty, usage set
	stopped  bool           // an OpenAI chat choice says why it finished
}

// text counts a string value as generated text.
func (e *eventInfo) text(v jsondom.Value) {
	if v.Kind() == jsondom.String {
		e.chars += int64(v.UTF16Len())
		e.texts++
		e.hole = v
	}
}

// raw counts a value's JSON bytes as generated text (tool arguments the
// provider sends as an object).
func (e *eventInfo) raw(v jsondom.Value) {
	if v.Exists() && !v.IsNull() {
		e.chars += int64(len(v.Raw()))
		e.rawText = true
	}
}

// pure reports whether the event did nothing but carry one text value: the
// fast path may then read events like it by their shape (see template).
func (e *eventInfo) pure() bool {
	return e.texts == 1 && !e.rawText && !e.terminal && !e.finished && e.perr == nil && !e.usage.any() && !e.usageRow && !e.stopped
}

// kindOf returns an event's type: its SSE event name, else the "type"
// member of its data (as in the source: escapes are not decoded).
func kindOf(name []byte, root jsondom.Value) []byte {
	if name != nil {
		return name
	}
	if t := root.Get("type"); t.Kind() == jsondom.String {
		raw := t.Raw()
		return raw[1 : len(raw)-1]
	}
	return nil
}

// kindIs compares an event type from kindOf with a name.
func kindIs(kind []byte, name string) bool { return string(kind) == name }

// parseEvent reads one event of format f into e. root is the parsed data;
// stream is false for a plain JSON response (or an element of a Gemini
// JSON array), whose text is in the message rather than in deltas.
func parseEvent(f Format, name []byte, root jsondom.Value, stream bool, e *eventInfo) {
	if root.Kind() != jsondom.Object {
		return
	}
	switch f {
	case OpenAIChat:
		parseChat(root, stream, e)
	case OpenAIResponses:
		parseResponses(name, root, stream, e)
	case AnthropicMessages:
		parseAnthropic(name, root, stream, e)
	case Gemini:
		parseGemini(root, e)
	}
}

func parseChat(root jsondom.Value, stream bool, e *eventInfo) {
	if errorObject(root, OpenAIChat, e, "type", "code") {
		return
	}
	part := "delta"
	if !stream {
		part = "message"
		e.terminal = true
	}
	choices := root.Get("choices")
	for c := choices.First(); c.Exists(); c = c.Next() {
		e.started = true
		d := c.Get(part)
		e.text(d.Get("content"))
		e.text(d.Get("refusal"))
		e.text(d.Get("reasoning_content"))
		for t := d.Get("tool_calls").First(); t.Exists(); t = t.Next() {
			e.text(t.Get("function").Get("arguments"))
		}
		e.text(d.Get("function_call").Get("arguments"))
		// Its finish reason makes it an event of its own kind, read in full
		// (see describe), not a template for the deltas.
		e.stopped = e.stopped || nonEmpty(c.Get("finish_reason"))
	}
	if openAIUsage(root.Get("usage"), &chatUsageKeys, e) {
		e.usageRow = stream && choices.Kind() == jsondom.Array && choices.Len() == 0
	}
}

// openAIUsageKeys names the members of an OpenAI usage object, which the
// two APIs name apart.
type openAIUsageKeys struct{ in, inDetails, out, outDetails string }

var (
	chatUsageKeys      = openAIUsageKeys{"prompt_tokens", "prompt_tokens_details", "completion_tokens", "completion_tokens_details"}
	responsesUsageKeys = openAIUsageKeys{"input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details"}
)

// openAIUsage reads an OpenAI usage object, if u is one: the input count
// includes cache reads and writes, the output count reasoning.
func openAIUsage(u jsondom.Value, k *openAIUsageKeys, e *eventInfo) bool {
	if u.Kind() != jsondom.Object {
		return false
	}
	e.usage.in.set(u.Get(k.in))
	d := u.Get(k.inDetails)
	e.usage.cacheRead.set(d.Get("cached_tokens"))
	e.usage.cacheWrite.set(d.Get("cache_write_tokens"))
	e.usage.out.set(u.Get(k.out))
	e.usage.reasoning.set(u.Get(k.outDetails).Get("reasoning_tokens"))
	return true
}

// responsesDeltas are the Responses stream events whose delta is generated
// text (reasoning and tool input included).
var responsesDeltas = []string{
	"response.output_text.delta",
	"response.refusal.delta",
	"response.function_call_arguments.delta",
	"response.reasoning_summary_text.delta",
	"response.reasoning_text.delta",
	"response.custom_tool_call_input.delta",
	"response.mcp_call_arguments.delta",
	"response.code_interpreter_call_code.delta",
}

func parseResponses(name []byte, root jsondom.Value, stream bool, e *eventInfo) {
	if !stream {
		responsesUsage(root, e)
		e.terminal = true
		if errorObject(root, OpenAIResponses, e, "code", "type") {
			return
		}
		for it := root.Get("output").First(); it.Exists(); it = it.Next() {
			e.started = true
			e.text(it.Get("arguments"))
			e.text(it.Get("input"))
			for c := it.Get("content").First(); c.Exists(); c = c.Next() {
				e.text(c.Get("text"))
				e.text(c.Get("refusal"))
			}
			for s := it.Get("summary").First(); s.Exists(); s = s.Next() {
				e.text(s.Get("text"))
			}
		}
		return
	}
	kind := kindOf(name, root)
	for _, d := range responsesDeltas {
		if kindIs(kind, d) {
			e.started = true
			e.text(root.Get("delta"))
			return
		}
	}
	switch {
	case kindIs(kind, "response.completed"), kindIs(kind, "response.incomplete"):
		responsesUsage(root.Get("response"), e)
		e.terminal = true
	case kindIs(kind, "response.failed"):
		r := root.Get("response")
		responsesUsage(r, e)
		e.terminal = true
		if !errorObject(r, OpenAIResponses, e, "code", "type") {
			e.perr = &ProviderError{Format: OpenAIResponses, Message: "response failed"}
		}
	case kindIs(kind, "error"):
		e.perr = responsesError(root)
		e.terminal = true
	}
}

// responsesError is the error a Responses stream's error event describes.
// The API documents its code and message as members of the event, but sends
// them (with the error's type) in an "error" object: each is taken from
// the event, else from that object. The error's name is its code, else its
// type; never the event's own type, "error".
func responsesError(root jsondom.Value) *ProviderError {
	pe := providerError(OpenAIResponses, root, "code")
	if inner := root.Get("error"); inner.Kind() == jsondom.Object {
		nested := providerError(OpenAIResponses, inner, "code", "type")
		if pe.Type == "" {
			pe.Type = nested.Type
		}
		if pe.Message == "" {
			pe.Message = nested.Message
		}
	}
	return pe
}

func responsesUsage(r jsondom.Value, e *eventInfo) {
	openAIUsage(r.Get("usage"), &responsesUsageKeys, e)
}

func parseAnthropic(name []byte, root jsondom.Value, stream bool, e *eventInfo) {
	kind := kindOf(name, root)
	if kindIs(kind, "error") {
		e.perr = providerError(AnthropicMessages, root.Get("error"), "type")
		e.terminal = true
		return
	}
	if !stream {
		e.terminal = true
		for b := root.Get("content").First(); b.Exists(); b = b.Next() {
			e.started = true
			e.text(b.Get("text"))
			e.text(b.Get("thinking"))
			e.raw(b.Get("input"))
		}
		anthropicUsage(root.Get("usage"), e, true)
		return
	}
	switch {
	case kindIs(kind, "content_block_delta"):
		e.started = true
		d := root.Get("delta")
		e.text(d.Get("text"))
		e.text(d.Get("partial_json"))
		e.text(d.Get("thinking"))
	case kindIs(kind, "message_start"):
		e.started = true
		// Its output_tokens is a placeholder of 1 or 2.
		anthropicUsage(root.Get("message").Get("usage"), e, false)
	case kindIs(kind, "message_delta"):
		anthropicUsage(root.Get("usage"), e, true)
	case kindIs(kind, "message_stop"):
		e.terminal = true
	}
}

func anthropicUsage(u jsondom.Value, e *eventInfo, output bool) {
	if u.Kind() != jsondom.Object {
		return
	}
	e.usage.in.set(u.Get("input_tokens"))
	e.usage.cacheWrite.set(u.Get("cache_creation_input_tokens"))
	e.usage.cacheRead.set(u.Get("cache_read_input_tokens"))
	if output {
		e.usage.out.set(u.Get("output_tokens"))
	}
}

// parseGemini reads one Gemini response: a whole one, or one chunk of a
// stream. A stream's usageMetadata is cumulative, and final only from the
// chunk that ends generation, the one with a finishReason: the meter
// reports earlier counts as not exact.
func parseGemini(root jsondom.Value, e *eventInfo) {
	if errorObject(root, Gemini, e, "status", "code") {
		return
	}
	e.started = true
	for c := root.Get("candidates").First(); c.Exists(); c = c.Next() {
		for p := c.Get("content").Get("parts").First(); p.Exists(); p = p.Next() {
			e.text(p.Get("text"))
			e.raw(p.Get("functionCall").Get("args"))
		}
		e.finished = e.finished || nonEmpty(c.Get("finishReason"))
	}
	if u := root.Get("usageMetadata"); u.Kind() == jsondom.Object {
		e.usage.in.set(u.Get("promptTokenCount"))
		e.usage.inExtra.set(u.Get("toolUsePromptTokenCount"))
		e.usage.cacheRead.set(u.Get("cachedContentTokenCount"))
		e.usage.out.set(u.Get("candidatesTokenCount"))
		e.usage.outExtra.set(u.Get("thoughtsTokenCount"))
	}
}

// errorObject reads a top-level "error" object of root, if there is one,
// as the provider's error; typeKeys name its members that may carry the
// error's type, best first.
func errorObject(root jsondom.Value, f Format, e *eventInfo, typeKeys ...string) bool {
	v := root.Get("error")
	if v.Kind() != jsondom.Object {
		return false
	}
	e.perr = providerError(f, v, typeKeys...)
	e.terminal = true
	return true
}

// providerError builds the error an error object describes.
func providerError(f Format, v jsondom.Value, typeKeys ...string) *ProviderError {
	pe := &ProviderError{Format: f}
	pe.Message, _ = v.Get("message").Str()
	for _, k := range typeKeys {
		t := v.Get(k)
		if s, ok := t.Str(); ok && s != "" {
			pe.Type = s
			break
		}
		if n, ok := t.Int(); ok {
			pe.Type = strconv.FormatInt(n, 10)
			break
		}
	}
	return pe
}

// nonEmpty reports whether v is a string other than "" (read in place).
func nonEmpty(v jsondom.Value) bool {
	return v.Kind() == jsondom.String && len(v.Raw()) > len(`""`)
}

// isDone reports whether an OpenAI chat event's data is the [DONE]
// sentinel.
func isDone(data []byte) bool { return bytes.HasPrefix(data, []byte("[DONE]")) }
