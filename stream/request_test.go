package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
	"github.com/llmbulkhead/bulkhead/internal/jsondom"
)

// Short names for the expected requests of the tables.
type (
	blk   = bulkhead.Block
	convo = []bulkhead.Message
)

func textBlk(s string) blk     { return blk{Type: "text", Text: s} }
func opaqueBlk(typ string) blk { return blk{Type: typ} }

func toolDefs(n int) []blk {
	bs := make([]blk, n)
	for i := range bs {
		bs[i] = opaqueBlk("tool_definition")
	}
	return bs
}

type parseCase struct {
	name         string
	body         string
	want         bulkhead.Request
	stream       bool
	includeUsage bool
}

func runParseCases(t *testing.T, f Format, cases []parseCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			call, err := ParseRequest(f, []byte(c.body))
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if call.Format != f {
				t.Errorf("Format = %v, want %v", call.Format, f)
			}
			if !reflect.DeepEqual(call.Request, c.want) {
				t.Errorf("Request =\n%s\nwant\n%s", showRequest(call.Request), showRequest(c.want))
			}
			if call.Stream != c.stream || call.IncludeUsage != c.includeUsage {
				t.Errorf("Stream, IncludeUsage = %v, %v, want %v, %v", call.Stream, call.IncludeUsage, c.stream, c.includeUsage)
			}
			if err := call.Request.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// show formats a request one message a line, nil and empty slices apart.
func showRequest(r bulkhead.Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Model %q System %q MaxTokens %d ExtraInputTokens %d\nSystemBlocks %#v\n", r.Model, r.System, r.MaxTokens, r.ExtraInputTokens, r.SystemBlocks)
	if r.Messages == nil {
		b.WriteString("Messages nil\n")
	}
	for i, m := range r.Messages {
		fmt.Fprintf(&b, "[%d] %q %q %#v\n", i, m.Role, m.Content, m.Blocks)
	}
	return b.String()
}

func TestParseOpenAIChat(t *testing.T) {
	runParseCases(t, OpenAIChat, []parseCase{
		{
			name: "string content",
			body: `{"model":"gpt-4o","temperature":0.2,"stream":true,"stream_options":{"include_usage":true},
				"max_tokens":100,"messages":[
				{"role":"system","content":"Be brief."},
				{"role":"user","name":"ann","content":"caf\u00e9 \"q\"\n"}]}`,
			want: bulkhead.Request{Model: "gpt-4o", MaxTokens: 100, Messages: convo{
				{Role: "system", Content: "Be brief."},
				{Role: "user", Content: "café \"q\"\n"},
			}},
			stream: true, includeUsage: true,
		},
		{
			name: "parts",
			body: `{"model":"gpt-4o-mini","stream":false,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":[
				{"type":"text","text":"What is in these?"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},
				{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},
				{"type":"file","file":{"file_id":"file-1"}},
				{"type":"text","text":"Thanks."}]}]}`,
			want: bulkhead.Request{Model: "gpt-4o-mini", Messages: convo{{Role: "user", Blocks: []blk{
				textBlk("What is in these?"), opaqueBlk("image_url"), opaqueBlk("input_audio"), opaqueBlk("file"), textBlk("Thanks."),
			}}}},
		},
		{
			name: "tools and tool calls, both max fields",
			body: `{"model":"o3","max_tokens":50,"max_completion_tokens":500,
				"tools":[{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}},
				         {"type":"function","function":{"name":"time"}}],
				"messages":[
				{"role":"developer","content":"Use the tools."},
				{"role":"user","content":"Weather and time in Paris?"},
				{"role":"assistant","content":null,"tool_calls":[
					{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}},
					{"id":"c2","type":"function","function":{"name":"time","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"18C"},
				{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"09:00"}]},
				{"role":"assistant","content":[{"type":"refusal","refusal":"No."}],"tool_calls":null}]}`,
			want: bulkhead.Request{Model: "o3", MaxTokens: 500, SystemBlocks: toolDefs(2), Messages: convo{
				{Role: "developer", Content: "Use the tools."},
				{Role: "user", Content: "Weather and time in Paris?"},
				{Role: "assistant", Blocks: []blk{opaqueBlk("tool_call"), opaqueBlk("tool_call")}},
				{Role: "tool", Content: "18C"},
				{Role: "tool", Blocks: []blk{textBlk("09:00")}},
				{Role: "assistant", Blocks: []blk{textBlk("No.")}},
			}},
		},
		{
			name: "max_tokens alone, max_completion_tokens null",
			body: `{"model":"gpt-4o","max_tokens":1e3,"max_completion_tokens":null,"messages":[]}`,
			want: bulkhead.Request{Model: "gpt-4o", MaxTokens: 1000},
		},
		{
			name: "malformed parts",
			body: `{"messages":[{"role":"user","content":[{"type":5},{"text":"no type"},"bare",{"type":"text","text":null},{"type":"text"},{"type":"","x":1}]}]}`,
			want: bulkhead.Request{Messages: convo{{Role: "user", Blocks: []blk{{}, {}, {}, {}, {}, {}}}}},
		},
		{
			name: "absent and null fields",
			body: `{"model":null,"messages":null,"max_tokens":null,"stream":null,"stream_options":null,"tools":null}`,
			want: bulkhead.Request{},
		},
		{
			name: "empty object",
			body: ` {} `,
			want: bulkhead.Request{},
		},
		{
			name: "message without role or content",
			body: `{"messages":[{},{"role":"user","content":""},{"role":"user","content":[]}]}`,
			want: bulkhead.Request{Messages: convo{{}, {Role: "user"}, {Role: "user"}}},
		},
	})
}

func TestParseOpenAIResponses(t *testing.T) {
	runParseCases(t, OpenAIResponses, []parseCase{
		{
			name: "string input",
			body: `{"model":"gpt-5-mini","instructions":"Be terse.","input":"Hi there","max_output_tokens":256,"stream":true,"reasoning":{"effort":"low"}}`,
			want: bulkhead.Request{Model: "gpt-5-mini", System: "Be terse.", MaxTokens: 256, Messages: convo{
				{Role: "user", Content: "Hi there"},
			}},
			stream: true,
		},
		{
			name: "items",
			body: `{"model":"gpt-5","tools":[{"type":"function","name":"lookup"},{"type":"web_search"},{"type":"file_search"}],
				"stream_options":{"include_usage":true},
				"input":[
				{"type":"message","role":"developer","content":"Cite sources."},
				{"role":"user","content":[
					{"type":"input_text","text":"Describe"},
					{"type":"input_image","image_url":"https://example.com/a.png"},
					{"type":"input_file","file_id":"file-1"},
					{"type":"input_audio","input_audio":{"data":"AA==","format":"mp3"}}]},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thinking"}]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."},{"type":"refusal","refusal":"Not that."}]},
				{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{}"},
				{"type":"function_call_output","call_id":"c1","output":"found \u2603"},
				{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"page"},{"type":"input_image","file_id":"f"}]},
				{"type":"function_call_output","call_id":"c3","output":{"weird":true}},
				{"type":"item_reference","id":"msg_9"}]}`,
			want: bulkhead.Request{Model: "gpt-5", SystemBlocks: toolDefs(3), Messages: convo{
				{Role: "developer", Content: "Cite sources."},
				{Role: "user", Blocks: []blk{textBlk("Describe"), opaqueBlk("input_image"), opaqueBlk("input_file"), opaqueBlk("input_audio")}},
				{Blocks: []blk{opaqueBlk("reasoning")}},
				{Role: "assistant", Blocks: []blk{textBlk("Looking."), textBlk("Not that.")}},
				{Blocks: []blk{opaqueBlk("function_call")}},
				{Blocks: []blk{textBlk("found ☃")}},
				{Blocks: []blk{textBlk("page"), opaqueBlk("input_image")}},
				{Blocks: []blk{opaqueBlk("function_call_output")}},
				{Blocks: []blk{opaqueBlk("item_reference")}},
			}},
		},
		{
			name: "malformed items",
			body: `{"input":[{"type":7},{},{"type":null,"role":"user","content":"typed by role"}]}`,
			want: bulkhead.Request{Messages: convo{{Blocks: []blk{{}}}, {Blocks: []blk{{}}}, {Role: "user", Content: "typed by role"}}},
		},
		{
			name: "no input",
			body: `{"model":"gpt-5","input":null,"instructions":null,"previous_response_id":"resp_1"}`,
			want: bulkhead.Request{Model: "gpt-5"},
		},
	})
}

func TestParseAnthropic(t *testing.T) {
	runParseCases(t, AnthropicMessages, []parseCase{
		{
			name: "string system and content",
			body: `{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"system":"You are terse.",
				"messages":[{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi."}]}`,
			want: bulkhead.Request{Model: "claude-sonnet-4-5", System: "You are terse.", MaxTokens: 1024, Messages: convo{
				{Role: "user", Content: "Hello"},
				{Role: "assistant", Content: "Hi."},
			}},
			stream: true,
		},
		{
			name: "blocks",
			body: `{"model":"claude-opus-4-5","max_tokens":2048,
				"system":[{"type":"text","text":"Policy.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"More."}],
				"tools":[{"name":"get_weather","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"web_search"}],
				"thinking":{"type":"enabled","budget_tokens":1024},
				"messages":[
				{"role":"user","content":[
					{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0="}},
					{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}},
					{"type":"text","text":"Compare."}]},
				{"role":"assistant","content":[
					{"type":"thinking","thinking":"hmm","signature":"sig"},
					{"type":"redacted_thinking","data":"xx"},
					{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Oslo"}}]},
				{"role":"user","content":[
					{"type":"tool_result","tool_use_id":"t1","content":"-3C"},
					{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"a"},{"type":"image","source":{}},{"type":"search_result","source":"s","title":"t","content":[]}]},
					{"type":"tool_result","tool_use_id":"t3","is_error":true},
					{"type":"search_result","source":"https://example.com","title":"T","content":[{"type":"text","text":"x"}]}]}]}`,
			want: bulkhead.Request{Model: "claude-opus-4-5", MaxTokens: 2048,
				SystemBlocks: append([]blk{textBlk("Policy."), textBlk("More.")}, toolDefs(2)...),
				Messages: convo{
					{Role: "user", Blocks: []blk{opaqueBlk("image"), opaqueBlk("document"), textBlk("Compare.")}},
					{Role: "assistant", Blocks: []blk{opaqueBlk("thinking"), opaqueBlk("redacted_thinking"), opaqueBlk("tool_use")}},
					{Role: "user", Blocks: []blk{textBlk("-3C"), textBlk("a"), opaqueBlk("image"), opaqueBlk("search_result"), opaqueBlk("search_result")}},
				}},
		},
		{
			name: "no max_tokens, tools only",
			body: `{"model":"claude-haiku-4-5","tools":[{"name":"x"}],"messages":[{"role":"user","content":"q"}]}`,
			want: bulkhead.Request{Model: "claude-haiku-4-5", SystemBlocks: toolDefs(1), Messages: convo{{Role: "user", Content: "q"}}},
		},
		{
			name: "nested tool_result stays opaque",
			body: `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":"deep"}]}]}]}`,
			want: bulkhead.Request{Messages: convo{{Role: "user", Blocks: []blk{opaqueBlk("tool_result")}}}},
		},
	})
}

func TestParseGemini(t *testing.T) {
	runParseCases(t, Gemini, []parseCase{
		{
			name: "camel case",
			body: `{"systemInstruction":{"parts":[{"text":"Be kind."}]},
				"generationConfig":{"maxOutputTokens":300,"temperature":0.1,"thinkingConfig":{"thinkingBudget":0}},
				"tools":[{"functionDeclarations":[{"name":"f"},{"name":"g"}]},{"googleSearch":{}}],
				"contents":[
				{"role":"user","parts":[{"text":"Look:"},{"inlineData":{"mimeType":"image/png","data":"AA=="}},{"fileData":{"fileUri":"gs://b/f.pdf"}}]},
				{"role":"model","parts":[{"text":"thinking...","thought":true},{"functionCall":{"name":"f","args":{}},"thoughtSignature":"c2ln"}]},
				{"role":"user","parts":[{"functionResponse":{"name":"f","response":{"ok":1}}}]},
				{"role":"model","parts":[{"executableCode":{"language":"PYTHON","code":"1+1"}},{"codeExecutionResult":{"outcome":"OUTCOME_OK"}}]}]}`,
			// Two function declarations and googleSearch: three tools.
			want: bulkhead.Request{MaxTokens: 300, SystemBlocks: append([]blk{textBlk("Be kind.")}, toolDefs(3)...), Messages: convo{
				{Role: "user", Blocks: []blk{textBlk("Look:"), opaqueBlk("inlineData"), opaqueBlk("fileData")}},
				{Role: "model", Blocks: []blk{textBlk("thinking..."), opaqueBlk("functionCall")}},
				{Role: "user", Blocks: []blk{opaqueBlk("functionResponse")}},
				{Role: "model", Blocks: []blk{opaqueBlk("executableCode"), opaqueBlk("codeExecutionResult")}},
			}},
		},
		{
			name: "snake case aliases",
			body: `{"system_instruction":{"role":"system","parts":[{"text":"Rules."},{"text":"More."}]},
				"generation_config":{"max_output_tokens":64},
				"contents":[{"role":"user","parts":[{"text":"hi"},{"inline_data":{"mime_type":"image/jpeg","data":"AA=="}},{"function_response":{"name":"f"}}]}]}`,
			want: bulkhead.Request{MaxTokens: 64, SystemBlocks: []blk{textBlk("Rules."), textBlk("More.")}, Messages: convo{
				{Role: "user", Blocks: []blk{textBlk("hi"), opaqueBlk("inlineData"), opaqueBlk("functionResponse")}},
			}},
		},
		{
			name: "a tool for each declaration and each other tool of an entry",
			body: `{"tools":[
				{"functionDeclarations":[{"name":"a"},{"name":"b"},{"name":"c"}],"codeExecution":{}},
				{"function_declarations":[{"name":"d"}]},
				{"functionDeclarations":[]},
				{"googleSearch":{},"urlContext":{},"functionDeclarations":null,"retrieval":null},
				{},
				7]}`,
			// 3 + codeExecution, 1, 0, googleSearch + urlContext, 0, and an
			// entry that is not an object counts one, as in the other formats.
			want: bulkhead.Request{SystemBlocks: toolDefs(8)},
		},
		{
			name: "camel case wins over null",
			body: `{"systemInstruction":null,"system_instruction":{"parts":[{"text":"S"}]},"generationConfig":{"maxOutputTokens":null,"max_output_tokens":9}}`,
			want: bulkhead.Request{MaxTokens: 9, SystemBlocks: []blk{textBlk("S")}},
		},
		{
			name: "odd parts",
			body: `{"contents":[{"parts":[{"futurePart":{}},{"thoughtSignature":"x"},{},7,{"text":5},{"text":null,"fileData":{}}]},{"role":"user"}]}`,
			want: bulkhead.Request{Messages: convo{
				{Blocks: []blk{opaqueBlk("futurePart"), {}, {}, {}, {}, opaqueBlk("fileData")}},
				{Role: "user"},
			}},
		},
		{
			name: "model and stream in the body are ignored",
			body: `{"model":"gemini-2.5-pro","stream":true,"contents":[{"role":"user","parts":[{"text":"x"}]}]}`,
			want: bulkhead.Request{Messages: convo{{Role: "user", Blocks: []blk{textBlk("x")}}}},
		},
	})
}

// TestParseEstimate checks that the default estimator counts a parsed
// body as it counts the same request written by hand.
func TestParseEstimate(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1, TokenBudget: &bulkhead.TokenBudget{Budget: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		b.Close()
		if _, err := b.Drain(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	cases := []struct {
		f    Format
		body string
		want bulkhead.Reservation
	}{
		// 37 characters at 3.7 a token for gpt-4o.
		{OpenAIChat, `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("a", 37) + `"}]}`,
			bulkhead.Reservation{Input: 10, MaxOutput: 100, Reserved: 110}},
		// "abcd" as a text part, and an image that the default estimator does
		// not charge; no max_tokens gives the 2048 output cap.
		{OpenAIChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			bulkhead.Reservation{Input: 2, MaxOutput: 2048, Reserved: 2050}},
		// claude-sonnet-4-5 at 3.9: system 14 + content 2 + tool result 23 = 39
		// characters; "\u00e9" is one.
		{AnthropicMessages, `{"model":"claude-sonnet-4-5","max_tokens":64,"system":"You are terse.","messages":[{"role":"user","content":"Hi"},
			{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"caf\u00e9 caf\u00e9 caf\u00e9 caf\u00e9 abc"}]}]}]}`,
			bulkhead.Reservation{Input: 10, MaxOutput: 64, Reserved: 74}},
	}
	for _, c := range cases {
		call, err := ParseRequest(c.f, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.Estimate(&call.Request)
		if err != nil {
			t.Fatal(err)
		}
		if *got != c.want {
			t.Errorf("%v %.60s: Estimate = %+v, want %+v", c.f, c.body, *got, c.want)
		}
	}
}

// TestParseToolsEstimate checks that a tool costs the same in every format:
// three function tools are three tool_definition blocks, whether they are
// three entries of tools (OpenAI, Anthropic) or three declarations of one
// Gemini entry.
func TestParseToolsEstimate(t *testing.T) {
	est, err := estimate.NewModelAware(estimate.ModelAwareOptions{DefaultModel: "gpt-4o",
		OpaqueBlockTokens: estimate.OpaqueSurcharge{ByType: map[string]int64{"tool_definition": 100}}})
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[Format]string{
		OpenAIChat:        `{"max_tokens":1,"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}},{"type":"function","function":{"name":"c"}}]}`,
		OpenAIResponses:   `{"max_output_tokens":1,"tools":[{"type":"function","name":"a"},{"type":"function","name":"b"},{"type":"function","name":"c"}]}`,
		AnthropicMessages: `{"max_tokens":1,"tools":[{"name":"a"},{"name":"b"},{"name":"c"}]}`,
		Gemini:            `{"generationConfig":{"maxOutputTokens":1},"tools":[{"functionDeclarations":[{"name":"a"},{"name":"b"},{"name":"c"}]}]}`,
	}
	for f, body := range bodies {
		call, err := ParseRequest(f, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := est.Estimate(&call.Request); err != nil || res.Input != 300 {
			t.Errorf("%v: Estimate = %+v, %v; want input 300, three tools at 100", f, res, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		f       Format
		body    string
		field   string
		problem string
	}{
		{OpenAIChat, `[]`, "", "want an object, got an array"},
		{OpenAIChat, `"x"`, "", "want an object, got a string"},
		{OpenAIChat, `{"model":1}`, "model", "want a string, got a number"},
		{OpenAIChat, `{"messages":{}}`, "messages", "want an array, got an object"},
		{OpenAIChat, `{"messages":[1]}`, "messages[0]", "want an object, got a number"},
		{OpenAIChat, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":5}]}`,
			"messages[2].content", "want a string or an array, got a number"},
		{OpenAIChat, `{"messages":[{"role":true}]}`, "messages[0].role", "want a string, got a boolean"},
		{OpenAIChat, `{"messages":[{"role":"assistant","tool_calls":{}}]}`, "messages[0].tool_calls", "want an array, got an object"},
		{OpenAIChat, `{"max_tokens":-1}`, "max_tokens", "want a non-negative integer, got -1"},
		{OpenAIChat, `{"max_tokens":1.5}`, "max_tokens", "want a non-negative integer, got 1.5"},
		{OpenAIChat, `{"max_tokens":"5"}`, "max_tokens", "want a non-negative integer, got a string"},
		{OpenAIChat, `{"max_tokens":1e30}`, "max_tokens", "want a non-negative integer, got 1e30"},
		{OpenAIChat, `{"max_tokens":1e-400}`, "max_tokens", "want a non-negative integer, got 1e-400"},
		{OpenAIChat, `{"max_tokens":1.0000000000000000001}`, "max_tokens", "want a non-negative integer, got 1.0000000000000000001"},
		{OpenAIChat, `{"messages":[{"role":"user","content":[{"type":"text","text":7}]}]}`, "messages[0].content[0].text", "want a string, got a number"},
		{AnthropicMessages, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":{}}]}]}`, "messages[0].content[1].text", "want a string, got an object"},
		{OpenAIChat, `{"max_tokens":10,"max_completion_tokens":true}`, "max_completion_tokens", "want a non-negative integer, got a boolean"},
		{OpenAIChat, `{"stream":"yes"}`, "stream", "want a boolean, got a string"},
		{OpenAIChat, `{"stream_options":true}`, "stream_options", "want an object, got a boolean"},
		{OpenAIChat, `{"stream_options":{"include_usage":1}}`, "stream_options.include_usage", "want a boolean, got a number"},
		{OpenAIChat, `{"tools":{}}`, "tools", "want an array, got an object"},
		{OpenAIResponses, `{"input":5}`, "input", "want a string or an array, got a number"},
		{OpenAIResponses, `{"input":[3]}`, "input[0]", "want an object, got a number"},
		{OpenAIResponses, `{"input":[{"type":"message","role":"user","content":{}}]}`, "input[0].content", "want a string or an array, got an object"},
		{OpenAIResponses, `{"input":[{"role":"user","content":"x"},{"type":"reasoning","role":4}]}`, "input[1].role", "want a string, got a number"},
		{OpenAIResponses, `{"instructions":[]}`, "instructions", "want a string, got an array"},
		{OpenAIResponses, `{"max_output_tokens":-3}`, "max_output_tokens", "want a non-negative integer, got -3"},
		{OpenAIResponses, `{"stream":0}`, "stream", "want a boolean, got a number"},
		{AnthropicMessages, `{"system":5}`, "system", "want a string or an array, got a number"},
		{AnthropicMessages, `{"max_tokens":null,"model":{}}`, "model", "want a string, got an object"},
		{AnthropicMessages, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","content":5}]}]}`,
			"messages[0].content[1].content", "want a string or an array, got a number"},
		{AnthropicMessages, `{"messages":[{"role":"user","content":false}]}`, "messages[0].content", "want a string or an array, got a boolean"},
		{AnthropicMessages, `{"tools":"x"}`, "tools", "want an array, got a string"},
		{Gemini, `{"contents":{}}`, "contents", "want an array, got an object"},
		{Gemini, `{"contents":[5]}`, "contents[0]", "want an object, got a number"},
		{Gemini, `{"contents":[{"parts":[]},{"parts":{}}]}`, "contents[1].parts", "want an array, got an object"},
		{Gemini, `{"contents":[{"role":5,"parts":[]}]}`, "contents[0].role", "want a string, got a number"},
		{Gemini, `{"systemInstruction":"x"}`, "systemInstruction", "want an object, got a string"},
		{Gemini, `{"system_instruction":{"parts":5}}`, "system_instruction.parts", "want an array, got a number"},
		{Gemini, `{"generationConfig":[]}`, "generationConfig", "want an object, got an array"},
		{Gemini, `{"generationConfig":{"maxOutputTokens":-1}}`, "generationConfig.maxOutputTokens", "want a non-negative integer, got -1"},
		{Gemini, `{"generation_config":{"max_output_tokens":"x"}}`, "generation_config.max_output_tokens", "want a non-negative integer, got a string"},
		{Gemini, `{"tools":{}}`, "tools", "want an array, got an object"},
		{Gemini, `{"tools":[{},{"functionDeclarations":{"name":"f"}}]}`, "tools[1].functionDeclarations", "want an array, got an object"},
		{Gemini, `{"tools":[{"function_declarations":"f"}]}`, "tools[0].function_declarations", "want an array, got a string"},
		// Syntax errors carry the parser's path.
		{OpenAIChat, `{"messages":[{"content":"a"},{"content":tru}]}`, "messages[1].content", "invalid literal, want true"},
		{AnthropicMessages, ``, "", "unexpected end of input, want a value"},
		{Gemini, `{"contents":[]} x`, "", "unexpected 'x' after the top-level value"},
	}
	for _, c := range cases {
		_, err := ParseRequest(c.f, []byte(c.body))
		var be *BodyError
		if !errors.As(err, &be) {
			t.Errorf("%v %s: err = %v, want a *BodyError", c.f, c.body, err)
			continue
		}
		if be.Field != c.field || be.Problem != c.problem || be.Format != c.f {
			t.Errorf("%v %s: got %v %q %q, want %q %q", c.f, c.body, be.Format, be.Field, be.Problem, c.field, c.problem)
		}
		if be.Offset < 0 || be.Offset > len(c.body) {
			t.Errorf("%v %s: Offset = %d", c.f, c.body, be.Offset)
		}
		if !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("%v %s: error does not match ErrInvalid", c.f, c.body)
		}
	}
}

func TestParseErrorOffset(t *testing.T) {
	body := `{"messages":[{"role":"user","content":42}]}`
	_, err := ParseRequest(OpenAIChat, []byte(body))
	var be *BodyError
	if !errors.As(err, &be) || be.Offset != strings.Index(body, "42") {
		t.Fatalf("err = %v, want a *BodyError at offset %d", err, strings.Index(body, "42"))
	}
	if want := "stream: invalid openai_chat body: messages[0].content: want a string or an array, got a number"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err, want)
	}
}

func TestParseUnknownFormat(t *testing.T) {
	for _, f := range []Format{0, Gemini + 1} {
		_, err := ParseRequest(f, []byte(`{}`))
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Format" || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("ParseRequest(%d) = %v, want a *ConfigError for Format", f, err)
		}
	}
}

// TestParseDoesNotKeepBody checks that the caller may reuse the body.
func TestParseDoesNotKeepBody(t *testing.T) {
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}`)
	call, err := ParseRequest(OpenAIChat, body)
	if err != nil {
		t.Fatal(err)
	}
	key := call.Key()
	for i := range body {
		body[i] = ' '
	}
	if call.Request.Model != "gpt-4o" || call.Request.Messages[0].Content != "hello" || call.Key() != key {
		t.Errorf("the call changed with the body: %+v", call)
	}
}

func TestKey(t *testing.T) {
	key := func(f Format, body string) string {
		t.Helper()
		call, err := ParseRequest(f, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return call.Key()
	}
	base := key(OpenAIChat, `{"model":"gpt-4o","temperature":0.5,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true,"x":1}}`)
	same := key(OpenAIChat, "{\n  \"stream_options\": {\"x\": 1, \"include_usage\": true},\n  \"messages\": [ {\"content\": \"hi\", \"role\": \"user\"} ],\n\t\"temperature\": 0.5, \"model\": \"gpt-4o\"\n}\n")
	if base != same {
		t.Errorf("keys differ under reordering and whitespace:\n%q\n%q", base, same)
	}
	for name, other := range map[string]string{
		"temperature":   key(OpenAIChat, `{"model":"gpt-4o","temperature":0.7,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true,"x":1}}`),
		"message order": key(OpenAIChat, `{"model":"gpt-4o","temperature":0.5,"messages":[{"content":"hi","role":"user"},{"role":"user","content":"hi"}],"stream_options":{"include_usage":true,"x":1}}`),
		"nested member": key(OpenAIChat, `{"model":"gpt-4o","temperature":0.5,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true,"x":2}}`),
		"format":        key(OpenAIResponses, `{"model":"gpt-4o","temperature":0.5,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true,"x":1}}`),
	} {
		if other == base {
			t.Errorf("%s: keys are equal", name)
		}
	}
	if !strings.HasPrefix(base, "openai_chat\x00\x00{") {
		t.Errorf("key = %q, want the format name, two 0 bytes and the body", base)
	}
}

func newPost(t *testing.T, path, body string) *http.Request {
	t.Helper()
	return httptest.NewRequest(http.MethodPost, "http://api.example.com"+path, strings.NewReader(body))
}

func TestReadRequestRestoresBody(t *testing.T) {
	body := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	orig := &trackingBody{r: strings.NewReader(body)}
	r := newPost(t, "/v1/messages", "")
	r.Body, r.ContentLength = orig, -1
	call, err := ReadRequest(r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if call.Format != AnthropicMessages || call.Request.Model != "claude-sonnet-4-5" || call.Request.MaxTokens != 10 {
		t.Errorf("call = %+v", call)
	}
	if !orig.closed {
		t.Error("the original body was not closed")
	}
	if r.ContentLength != int64(len(body)) {
		t.Errorf("ContentLength = %d, want %d", r.ContentLength, len(body))
	}
	if got := readString(t, r.Body); got != body {
		t.Errorf("Body reads %q", got)
	}
	for range 2 {
		rc, err := r.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		if got := readString(t, rc); got != body {
			t.Errorf("GetBody reads %q", got)
		}
	}
}

func TestReadRequestSendsAgain(t *testing.T) {
	const body = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	}))
	defer srv.Close()
	r, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRequest(r, 1<<10); err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 1 || got[0] != body {
		t.Errorf("the server got %q", got)
	}
}

func TestReadRequestLimit(t *testing.T) {
	body := `{"model":"gpt-4o","messages":[]}`
	limit := int64(len(body))
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("content length known %v", known), func(t *testing.T) {
			r := newPost(t, "/v1/chat/completions", body)
			if !known {
				r.ContentLength = -1
			}
			if _, err := ReadRequest(r, limit); err != nil {
				t.Fatalf("a body of exactly the limit: %v", err)
			}
			for _, extra := range []int{1, 1 << 20} {
				over := &trackingBody{r: strings.NewReader(body + strings.Repeat(" ", extra))}
				r = newPost(t, "/v1/chat/completions", "")
				r.Body, r.ContentLength = over, limit+int64(extra)
				if !known {
					r.ContentLength = -1
				}
				_, err := ReadRequest(r, limit)
				var tl *TooLargeError
				if !errors.As(err, &tl) || tl.Limit != limit {
					t.Fatalf("limit+%d: err = %v, want a *TooLargeError with limit %d", extra, err, limit)
				}
				if !errors.Is(err, ErrBodyTooLarge) || !errors.Is(err, bulkhead.ErrInvalid) {
					t.Errorf("limit+%d: err %v does not match ErrBodyTooLarge and ErrInvalid", extra, err)
				}
				if most := map[bool]int64{true: 0, false: limit + 1}[known]; over.n > most {
					t.Errorf("limit+%d: read %d bytes, want at most %d", extra, over.n, most)
				}
				if !over.closed {
					t.Errorf("limit+%d: the original body was not closed", extra)
				}
			}
		})
	}
}

func TestReadRequestDefaultLimit(t *testing.T) {
	r := newPost(t, "/v1/chat/completions", "")
	orig := &trackingBody{r: strings.NewReader("{}")}
	r.Body, r.ContentLength = orig, DefaultMaxBodyBytes+1
	_, err := ReadRequest(r, -5)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Limit != DefaultMaxBodyBytes {
		t.Fatalf("err = %v, want a *TooLargeError with the default limit", err)
	}
	if orig.n != 0 || !orig.closed {
		t.Errorf("read %d bytes of a body whose length says it is too large (closed %v)", orig.n, orig.closed)
	}
}

func TestReadRequestGemini(t *testing.T) {
	const body = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":8}}`
	read := func(path string) *Call {
		t.Helper()
		call, err := ReadRequest(newPost(t, path, body), 0)
		if err != nil {
			t.Fatal(err)
		}
		return call
	}
	plain := read("/v1beta/models/gemini-2.5-flash:generateContent")
	if plain.Format != Gemini || plain.Request.Model != "gemini-2.5-flash" || plain.Stream || plain.Request.MaxTokens != 8 {
		t.Errorf("generateContent: %+v", plain)
	}
	streamed := read("/v1beta/models/gemini-2.5-flash:streamGenerateContent")
	if streamed.Request.Model != "gemini-2.5-flash" || !streamed.Stream {
		t.Errorf("streamGenerateContent: %+v", streamed)
	}
	sse := read("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key=secret")
	if !strings.HasPrefix(sse.Key(), "gemini\x0016:gemini-2.5-flash21:streamGenerateContent3:sse\x00{") {
		t.Errorf("key = %q", sse.Key())
	}
	keys := map[string]bool{plain.Key(): true, streamed.Key(): true, sse.Key(): true,
		read("/v1beta/models/gemini-2.5-pro:generateContent").Key(): true}
	if len(keys) != 4 {
		t.Errorf("%d distinct keys for four models, methods or alt parameters, want 4", len(keys))
	}
	if again := read("/v1/models/gemini-2.5-flash:generateContent/"); again.Key() != plain.Key() {
		t.Errorf("the key depends on the API version: %q, %q", again.Key(), plain.Key())
	}
}

