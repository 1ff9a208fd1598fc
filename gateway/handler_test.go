package gateway_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// fakeOpenAI is an OpenAI-compatible upstream: a plain completion, or a
// stream of two deltas and a usage chunk. A request whose user message is
// "hold" streams its first delta, then waits for release (or for the
// client to go away).
type fakeOpenAI struct {
	srv     *httptest.Server
	release chan struct{}
	auth    chan string

	mu  sync.Mutex
	ids []string // the X-Request-Id of each request
}

// requestIDs returns the X-Request-Id of each request so far.
func (f *fakeOpenAI) requestIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ids...)
}

func newFakeOpenAI(t *testing.T) *fakeOpenAI {
	f := &fakeOpenAI{release: make(chan struct{}), auth: make(chan string, 16)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.ids = append(f.ids, r.Header.Get("X-Request-Id"))
		f.mu.Unlock()
		f.auth <- r.Header.Get("Authorization")
		var body struct {
			Stream   bool `json:"stream"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if !body.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fmt.Fprint(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}\n\n")
		fl.Flush()
		if len(body.Messages) > 0 && body.Messages[0].Content == "hold" {
			select {
			case <-f.release:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n")
		if body.StreamOptions != nil && body.StreamOptions.IncludeUsage {
			fmt.Fprint(w, "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n")
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func newGateway(t *testing.T, upstream string, cfg bulkhead.Config) (*httptest.Server, *bulkhead.Bulkhead) {
	t.Helper()
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(upstream)
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, APIKey: "sk-upstream", Bulkhead: b,
		Options: func(r *http.Request, _ *stream.Call) []bulkhead.Option {
			return []bulkhead.Option{bulkhead.WithTag(r.Header.Get("X-Request-Id"))}
		}})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	t.Cleanup(func() {
		gw.Close()
		if res, err := b.Shutdown(context.Background()); err != nil || !res.Drained {
			t.Errorf("Shutdown: %+v, %v", res, err)
		}
	})
	return gw, b
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer client-key")
	req.Header.Set("X-Request-Id", "req-1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func idle(b *bulkhead.Bulkhead) func() bool {
	return func() bool {
		st := b.Stats()
		return st.Gate.InFlight == 0 && st.Calls.InFlight == 0 && st.TokenBudget.InFlightTokens == 0
	}
}

// wantSettled waits until b holds nothing, then checks that it released
// released calls, which consumed consumed tokens in all.
func wantSettled(t *testing.T, b *bulkhead.Bulkhead, released, consumed int64) {
	t.Helper()
	testutil.WaitFor(t, "the calls' release", idle(b))
	if st := b.Stats(); st.Calls.Released != released || st.TokenBudget.TotalConsumed != consumed {
		t.Fatalf("settlement: %v; want %d released, %d tokens", st, released, consumed)
	}
}

func budgetConfig(maxConc int) bulkhead.Config {
	return bulkhead.Config{Model: "gpt-4o", MaxConcurrent: maxConc, TokenBudget: &bulkhead.TokenBudget{Budget: 100_000}}
}

func TestHandlerPlainAndStream(t *testing.T) {
	up := newFakeOpenAI(t)
	gw, b := newGateway(t, up.srv.URL, budgetConfig(4))
	res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	// A plain response goes to the client whole, with its length.
	if res.StatusCode != 200 || !strings.Contains(string(body), `"content":"hello"`) || res.ContentLength != int64(len(body)) {
		t.Fatalf("plain: %d, length %d, %s", res.StatusCode, res.ContentLength, body)
	}
	if got := <-up.auth; got != "Bearer sk-upstream" {
		t.Fatalf("upstream saw Authorization %q; want the gateway's key", got)
	}
	wantSettled(t, b, 1, 11)

	// A stream: the client did not ask for usage, so the gateway asks the
	// upstream for it and strips the extra chunk from what the client sees.
	res = post(t, context.Background(), gw.URL, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	<-up.auth
	if res.StatusCode != 200 || strings.Contains(string(body), `"usage"`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %q", res.StatusCode, body)
	}
	wantSettled(t, b, 2, 22)
}

func TestHandlerSheds(t *testing.T) {
	up := newFakeOpenAI(t)
	gw, b := newGateway(t, up.srv.URL, budgetConfig(1))
	// One stream holds the only slot.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := post(t, ctx, gw.URL, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}],"max_tokens":50}`)
	<-up.auth
	line, _ := bufio.NewReader(held.Body).ReadString('\n')
	if !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
	res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
	var shed struct {
		Error struct {
			Type     string         `json:"type"`
			Code     string         `json:"code"`
			Bulkhead gateway.Detail `json:"bulkhead"`
		} `json:"error"`
	}
	if err := json.NewDecoder(res.Body).Decode(&shed); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "true" || res.Header.Get("Retry-After") != "" ||
		shed.Error.Code != "server_is_overloaded" || shed.Error.Bulkhead.Reason != "concurrency_limit" || shed.Error.Bulkhead.Tag != "req-1" {
		t.Fatalf("shed: %d %v %+v", res.StatusCode, res.Header, shed)
	}
	select {
	case <-up.auth:
		t.Fatal("a shed call reached the upstream")
	default:
	}
	// The client of the held stream goes away mid-stream: its admission
	// is released at once.
	cancel()
	held.Body.Close()
	testutil.WaitFor(t, "the vanished client's release", idle(b))
	if st := b.Stats(); st.Calls.Released != 1 || st.Calls.RejectedByReason[bulkhead.ConcurrencyLimit] != 1 {
		t.Fatalf("stats: %v", st)
	}
}

func TestHandlerErrors(t *testing.T) {
	up := newFakeOpenAI(t)
	gw, b := newGateway(t, up.srv.URL, budgetConfig(2))
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"malformed", `{"model":`, 400},
		{"wrong type", `{"model":"gpt-4o","messages":3}`, 400},
		{"no model", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, 400},
		{"too large for the budget", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":200000}`, 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := post(t, context.Background(), gw.URL, tc.body)
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status || res.Header.Get("X-Should-Retry") != "false" {
				t.Fatalf("status %d, x-should-retry %q; want %d, false", res.StatusCode, res.Header.Get("X-Should-Retry"), tc.status)
			}
		})
	}
	// No route: 404. An upstream that is down: 502, and nothing held.
	res, err := http.Post(gw.URL+"/v1/messages", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 404 {
		t.Fatalf("no route: %d", res.StatusCode)
	}
	up.srv.Close()
	res = post(t, context.Background(), gw.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	res.Body.Close()
	if res.StatusCode != 502 {
		t.Fatalf("upstream down: %d", res.StatusCode)
	}
	testutil.WaitFor(t, "nothing held", idle(b))
}

func TestNewValidates(t *testing.T) {
	b, _ := bulkhead.New(bulkhead.Config{MaxConcurrent: 1})
	defer b.Shutdown(context.Background())
	u, _ := url.Parse("https://api.openai.com")
	for _, tc := range []struct {
		name  string
		r     []gateway.Route
		field string
	}{
		{"format", []gateway.Route{{Upstream: u, Bulkhead: b}}, "routes[0].Format"},
		{"upstream", []gateway.Route{{Format: stream.OpenAIChat, Bulkhead: b}}, "routes[0].Upstream"},
		{"relative upstream", []gateway.Route{{Format: stream.OpenAIChat, Upstream: &url.URL{Path: "/x"}, Bulkhead: b}}, "routes[0].Upstream"},
		{"bulkhead", []gateway.Route{{Format: stream.OpenAIChat, Upstream: u}}, "routes[0].Bulkhead"},
		{"attempt header", []gateway.Route{{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, AttemptHeader: "Retry Count"}}, "routes[0].AttemptHeader"},
		{"twice", []gateway.Route{{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b}, {Format: stream.OpenAIChat, Upstream: u, Bulkhead: b}}, "routes[1].Format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.New(tc.r...)
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("New: %v; want a ConfigError on %s", err, tc.field)
			}
		})
	}
}

