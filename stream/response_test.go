package stream

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestMeterRecordsWhatTheResponseSaysOfItself(t *testing.T) {
	for _, c := range []struct {
		file   string
		format Format
		sse    bool
		want   ResponseInfo
	}{
		{"openai_chat_normal.sse", OpenAIChat, true, ResponseInfo{ID: "chatcmpl-C9tYqX2vZ", Model: "gpt-4o-2024-08-06", FinishReasons: []string{"stop"}}},
		{"openai_chat_tool_calls.sse", OpenAIChat, true, ResponseInfo{ID: "chatcmpl-C9tYqX2vZ", Model: "gpt-4o-2024-08-06", FinishReasons: []string{"tool_calls"}}},
		{"openai_chat.json", OpenAIChat, false, ResponseInfo{ID: "chatcmpl-C9u0", Model: "gpt-4o-2024-08-06", FinishReasons: []string{"stop"}}},
		{"openai_responses_normal.sse", OpenAIResponses, true, ResponseInfo{ID: "resp_68a1f0c2", Model: "gpt-5-mini-2025-08-07", FinishReasons: []string{"completed"}}},
		// Cut before response.completed: no reason yet.
		{"openai_responses_truncated.sse", OpenAIResponses, true, ResponseInfo{ID: "resp_68a1f0c2", Model: "gpt-5-mini-2025-08-07"}},
		{"openai_responses.json", OpenAIResponses, false, ResponseInfo{ID: "resp_68a1f0c3", Model: "o4-mini-2025-04-16", FinishReasons: []string{"completed"}}},
		{"anthropic_normal.sse", AnthropicMessages, true, ResponseInfo{ID: "msg_01XFDUDYJgAACzvnptvVoYEL", Model: "claude-sonnet-4-5-20250929", FinishReasons: []string{"end_turn"}}},
		{"anthropic.json", AnthropicMessages, false, ResponseInfo{ID: "msg_01Aq9w938a90dw8q", Model: "claude-sonnet-4-5-20250929", FinishReasons: []string{"end_turn"}}},
		{"gemini_normal.sse", Gemini, true, ResponseInfo{ID: "mH2oaPqWLo", Model: "gemini-2.5-flash", FinishReasons: []string{"STOP"}}},
		{"gemini.json", Gemini, false, ResponseInfo{ID: "mH2oaPqWLo", Model: "gemini-2.5-flash", FinishReasons: []string{"STOP"}}},
		{"gemini_array.json", Gemini, false, ResponseInfo{ID: "mH2oaPqWLo", Model: "gemini-2.5-flash", FinishReasons: []string{"STOP"}}},
	} {
		data := readFixture(t, c.file)
		for _, ch := range chunkings {
			t.Run(c.file+"/"+ch.name, func(t *testing.T) {
				m, err := NewMeter(io.NopCloser(ch.r(data)), nil, MeterOptions{Format: c.format, SSE: c.sse, RecordResponse: true})
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, m)
				if got := m.Response(); !reflect.DeepEqual(got, c.want) {
					t.Errorf("Response() = %+v, want %+v", got, c.want)
				}
			})
		}
	}
}

func TestMeterRecordsNothingOfTheResponseUnlessAsked(t *testing.T) {
	m, err := NewMeter(io.NopCloser(strings.NewReader(string(readFixture(t, "openai_chat_normal.sse")))), nil, MeterOptions{Format: OpenAIChat, SSE: true})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, m)
	if got := m.Response(); !reflect.DeepEqual(got, ResponseInfo{}) {
		t.Errorf("Response() = %+v, want nothing", got)
	}
}

// TestMeterRecordsEveryFinishReasonOfLookalikeChunks: a chunk with a
// finish reason is never read as a text delta by its shape, so two
// choices that end alike both count.
func TestMeterRecordsEveryFinishReasonOfLookalikeChunks(t *testing.T) {
	body := `data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"Yo"},"finish_reason":"stop"}]}

data: [DONE]

`
	m, err := NewMeter(io.NopCloser(strings.NewReader(body)), nil, MeterOptions{Format: OpenAIChat, SSE: true, RecordResponse: true})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, m)
	if got := m.Response().FinishReasons; !reflect.DeepEqual(got, []string{"stop", "stop"}) {
		t.Errorf("FinishReasons = %q, want both", got)
	}
}
