package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// newHandler is a gateway.Handler with one route per format given, to
// upstream, through b; edit adjusts it before it serves.
func newHandler(t *testing.T, upstream string, b *bulkhead.Bulkhead, maxBody int64, edit func(*gateway.Handler), formats ...stream.Format) (*gateway.Handler, *httptest.Server) {
	t.Helper()
	u, _ := url.Parse(upstream)
	var routes []gateway.Route
	for _, f := range formats {
		routes = append(routes, gateway.Route{Format: f, Upstream: u, Bulkhead: b, MaxBodyBytes: maxBody})
	}
	h, err := gateway.New(routes...)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv
}

// rawRequest is the head of a POST of a chat completion whose body is n
// bytes (chunked when n < 0), on a connection kept alive.
func rawRequest(path string, n int) string {
	length := fmt.Sprintf("Content-Length: %d\r\n", n)
	if n < 0 {
		length = "Transfer-Encoding: chunked\r\n"
	}
	return "POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + length + "\r\n"
}

// readResponse reads one response from br, its body whole.
func readResponse(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return res, string(body)
}

// TestOversizedBodyAnswerReadable: a client that writes a whole body over
// the limit before it reads (as the Python SDKs do) reads a 413 in its
// dialect, and its connection stays usable: the gateway reads and discards
// the rest of a body up to its limit again. A client that goes on writing
// past that reads the 413 too, and the connection closes.
func TestOversizedBodyAnswerReadable(t *testing.T) {
	up := newFakeOpenAI(t)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	const limit = 4 << 20
	_, srv := newHandler(t, up.srv.URL, b, limit, nil, stream.OpenAIChat)
	addr := strings.TrimPrefix(srv.URL, "http://")
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("x", 2*limit-64) + `"}]}`
	small := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`

	for _, chunked := range []bool{false, true} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		// The whole body first, then the answer, as a sequential client.
		if chunked {
			_, err = io.WriteString(conn, rawRequest("/v1/chat/completions", -1)+fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(big), big))
		} else {
			_, err = io.WriteString(conn, rawRequest("/v1/chat/completions", len(big))+big)
		}
		if err != nil {
			t.Fatalf("chunked %v: writing the body: %v (the gateway closed the connection before reading it)", chunked, err)
		}
		res, body := readResponse(t, br)
		if res.StatusCode != 413 || res.Header.Get("X-Should-Retry") != "false" || !strings.Contains(body, `"code":"request_too_large"`) || res.Close {
			t.Fatalf("chunked %v: %d %v %s", chunked, res.StatusCode, res.Header, body)
		}
		// The connection goes on.
		if _, err := io.WriteString(conn, rawRequest("/v1/chat/completions", len(small))+small); err != nil {
			t.Fatal(err)
		}
		if res, body := readResponse(t, br); res.StatusCode != 200 {
			t.Fatalf("chunked %v: the next call on the connection: %d %s", chunked, res.StatusCode, body)
		}
		<-up.auth
		conn.Close()
	}

	// A client that says it sends far more than the gateway discards, and
	// goes on writing, reads its 413 while it writes.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		chunk := []byte(strings.Repeat("x", 64<<10))
		if _, err := io.WriteString(conn, rawRequest("/v1/chat/completions", 1<<30)+`{"model":"gpt-4o","messages":[{"role":"user","content":"`); err != nil {
			return
		}
		for {
			if _, err := conn.Write(chunk); err != nil {
				return // the gateway closed the connection
			}
		}
	}()
	res, body := readResponse(t, bufio.NewReader(conn))
	if res.StatusCode != 413 || !res.Close || !strings.Contains(body, "larger than 4194304 bytes") {
		t.Fatalf("a body far too large: %d close=%v %s", res.StatusCode, res.Close, body)
	}
	conn.Close()
	wg.Wait()
	if st := b.Stats(); st.Calls.Admitted != 2 {
		t.Fatalf("admitted %d calls; want the 2 small ones", st.Calls.Admitted)
	}
}

// TestBodyBudget: the bytes of the bodies being read count against one
// budget; a call whose body finds it spent is answered 503 (529 for
// Anthropic) with x-should-retry: true, and the bytes return to the budget
// when a call ends.
func TestBodyBudget(t *testing.T) {
	up := newFakeOpenAI(t)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, srv := newHandler(t, up.srv.URL, b, 0, func(h *gateway.Handler) { h.BodyBudget = 4096 }, stream.OpenAIChat, stream.AnthropicMessages)
	// A slow client holds 4000 bytes of the budget.
	slow, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, rawRequest("/v1/chat/completions", 4090)+strings.Repeat(" ", 4000)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the slow body's bytes to be held", func() bool { return gateway.BodyBytesHeld(h) == 4000 })
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}],"max_tokens":5}`
	for _, c := range []struct {
		path   string
		status int
		field  string
	}{{"/v1/chat/completions", 503, "error.code"}, {"/v1/messages", 529, "error.type"}} {
		res, err := http.Post(srv.URL+c.path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		res.Body.Close()
		if res.StatusCode != c.status || res.Header.Get("X-Should-Retry") != "true" || !strings.Contains(fmt.Sprint(m), "overloaded") {
			t.Fatalf("%s with the budget spent: %d %v %v", c.path, res.StatusCode, res.Header, m)
		}
	}
	if n := gateway.BodyBytesHeld(h); n != 4000 {
		t.Fatalf("%d bytes held after the refused calls; want the slow client's 4000", n)
	}
	slow.Close()
	testutil.WaitFor(t, "the slow body's bytes to return", func() bool { return gateway.BodyBytesHeld(h) == 0 })
	res := post(t, context.Background(), srv.URL, body)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	<-up.auth
	if res.StatusCode != 200 {
		t.Fatalf("with the budget free: %d", res.StatusCode)
	}
	testutil.WaitFor(t, "the call's bytes to return", func() bool { return gateway.BodyBytesHeld(h) == 0 })
	if st := b.Stats(); st.Calls.Admitted != 1 {
		t.Fatalf("admitted %d", st.Calls.Admitted)
	}
}

// TestBodyTimeout: a body that does not arrive within the body timeout is
// answered 408, and the connection closed.
func TestBodyTimeout(t *testing.T) {
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, srv := newHandler(t, "http://upstream.invalid", b, 0, func(h *gateway.Handler) { h.BodyTimeout = 100 * time.Millisecond }, stream.OpenAIChat)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, rawRequest("/v1/chat/completions", 1000)+`{"model":`); err != nil {
		t.Fatal(err)
	}
	res, body := readResponse(t, bufio.NewReader(conn))
	if res.StatusCode != 408 || !res.Close || !strings.Contains(body, "did not arrive within 100ms") {
		t.Fatalf("%d close=%v %s", res.StatusCode, res.Close, body)
	}
	testutil.WaitFor(t, "the bytes to return", func() bool { return gateway.BodyBytesHeld(h) == 0 })
}

// TestBodyLimitsOverflowSafe: the largest limits there are read a call as
// any other.
func TestBodyLimitsOverflowSafe(t *testing.T) {
	up := newFakeOpenAI(t)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	_, srv := newHandler(t, up.srv.URL, b, math.MaxInt64, func(h *gateway.Handler) { h.BodyBudget = math.MaxInt64 }, stream.OpenAIChat)
	res := post(t, context.Background(), srv.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	<-up.auth
	if res.StatusCode != 200 {
		t.Fatalf("%d", res.StatusCode)
	}
}

// TestSlowClientsBoundedMemory: 64 clients that each declare a 32 MiB body
// and send one byte of it hold a few bytes each, not what they declared,
// while other calls go on being served.
func TestSlowClientsBoundedMemory(t *testing.T) {
	up := newFakeOpenAI(t)
	g, srv := buildGateway(t, `upstreams: {openai: {base_url: "`+up.srv.URL+`"}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 16, token_budget: 100000}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`, nil, io.Discard)
	call := func() bool {
		res, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
		if err != nil {
			t.Error(err)
			return false
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("a call beside the slow clients: %d", res.StatusCode)
			return false
		}
		<-up.auth
		return true
	}
	if !call() {
		t.FailNow()
	}
	idle := heapInuse()
	const clients = 64
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range clients {
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, rawRequest("/v1/chat/completions", 32<<20)+"{"); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "every slow client's byte to be read", func() bool { return gateway.GatewayBodyBytesHeld(g) == clients })
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call()
		}()
	}
	wg.Wait()
	held := heapInuse()
	t.Logf("heap in use: %.1f MiB idle, %.1f MiB with %d slow clients (+%.1f MiB)", mib(idle), mib(held), clients, mib(held-idle))
	if held > idle+100<<20 {
		t.Fatalf("%d slow clients took the heap from %.1f MiB to %.1f MiB", clients, mib(idle), mib(held))
	}
	for _, c := range conns {
		c.Close()
	}
	testutil.WaitFor(t, "the slow clients' bytes to return", func() bool { return gateway.GatewayBodyBytesHeld(g) == 0 })
}

func heapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestRouteBodyLimit: a model's route with a smaller body limit than its
// format's other routes refuses a body over its own limit, 413, once the
// body is read; the other routes take it.
func TestRouteBodyLimit(t *testing.T) {
	up := newFakeOpenAI(t)
	u, _ := url.Parse(up.srv.URL)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, err := gateway.New(
		gateway.Route{Format: stream.OpenAIChat, Models: []string{"gpt-4o"}, Upstream: u, Bulkhead: b, MaxBodyBytes: 100},
		gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b},
	)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range []struct {
		model  string
		status int
	}{{"gpt-4o", 413}, {"llama", 200}} {
		res := post(t, context.Background(), srv.URL, `{"model":"`+c.model+`","messages":[{"role":"user","content":"`+strings.Repeat("x", 200)+`"}],"max_tokens":5}`)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.status {
			t.Fatalf("%s: %d %s; want %d", c.model, res.StatusCode, body, c.status)
		}
		if c.status == 413 && !strings.Contains(string(body), `larger than 100 bytes (the limit for model \"gpt-4o\")`) {
			t.Fatalf("%s: %s", c.model, body)
		}
		if c.status == 200 {
			<-up.auth
		}
	}
}

