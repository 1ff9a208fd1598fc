package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rig is the handler on loopback in front of a simulated account on a mock
// clock.
type rig struct {
	srv  *httptest.Server
	prov *simprovider.Provider
	clk  *clock.Mock
}

// instant is an account that answers at once (no latency), so a test
// moves its clock only to move its windows.
func instant() simprovider.Config {
	return simprovider.Config{OutputMedian: 20, ChunkTokens: 8}
}

func newRig(t *testing.T, cfg simprovider.Config) *rig {
	t.Helper()
	r := &rig{clk: clock.NewMockAt(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	cfg.Clock = r.clk
	p, err := simprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.prov = p
	r.srv = httptest.NewServer(NewHandler(p, Options{}))
	t.Cleanup(r.srv.Close)
	return r
}

// answer is a response read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(a.body), &m); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	return m
}

// sseEvent is one server-sent event.
type sseEvent struct {
	name string
	data string
}

// events splits a's body into server-sent events.
func (a answer) events(t *testing.T) []sseEvent {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, want text/event-stream; body %q", ct, a.body)
	}
	var out []sseEvent
	for _, block := range strings.Split(strings.TrimSuffix(a.body, "\n\n"), "\n\n") {
		var e sseEvent
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				e.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				e.data = line[len("data: "):]
			default:
				t.Fatalf("line %q in %q", line, a.body)
			}
		}
		out = append(out, e)
	}
	return out
}

func (r *rig) post(t *testing.T, path, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: string(b)}
}

// get returns the value at a dotted path of a decoded JSON value ("a.0.b").
func get(t *testing.T, v any, path string) any {
	t.Helper()
	for _, k := range strings.Split(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[k]; !ok {
				t.Fatalf("no %q in %v (path %s)", k, c, path)
			}
		case []any:
			i := int(k[0] - '0')
			if len(k) != 1 || i >= len(c) {
				t.Fatalf("no index %s in %v (path %s)", k, c, path)
			}
			v = c[i]
		default:
			t.Fatalf("%s: %v is not a container", path, v)
		}
	}
	return v
}

// want checks the values at paths of v, numbers given as float64.
func want(t *testing.T, v any, pairs ...any) {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		path := pairs[i].(string)
		if got := get(t, v, path); got != pairs[i+1] {
			t.Errorf("%s = %#v, want %#v", path, got, pairs[i+1])
		}
	}
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return m
}

const chatBody = `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello, world!"}],"max_tokens":100}`

// chatInput is what chatBody's prompt counts: 3 + 3 a message, and the
// text of every string ("system" 1, "Be brief." 3, "user" 1, "Hello,
// world!" 4).
const chatInput = 3 + 2*3 + 1 + 3 + 1 + 4

func TestChatCompletion(t *testing.T) {
	r := newRig(t, instant())
	a := r.post(t, "/v1/chat/completions", chatBody, HeaderOutputTokens, "12")
	if a.status != 200 || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v %s", a.status, a.header, a.body)
	}
	m := a.json(t)
	want(t, m, "object", "chat.completion", "model", "gpt-4o", "choices.0.index", 0.0, "choices.0.message.role", "assistant",
		"choices.0.message.content", words(0, 12), "choices.0.finish_reason", "stop",
		"usage.prompt_tokens", float64(chatInput), "usage.completion_tokens", 12.0, "usage.total_tokens", float64(chatInput+12))
	if id := m["id"].(string); !strings.HasPrefix(id, "chatcmpl-") || a.header.Get("X-Request-Id") == "" {
		t.Errorf("id %q, x-request-id %q", id, a.header.Get("X-Request-Id"))
	}
	if got := countText(words(0, 12)); got != 12 {
		t.Errorf("the text of 12 tokens counts %d", got)
	}
	// The output cap stops the text: finish_reason length.
	a = r.post(t, "/v1/chat/completions", chatBody, HeaderOutputTokens, "500")
	want(t, a.json(t), "choices.0.finish_reason", "length", "usage.completion_tokens", 100.0)
}