// TestHandlerRoutesByModel checks that a call takes the route of its model,
// that the other models take the format's route without Models, and that
// a model no route takes is answered 404.
func TestHandlerRoutesByModel(t *testing.T) {
	up := newFakeOpenAI(t)
	u, _ := url.Parse(up.srv.URL)
	closed, _ := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 0}) // sheds everything
	open, _ := bulkhead.New(budgetConfig(4))
	defer closed.Shutdown(context.Background())
	defer open.Shutdown(context.Background())
	h, err := gateway.New(
		gateway.Route{Format: stream.OpenAIChat, Models: []string{"gpt-4o", "gpt-4.1"}, Upstream: u, Bulkhead: closed},
		gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: open},
		gateway.Route{Format: stream.OpenAIResponses, Models: []string{"o3"}, Upstream: u, Bulkhead: open},
	)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()
	for _, tc := range []struct {
		path, model string
		stream      bool
		status      int
	}{
		{"/v1/chat/completions", "gpt-4o", false, 503},
		{"/v1/chat/completions", "gpt-4.1", true, 503},
		{"/v1/chat/completions", "llama", false, 200},
		{"/v1/chat/completions", "llama", true, 200},
		{"/v1/responses", "gpt-5", false, 404},
		{"/v1/responses", "", false, 400}, // a body without a model is invalid, not a model without a route
	} {
		model := fmt.Sprintf(`"model":%q,`, tc.model)
		if tc.model == "" {
			model = ""
		}
		req, _ := http.NewRequest("POST", gw.URL+tc.path, strings.NewReader(fmt.Sprintf(`{%s"stream":%v,"messages":[{"role":"user","content":"hi"}],"input":"hi","max_tokens":5}`, model, tc.stream)))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Fatalf("%s %s: %d %s; want %d", tc.path, tc.model, res.StatusCode, body, tc.status)
		}
		if tc.status == 200 {
			<-up.auth
			if tc.stream && strings.Contains(string(body), `"usage"`) {
				t.Fatalf("the usage chunk the gateway asked for reached the client: %q", body)
			}
		}
	}
	testutil.WaitFor(t, "the calls' releases", idle(open))
	if st := open.Stats(); st.Calls.Released != 2 || st.TokenBudget.TotalConsumed != 22 {
		t.Fatalf("the default route's bulkhead: %v", st)
	}
	if st := closed.Stats(); st.Calls.Rejected != 2 {
		t.Fatalf("the model route's bulkhead: %v", st)
	}
	_, err = gateway.New(gateway.Route{Format: stream.OpenAIChat, Models: []string{"a"}, Upstream: u, Bulkhead: open},
		gateway.Route{Format: stream.OpenAIChat, Models: []string{"b", "a"}, Upstream: u, Bulkhead: open})
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) || ce.Field != "routes[1].Models[1]" {
		t.Fatalf("a model in two routes: %v", err)
	}
}

