package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// holdSlot starts a streamed call the fake upstream holds until released
// (or the test ends), and returns once its first event has come back.
func holdSlot(t *testing.T, up *fakeOpenAI, url string) *http.Response {
	t.Helper()
	res := post(t, context.Background(), url, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}]}`)
	t.Cleanup(func() { res.Body.Close() }) // a test that fails lets it go
	<-up.auth
	if line, _ := bufio.NewReader(res.Body).ReadString('\n'); !strings.HasPrefix(line, "data: ") {
		t.Fatalf("held call: %d %q", res.StatusCode, line)
	}
	return res
}

// metric returns the line of the gateway's /metrics that starts with
// prefix.
func metric(t *testing.T, url, prefix string) string {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestShedEarly: once the bulkhead has turned a call away for want of a
// slot, a call that finds the gateway's calls still filling it is answered
// before its body is read: a body that is not even JSON gets the bulkhead's
// 503, with its detail, not the 400 a parse would give. The body is read
// and discarded, so the connection carries the next call. The request log
// says shed; the gateway's metrics count the early refusals, which the
// bulkhead's own do not. Once the slot frees, calls go through again.
func TestShedEarly(t *testing.T) {
	up := newFakeOpenAI(t)
	logs := &testutil.Buffer{}
	g, srv := buildGateway(t, `log: {format: json}
upstreams:
  openai: {base_url: "`+up.srv.URL+`"}
bulkheads:
  main: {model: gpt-4o, max_concurrent: 1, token_budget: 100000}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: main}
`, nil, logs)
	b := g.Bulkheads["main"]
	held := holdSlot(t, up, srv.URL)

	// Before the bulkhead has refused anything, a call takes the full
	// path: its body is parsed.
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	notJSON := "this is not JSON"
	io.WriteString(conn, rawRequest("/v1/chat/completions", len(notJSON))+notJSON)
	if res, body := readResponse(t, br); res.StatusCode != 400 {
		t.Fatalf("before any refusal: %d %s", res.StatusCode, body)
	}
	res := post(t, context.Background(), srv.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 503 || b.Stats().Calls.Rejected != 1 {
		t.Fatalf("the full path's refusal: %d, %d rejected", res.StatusCode, b.Stats().Calls.Rejected)
	}

	// Now the same body is turned away unread, twice on one connection.
	for i := range 2 {
		io.WriteString(conn, strings.Replace(rawRequest("/v1/chat/completions", len(notJSON)), "\r\n\r\n", "\r\nX-Request-Id: early\r\n\r\n", 1)+notJSON)
		res, body := readResponse(t, br)
		var got struct {
			Error struct {
				Code     string          `json:"code"`
				Bulkhead *gateway.Detail `json:"bulkhead"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("%d: %v: %s", i, err, body)
		}
		d := got.Error.Bulkhead
		if res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "true" || res.Header.Get("X-Bulkhead-Reason") != "concurrency_limit" ||
			res.Close || got.Error.Code != "server_is_overloaded" || d == nil || d.InFlight != 1 || d.MaxConcurrent != 1 || d.Tag != "early" {
			t.Fatalf("%d: %d close=%v %v %s", i, res.StatusCode, res.Close, res.Header, body)
		}
	}
	if st := b.Stats(); st.Calls.Rejected != 1 {
		t.Errorf("the bulkhead counted %d rejections; want the full path's 1", st.Calls.Rejected)
	}
	if m := metric(t, srv.URL, `bulkhead_gateway_rejected_early_total{bulkhead="main",reason="concurrency_limit"}`); !strings.HasSuffix(m, " 2") {
		t.Errorf("early refusals metric: %q", m)
	}
	testutil.WaitFor(t, "the early calls' log lines", func() bool { return strings.Count(logs.String(), `"tag":"early"`) == 2 })
	for _, l := range logLines(t, logs) {
		if l["tag"] == "early" && (l["end"] != "shed" || l["shed"] != "concurrency_limit" || l["bulkhead"] != "main" || l["status"] != 503.0) {
			t.Errorf("log line %v", l)
		}
	}

	// A client that waits for 100 Continue before sending its body is
	// answered without it: the body is never asked for, and the
	// connection closes after the answer.
	if res, body := expectContinue(t, srv.URL, 1000); res.StatusCode != 503 || !res.Close {
		t.Fatalf("a call expecting 100 Continue: %d close=%v %s", res.StatusCode, res.Close, body)
	}

	// The slot frees: calls go through again.
	close(up.release)
	io.Copy(io.Discard, held.Body)
	held.Body.Close()
	testutil.WaitFor(t, "the held call's release", idle(b))
	res = post(t, context.Background(), srv.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	<-up.auth
	if res.StatusCode != 200 {
		t.Fatalf("with the slot free: %d", res.StatusCode)
	}
}