func TestChatCompletionStream(t *testing.T) {
	r := newRig(t, instant())
	body := strings.Replace(chatBody, `"max_tokens":100`, `"max_completion_tokens":100,"stream":true,"stream_options":{"include_usage":true}`, 1)
	evs := r.post(t, "/v1/chat/completions", body, HeaderOutputTokens, "20").events(t)
	if last := evs[len(evs)-1]; last.data != "[DONE]" || last.name != "" {
		t.Fatalf("last event %+v, want data: [DONE]", last)
	}
	evs = evs[:len(evs)-1]
	want(t, decode(t, evs[0].data), "object", "chat.completion.chunk", "choices.0.delta.role", "assistant", "choices.0.delta.content", "")
	var text strings.Builder
	for _, e := range evs[1 : len(evs)-2] {
		c := decode(t, e.data)
		want(t, c, "choices.0.finish_reason", nil, "usage", nil)
		text.WriteString(get(t, c, "choices.0.delta.content").(string))
	}
	if text.String() != words(0, 20) || len(evs) != 1+3+2 { // 20 tokens in chunks of 8
		t.Fatalf("%d events, text %q", len(evs), text.String())
	}
	want(t, decode(t, evs[len(evs)-2].data), "choices.0.finish_reason", "stop", "usage", nil)
	u := decode(t, evs[len(evs)-1].data)
	want(t, u, "usage.prompt_tokens", float64(chatInput), "usage.completion_tokens", 20.0, "usage.total_tokens", float64(chatInput+20))
	if c := u["choices"].([]any); len(c) != 0 {
		t.Errorf("usage chunk choices %v, want []", c)
	}

	// Without include_usage no chunk has a usage key.
	a := r.post(t, "/v1/chat/completions", strings.Replace(chatBody, `"max_tokens":100`, `"stream":true`, 1), HeaderOutputTokens, "3")
	for _, e := range a.events(t) {
		if e.data != "[DONE]" {
			if _, ok := decode(t, e.data)["usage"]; ok {
				t.Errorf("a chunk has usage without include_usage: %s", e.data)
			}
		}
	}
}

const responsesBody = `{"model":"gpt-4o","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hello, world!"}]}]}`

// responsesInput: 3, 3 for the one item, "Be brief." 3, "user" 1,
// "input_text" 3, "Hello, world!" 4.
const responsesInput = 3 + 3 + 3 + 1 + 3 + 4

func TestResponses(t *testing.T) {
	r := newRig(t, instant())
	m := r.post(t, "/v1/responses", responsesBody, HeaderOutputTokens, "9").json(t)
	want(t, m, "object", "response", "status", "completed", "model", "gpt-4o", "output.0.type", "message", "output.0.status", "completed",
		"output.0.role", "assistant", "output.0.content.0.type", "output_text", "output.0.content.0.text", words(0, 9),
		"usage.input_tokens", float64(responsesInput), "usage.output_tokens", 9.0, "usage.total_tokens", float64(responsesInput+9),
		"max_output_tokens", nil, "incomplete_details", nil, "error", nil)
	if !strings.HasPrefix(m["id"].(string), "resp_") || !strings.HasPrefix(get(t, m, "output.0.id").(string), "msg_") {
		t.Errorf("ids %v %v", m["id"], get(t, m, "output.0.id"))
	}
	// Over max_output_tokens: incomplete.
	m = r.post(t, "/v1/responses", `{"model":"gpt-4o","input":"hi","max_output_tokens":16}`, HeaderOutputTokens, "40").json(t)
	want(t, m, "status", "incomplete", "incomplete_details.reason", "max_output_tokens", "output.0.status", "incomplete",
		"usage.output_tokens", 16.0, "max_output_tokens", 16.0)
}