// TestHandlerUpstreamTrouble: an upstream that does not answer in time is a
// 502 (and the admission is released); an upstream error mid-stream reaches
// the client as the provider sent it, and the admission settles once.
func TestHandlerUpstreamTrouble(t *testing.T) {
	stuck := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "chat") {
			select { // never answers in time
			case <-stuck:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n")
		fmt.Fprint(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	}))
	defer up.Close()
	defer close(stuck)
	u, _ := url.Parse(up.URL)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	slow := http.DefaultTransport.(*http.Transport).Clone()
	slow.ResponseHeaderTimeout = 50 * time.Millisecond
	defer slow.CloseIdleConnections()
	h, err := gateway.New(
		gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, Transport: slow},
		gateway.Route{Format: stream.AnthropicMessages, Upstream: u, Bulkhead: b},
	)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()
	res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	res.Body.Close()
	if res.StatusCode != 502 || res.Header.Get("X-Should-Retry") != "true" {
		t.Fatalf("an upstream that does not answer: %d", res.StatusCode)
	}
	testutil.WaitFor(t, "the timed-out call's release", idle(b))

	res, err = http.Post(gw.URL+"/v1/messages", "application/json",
		strings.NewReader(`{"model":"claude","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"overloaded_error"`) {
		t.Fatalf("mid-stream error: %d %q", res.StatusCode, body)
	}
	testutil.WaitFor(t, "the failed stream's release", idle(b))
	if st := b.Stats(); st.Calls.Released != 2 || st.Gate.DoubleReleases != 0 {
		t.Fatalf("stats: %v", st)
	}
}

