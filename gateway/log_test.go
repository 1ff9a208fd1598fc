package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// logLines decodes the JSON lines of a request log.
func logLines(t *testing.T, logs *testutil.Buffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// lineOf returns the line of the request tagged tag.
func lineOf(t *testing.T, lines []map[string]any, tag string) map[string]any {
	t.Helper()
	for _, l := range lines {
		if l["tag"] == tag {
			return l
		}
	}
	t.Fatalf("no log line for %s", tag)
	return nil
}

// logRig is a gateway, logging JSON lines, in front of an upstream that
// streams (the fake OpenAI's "hold" waits to be released) and of one that
// breaks its stream after the first event.
func logRig(t *testing.T, mode string) (*testutil.Buffer, *fakeOpenAI, func(path, tag, body string, ctx context.Context) *http.Response, func() map[string]any) {
	up := newFakeOpenAI(t)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection breaks mid-stream
	}))
	t.Cleanup(broken.Close)
	logs := &testutil.Buffer{}
	g, srv := buildGateway(t, `log: {format: json, requests: `+mode+`}
upstreams:
  openai: {base_url: "`+up.srv.URL+`"}
  broken: {base_url: "`+broken.URL+`"}
  down: {base_url: "http://127.0.0.1:1"}
bulkheads:
  main: {model: gpt-4o, max_concurrent: 1, token_budget: 100000}
  other: {max_concurrent: 4}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: main}
  - {api: anthropic-messages, upstream: broken, bulkhead: other}
  - {api: openai-responses, upstream: down, bulkhead: other}
`, nil, logs)
	call := func(path, tag, body string, ctx context.Context) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+path, strings.NewReader(body))
		req.Header.Set("X-Request-Id", tag)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	shutdown := func() map[string]any {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the deadline has passed: the calls still running are cut
		left := g.Shutdown(ctx)
		out := map[string]any{}
		for k, v := range left {
			out[k] = v
		}
		return out
	}
	return logs, up, call, shutdown
}