func TestResponsesStream(t *testing.T) {
	r := newRig(t, instant())
	evs := r.post(t, "/v1/responses", strings.Replace(responsesBody, `{"model"`, `{"stream":true,"model"`, 1), HeaderOutputTokens, "10").events(t)
	var names []string
	var text strings.Builder
	for i, e := range evs {
		m := decode(t, e.data)
		if m["type"] != e.name || m["sequence_number"] != float64(i) {
			t.Errorf("event %d %q: type %v, sequence_number %v", i, e.name, m["type"], m["sequence_number"])
		}
		names = append(names, e.name)
		if e.name == "response.output_text.delta" {
			text.WriteString(m["delta"].(string))
		}
	}
	wantNames := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.done response.content_part.done " +
		"response.output_item.done response.completed"
	if strings.Join(names, " ") != wantNames || text.String() != words(0, 10) {
		t.Fatalf("events %v, text %q", names, text.String())
	}
	want(t, decode(t, evs[0].data), "response.status", "in_progress", "response.usage", nil)
	done := decode(t, evs[len(evs)-1].data)
	want(t, done, "response.status", "completed", "response.usage.input_tokens", float64(responsesInput), "response.usage.output_tokens", 10.0,
		"response.output.0.content.0.text", words(0, 10))
}

const messagesBody = `{"model":"claude-sonnet-4-5","max_tokens":50,"system":"Be brief.","messages":[{"role":"user","content":"Hello, world!"}]}`

// messagesInput: 3, 3 for the message, "user" 1, "Hello, world!" 4, "Be
// brief." 3.
const messagesInput = 3 + 3 + 1 + 4 + 3

func TestAnthropicMessages(t *testing.T) {
	r := newRig(t, instant())
	a := r.post(t, "/v1/messages", messagesBody, HeaderOutputTokens, "7")
	want(t, a.json(t), "type", "message", "role", "assistant", "model", "claude-sonnet-4-5", "content.0.type", "text",
		"content.0.text", words(0, 7), "stop_reason", "end_turn", "stop_sequence", nil,
		"usage.input_tokens", float64(messagesInput), "usage.output_tokens", 7.0, "usage.cache_read_input_tokens", 0.0)
	if !strings.HasPrefix(a.json(t)["id"].(string), "msg_") || a.header.Get("Request-Id") == "" {
		t.Errorf("id %v, request-id %q", a.json(t)["id"], a.header.Get("Request-Id"))
	}
	want(t, r.post(t, "/v1/messages", messagesBody, HeaderOutputTokens, "80").json(t), "stop_reason", "max_tokens", "usage.output_tokens", 50.0)
}

func TestAnthropicMessagesStream(t *testing.T) {
	r := newRig(t, instant())
	evs := r.post(t, "/v1/messages", strings.Replace(messagesBody, `{"model"`, `{"stream":true,"model"`, 1), HeaderOutputTokens, "12").events(t)
	var names []string
	var text strings.Builder
	for _, e := range evs {
		m := decode(t, e.data)
		if m["type"] != e.name {
			t.Errorf("event %q has type %v", e.name, m["type"])
		}
		names = append(names, e.name)
		if e.name == "content_block_delta" {
			want(t, m, "delta.type", "text_delta", "index", 0.0)
			text.WriteString(get(t, m, "delta.text").(string))
		}
	}
	wantNames := "message_start content_block_start ping content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != wantNames || text.String() != words(0, 12) {
		t.Fatalf("events %v, text %q", names, text.String())
	}
	start := decode(t, evs[0].data)
	want(t, start, "message.usage.input_tokens", float64(messagesInput), "message.usage.output_tokens", 1.0, "message.stop_reason", nil)
	if c := get(t, start, "message.content").([]any); len(c) != 0 {
		t.Errorf("message_start content %v, want []", c)
	}
	want(t, decode(t, evs[6].data), "delta.stop_reason", "end_turn", "usage.output_tokens", 12.0)
}