func TestReadRequestUnknownEndpoint(t *testing.T) {
	const body = `{"input":"embed me"}`
	for _, path := range []string{"/v1/embeddings", "/v1/models", "/v1beta/models/gemini-2.5-flash:countTokens", ""} {
		r := newPost(t, "/", body)
		r.URL.Path = path
		_, err := ReadRequest(r, 0)
		if !errors.Is(err, ErrUnknownEndpoint) {
			t.Errorf("%q: err = %v, want ErrUnknownEndpoint", path, err)
		}
		if got := readString(t, r.Body); got != body {
			t.Errorf("%q: body reads %q afterwards", path, got)
		}
	}
}

func TestReadRequestBadBody(t *testing.T) {
	const body = `{"messages":5}`
	r := newPost(t, "/v1/chat/completions", body)
	_, err := ReadRequest(r, 0)
	var be *BodyError
	if !errors.As(err, &be) || be.Field != "messages" {
		t.Fatalf("err = %v, want a *BodyError for messages", err)
	}
	if got := readString(t, r.Body); got != body {
		t.Errorf("body reads %q afterwards", got)
	}
}

func TestReadRequestEmptyBody(t *testing.T) {
	for _, b := range []io.ReadCloser{nil, http.NoBody} {
		r := newPost(t, "/v1/chat/completions", "")
		r.Body = b
		_, err := ReadRequest(r, 0)
		var be *BodyError
		if !errors.As(err, &be) {
			t.Errorf("body %v: err = %v, want a *BodyError", b, err)
		}
		if r.Body != http.NoBody || r.ContentLength != 0 {
			t.Errorf("body %v: Body %v ContentLength %d afterwards", b, r.Body, r.ContentLength)
		}
		if rc, err := r.GetBody(); err != nil || rc != http.NoBody {
			t.Errorf("GetBody = %v, %v", rc, err)
		}
	}
}

