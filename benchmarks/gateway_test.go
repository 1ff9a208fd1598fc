package benchmarks

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/stream"
)

const gatewayRate = 2000 // requests per second, open loop

// fakeUpstream answers a chat completion at once, plain or as a stream of
// ten deltas and a usage chunk. A request whose message is "hold" streams
// one delta, then waits until release is closed.
func fakeUpstream(release <-chan struct{}) *httptest.Server {
	return fakeUpstreamCounting(release, nil)
}

// fakeUpstreamCounting is fakeUpstream, counting the connections opened to
// it in conns (nil: not counted).
func fakeUpstreamCounting(release <-chan struct{}, conns *atomic.Int64) *httptest.Server {
	plain := `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	var sse strings.Builder
	for i := 0; i < 10; i++ {
		sse.WriteString(`data: {"id":"c1","choices":[{"index":0,"delta":{"content":"word "}}]}` + "\n\n")
	}
	sse.WriteString(`data: {"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":10,"total_tokens":19}}` + "\n\ndata: [DONE]\n\n")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, plain)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(string(body), `"hold"`) {
			io.WriteString(w, `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"word "}}]}`+"\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, sse.String())
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew && conns != nil {
			conns.Add(1)
		}
	}
	srv.Start()
	return srv
}

func newGatewayServer(b *testing.B, upstream string, maxConc int) (*httptest.Server, *bulkhead.Bulkhead) {
	bh := newBench(b, bulkhead.Config{Model: "gpt-4o", MaxConcurrent: maxConc, TokenBudget: &bulkhead.TokenBudget{Budget: 1 << 40}})
	u, _ := url.Parse(upstream)
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: bh,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	return srv, bh
}

// openLoop sends n requests at gatewayRate (not waiting for answers) and
// returns each one's latency, sorted.
func openLoop(b *testing.B, client *http.Client, target, body string, n int) []time.Duration {
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / gatewayRate)
	defer tick.Stop()
	for i := 0; i < n; i++ {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			res, err := client.Post(target+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			lat[i] = time.Since(start)
		}()
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat
}

// BenchmarkGateway is the latency the gateway adds to a call, at a fixed
// 2,000 requests per second on loopback: each b.N is one request, sent
// open loop, first straight to the fake upstream, then through the gateway
// to it, in the same run (goal: under 50 µs p50 and 1 ms p99 added).
// stream-usage is a stream whose client asks for usage itself, so the
// gateway neither rewrites its body nor strips a chunk from its response.
func BenchmarkGateway(b *testing.B) {
	release := make(chan struct{})
	defer close(release)
	var conns atomic.Int64
	up := fakeUpstreamCounting(release, &conns)
	defer up.Close()
	for _, mode := range []string{"plain", "stream", "stream-usage"} {
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`
		switch mode {
		case "stream": // the gateway asks for usage and strips the extra chunk
			body = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":50}`
		case "stream-usage": // the client asks for usage: nothing to rewrite or strip
			body = `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}],"max_tokens":50}`
		}
		b.Run(mode, func(b *testing.B) {
			gw, _ := newGatewayServer(b, up.URL, 1<<20)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
			defer client.CloseIdleConnections()
			n := max(b.N, 200)
			openLoop(b, client, up.URL, body, 100) // warm both paths
			openLoop(b, client, gw.URL, body, 100)
			b.ResetTimer()
			c0 := conns.Load()
			direct := openLoop(b, client, up.URL, body, n)
			c1 := conns.Load()
			through := openLoop(b, client, gw.URL, body, n)
			c2 := conns.Load()
			b.StopTimer()
			// Connections opened to the upstream per 1,000 requests, by the
			// client and by the gateway: keep-alive should make them rare.
			b.ReportMetric(float64(c1-c0)*1000/float64(n), "direct-conns/1k")
			b.ReportMetric(float64(c2-c1)*1000/float64(n), "gateway-conns/1k")
			p := func(ds []time.Duration, q int) float64 { return float64(ds[(len(ds)-1)*q/100]) / 1e3 }
			b.ReportMetric(p(direct, 50), "direct-p50-µs")
			b.ReportMetric(p(direct, 99), "direct-p99-µs")
			b.ReportMetric(p(through, 50), "gateway-p50-µs")
			b.ReportMetric(p(through, 99), "gateway-p99-µs")
			b.ReportMetric(p(through, 50)-p(direct, 50), "added-p50-µs")
			b.ReportMetric(p(through, 99)-p(direct, 99), "added-p99-µs")
		})
	}
}

// BenchmarkGatewayStreamMemory is the memory and goroutines each stream
// held open through the gateway costs, measured over the whole loopback
// path in this process (the client, the gateway and the fake upstream):
// the gateway's own part is below it.
func BenchmarkGatewayStreamMemory(b *testing.B) {
	{
		hold := make(chan struct{})
		upHold := fakeUpstream(hold)
		defer upHold.Close()
		gw, bh := newGatewayServer(b, upHold.URL, 1<<20)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
		defer client.CloseIdleConnections()
		const streams = 200
		body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}],"max_tokens":50}`
		measure := func() (uint64, int) {
			// Twice: the buffers the last iteration's streams gave back
			// to a sync.Pool survive one collection, and would count as
			// memory that was there before the streams.
			runtime.GC()
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapInuse, runtime.NumGoroutine()
		}
		for i := 0; i < b.N; i++ {
			heap0, g0 := measure()
			var open []*http.Response
			for j := 0; j < streams; j++ {
				res, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, 16)
				if _, err := res.Body.Read(buf); err != nil {
					b.Fatal(err)
				}
				open = append(open, res)
			}
			if st := bh.Stats(); st.Calls.InFlight != streams {
				b.Fatalf("%d in flight", st.Calls.InFlight)
			}
			heap1, g1 := measure()
			b.ReportMetric(float64(heap1-heap0)/streams/1024, "KiB/stream")
			b.ReportMetric(float64(g1-g0)/streams, "goroutines/stream")
			for _, res := range open {
				res.Body.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for bh.Stats().Calls.InFlight != 0 && ctx.Err() == nil {
				runtime.Gosched()
			}
			cancel()
		}
		close(hold)
	}
}
