package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/llmbulkhead/bulkhead"
)

// fakeUpstream is a RoundTripper that answers every request with resp (or
// err) and records what it was sent.
type fakeUpstream struct {
	mu     sync.Mutex
	sent   []*http.Request
	bodies [][]byte
	answer func(*http.Request) (*http.Response, error)
}

func (f *fakeUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	f.mu.Lock()
	f.sent = append(f.sent, r)
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	return f.answer(r)
}

func (f *fakeUpstream) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sent)
}

func respond(status int, contentType, body string) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		return &http.Response{
			StatusCode: status,
			Header:     http.Header{"Content-Type": {contentType}},
			Body:       io.NopCloser(strings.NewReader(body)),
			Request:    r,
		}, nil
	}
}

const chatBody = `{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}`

func post(t *testing.T, rt http.RoundTripper, path, body string, header ...string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://provider.test"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return rt.RoundTrip(req)
}

func TestTransportPlainJSON(t *testing.T) {
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	up := &fakeUpstream{answer: respond(200, "application/json",
		`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`)}
	var gotCall *Call
	tr := &Transport{Bulkhead: b, Base: up, Options: func(r *http.Request, c *Call) []bulkhead.Option {
		gotCall = c
		return []bulkhead.Option{bulkhead.WithTag(r.Header.Get("X-Tag"))}
	}}
	resp, err := post(t, tr, "/v1/chat/completions", chatBody, "X-Tag", "t-1")
	if err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.Calls.InFlight != 1 {
		t.Errorf("in flight before the body is read: %d, want 1", s.Calls.InFlight)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(out), `"content":"hi"`) {
		t.Errorf("body = %s", out)
	}
	if gotCall == nil || gotCall.Format != OpenAIChat || gotCall.Request.MaxTokens != 200 {
		t.Errorf("Options saw %+v", gotCall)
	}
	if !bytes.Equal(up.bodies[0], []byte(chatBody)) {
		t.Errorf("upstream body = %s, want the caller's", up.bodies[0])
	}
	_, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, bulkhead.Usage{Input: 12, Output: 3})
	if releases[0].Tag != "t-1" || releases[0].Reserved != testReserved {
		t.Errorf("release %v, want tag t-1 and %d reserved", releases[0], testReserved)
	}
}

func TestTransportIncludeUsage(t *testing.T) {
	stream := strings.Join([]string{
		`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":"stop"}]}`,
		`data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2}}`,
		`data: [DONE]`, ``, ``}, "\n\n")
	withoutUsage := strings.Replace(stream, `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2}}`+"\n\n", "", 1)
	streamBody := strings.Replace(chatBody, `{"model"`, `{"stream":true,"model"`, 1)
	asked := strings.Replace(chatBody, `{"model"`, `{"stream":true,"stream_options":{"include_usage":true},"model"`, 1)
	for _, c := range []struct {
		name      string
		body      string
		keep      bool
		upUsage   bool   // upstream was asked for usage
		wantOut   string // what the caller reads
		wantUsage bulkhead.Usage
	}{
		{"added and stripped", streamBody, false, true, withoutUsage, bulkhead.Usage{Input: 12, Output: 2}},
		{"asked by the caller", asked, false, true, stream, bulkhead.Usage{Input: 12, Output: 2}},
		{"kept as written", streamBody, true, false, stream, bulkhead.Usage{Input: 12, Output: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := &events{}
			b := newBudgetBulkhead(t, ev)
			up := &fakeUpstream{answer: respond(200, "text/event-stream", stream)}
			tr := &Transport{Bulkhead: b, Base: up, KeepStreamOptions: c.keep}
			resp, err := post(t, tr, "/v1/chat/completions", c.body)
			if err != nil {
				t.Fatal(err)
			}
			out, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(out) != c.wantOut {
				t.Errorf("read %q, %v; want %q", out, err, c.wantOut)
			}
			var sent map[string]any
			if err := json.Unmarshal(up.bodies[0], &sent); err != nil {
				t.Fatal(err)
			}
			so, _ := sent["stream_options"].(map[string]any)
			if got := so["include_usage"] == true; got != c.upUsage {
				t.Errorf("upstream include_usage = %v, want %v (body %s)", got, c.upUsage, up.bodies[0])
			}
			if cl := up.sent[0].ContentLength; cl != int64(len(up.bodies[0])) {
				t.Errorf("ContentLength %d for a %d-byte body", cl, len(up.bodies[0]))
			}
			_, releases := ev.wait(t, 1)
			checkSettled(t, b, releases, c.wantUsage)
		})
	}
}

