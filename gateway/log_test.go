package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
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

	lines := logLines(t, logs)
	if len(lines) != 7 {
		t.Fatalf("%d lines; want 7:\n%s", len(lines), logs.String())
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