func TestReadRequestReadError(t *testing.T) {
	boom := errors.New("boom")
	orig := &trackingBody{r: io.MultiReader(strings.NewReader(`{"mod`), failingReader{boom})}
	r := newPost(t, "/v1/responses", "")
	r.Body, r.ContentLength = orig, -1
	_, err := ReadRequest(r, 0)
	if !errors.Is(err, boom) {
		t.Errorf("err = %v, want it to wrap the read error", err)
	}
	if !orig.closed {
		t.Error("the original body was not closed")
	}
}

// trackingBody counts what is read from it and whether it was closed.
type trackingBody struct {
	r      io.Reader
	n      int64
	closed bool
}

func (b *trackingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *trackingBody) Close() error { b.closed = true; return nil }

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

func readString(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAddIncludeUsage(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"absent", `{"model":"gpt-4o","stream":true}`, `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`},
		{"absent, whitespace kept", "{ \"stream\" : true }\n", "{ \"stream\" : true ,\"stream_options\":{\"include_usage\":true}}\n"},
		{"empty body object", `{}`, `{"stream_options":{"include_usage":true}}`},
		{"null", `{"stream_options":null,"stream":true}`, `{"stream_options":{"include_usage":true},"stream":true}`},
		{"empty object", `{"stream_options":{}}`, `{"stream_options":{"include_usage":true}}`},
		{"other members", `{"stream_options":{"include_obfuscation":false},"n":1}`, `{"stream_options":{"include_obfuscation":false,"include_usage":true},"n":1}`},
		{"false", `{"stream_options":{"include_usage":false,"include_obfuscation":false}}`, `{"stream_options":{"include_usage":true,"include_obfuscation":false}}`},
		{"null member", `{"stream_options":{"include_usage":null}}`, `{"stream_options":{"include_usage":true}}`},
		{"already true", `{"stream_options":{"include_usage":true}}`, `{"stream_options":{"include_usage":true}}`},
	}
	for _, c := range cases {
		got, err := addIncludeUsage([]byte(c.in))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
		call, err := ParseRequest(OpenAIChat, got)
		if err != nil || !call.IncludeUsage {
			t.Errorf("%s: the result does not parse with IncludeUsage: %v", c.name, err)
		}
	}
}