func TestTransportRejection(t *testing.T) {
	cfg := bulkhead.Interactive("gpt-4o", 0) // no slot
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	up := &fakeUpstream{answer: respond(200, "application/json", `{}`)}
	body := &closeCounter{Reader: strings.NewReader(chatBody)}
	req, _ := http.NewRequest(http.MethodPost, "http://provider.test/v1/chat/completions", body)
	_, err = (&Transport{Bulkhead: b, Base: up}).RoundTrip(req)
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || rej.Reason != bulkhead.ConcurrencyLimit {
		t.Fatalf("err = %v, want a concurrency_limit rejection", err)
	}
	if up.count() != 0 {
		t.Error("a rejected call was sent upstream")
	}
	if body.closes != 1 {
		t.Errorf("request body closed %d times, want 1", body.closes)
	}
}

// TestTransportClosesTheBodyOfARejectedCallItWasGiven: a call read before
// RoundTrip (WithCall) and then rejected still has its request body
// closed, as a RoundTripper must on every error.
func TestTransportClosesTheBodyOfARejectedCallItWasGiven(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Interactive("gpt-4o", 0)) // no slot
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	up := &fakeUpstream{answer: respond(200, "application/json", `{}`)}
	for _, stream := range []bool{false, true} {
		body := chatBody
		if stream {
			body = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		req, _ := http.NewRequest(http.MethodPost, "http://provider.test/v1/chat/completions", strings.NewReader(body))
		call, err := ReadRequest(req, 0)
		if err != nil {
			t.Fatal(err)
		}
		counter := &closeCounter{Reader: strings.NewReader(body)}
		req.Body = counter
		req = req.WithContext(WithCall(req.Context(), call))
		if _, err := (&Transport{Bulkhead: b, Base: up}).RoundTrip(req); !errors.Is(err, bulkhead.ErrConcurrencyLimit) {
			t.Fatalf("stream %v: err = %v, want a concurrency_limit rejection", stream, err)
		}
		if counter.closes != 1 {
			t.Errorf("stream %v: request body closed %d times, want 1", stream, counter.closes)
		}
	}
	if up.count() != 0 {
		t.Error("a rejected call was sent upstream")
	}
}

func TestTransportErrors(t *testing.T) {
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	sendErr := errors.New("connection refused")
	up := &fakeUpstream{answer: func(*http.Request) (*http.Response, error) { return nil, sendErr }}
	tr := &Transport{Bulkhead: b, Base: up, MaxBodyBytes: 1 << 10}

	if _, err := post(t, tr, "/v1/chat/completions", chatBody); !errors.Is(err, sendErr) {
		t.Errorf("send error = %v", err)
	}
	_, releases := ev.wait(t, 1)
	if releases[0].Usage != nil {
		t.Errorf("a failed send released with usage %v, want none known", releases[0].Usage)
	}

	var be *BodyError
	if _, err := post(t, tr, "/v1/chat/completions", `{"messages":7}`); !errors.As(err, &be) || be.Field != "messages" {
		t.Errorf("bad body: %v", err)
	}
	if _, err := post(t, tr, "/v1/chat/completions", strings.Repeat(" ", 2<<10)); !errors.Is(err, ErrBodyTooLarge) {
		t.Errorf("large body: %v", err)
	}
	if up.count() != 1 {
		t.Errorf("%d requests sent, want only the first", up.count())
	}
	if _, err := post(t, &Transport{}, "/v1/messages", `{}`); !errors.Is(err, ErrNoBulkhead) {
		t.Errorf("no bulkhead: %v", err)
	}
	if s := b.Stats(); s.Calls.InFlight != 0 || s.Calls.Admitted != 1 {
		t.Errorf("stats %+v", s.Calls)
	}
}

