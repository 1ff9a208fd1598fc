package stream

import "strings"

// Format is a provider API whose request and response bodies this package
// reads.
type Format uint8

// The formats. The zero Format is none.
const (
	// OpenAIChat is OpenAI Chat Completions (POST /v1/chat/completions),
	// also spoken by most OpenAI-compatible servers.
	OpenAIChat Format = iota + 1
	// OpenAIResponses is the OpenAI Responses API (POST /v1/responses).
	OpenAIResponses
	// AnthropicMessages is the Anthropic Messages API (POST /v1/messages).
	AnthropicMessages
	// Gemini is Google's Gemini generateContent and streamGenerateContent
	// (POST /v1beta/models/{model}:generateContent).
	Gemini
)

// String returns the format's name: "openai_chat", "openai_responses",
// "anthropic_messages" or "gemini"; "" for the zero Format.
func (f Format) String() string {
	switch f {
	case OpenAIChat:
		return "openai_chat"
	case OpenAIResponses:
		return "openai_responses"
	case AnthropicMessages:
		return "anthropic_messages"
	case Gemini:
		return "gemini"
	}
	return ""
}

// MarshalText encodes the format as its name.
func (f Format) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// FormatOf returns the format of a request to the URL path path, by its
// endpoint: a path ending in /chat/completions, /responses or /messages, or a
// Gemini model method :generateContent or :streamGenerateContent. Prefixes
// (a version, an Azure deployment, a gateway's mount point) do not matter.
// Other endpoints (models, embeddings, batches, token counting, messages
// added to an OpenAI Assistants thread) are not recognised.
func FormatOf(path string) (Format, bool) {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return OpenAIChat, true
	case strings.HasSuffix(path, "/responses"):
		return OpenAIResponses, true
	case strings.HasSuffix(path, "/messages") && !strings.Contains(path, "/threads/"):
		// (OpenAI's Assistants API adds messages to threads, not a call.)
		return AnthropicMessages, true
	}
	if _, _, ok := geminiMethod(path); ok {
		return Gemini, true
	}
	return 0, false
}

// geminiMethod parses a Gemini model method path,
// ".../models/{model}:generateContent" or ":streamGenerateContent".
func geminiMethod(path string) (model string, streaming, ok bool) {
	i := strings.LastIndexByte(path, ':')
	if i < 0 {
		return "", false, false
	}
	switch path[i+1:] {
	case "generateContent":
	case "streamGenerateContent":
		streaming = true
	default:
		return "", false, false
	}
	head := path[:i]
	j := strings.LastIndex(head, "/models/")
	if j < 0 {
		return "", false, false
	}
	model = head[j+len("/models/"):]
	if model == "" || strings.Contains(model, "/") {
		return "", false, false
	}
	return model, streaming, true
}