func TestAddIncludeUsageErrors(t *testing.T) {
	for _, c := range []struct{ in, field string }{
		{`{"stream_options":true}`, "stream_options"},
		{`{"stream_options":[]}`, "stream_options"},
		{`[]`, ""},
		{`{"a":`, "a"},
	} {
		_, err := addIncludeUsage([]byte(c.in))
		var be *BodyError
		if !errors.As(err, &be) || be.Field != c.field || be.Format != OpenAIChat {
			t.Errorf("%s: err = %v, want a *BodyError for %q", c.in, err, c.field)
		}
	}
}

// TestAddIncludeUsageKeepsBytes checks that only the include_usage member
// is new: everything else is byte for byte the input.
func TestAddIncludeUsageKeepsBytes(t *testing.T) {
	in := []byte("{\"model\": \"gpt-4o\",\n \"messages\": [{\"role\":\"user\",\"content\":\"caf\\u00e9\"}],\n \"stream\": true}")
	got, err := addIncludeUsage(in)
	if err != nil {
		t.Fatal(err)
	}
	const added = `,"stream_options":{"include_usage":true}`
	if !bytes.Equal(bytes.Replace(got, []byte(added), nil, 1), in) {
		t.Errorf("got %s", got)
	}
	var d jsondom.Doc
	if err := jsondom.Parse(&d, got); err != nil {
		t.Fatal(err)
	}
}