func TestTransportPassThrough(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	up := &fakeUpstream{answer: respond(200, "application/json", `{"data":[]}`)}
	tr := &Transport{Bulkhead: b, Base: up}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1/models"},
		{http.MethodPost, "/v1/embeddings"},
		{http.MethodGet, "/v1/chat/completions"},
		{http.MethodPost, "/v1/messages/count_tokens"},
	} {
		req, _ := http.NewRequest(c.method, "http://provider.test"+c.path, strings.NewReader(`{}`))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		resp.Body.Close()
	}
	if s := b.Stats(); s.Calls.Admitted != 0 || up.count() != 4 {
		t.Errorf("admitted %d, sent %d; want 0 and 4", s.Calls.Admitted, up.count())
	}
}

func TestTransportErrorStatus(t *testing.T) {
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	up := &fakeUpstream{answer: respond(529, "application/json", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)}
	tr := &Transport{Bulkhead: b, Base: up}
	resp, err := post(t, tr, "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 529 {
		t.Errorf("status %d", resp.StatusCode)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(out), "overloaded_error") {
		t.Errorf("body = %s, want the provider's error", out)
	}
	_, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, bulkhead.Usage{})
}

func TestTransportBadMeterOptionsSendNothing(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	up := &fakeUpstream{answer: respond(200, "application/json", `{}`)}
	tr := &Transport{Bulkhead: b, Base: up, Meter: MeterOptions{ReportEvery: -1}}
	_, err := post(t, tr, "/v1/chat/completions", chatBody)
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) || ce.Field != "MeterOptions.ReportEvery" {
		t.Fatalf("err = %v, want the options' *ConfigError", err)
	}
	if up.count() != 0 || b.Stats().Calls.Admitted != 0 {
		t.Errorf("sent %d, admitted %d; want nothing", up.count(), b.Stats().Calls.Admitted)
	}
}

type panicking struct{}

func (panicking) RoundTrip(*http.Request) (*http.Response, error) { panic("base transport bug") }

func TestTransportBasePanicReleases(t *testing.T) {
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	tr := &Transport{Bulkhead: b, Base: panicking{}}
	func() {
		defer func() {
			if p := recover(); p != "base transport bug" {
				t.Errorf("recovered %v, want the base's panic", p)
			}
		}()
		post(t, tr, "/v1/chat/completions", chatBody)
	}()
	ev.wait(t, 1)
	if s := b.Stats(); s.Calls.InFlight != 0 {
		t.Errorf("%d in flight after a panic", s.Calls.InFlight)
	}
}

func TestTransportLetsBaseDecompress(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	up := &fakeUpstream{answer: respond(200, "application/json", `{}`)}
	tr := &Transport{Bulkhead: b, Base: up}
	resp, err := post(t, tr, "/v1/chat/completions", chatBody, "Accept-Encoding", "gzip")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ae := up.sent[0].Header.Get("Accept-Encoding"); ae != "" {
		t.Errorf("sent Accept-Encoding %q, want it left to the base transport", ae)
	}
}