// TestRequestLog: every request gets one line, however it ends: done,
// shed, refused, unauthorized, its client gone mid-stream (499), its
// upstream failing before or during its answer, or cut at the shutdown
// deadline; with the route, bulkhead, model and durations in milliseconds.
func TestRequestLog(t *testing.T) {
	logs, up, call, shutdown := logRig(t, "all")
	chat := func(content string, stream bool) string {
		return fmt.Sprintf(`{"model":"gpt-4o","stream":%v,"messages":[{"role":"user","content":%q}],"max_tokens":5}`, stream, content)
	}
	drain := func(res *http.Response) {
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	drain(call("/v1/chat/completions", "done", chat("hi", false), context.Background()))
	<-up.auth
	drain(call("/v1/chat/completions", "refused", `{"messages":[]}`, context.Background()))
	drain(call("/v1/responses", "down", `{"model":"o3","input":"hi"}`, context.Background()))
	drain(call("/v1/messages", "broken", `{"model":"claude","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, context.Background()))

	// A stream whose client goes away after the first event.
	ctx, cancel := context.WithCancel(context.Background())
	gone := call("/v1/chat/completions", "gone", chat("hold", true), ctx)
	<-up.auth
	if line, _ := bufio.NewReader(gone.Body).ReadString('\n'); !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
	cancel()
	gone.Body.Close()
	testutil.WaitFor(t, "the vanished client's line", func() bool { return strings.Contains(logs.String(), `"tag":"gone"`) })

	// A stream holds the only slot: the next call is shed; then the
	// gateway shuts down past its deadline and cuts the stream.
	cut := call("/v1/chat/completions", "cut", chat("hold", true), context.Background())
	<-up.auth
	br := bufio.NewReader(cut.Body)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
	drain(call("/v1/chat/completions", "shed", chat("hi", false), context.Background()))
	left := shutdown()
	if fmt.Sprint(left) != "map[main:{false 1 0 0 0}]" {
		t.Errorf("left at the deadline: %v; want main with its one stream", left)
	}
	if _, err := io.ReadAll(br); err == nil {
		t.Error("the cut stream ended cleanly")
	}
	cut.Body.Close()

	var lines []map[string]any // the request lines (the proxy warns of the broken and the cut streams too)
	for _, l := range logLines(t, logs) {
		if l["msg"] == "request" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 7 {
		t.Fatalf("%d request lines; want 7:\n%s", len(lines), logs.String())
	}
	for _, want := range []struct {
		tag, end string
		status   float64
		route    any
		bulkhead any
	}{
		{"done", "done", 200, 0.0, "main"},
		{"refused", "refused", 400, nil, nil},
		{"down", "upstream_error", 502, 2.0, "other"},
		{"broken", "upstream_error", 200, 1.0, "other"},
		{"gone", "client_gone", 499, 0.0, "main"},
		{"shed", "shed", 503, 0.0, "main"},
		{"cut", "shutdown", 200, 0.0, "main"},
	} {
		l := lineOf(t, lines, want.tag)
		if l["end"] != want.end || l["status"] != want.status || l["route"] != want.route || l["bulkhead"] != want.bulkhead {
			t.Errorf("%s: %v; want end %s, status %v, route %v, bulkhead %v", want.tag, l, want.end, want.status, want.route, want.bulkhead)
		}
		if d, ok := l["duration_ms"].(float64); !ok || d <= 0 || d > 60_000 {
			t.Errorf("%s: duration_ms %v", want.tag, l["duration_ms"])
		}
	}
	for _, tag := range []string{"done", "gone", "cut"} {
		l := lineOf(t, lines, tag)
		if l["model"] != "gpt-4o" || len(fmt.Sprint(l["admission_id"])) != 36 || l["header_ms"] == nil {
			t.Errorf("%s: %v; want the model, the admission ID and header_ms", tag, l)
		}
	}
	if l := lineOf(t, lines, "shed"); l["shed"] != "concurrency_limit" {
		t.Errorf("shed: %v", l)
	}
}

// TestRequestLogModes: requests: errors logs only what did not end in a
// success; none logs nothing.
func TestRequestLogModes(t *testing.T) {
	for mode, want := range map[string][]string{"errors": {"refused", "down"}, "none": nil} {
		logs, up, call, shutdown := logRig(t, mode)
		for _, c := range []struct{ path, tag, body string }{
			{"/v1/chat/completions", "done", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`},
			{"/v1/chat/completions", "refused", `{"messages":[]}`},
			{"/v1/responses", "down", `{"model":"o3","input":"hi"}`},
		} {
			res := call(c.path, c.tag, c.body, context.Background())
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		<-up.auth
		shutdown()
		var tags []string
		for _, l := range logLines(t, logs) {
			tags = append(tags, fmt.Sprint(l["tag"]))
		}
		if fmt.Sprint(tags) != fmt.Sprint(want) {
			t.Errorf("requests: %s logged %v; want %v", mode, tags, want)
		}
	}
}

// stdLog captures what the standard logger writes until the test ends.
func stdLog(t *testing.T) *testutil.Buffer {
	var b testutil.Buffer
	w, flags := log.Writer(), log.Flags()
	log.SetOutput(&b)
	t.Cleanup(func() { log.SetOutput(w); log.SetFlags(flags) })
	return &b
}

// TestProxyErrorsInGatewayLog: the reverse proxy's own error lines (a
// stream the upstream broke off) go to the gateway's log, as structured
// warnings, never to the standard logger.
func TestProxyErrorsInGatewayLog(t *testing.T) {
	std := stdLog(t)
	logs, _, call, _ := logRig(t, "all")
	res := call("/v1/messages", "broken", `{"model":"claude","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, context.Background())
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	testutil.WaitFor(t, "the broken stream's line", func() bool { return strings.Contains(logs.String(), `"tag":"broken"`) })
	if s := std.String(); s != "" {
		t.Errorf("the standard logger got %q", s)
	}
	var warned bool
	for _, l := range logLines(t, logs) {
		if l["level"] == "WARN" && strings.Contains(fmt.Sprint(l["msg"]), "ReverseProxy read error") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning of the proxy's read error in the gateway's log:\n%s", logs.String())
	}
}

// TestStreamClosedAfterLastEventIsDone: a client that closes a stream as
// soon as it has read its last event (openai-go stops at data: [DONE]),
// while the upstream has not ended the response yet, got the whole
// answer: the call is logged done, 200, in every dialect, and the
// bulkhead settles it with the provider's usage.
func TestStreamClosedAfterLastEventIsDone(t *testing.T) {
	events := map[string][]string{
		"/v1/chat/completions": {
			`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`,
			`data: {"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`,
			`data: [DONE]`,
		},
		"/v1/responses": {
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":3,\"total_tokens\":13}}}",
		},
		"/v1/messages": {
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}",
		},
		"/v1beta/models/gemini-2.5-flash:streamGenerateContent": {
			`data: {"candidates":[{"content":{"parts":[{"text":"hi"}]}}]}`,
			`data: {"candidates":[{"content":{"parts":[{"text":"!"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":3,"totalTokenCount":13}}`,
		},
	}
	// The upstream sends a stream's events, then holds the response open
	// until the gateway gives up on it.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events[r.URL.Path] {
			fmt.Fprint(w, e+"\n\n")
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer up.Close()
	std := stdLog(t)
	logs := &testutil.Buffer{}
	g, srv := buildGateway(t, `log: {format: json}
upstreams: {up: {base_url: "`+up.URL+`"}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 8, token_budget: 100000}}
routes:
  - {api: openai-chat, upstream: up, bulkhead: main}
  - {api: openai-responses, upstream: up, bulkhead: main}
  - {api: anthropic-messages, upstream: up, bulkhead: main}
  - {api: gemini, upstream: up, bulkhead: main}
`, nil, logs)
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		"/v1/responses":        `{"model":"gpt-4o","stream":true,"input":"hi","max_output_tokens":5}`,
		"/v1/messages":         `{"model":"gpt-4o","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		"/v1beta/models/gemini-2.5-flash:streamGenerateContent": `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":5}}`,
	}
	for path, body := range bodies {
		req, _ := http.NewRequest("POST", srv.URL+path+"?alt=sse", strings.NewReader(body))
		req.Header.Set("X-Request-Id", path)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		last := events[path][len(events[path])-1]
		last = last[strings.LastIndex(last, "data: "):]
		br := bufio.NewReader(res.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: %v before the last event", path, err)
			}
			if strings.TrimSuffix(line, "\n") == last {
				break
			}
		}
		res.Body.Close() // as soon as the last event is read
		testutil.WaitFor(t, path+"'s log line", func() bool { return strings.Contains(logs.String(), `"tag":"`+path+`"`) })
	}
	lines := logLines(t, logs)
	for path := range bodies {
		if l := lineOf(t, lines, path); l["end"] != "done" || l["status"] != 200.0 {
			t.Errorf("%s: logged %v; want end done, status 200", path, l)
		}
	}
	b := g.Bulkheads["main"]
	testutil.WaitFor(t, "the calls to be released", func() bool { return b.Stats().Calls.Released == 4 })
	if st := b.Stats(); st.TokenBudget.TotalConsumed != 4*13 {
		t.Errorf("consumed %d tokens; want the provider's 13 for each call", st.TokenBudget.TotalConsumed)
	}
	if s := std.String(); s != "" {
		t.Errorf("the standard logger got %q", s)
	}
}