// TestKeyNoCollisions: bodies or Gemini URLs that differ never share a key.
func TestKeyNoCollisions(t *testing.T) {
	for _, pair := range [][2]string{
		{`{"messages":[],"x":{"\ud800":1}}`, `{"messages":[],"x":{"\udc00":1}}`},
		{`{"messages":[],"x":{"\ud800":1}}`, `{"messages":[],"x":{"` + "\ufffd" + `":1}}`},
		{`{"messages":[],"x":{"a` + "\xff" + `":1}}`, `{"messages":[],"x":{"a` + "\xfe" + `":1}}`},
	} {
		a, errA := ParseRequest(OpenAIChat, []byte(pair[0]))
		b, errB := ParseRequest(OpenAIChat, []byte(pair[1]))
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		if a.Key() == b.Key() {
			t.Errorf("%s and %s share a key", pair[0], pair[1])
		}
	}
	read := func(url string) string {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"contents":[]}`))
		c, err := ReadRequest(req, 0)
		if err != nil {
			t.Fatal(err)
		}
		return c.Key()
	}
	a := read("http://x/v1beta/models/m:generateContent?alt=x:generateContent?alt=y")
	b := read("http://x/v1beta/models/m:generateContent%3Falt=x:generateContent?alt=y")
	if a == b {
		t.Error("two Gemini models share a key")
	}
}

func TestFormatOf(t *testing.T) {
	for path, want := range map[string]Format{
		"/v1/chat/completions": OpenAIChat, "/openai/deployments/d/chat/completions": OpenAIChat,
		"/v1/responses": OpenAIResponses, "/v1/messages": AnthropicMessages, "/anthropic/v1/messages/": AnthropicMessages,
		"/v1beta/models/gemini-2.5-flash:generateContent":       Gemini,
		"/v1beta/models/gemini-2.5-flash:streamGenerateContent": Gemini,
		"/v1/threads/thread_1/messages":                         0, "/v1/messages/count_tokens": 0, "/v1/models": 0,
		"/v1/embeddings": 0, "/v1beta/models/:generateContent": 0, "/v1beta/models/m:countTokens": 0,
	} {
		f, ok := FormatOf(path)
		if f != want || ok != (want != 0) {
			t.Errorf("FormatOf(%q) = %v, %v; want %v", path, f, ok, want)
		}
	}
}
