package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// deliveringWriter is a ResponseWriter whose client sees a write only once
// it is flushed; it counts the flushes.
type deliveringWriter struct {
	h       http.Header
	mu      sync.Mutex
	pending bytes.Buffer
	seen    bytes.Buffer
	flushes int
}

func (w *deliveringWriter) Header() http.Header { return w.h }
func (w *deliveringWriter) WriteHeader(int)     {}
func (w *deliveringWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending.Write(p)
}

func (w *deliveringWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushes++
	w.pending.WriteTo(&w.seen)
}

// delivered returns what the client has seen, and the flushes so far.
func (w *deliveringWriter) delivered() (string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen.String(), w.flushes
}

// rawUpstream is an upstream that answers one streamed call: it writes the
// answer's head and the chunks of first at once, then waits for release,
// then writes the chunks of rest and the end of the answer.
func rawUpstream(t *testing.T, first, rest []string, release <-chan struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	chunks := func(events []string) string {
		var b strings.Builder
		for _, e := range events {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", len(e), e)
		}
		return b.String()
	}
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+chunks(first))
		<-release
		io.WriteString(c, chunks(rest)+"0\r\n\r\n")
	}()
	return "http://" + ln.Addr().String()
}

// event is the n-th text delta of a chat stream.
func event(n int) string {
	return fmt.Sprintf("data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word %04d %s\"}}]}\n\n", n, strings.Repeat("x", 150))
}

// TestStreamFlushCoalesced: events that the upstream sends together reach
// the client in one flush, however many reads the proxy makes of them,
// and at once, while the upstream says nothing more; the rest follows when
// it comes.
func TestStreamFlushCoalesced(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("connections are watched on Unix only: every write is flushed")
	}
	var first, rest []string
	for i := range 1000 { // ~200 KB: many reads of the upstream's answer
		first = append(first, event(i))
	}
	rest = append(rest, event(1000), "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1001,\"total_tokens\":1010}}\n\n", "data: [DONE]\n\n")
	release := make(chan struct{})
	up, _ := url.Parse(rawUpstream(t, first, rest, release))
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: up, Bulkhead: b})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}],"max_tokens":500}`))
	w := &deliveringWriter{h: http.Header{}}
	served := make(chan struct{})
	go func() { defer close(served); h.ServeHTTP(w, req) }()

	want := strings.Join(first, "")
	testutil.WaitFor(t, "the first events, while the upstream waits", func() bool { got, _ := w.delivered(); return got == want })
	// One flush, or two should the kernel hand the upstream's write over
	// in parts (a flush for every read of the upstream is about 8).
	if _, flushes := w.delivered(); flushes > 2 {
		t.Errorf("%d events sent together reached the client in %d flushes; want 1", len(first), flushes)
	}
	close(release)
	<-served
	w.Flush() // the server's own, at the end of the handler
	if got, _ := w.delivered(); got != want+strings.Join(rest, "") {
		t.Fatalf("the stream as the client got it:\n%q", got)
	}
	testutil.WaitFor(t, "the call's release", idle(b))
}

// TestStreamHeadBeforeFirstEvent: a streamed answer's head reaches the
// client as soon as the upstream sends it, while the upstream has yet to
// send its first event (a model's time to first token), as it did before
// flushes were coalesced.
func TestStreamHeadBeforeFirstEvent(t *testing.T) {
	release := make(chan struct{})
	released := false
	up, _ := url.Parse(rawUpstream(t, nil, []string{event(0), "data: [DONE]\n\n"}, release))
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: up, Bulkhead: b})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()
	defer func() { // before gw.Close, which waits for the call
		if !released {
			close(release)
		}
	}()
	head := make(chan *http.Response, 1)
	go func() {
		res, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Error(err)
			close(head)
			return
		}
		head <- res
	}()
	var res *http.Response
	testutil.WaitFor(t, "the answer's head while the upstream thinks", func() bool {
		select {
		case res = <-head:
			return true
		default:
			return false
		}
	})
	if res == nil {
		return
	}
	defer res.Body.Close()
	close(release)
	released = true
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("%d %q %v", res.StatusCode, body, err)
	}
	testutil.WaitFor(t, "the call's release", idle(b))
}

// sizedBody is a streamed answer's body that notes the size of each read
// of it: it gives its first event, then waits for release (or Close).
type sizedBody struct {
	first   string
	release chan struct{}
	closed  chan struct{}
	once    sync.Once

	mu    sync.Mutex
	sizes []int
	sent  bool
}

func (b *sizedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.sizes = append(b.sizes, len(p))
	sent := b.sent
	b.sent = true
	b.mu.Unlock()
	if !sent {
		return copy(p, b.first), nil
	}
	select {
	case <-b.release:
	case <-b.closed:
	}
	return 0, io.EOF
}

func (b *sizedBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// readSizes returns the size of each read so far.
func (b *sizedBody) readSizes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.sizes...)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestHeldStreamWaitsOnSmallBuffer: while a streamed answer waits for its
// upstream's next event, the read that waits holds a small buffer (at
// most 4 KiB), not the 32 KiB a plain answer is copied with: thousands of
// streams held at once each keep it for as long as they last.
func TestHeldStreamWaitsOnSmallBuffer(t *testing.T) {
	body := &sizedBody{first: event(0), release: make(chan struct{}), closed: make(chan struct{})}
	up, _ := url.Parse("http://upstream.test")
	b, _ := bulkhead.New(budgetConfig(4))
	defer b.Shutdown(context.Background())
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: up, Bulkhead: b,
		Transport: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			io.Copy(io.Discard, r.Body)
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body,
				ContentLength: -1, Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()
	res, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	first := make([]byte, len(event(0)))
	if _, err := io.ReadFull(res.Body, first); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the read that waits for the next event", func() bool { return len(body.readSizes()) == 2 })
	if sizes := body.readSizes(); sizes[1] > 4<<10 {
		t.Errorf("the read waiting for the next event holds a buffer of %d bytes; want at most 4 KiB", sizes[1])
	}
	close(body.release)
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the call's release", idle(b))
}
