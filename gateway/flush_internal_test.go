package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// tcpPair returns both ends of a loopback TCP connection, the first
// watched.
func tcpPair(t *testing.T) (*watchedConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	t.Cleanup(func() { c.Close(); peer.Close() })
	wc, ok := watch(c).(*watchedConn)
	if !ok && runtime.GOOS == "windows" {
		t.Skip("connections are watched on Unix only")
	}
	if !ok {
		t.Fatal("a TCP connection is not watched")
	}
	return wc, peer
}

// TestWatchedConnReads: a watched connection with an owner reads as a
// net.Conn does (bytes, the end, a deadline, its own close), and flushes
// its owner's pending writes before it waits for the peer.
func TestWatchedConnReads(t *testing.T) {
	wc, peer := tcpPair(t)
	rec := httptest.NewRecorder()
	co := &coalescer{ResponseWriter: rec, conn: wc, pending: true}
	wc.owner.Store(co)

	read := make(chan string, 1)
	go func() {
		buf := make([]byte, 16)
		n, err := wc.Read(buf)
		read <- string(buf[:n]) + errString(err)
	}()
	// The read waits for the peer: the owner's writes went out first.
	testutil.WaitFor(t, "the owner's flush before the read waits", func() bool {
		co.mu.Lock()
		defer co.mu.Unlock()
		return rec.Flushed
	})
	io.WriteString(peer, "abc")
	if got := <-read; got != "abc" {
		t.Fatalf("read %q", got)
	}

	wc.SetReadDeadline(time.Now().Add(-time.Second))
	_, err := wc.Read(make([]byte, 4))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("past the deadline: %v", err)
	}
	wc.SetReadDeadline(time.Time{})

	peer.Close()
	if n, err := wc.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d, %v", n, err)
	}
	wc.Close()
	if _, err := wc.Read(make([]byte, 4)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after closing: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}

// TestStreamOverTLS: a stream from an HTTPS upstream, over HTTP/1.1 (the
// connection watched under TLS) and over HTTP/2 (not watched: every write
// flushed), reaches the client event by event: the first before the
// upstream sends the second.
func TestStreamOverTLS(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1", true: "h2"}[h2], func(t *testing.T) {
			release := make(chan struct{})
			proto := make(chan string, 1)
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				proto <- r.Proto
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one\"}}]}\n\n")
				w.(http.Flusher).Flush()
				<-release
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"two\"}}]}\n\ndata: [DONE]\n\n")
			}))
			up.EnableHTTP2 = h2
			up.StartTLS()
			defer up.Close()
			tr := defaultTransport.Clone()
			tr.TLSClientConfig = up.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
			tr.ForceAttemptHTTP2 = h2
			defer tr.CloseIdleConnections()
			u, _ := url.Parse(up.URL)
			b, _ := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 4})
			defer b.Shutdown(context.Background())
			h, err := New(Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b, Transport: tr})
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
			if p, want := <-proto, map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; p != want {
				t.Fatalf("upstream protocol %s; want %s", p, want)
			}
			br := bufio.NewReader(res.Body)
			if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, `"one"`) {
				t.Fatalf("first event %q, %v", line, err)
			}
			close(release)
			rest, err := io.ReadAll(br)
			if err != nil || !strings.Contains(string(rest), `"two"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
				t.Fatalf("rest %q, %v", rest, err)
			}
		})
	}
}

// TestWatchedConnReadAllocatesNothing: reading a watched connection with an
// owner allocates nothing, whether the read finds bytes at once or waits
// for them, flushing what its owner wrote first: a stream reads its
// upstream once an event, thousands of streams at once.
func TestWatchedConnReadAllocatesNothing(t *testing.T) {
	wc, peer := tcpPair(t)
	rw := &signalingWriter{flushed: make(chan struct{}, 1)}
	co := &coalescer{ResponseWriter: rw, conn: wc}
	wc.owner.Store(co)
	buf := make([]byte, 1)
	// Bytes there already: the read does not wait.
	if _, err := peer.Write(make([]byte, 101)); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := wc.Read(buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a read that finds its bytes allocates %v times", n)
	}
	// Nothing there: the read flushes what its owner wrote, then waits;
	// the peer writes once it sees the flush.
	done := make(chan struct{})
	go func() {
		defer close(done)
		one := []byte{'y'}
		for range 101 {
			<-rw.flushed
			if _, err := peer.Write(one); err != nil {
				return
			}
		}
	}()
	if n := testing.AllocsPerRun(100, func() {
		co.mu.Lock()
		co.pending = true
		co.mu.Unlock()
		if _, err := wc.Read(buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a read that flushes and waits allocates %v times", n)
	}
	<-done
}

// signalingWriter is a ResponseWriter that signals each flush.
type signalingWriter struct {
	h       http.Header
	flushed chan struct{}
}

func (w *signalingWriter) Header() http.Header         { return w.h }
func (w *signalingWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *signalingWriter) WriteHeader(int)             {}
func (w *signalingWriter) Flush()                      { w.flushed <- struct{}{} }