// TestHandlerSlowClientAndBigBody: a client that reads a stream a byte at a
// time gets it whole and its admission is released when it is done; a
// body over the route's limit is a 413 before anything is admitted.
func TestHandlerSlowClientAndBigBody(t *testing.T) {
	up := newFakeOpenAI(t)
	u, _ := url.Parse(up.srv.URL)
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, MaxBodyBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()
	res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	<-up.auth
	var got []byte
	one := make([]byte, 1)
	for {
		n, err := res.Body.Read(one)
		got = append(got, one[:n]...)
		if err != nil {
			break
		}
	}
	res.Body.Close()
	if !strings.Contains(string(got), `"content":"hel"`) || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("slow client got %q", got)
	}
	testutil.WaitFor(t, "the slow client's release", idle(b))

	res = post(t, context.Background(), gw.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"`+strings.Repeat("x", 2000)+`"}]}`)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 413 || res.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("a body over the limit: %d", res.StatusCode)
	}
	if st := b.Stats(); st.Calls.Admitted != 1 || st.Calls.Rejected != 0 {
		t.Fatalf("stats: %v", st)
	}
}

// A stream the gateway strips the usage chunk from reaches the client event
// by event: the first event arrives while the upstream still holds the
// second, and every byte but the usage chunk's arrives, settled once.
func TestHandlerStrippedStreamIsPrompt(t *testing.T) {
	up := newFakeOpenAI(t)
	gw, b := newGateway(t, up.srv.URL, budgetConfig(4))
	res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}],"max_tokens":50}`)
	defer res.Body.Close()
	<-up.auth
	first := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}\n\n"
	got := make([]byte, len(first))
	if _, err := io.ReadFull(res.Body, got); err != nil || string(got) != first {
		t.Fatalf("first event %q, %v; want %q before the upstream sends the second", got, err, first)
	}
	close(up.release)
	rest, err := io.ReadAll(res.Body)
	want := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	if err != nil || string(rest) != want {
		t.Fatalf("rest %q, %v; want %q", rest, err, want)
	}
	wantSettled(t, b, 1, 11)
}

// An upstream that sends a whole stream at once has it sent with a
// Content-Length; the gateway strips the usage chunk, so the client must
// get the shorter body framed as it is, not the upstream's length (which
// would cut the client off, and close its connection).
func TestHandlerStrippedStreamWithLength(t *testing.T) {
	events := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"},\"finish_reason\":\"stop\"}]}\n\n"
	usage := "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(events+usage+"data: [DONE]\n\n")))
		fmt.Fprint(w, events+usage+"data: [DONE]\n\n")
	}))
	defer up.Close()
	gw, b := newGateway(t, up.URL, budgetConfig(4))
	for i := 0; i < 2; i++ {
		res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || string(body) != events+"data: [DONE]\n\n" || res.ContentLength != -1 && res.ContentLength != int64(len(body)) {
			t.Fatalf("stream %d: length %d, %q, %v", i, res.ContentLength, body, err)
		}
	}
	wantSettled(t, b, 2, 22)
}

// The client's request ID goes upstream and comes back, unless the upstream
// answers with an ID of its own (a provider's request ID), which is kept
// alone.
func TestHandlerRequestID(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Request-Id") != "req-1" {
			http.Error(w, "no request ID", 400)
			return
		}
		if body, _ := io.ReadAll(r.Body); strings.Contains(string(body), `"own"`) {
			w.Header().Set("X-Request-Id", "req_provider")
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
	}))
	defer up.Close()
	gw, b := newGateway(t, up.URL, budgetConfig(4))
	for _, c := range []struct{ content, want string }{{"hi", "req-1"}, {"own", "req_provider"}} {
		res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","messages":[{"role":"user","content":"`+c.content+`"}],"max_tokens":50}`)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if got := res.Header.Values("X-Request-Id"); res.StatusCode != 200 || len(got) != 1 || got[0] != c.want {
			t.Fatalf("%q: %d, X-Request-Id %q; want %q", c.content, res.StatusCode, got, c.want)
		}
	}
	testutil.WaitFor(t, "the calls' release", idle(b))
}

// TestUpstreamBasePath: a call's path is joined to the upstream's base
// URL, path included (a base URL ending in the API's version is refused:
// TestConfigRefusesVersionInBaseURL); and without clients, an upstream without api_key_env receives the caller's
// own credentials, unchanged.
func TestUpstreamBasePath(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
	}))
	defer up.Close()
	for _, tc := range []struct{ base, want string }{
		{up.URL, "/v1/chat/completions Bearer sk-caller"},
		{up.URL + "/openai", "/openai/v1/chat/completions Bearer sk-caller"},
	} {
		_, srv := buildGateway(t, `upstreams: {up: {base_url: "`+tc.base+`"}}
bulkheads: {main: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
`, nil, io.Discard)
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer sk-caller")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		mu.Lock()
		got := seen[len(seen)-1]
		mu.Unlock()
		if res.StatusCode != 200 || got != tc.want {
			t.Errorf("base_url %s: %d, upstream saw %q; want %q", tc.base, res.StatusCode, got, tc.want)
		}
	}
}

