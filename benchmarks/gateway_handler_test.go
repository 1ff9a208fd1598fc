//go:build unix

package benchmarks

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/llmbulkhead/bulkhead/gateway"
)

// discardWriter is an http.ResponseWriter that keeps nothing but its
// headers (reused between calls) and the status.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Flush()                      {}

// buildGateway builds a gateway of one OpenAI chat route to upstream
// through a bulkhead of limit calls at once, logging every request to
// io.Discard in JSON, as the command logs to standard error, with opts.
func buildGateway(b *testing.B, upstream string, limit int, opts ...gateway.BuildOption) *gateway.Gateway {
	b.Helper()
	cfg, err := gateway.ParseConfig("bench.yaml", []byte(`
log: {requests: all}
upstreams:
  fake: {base_url: "`+upstream+`"}
bulkheads:
  bench: {model: gpt-4o-mini, max_concurrent: `+itoa(limit)+`, max_queue: 0, token_budget: 100000000}
routes:
  - {api: openai-chat, upstream: fake, bulkhead: bench}
`))
	if err != nil {
		b.Fatal(err)
	}
	g, err := gateway.Build(cfg, "bench.yaml", nil, gateway.NewLogger(io.Discard, "json"), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Shutdown(context.Background()) })
	return g
}

func itoa(n int) string {
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(buf[i:])
		}
	}
}

// serveCalls sends b.N calls with body straight to the gateway's handler
// (no client connection) and returns the last status. Besides the wall
// time it reports the process's CPU time per call (cpu-ns/op: user and
// system, every goroutine), which other work on a shared machine moves
// less.
func serveCalls(b *testing.B, h http.Handler, body string) int {
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodPost, "http://gateway/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		clear(w.h)
		w.status = 0
		h.ServeHTTP(w, req)
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	return w.status
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGatewayHandler is the CPU a Build gateway's handler spends on
// one call, in process (no client connection; the served calls go to a
// fake upstream on loopback, whose own cost is in the figure): served
// plain and streamed, and shed: the bulkhead's one slot is held by a
// stream through the gateway, and each call is answered 503. The request
// log is on, to io.Discard. Telemetry is off (the default); the "-traced"
// runs trace every call (the gateway's span, its admission, its upstream
// call) into the SDK's batching processor and an exporter that drops what
// it is given, so they measure the gateway's and the SDK's cost, not an
// exporter's. The "floor-" runs send the same calls through a bare
// httputil.ReverseProxy that reads the body first (as the gateway does),
// the floor of a proxy in Go: what the gateway's own work (parsing,
// admission, metering, the request log) costs is the difference.
func BenchmarkGatewayHandler(b *testing.B) {
	release := make(chan struct{})
	defer close(release)
	up := fakeUpstream(release)
	defer up.Close()
	plain := `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64}`
	streamed := strings.Replace(plain, `{"model"`, `{"stream":true,"model"`, 1)
	for _, body := range []struct{ name, body string }{{"plain", plain}, {"streamed", streamed}} {
		b.Run("floor-"+body.name, func(b *testing.B) {
			if st := serveCalls(b, bareProxy(b, up.URL), body.body); st != http.StatusOK {
				b.Fatalf("status %d", st)
			}
		})
	}
	for _, traced := range []bool{false, true} {
		suffix := ""
		if traced {
			suffix = "-traced"
		}
		opts := func(b *testing.B) []gateway.BuildOption {
			if !traced {
				return nil
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(dropSpans{}))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			return []gateway.BuildOption{gateway.WithTracerProvider(tp)}
		}
		b.Run("plain"+suffix, func(b *testing.B) {
			g := buildGateway(b, up.URL, 64, opts(b)...)
			if st := serveCalls(b, g.Handler, plain); st != http.StatusOK {
				b.Fatalf("status %d", st)
			}
		})
		b.Run("streamed"+suffix, func(b *testing.B) {
			g := buildGateway(b, up.URL, 64, opts(b)...)
			if st := serveCalls(b, g.Handler, streamed); st != http.StatusOK {
				b.Fatalf("status %d", st)
			}
		})
		b.Run("shed"+suffix, func(b *testing.B) {
			hold := make(chan struct{})
			upHold := fakeUpstream(hold)
			defer upHold.Close()
			g := buildGateway(b, upHold.URL, 1, opts(b)...)
			srv := httptest.NewServer(g.Handler)
			defer srv.Close()
			res, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hold"}]}`))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := res.Body.Read(make([]byte, 16)); err != nil {
				b.Fatal(err)
			}
			if st := serveCalls(b, g.Handler, plain); st != http.StatusServiceUnavailable {
				b.Fatalf("status %d", st)
			}
			close(hold)
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		})
	}
}

// bareProxy is a bare httputil.ReverseProxy to upstream that reads a
// request's body before it sends it on, as the gateway does, with
// keep-alive connections to it.
func bareProxy(b *testing.B, upstream string) http.Handler {
	u, err := url.Parse(upstream)
	if err != nil {
		b.Fatal(err)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	b.Cleanup(t.CloseIdleConnections)
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, Transport: t}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		proxy.ServeHTTP(w, r)
	})
}

// dropSpans is a span exporter that drops what it is given.
type dropSpans struct{}

func (dropSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropSpans) Shutdown(context.Context) error                             { return nil }