// TestExpectContinueRefused: a body refused for its declared length is not
// asked for when its client waits for 100 Continue: the answer comes at
// once, and closes the connection.
func TestExpectContinueRefused(t *testing.T) {
	up := newFakeOpenAI(t)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	_, srv := newHandler(t, up.srv.URL, b, 100, nil, stream.OpenAIChat)
	if res, body := expectContinue(t, srv.URL, 500); res.StatusCode != 413 || !res.Close {
		t.Fatalf("%d close=%v %s; want 413 without 100 Continue", res.StatusCode, res.Close, body)
	}
}

// expectContinue sends, on a connection of its own, the head of a chat
// completion whose body is n bytes, saying the client waits for 100
// Continue before it sends the body (which it never does), and returns the
// first response.
func expectContinue(t *testing.T, srvURL string, n int) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srvURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	io.WriteString(conn, strings.Replace(rawRequest("/v1/chat/completions", n), "\r\n\r\n", "\r\nExpect: 100-continue\r\n\r\n", 1))
	return readResponse(t, bufio.NewReader(conn))
}

// TestRefusedBodiesCloseConnections: clients that declare a body, send
// part of it and stop, to a path no route serves, to a route (too slow, or
// declared too large) or waiting for 100 Continue, get their answer and
// their connection closed by the Handler's server within the body timeout,
// though they keep it open: no connection is left open.
func TestRefusedBodiesCloseConnections(t *testing.T) {
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	u, _ := url.Parse("http://upstream.invalid")
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, MaxBodyBytes: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	const bodyTimeout = 300 * time.Millisecond
	h.BodyTimeout = bodyTimeout
	var open sync.WaitGroup // the server's connections
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Done()
		}
	}
	srv.Start()
	defer srv.Close()
	variants := []struct {
		head, part string
		status     int
	}{
		{rawRequest("/v1/no/such/api", 100_000), "{", 404},
		{strings.Replace(rawRequest("/v1/no/such/api", 100_000), "\r\n\r\n", "\r\nExpect: 100-continue\r\n\r\n", 1), "", 404},
		{rawRequest("/v1/chat/completions", 5000), `{"model":`, 408},
		{rawRequest("/v1/chat/completions", -1), "100\r\n{\"model\":", 408},
		{rawRequest("/v1/chat/completions", 20_000), `{"model":`, 413},
	}
	const clients = 100
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	statuses := make([]int, clients)
	var read sync.WaitGroup
	for i := range clients {
		v := variants[i%len(variants)]
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, v.head+v.part); err != nil {
			t.Fatal(err)
		}
		read.Add(1)
		go func() {
			defer read.Done()
			if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				statuses[i] = res.StatusCode
			}
		}()
	}
	closed := make(chan struct{})
	go func() {
		read.Wait()
		open.Wait()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(bodyTimeout + testutil.Settle):
		for _, c := range conns {
			c.Close() // lets the test end
		}
		<-closed
		t.Fatalf("connections still open %v after the body timeout", testutil.Settle)
	}
	for i, st := range statuses {
		if want := variants[i%len(variants)].status; st != want {
			t.Errorf("client %d (%q): answered %d; want %d", i, variants[i%len(variants)].head, st, want)
		}
	}
}
