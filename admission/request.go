package admission

// Request is the part of an LLM call that admission looks at: enough to
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
// Both fields are non-negative.
type Usage struct {
	Input  int64
	Output int64
}

// Total returns Input + Output.
func (u Usage) Total() int64 { return u.Input + u.Output }

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
