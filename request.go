package bulkhead

import "github.com/llmbulkhead/bulkhead/internal/tokens"

// Request is the part of an LLM call that admission reads: enough to
// estimate how many tokens the call may commit. It mirrors the common shape
// of the OpenAI-compatible and Anthropic message APIs.
//
// The bulkhead never sends the request anywhere; it reads it to estimate the
// reservation and hands it back unchanged on events.
type Request struct {
	// Model names the model the call is for. Empty means the bulkhead's
	// Config.Model; the default estimator looks its character ratio up here.
	Model string

	// System is a plain-text system prompt.
	System string

	// SystemBlocks is a structured system prompt. Its text blocks count like
	// System; its other blocks count as opaque (see Block).
	SystemBlocks []Block

	// Messages is the conversation.
	Messages []Message

	// MaxTokens is the call's output cap (max_tokens). Zero means not set:
	// the estimator's output cap applies (2048 by default). Negative is
	// invalid.
	MaxTokens int64

	// ExtraInputTokens is added to the input estimate as is: tool
	// definitions, cached context or anything else the text does not show.
	// Negative is invalid.
	ExtraInputTokens int64
}

// Validate checks the fields every estimate depends on: r must not be nil,
// and MaxTokens and ExtraInputTokens must not be negative. A problem is a
// *ConfigError naming the field. The bulkhead validates every request this
// way, with or without a token budget.
func (r *Request) Validate() error {
	if r == nil {
		return invalidf("Request", "must not be nil")
	}
	if err := checkNonNegative("Request.MaxTokens", r.MaxTokens); err != nil {
		return err
	}
	return checkNonNegative("Request.ExtraInputTokens", r.ExtraInputTokens)
}

// TextLength returns the number of characters of all the text in r, in
// UTF-16 code units (a character
// above U+FFFF counts 2): System, the Text of the "text" blocks
// of SystemBlocks, and of every message its Content and the Text of its
// "text" blocks. Opaque blocks count nothing here. A nil request has
// length 0. TextLength does not allocate.
func (r *Request) TextLength() int {
	if r == nil {
		return 0
	}
	n := tokens.UTF16Len(r.System) + blocksLength(r.SystemBlocks)
	for i := range r.Messages {
		m := &r.Messages[i]
		n += tokens.UTF16Len(m.Content) + blocksLength(m.Blocks)
	}
	return n
}

func blocksLength(bs []Block) int {
	n := 0
	for i := range bs {
		if bs[i].Type == "text" {
			n += tokens.UTF16Len(bs[i].Text)
		}
	}
	return n
}

// Message is one turn of a conversation.
type Message struct {
	// Role is "user", "assistant", "system", "tool" or whatever the provider
	// uses. Admission does not read it.
	Role string

	// Content is plain-text content.
	Content string

	// Blocks is structured content. It is counted in addition to Content.
	Blocks []Block
}

// Block is one block of structured content.
//
// A block whose Type is "text" counts its Text. Any other type (an image, a
// document, a tool call...) is opaque: it adds the estimator's opaque-block
// surcharge instead. A block with an empty Type is malformed and also counts
// as opaque.
type Block struct {
	// Type is the block type: "text", "image", "document", "tool_use"...
	Type string

	// Text is the text of a "text" block.
	Text string
}

// Usage is the number of tokens a call consumed, as the provider reports it.
//
// Input is all the input tokens, cached reads and cache writes included;
// Output is all the output tokens, reasoning included. The budget counts
// Input + Output and nothing else: cache reads and writes count as input,
// reasoning as output. The breakdown fields (CachedInput, CacheCreation,
// Reasoning) are parts of those totals, for information only: they never
// change a hold, a refund, a consumed total or an admission decision. They
// are carried on UsageEvent.Usage (clamped like the totals, see
// Permit.ReportUsage) and on ReleaseEvent.Usage as the final usage was
// given (to Release or RunContext.SetUsage) or last reported; UsageReport
// and Stats count totals only.
//
// Every field is non-negative, Input + Output must fit an int64,
// CachedInput + CacheCreation must not exceed Input and Reasoning must not
// exceed Output.
type Usage struct {
	// Input is every input token, cached reads and cache writes included.
	Input int64
	// Output is every output token, reasoning included.
	Output int64
	// CachedInput is the part of Input read from the provider's prompt cache
	// (OpenAI cached_tokens, Anthropic cache_read_input_tokens, Gemini
	// cachedContentTokenCount).
	CachedInput int64
	// CacheCreation is the part of Input written to the prompt cache
	// (Anthropic cache_creation_input_tokens, OpenAI cache_write_tokens).
	CacheCreation int64
	// Reasoning is the part of Output spent on hidden reasoning or thinking
	// (OpenAI reasoning_tokens, Gemini thoughtsTokenCount).
	Reasoning int64
}