const geminiBody = `{"systemInstruction":{"parts":[{"text":"Be brief."}]},"contents":[{"role":"user","parts":[{"text":"Hello, world!"}]}],"generationConfig":{"maxOutputTokens":30}}`

// geminiInput: 3, 3 for the content, "user" 1, "Hello, world!" 4, "Be
// brief." 3.
const geminiInput = 3 + 3 + 1 + 4 + 3

func TestGemini(t *testing.T) {
	r := newRig(t, instant())
	m := r.post(t, "/v1beta/models/gemini-2.5-flash:generateContent", geminiBody, HeaderOutputTokens, "5").json(t)
	want(t, m, "candidates.0.content.role", "model", "candidates.0.content.parts.0.text", words(0, 5), "candidates.0.finishReason", "STOP",
		"usageMetadata.promptTokenCount", float64(geminiInput), "usageMetadata.candidatesTokenCount", 5.0,
		"usageMetadata.totalTokenCount", float64(geminiInput+5), "modelVersion", "gemini-2.5-flash")
	m = r.post(t, "/v1beta/models/gemini-2.5-flash:generateContent", geminiBody, HeaderOutputTokens, "99").json(t)
	want(t, m, "candidates.0.finishReason", "MAX_TOKENS", "usageMetadata.candidatesTokenCount", 30.0)
}

func TestGeminiStream(t *testing.T) {
	r := newRig(t, instant())
	evs := r.post(t, "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", geminiBody, HeaderOutputTokens, "10").events(t)
	if len(evs) != 3 { // 8 + 2 tokens, then the finish
		t.Fatalf("%d events: %v", len(evs), evs)
	}
	var text strings.Builder
	for i, e := range evs {
		m := decode(t, e.data)
		text.WriteString(get(t, m, "candidates.0.content.parts.0.text").(string))
		out := []float64{8, 10, 10}[i]
		want(t, m, "usageMetadata.promptTokenCount", float64(geminiInput), "usageMetadata.candidatesTokenCount", out,
			"usageMetadata.totalTokenCount", float64(geminiInput)+out)
	}
	want(t, decode(t, evs[2].data), "candidates.0.finishReason", "STOP")
	if text.String() != words(0, 10) {
		t.Errorf("text %q", text.String())
	}

	// Without alt=sse: one JSON array of the same chunks.
	a := r.post(t, "/v1beta/models/gemini-2.5-flash:streamGenerateContent", geminiBody, HeaderOutputTokens, "10")
	var arr []map[string]any
	if err := json.Unmarshal([]byte(a.body), &arr); err != nil || len(arr) != 3 || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("array %q: %v", a.body, err)
	}
	want(t, arr[2], "candidates.0.finishReason", "STOP", "usageMetadata.candidatesTokenCount", 10.0)
}