// TestCompressionLeftToTheUpstreamTransport: a client's Accept-Encoding
// does not go upstream; the gateway's transport asks for gzip itself and
// decompresses, so the meter reads the answer (and settles its usage) and
// the client gets it plain.
func TestCompressionLeftToTheUpstreamTransport(t *testing.T) {
	const answer = `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	up, asked := gzipUpstream(t, answer)
	gw, b := newGateway(t, up.URL, budgetConfig(4))
	req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`))
	req.Header.Set("Accept-Encoding", "br")
	res, err := http.DefaultTransport.RoundTrip(req) // the client's header as it is, no gzip of its own
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if got := <-asked; got != "gzip" {
		t.Errorf("the upstream was asked for Accept-Encoding %q; want the transport's own gzip", got)
	}
	if string(body) != answer || res.Header.Get("Content-Encoding") != "" {
		t.Errorf("the client got %q (Content-Encoding %q); want the answer plain", body, res.Header.Get("Content-Encoding"))
	}
	wantSettled(t, b, 1, 11)
}

// gzipUpstream is an upstream that answers every request body with JSON
// body, gzipped when it is asked for gzip alone, and sends the
// Accept-Encoding of each request on asked.
func gzipUpstream(t *testing.T, body string) (*httptest.Server, chan string) {
	asked := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		asked <- r.Header.Get("Accept-Encoding")
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Accept-Encoding") != "gzip" {
			io.WriteString(w, body)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, body)
		zw.Close()
	}))
	t.Cleanup(up.Close)
	return up, asked
}

// TestUnmeteredCallKeepsTheClientsCompression: a request the gateway
// passes on without admitting it (a GET listing stored chat completions)
// goes upstream with the client's Accept-Encoding, and its answer comes
// back as the upstream encoded it: only a metered answer is decompressed.
func TestUnmeteredCallKeepsTheClientsCompression(t *testing.T) {
	const list = `{"object":"list","data":[]}`
	up, asked := gzipUpstream(t, list)
	gw, _ := newGateway(t, up.URL, budgetConfig(4))
	req, _ := http.NewRequest("GET", gw.URL+"/v1/chat/completions", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	res, err := http.DefaultTransport.RoundTrip(req) // the client's header as it is: no decompression of its own
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if got := <-asked; got != "gzip" {
		t.Errorf("the upstream was asked for Accept-Encoding %q; want the client's gzip", got)
	}
	if ce := res.Header.Get("Content-Encoding"); ce != "gzip" {
		t.Fatalf("the client got Content-Encoding %q; want the upstream's gzip", ce)
	}
	zr, err := gzip.NewReader(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(zr); err != nil || string(body) != list {
		t.Errorf("the client got %q, %v", body, err)
	}
}

// TestStrippedStreamWithEventsLargerThanTheCopyBuffer: a streamed answer,
// copied to the client through a buffer smaller than some of its events
// and arriving in pieces that split them anywhere, reaches the client
// whole but for the usage chunk the gateway asked for, in order.
func TestStrippedStreamWithEventsLargerThanTheCopyBuffer(t *testing.T) {
	var want strings.Builder
	for i, size := range []int{10, 2000, 2047, 2048, 2049, 5000, 3, 9000, 40} {
		end := [...]string{"\n", "\r\n", "\r"}[i%3]
		fmt.Fprintf(&want, `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"%s"}}]}`+end+end, strings.Repeat("y", size))
	}
	want.WriteString(`data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n")
	usage := `data: {"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}` + "\r\n\r\n"
	stream := want.String() + usage + "data: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for s, i := stream, 0; len(s) > 0; i++ {
			n := min(len(s), []int{1000, 1, 777, 2049, 13}[i%5])
			io.WriteString(w, s[:n])
			rc.Flush()
			s = s[n:]
		}
	}))
	defer up.Close()
	gw, b := newGateway(t, up.URL, budgetConfig(4))
	res := post(t, context.Background(), gw.URL, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(body) != want.String()+"data: [DONE]\n\n" {
		t.Fatalf("the client got %d bytes, %v; want %d", len(body), err, len(want.String()+"data: [DONE]\n\n"))
	}
	wantSettled(t, b, 1, 11)
}