// TestTransportAdmitsThroughItsAcquire checks that a Transport whose
// Acquire is set admits each call through it, with the request's context,
// the call's request and its options.
func TestTransportAdmitsThroughItsAcquire(t *testing.T) {
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	up := &fakeUpstream{answer: respond(200, "application/json",
		`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`)}
	type key struct{}
	var calls int
	tr := &Transport{Bulkhead: b, Base: up,
		Options: func(*http.Request, *Call) []bulkhead.Option { return []bulkhead.Option{bulkhead.WithTag("t-2")} },
		Acquire: func(ctx context.Context, req *bulkhead.Request, opts ...bulkhead.Option) (*bulkhead.Permit, error) {
			calls++
			if ctx.Value(key{}) != "v" || req.MaxTokens != 200 || len(opts) != 1 {
				t.Errorf("Acquire got ctx value %v, request %+v, %d options", ctx.Value(key{}), req, len(opts))
			}
			return b.Acquire(ctx, req, opts...)
		}}
	req, err := http.NewRequestWithContext(context.WithValue(context.Background(), key{}, "v"), http.MethodPost,
		"http://provider.test/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	_, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, bulkhead.Usage{Input: 12, Output: 3})
	if calls != 1 || releases[0].Tag != "t-2" {
		t.Errorf("Acquire called %d times, release %v; want once, tag t-2", calls, releases[0])
	}
}

// TestTransportChangesOnlyItsOwnCopy: a call whose request the transport
// must change (an Accept-Encoding to drop, include_usage to add) goes out
// as a copy and leaves the caller's request as it was; one it has nothing
// to change in (a proxy that read the body already, with WithCall, and
// left compression to the base transport) goes out as it is, without a
// copy of the request and its headers, which a streamed call holds for as
// long as it lasts.
func TestTransportChangesOnlyItsOwnCopy(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	streamed := `{"model":"gpt-4o","max_tokens":200,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, body, encoding string
		same                 bool
	}{
		{"nothing to change", chatBody, "", true},
		{"accept-encoding", chatBody, "gzip", false},
		{"include_usage", streamed, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{answer: respond(200, "application/json",
				`{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}`)}
			tr := &Transport{Bulkhead: b, Base: up}
			req, err := http.NewRequest(http.MethodPost, "http://provider.test/v1/chat/completions", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.encoding != "" {
				req.Header.Set("Accept-Encoding", tc.encoding)
			}
			call, err := ReadRequest(req, 0)
			if err != nil {
				t.Fatal(err)
			}
			req = req.WithContext(WithCall(req.Context(), call))
			header, body := req.Header.Clone(), req.Body
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if sent := up.sent[0]; (sent == req) != tc.same {
				t.Errorf("sent the caller's request itself: %v, want %v", sent == req, tc.same)
			}
			if !equalHeaders(req.Header, header) || req.Body != body {
				t.Errorf("the caller's request changed: %v", req.Header)
			}
			if ae := up.sent[0].Header.Get("Accept-Encoding"); ae != "" {
				t.Errorf("sent Accept-Encoding %q", ae)
			}
			if want := tc.body != streamed; strings.Contains(string(up.bodies[0]), "include_usage") == want {
				t.Errorf("sent %s", up.bodies[0])
			}
		})
	}
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "\x00") != strings.Join(b[k], "\x00") {
			return false
		}
	}
	return true
}

// rereadingUpstream reads the body of each request it is sent, then reads
// it again through GetBody, as http.Transport does to retry a request on a
// fresh connection, and answers a plain chat completion.
type rereadingUpstream struct {
	sent          *http.Request
	body, reread  []byte
	contentLength int64
	getBodyErr    error
}

func (u *rereadingUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	u.sent, u.contentLength = r, r.ContentLength
	u.body, _ = io.ReadAll(r.Body)
	r.Body.Close()
	if r.GetBody == nil {
		u.getBodyErr = errors.New("no GetBody")
	} else if b, err := r.GetBody(); err != nil {
		u.getBodyErr = err
	} else {
		u.reread, _ = io.ReadAll(b)
	}
	return respond(200, "application/json",
		`{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}`)(r)
}

// TestTransportSendsARequestItCanSendAgain: whatever the transport changes
// in a request (nothing, its Accept-Encoding, include_usage in its body),
// and whether or not the call was read before (WithCall), the request it
// sends has a body that GetBody gives again, byte for byte, of the length
// it declares, and the caller's request keeps its headers, body, GetBody
// and length.
func TestTransportSendsARequestItCanSendAgain(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	streamed := `{"model":"gpt-4o","max_tokens":200,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, body := range []string{chatBody, streamed} {
		for _, encoding := range []string{"", "gzip"} {
			for _, withCall := range []bool{false, true} {
				name := fmt.Sprintf("stream-%v/encoding-%q/with-call-%v", body == streamed, encoding, withCall)
				t.Run(name, func(t *testing.T) {
					req, err := http.NewRequest(http.MethodPost, "http://provider.test/v1/chat/completions", strings.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					if encoding != "" {
						req.Header.Set("Accept-Encoding", encoding)
					}
					if withCall {
						call, err := ReadRequest(req, 0)
						if err != nil {
							t.Fatal(err)
						}
						req = req.WithContext(WithCall(req.Context(), call))
					}
					orig, callersGetBody := req.GetBody, false
					req.GetBody = func() (io.ReadCloser, error) { callersGetBody = true; return orig() }
					header, reqBody, length := req.Header.Clone(), req.Body, req.ContentLength
					up := &rereadingUpstream{}
					resp, err := (&Transport{Bulkhead: b, Base: up}).RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if up.getBodyErr != nil || !bytes.Equal(up.body, up.reread) || int64(len(up.body)) != up.contentLength {
						t.Errorf("sent %q (ContentLength %d); GetBody gave %q, %v", up.body, up.contentLength, up.reread, up.getBodyErr)
					}
					if want := body == streamed; bytes.Contains(up.body, []byte(`"include_usage":true`)) != want {
						t.Errorf("sent %s", up.body)
					}
					if ae := up.sent.Header.Get("Accept-Encoding"); ae != "" {
						t.Errorf("sent Accept-Encoding %q", ae)
					}
					callersGetBody = false
					if _, err := req.GetBody(); err != nil || !callersGetBody {
						t.Errorf("the caller's GetBody was replaced")
					}
					if !equalHeaders(req.Header, header) || req.Body != reqBody || req.ContentLength != length {
						t.Errorf("the caller's request changed: header %v, body %v, length %d", req.Header, req.Body != reqBody, req.ContentLength)
					}
				})
			}
		}
	}
}

// TestTransportPassesTheAttemptHeaderOn: the SDKs' attempt header (or the
// one the transport names) makes the call a retry for the bulkhead: over
// its retry budget it is refused RetryBudget and nothing is sent; a value
// that is not a number fails the call as invalid, before anything is
// taken.
func TestTransportPassesTheAttemptHeaderOn(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4,
		RetryBudgets: &bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{MinRetries: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	up := &fakeUpstream{answer: respond(200, "application/json", `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)}
	tr := &Transport{Bulkhead: b, Base: up}
	for i, h := range [][]string{
		{"X-Stainless-Retry-Count", "0"}, // a first attempt
		{"X-Stainless-Retry-Count", "1"}, // the one retry the floor allows
		{"X-Attempt", "1"},               // a header this transport does not read: a first attempt
	} {
		resp, err := post(t, tr, "/v1/chat/completions", chatBody, h...)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	_, err = post(t, tr, "/v1/chat/completions", chatBody, "X-Stainless-Retry-Count", "2")
	if !errors.Is(err, bulkhead.ErrRetryBudget) {
		t.Fatalf("a retry over budget: %v", err)
	}
	_, err = post(t, &Transport{Bulkhead: b, Base: up, AttemptHeader: "X-Attempt"}, "/v1/chat/completions", chatBody, "X-Attempt", "1")
	if !errors.Is(err, bulkhead.ErrRetryBudget) {
		t.Fatalf("a retry over budget in the named header: %v", err)
	}
	_, err = post(t, tr, "/v1/chat/completions", chatBody, "X-Stainless-Retry-Count", "-1")
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) || ce.Field != "header X-Stainless-Retry-Count" {
		t.Fatalf("a bad attempt header: %v", err)
	}
	if up.count() != 3 {
		t.Errorf("%d calls sent, want the 3 admitted", up.count())
	}
	if st := b.Stats(); st.Retries.Admitted != 1 || st.Calls.RejectedByReason[bulkhead.RetryBudget] != 2 || st.Calls.InFlight != 0 {
		t.Errorf("stats: retries %+v, calls %+v", st.Retries, st.Calls)
	}
}