// TestRateLimitHeadersCountDown: every answer says what is left of the
// account's per-minute limits, in its API's headers, counting down with
// each request.
func TestRateLimitHeadersCountDown(t *testing.T) {
	cfg := instant()
	cfg.RequestsPerMinute, cfg.TokensPerMinute, cfg.InputTokensPerMinute, cfg.OutputTokensPerMinute = 10, 10_000, 5_000, 2_000
	r := newRig(t, cfg)
	for i := range 3 {
		a := r.post(t, "/v1/chat/completions", chatBody, HeaderOutputTokens, "10")
		left := 10_000 - int64(i+1)*(chatInput+100)
		for k, v := range map[string]string{"Limit-Requests": "10", "Remaining-Requests": itoa(int64(9 - i)), "Reset-Requests": "1m0s",
			"Limit-Tokens": "10000", "Remaining-Tokens": itoa(left), "Reset-Tokens": "1m0s"} {
			if got := a.header.Get("X-Ratelimit-" + k); got != v {
				t.Errorf("request %d: x-ratelimit-%s = %q, want %q", i, k, got, v)
			}
		}
	}
	r.clk.Add(30 * time.Second)
	a := r.post(t, "/v1/messages", messagesBody, HeaderOutputTokens, "10")
	reset := r.clk.Now().Add(time.Minute).Format(time.RFC3339)
	for k, v := range map[string]string{
		"Requests-Limit": "10", "Requests-Remaining": "6", "Requests-Reset": reset,
		"Tokens-Limit": "10000", "Tokens-Remaining": itoa(10_000 - 3*(chatInput+100) - (messagesInput + 50)), "Tokens-Reset": reset,
		"Input-Tokens-Limit": "5000", "Input-Tokens-Remaining": itoa(5_000 - 3*chatInput - messagesInput), "Input-Tokens-Reset": reset,
		// output: 3 × 10 written, and this request's 10 (its 50 reserved, corrected when it ended)
		"Output-Tokens-Limit": "2000", "Output-Tokens-Remaining": itoa(2_000 - 40), "Output-Tokens-Reset": reset,
	} {
		if got := a.header.Get("Anthropic-Ratelimit-" + k); got != v {
			t.Errorf("anthropic-ratelimit-%s = %q, want %q", k, got, v)
		}
	}
	if d := a.header.Get("Date"); d != r.clk.Now().Format(http.TimeFormat) {
		t.Errorf("Date %q: want the provider's clock", d)
	}
}

// TestRateLimited: past the account's per-minute limits a request is
// answered 429 in its API's error shape, with the exact time until it fits
// in retry-after-ms and retry-after; the account counts no 429, and once
// the window moves on the request goes through.
func TestRateLimited(t *testing.T) {
	cfg := instant()
	cfg.RequestsPerMinute = 2
	r := newRig(t, cfg)
	r.post(t, "/v1/chat/completions", chatBody)
	r.clk.Add(20 * time.Second)
	r.post(t, "/v1/messages", messagesBody)
	r.clk.Add(10 * time.Second) // the first request leaves the window in 30 s

	for _, tc := range []struct {
		path, body, want string
		status           int
	}{
		{"/v1/chat/completions", chatBody, `"error":{"message":"Rate limit reached for gpt-4o in organization org-simulated on requests per min (RPM): Limit 2, Used 2, Requested 1. Please try again in 30s.","type":"requests","param":null,"code":"rate_limit_exceeded"}`, 429},
		{"/v1/responses", responsesBody, `"type":"requests"`, 429},
		{"/v1/messages", messagesBody, `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 2 requests per minute (2 used, 1 requested). Please try again later."},"request_id":"req_sim`, 429},
		{"/v1beta/models/gemini-2.5-flash:generateContent", geminiBody, `{"error":{"code":429,"message":"You exceeded your current quota: 2 requests per minute (2 used, 1 requested). Please retry in 30s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30.000s"}]}}`, 429},
	} {
		a := r.post(t, tc.path, tc.body)
		if a.status != tc.status || !strings.Contains(a.body, tc.want) {
			t.Errorf("%s: %d %s\nwant %d with %s", tc.path, a.status, a.body, tc.status, tc.want)
		}
		for k, v := range map[string]string{"Retry-After": "30", "Retry-After-Ms": "30000", "X-Should-Retry": "true", "Content-Type": "application/json"} {
			if got := a.header.Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", tc.path, k, got, v)
			}
		}
	}
	if a := r.post(t, "/v1/chat/completions", chatBody); a.header.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Errorf("a 429 says %q requests left, want 0", a.header.Get("X-Ratelimit-Remaining-Requests"))
	}
	r.clk.Add(30 * time.Second)
	if a := r.post(t, "/v1/chat/completions", chatBody); a.status != 200 {
		t.Fatalf("after the first request left the window: %d %s", a.status, a.body)
	}
	if st := r.prov.Stats(); st.RateLimitedRequests != 5 || st.Completed != 3 {
		t.Errorf("stats %+v", st)
	}

	// Tokens: OpenAI's type is "tokens".
	cfg = instant()
	cfg.TokensPerMinute = 150
	r = newRig(t, cfg)
	r.post(t, "/v1/chat/completions", chatBody)
	if a := r.post(t, "/v1/chat/completions", chatBody); a.status != 429 || !strings.Contains(a.body, `on tokens per min (TPM): Limit 150, Used 118, Requested 118.`) || !strings.Contains(a.body, `"type":"tokens"`) {
		t.Errorf("TPM: %d %s", a.status, a.body)
	}
}