// TestShedEarlyBodies: a call turned away early whose declared body is
// longer than the route's limit again (at least 1 MiB) is not read: its
// answer closes the connection. A Handler whose route chooses admission
// options from the parsed call never turns a call away unread; one without
// options does.
func TestShedEarlyBodies(t *testing.T) {
	up := newFakeOpenAI(t)
	b, _ := bulkhead.New(budgetConfig(1))
	defer b.Shutdown(context.Background())
	fromCall := func(_ *http.Request, c *stream.Call) []bulkhead.Option {
		return []bulkhead.Option{bulkhead.WithTag(c.Request.Model)}
	}
	for _, tc := range []struct {
		name    string
		options func(*http.Request, *stream.Call) []bulkhead.Option
		early   bool
	}{{"no options", nil, true}, {"options from the call", fromCall, false}} {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := url.Parse(up.srv.URL)
			h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, MaxBodyBytes: 1 << 10, Options: tc.options})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			held := holdSlot(t, up, srv.URL)
			res := post(t, context.Background(), srv.URL, `{"model":"gpt-4o","messages":[]}`) // the full path's refusal
			io.Copy(io.Discard, res.Body)
			res.Body.Close()

			conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, rawRequest("/v1/chat/completions", 4<<20)+"{")
			res, body := readResponse(t, bufio.NewReader(conn))
			if tc.early && (res.StatusCode != 503 || !res.Close) || !tc.early && res.StatusCode != 413 {
				t.Fatalf("%d close=%v %s", res.StatusCode, res.Close, body)
			}

			up.release <- struct{}{}
			io.Copy(io.Discard, held.Body)
			held.Body.Close()
			testutil.WaitFor(t, "the held call's release", idle(b))
		})
	}
}

// TestShedEarlyLeavesRetriesToTheirBudget: at a full gateway, a retry that
// its retry budget refuses is answered for its budget (x-should-retry:
// false, so the SDK stops), not for the capacity the early check sees
// (x-should-retry: true, and the SDK would come back), and the bulkhead
// counts it; a first attempt is shed early as before.
func TestShedEarlyLeavesRetriesToTheirBudget(t *testing.T) {
	up := newFakeOpenAI(t)
	g, srv := buildGateway(t, `upstreams:
  openai: {base_url: "`+up.srv.URL+`"}
bulkheads:
  main: {model: gpt-4o, max_concurrent: 2, retry_budget: {min_retries: 1}}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: main}
`, nil, io.Discard)
	b := g.Bulkheads["main"]
	call := func(attempt string, hold bool) *http.Response {
		t.Helper()
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
		if hold {
			body = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}]}`
		}
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Stainless-Retry-Count", attempt)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if hold {
			t.Cleanup(func() { res.Body.Close() })
			<-up.auth
			return res
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	call("0", true)
	call("1", true) // both slots held; the floor's one retry taken
	if res := call("0", false); res.StatusCode != 503 || res.Header.Get("X-Bulkhead-Reason") != "concurrency_limit" {
		t.Fatalf("the full path's refusal: %d %v", res.StatusCode, res.Header)
	}
	res := call("2", false)
	if res.StatusCode != 503 || res.Header.Get("X-Bulkhead-Reason") != "retry_budget" || res.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("a retry over budget at a full gateway: %d %v", res.StatusCode, res.Header)
	}
	if res := call("0", false); res.Header.Get("X-Bulkhead-Reason") != "concurrency_limit" || res.Header.Get("X-Should-Retry") != "true" {
		t.Fatalf("a first attempt at a full gateway: %d %v", res.StatusCode, res.Header)
	}
	if m := metric(t, srv.URL, `bulkhead_gateway_rejected_early_total{bulkhead="main",reason="concurrency_limit"}`); !strings.HasSuffix(m, " 1") {
		t.Errorf("early refusals: %q, want the first attempt's", m)
	}
	if st := b.Stats(); st.Calls.RejectedByReason[bulkhead.RetryBudget] != 1 || st.Calls.RejectedByReason[bulkhead.ConcurrencyLimit] != 1 {
		t.Errorf("the bulkhead counted %v", st.Calls.RejectedByReason)
	}
}