// Total returns Input + Output, the tokens the budget counts.
func (u Usage) Total() int64 { return u.Input + u.Output }

// validate checks that u's fields are non-negative, that Input + Output
// fits an int64 and that the breakdown fits inside its totals.
func (u *Usage) validate() error {
	if u == nil {
		return nil
	}
	if err := checkNonNegative("Usage.Input", u.Input); err != nil {
		return err
	}
	if err := checkNonNegative("Usage.Output", u.Output); err != nil {
		return err
	}
	if u.Input > maxInt64-u.Output {
		return invalidf("Usage", "Input + Output overflows int64 (%d + %d)", u.Input, u.Output)
	}
	if err := checkNonNegative("Usage.CachedInput", u.CachedInput); err != nil {
		return err
	}
	if err := checkNonNegative("Usage.CacheCreation", u.CacheCreation); err != nil {
		return err
	}
	if err := checkNonNegative("Usage.Reasoning", u.Reasoning); err != nil {
		return err
	}
	// Both parts are non-negative, so Input - CachedInput cannot overflow
	// once CachedInput <= Input.
	if u.CachedInput > u.Input || u.CacheCreation > u.Input-u.CachedInput {
		return invalidf("Usage.CachedInput", "CachedInput + CacheCreation must not exceed Input (%d + %d > %d)",
			u.CachedInput, u.CacheCreation, u.Input)
	}
	if u.Reasoning > u.Output {
		return invalidf("Usage.Reasoning", "Reasoning must not exceed Output (%d > %d)", u.Reasoning, u.Output)
	}
	return nil
}

const maxInt64 = 1<<63 - 1

// Reservation is how many tokens an admission holds against the token
// budget: the input estimate plus the most output the call may produce.
//
// Reserved is Input + MaxOutput. In a per-call reservation override it may
// be left zero; when set it must equal Input + MaxOutput.
type Reservation struct {
	Input     int64
	MaxOutput int64
	Reserved  int64
}

// Priority is a call's claim on the token budget's high-priority reserve.
type Priority uint8

// The priorities. Normal is the zero value.
const (
	// Normal calls may use the budget less the high-priority reserve.
	Normal Priority = iota
	// High calls may use the whole budget.
	High
)

// String returns "normal" or "high".
func (p Priority) String() string {
	switch p {
	case Normal:
		return "normal"
	case High:
		return "high"
	}
	return "priority(" + itoa(int64(p)) + ")"
}

// MarshalText encodes the priority as "normal" or "high".
func (p Priority) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// Progressive asks ReportUsage to hold only what a live stream may still
// produce, freeing processed input and generated output as the stream goes.
type Progressive struct {
	// RemainingOutput is the most output the stream may still produce. It
	// must not exceed the reservation's MaxOutput.
	RemainingOutput int64
	// SafetyMargin is held on top of RemainingOutput.
	SafetyMargin int64
}

// UsageReport is the state of an admission's token hold after ReportUsage.
type UsageReport struct {
	// AdmissionID, LimitRevision and Class identify the admission.
	AdmissionID   ID
	LimitRevision int64
	Class         string
	// Sequence counts the reports that changed the usage or the hold: 1 for
	// the first, 2 for the next... A stale or duplicate report leaves it.
	Sequence int64
	// Reserved is the admission's reservation.
	Reserved int64
	// Held is what the admission holds now; 0 after release or without a
	// budget.
	Held int64
	// Consumed is the reported usage's total (after clamping).
	Consumed int64
	// OutputCap is the reservation's MaxOutput; nil without a budget.
	OutputCap *int64
	// OutputRemaining is max(0, OutputCap - output); nil without a budget.
	OutputRemaining *int64
	// OverReservation is how far Consumed exceeds Reserved, 0 when it does
	// not; always 0 without a budget, where nothing is reserved.
	OverReservation int64
}

// String formats the report with its output cap and remainder followed.
func (r UsageReport) String() string { return format(r) }