// TestOverloaded: a request over the account's concurrency is an
// overload: 503 for OpenAI and Gemini, 529 overloaded_error for
// Anthropic, with the retry headers. Answers come when the account's
// latency says: the one in flight holds until the clock moves.
func TestOverloaded(t *testing.T) {
	cfg := instant()
	cfg.MaxConcurrent = 1
	cfg.TimeToFirstToken = time.Second
	r := newRig(t, cfg)
	held := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- answer{}
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		held <- answer{status: res.StatusCode, body: string(b)}
	}()
	testutil.WaitFor(t, "a request in flight", func() bool { return r.prov.Stats().InFlight == 1 })
	for _, tc := range []struct {
		path, body, want string
		status           int
	}{
		{"/v1/chat/completions", chatBody, `{"error":{"message":"The server is overloaded: the simulated account has 1 of its 1 concurrent requests in flight. Please try again later.","type":"service_unavailable_error","param":null,"code":"server_is_overloaded"}}`, 503},
		{"/v1/messages", messagesBody, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}`, 529},
		{"/v1beta/models/g:streamGenerateContent?alt=sse", geminiBody, `"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"`, 503},
	} {
		a := r.post(t, tc.path, tc.body)
		if a.status != tc.status || !strings.Contains(a.body, tc.want) || a.header.Get("Retry-After") != "1" || a.header.Get("X-Should-Retry") != "true" {
			t.Errorf("%s: %d %v %s\nwant %d with %s", tc.path, a.status, a.header, a.body, tc.status, tc.want)
		}
	}
	select {
	case a := <-held:
		t.Fatalf("answered before its latency: %+v", a)
	default:
	}
	r.clk.Add(time.Second)
	if a := <-held; a.status != 200 {
		t.Fatalf("held request: %+v", a)
	}
}

// TestBadRequests: what the API would refuse is answered 400 (404, 405,
// 413) in the API's own error shape, and never reaches the account.
func TestBadRequests(t *testing.T) {
	r := newRig(t, instant())
	for _, tc := range []struct {
		path, body, want string
		status           int
		header           []string
	}{
		{"/v1/chat/completions", `{"model":`, `{"error":{"message":"We could not parse the JSON body of your request: unexpected EOF","type":"invalid_request_error","param":null,"code":null}}`, 400, nil},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, `{"error":{"message":"you must provide a model parameter","type":"invalid_request_error","param":"model","code":"missing_required_parameter"}}`, 400, nil},
		{"/v1/chat/completions", `{"model":"m","messages":[]}`, `"param":"messages","code":"empty_array"`, 400, nil},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, `"param":"max_tokens","code":"integer_below_min_value"`, 400, nil},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, `only allowed when 'stream' is enabled`, 400, nil},
		{"/v1/chat/completions", `[1]`, `The request body must be a JSON object, got an array`, 400, nil},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]} {}`, `data after the top-level value`, 400, nil},
		{"/v1/chat/completions", chatBody, `"param":"X-Sim-Output-Tokens"`, 400, []string{HeaderOutputTokens, "-1"}},
		{"/v1/responses", `{"input":"hi"}`, `you must provide a model parameter`, 400, nil},
		{"/v1/responses", `{"model":"m","input":7}`, `Invalid type for 'input'`, 400, nil},
		{"/v1/messages", `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"},"request_id":"req_sim`, 400, nil},
		{"/v1/messages", `{"max_tokens":5,"messages":[]}`, `"message":"model: Field required"`, 400, nil},
		{"/v1/messages", `nope`, `"type":"invalid_request_error","message":"We could not parse the JSON body of your request: invalid character`, 400, nil},
		{"/v1beta/models/g:generateContent", `{}`, `{"error":{"code":400,"message":"Missing required parameter: 'contents'.","status":"INVALID_ARGUMENT"}}`, 400, nil},
		{"/v1beta/models/:generateContent", geminiBody, `"message":"The model is missing from the URL`, 400, nil},
		{"/v1beta/models/g:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":"x"}}`, `Invalid type for 'maxOutputTokens'`, 400, nil},
		{"/v1/embeddings", `{}`, `{"error":{"message":"Invalid URL (POST /v1/embeddings)","type":"invalid_request_error","param":null,"code":"unknown_url"}}`, 404, nil},
	} {
		a := r.post(t, tc.path, tc.body, tc.header...)
		if a.status != tc.status || !strings.Contains(a.body, tc.want) {
			t.Errorf("%s %s: %d %s\nwant %d with %s", tc.path, tc.body, a.status, a.body, tc.status, tc.want)
		}
	}
	res, err := http.Get(r.srv.URL + "/v1/messages")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 405 || res.Header.Get("Allow") != "POST" || !strings.Contains(string(b), `"type":"invalid_request_error"`) {
		t.Errorf("GET /v1/messages: %d %v %s", res.StatusCode, res.Header, b)
	}
	res, err = http.Post(r.srv.URL+"/v1/chat/completions", "application/json", io.LimitReader(zeros{}, maxBodyBytes+1))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 || !strings.Contains(string(b), "Request body is larger than") {
		t.Errorf("a body over the limit: %d %s", res.StatusCode, b)
	}
	if n := r.prov.Stats().Requests; n != 0 {
		t.Errorf("the account saw %d requests", n)
	}
	res, err = http.Get(r.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), "any API key is accepted") {
		t.Errorf("GET /: %d %s", res.StatusCode, b)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestSimHeaders: X-Sim-Id fixes a request's draws, so the same ID gets
// the same answer; X-Sim-Input-Tokens replaces the count from the text.
func TestSimHeaders(t *testing.T) {
	cfg := instant()
	cfg.OutputSpread, cfg.Seed = 1, 7
	r := newRig(t, cfg)
	a := r.post(t, "/v1/chat/completions", chatBody, HeaderID, "42", HeaderInputTokens, "1234").json(t)
	b := r.post(t, "/v1/chat/completions", chatBody, HeaderID, "42", HeaderInputTokens, "1234").json(t)
	if get(t, a, "usage.completion_tokens") != get(t, b, "usage.completion_tokens") || get(t, a, "usage.prompt_tokens") != 1234.0 {
		t.Errorf("same ID, usages %v and %v", a["usage"], b["usage"])
	}
}

// TestClientGoneMidStream: a client that goes away mid-stream ends the
// request at the account (counted cancelled), and the handler returns.
func TestClientGoneMidStream(t *testing.T) {
	cfg := instant()
	cfg.PerOutputToken = time.Second
	r := newRig(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/v1/messages",
		strings.NewReader(strings.Replace(messagesBody, `{"model"`, `{"stream":true,"model"`, 1)))
	req.Header.Set(HeaderOutputTokens, "40")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if _, err := io.ReadFull(res.Body, buf); err != nil || string(buf) != "event: message_s" {
		t.Fatalf("first bytes %q, %v", buf, err)
	}
	cancel()
	res.Body.Close()
	testutil.WaitFor(t, "the request to end", func() bool { return r.prov.Stats().Canceled == 1 && r.prov.Stats().InFlight == 0 })
}
