// Command retries measures what a retry budget buys a gateway under
// overload: clients that retry exactly as the official OpenAI and
// Anthropic Go SDKs do (see sdk.go) call a gateway built from its YAML
// configuration, in front of a fake upstream that takes a service time per
// call, on loopback, in this process. It is not a test: run it with
// scripts/bench-retries.sh.
//
// Calls arrive at random (Poisson) at -factors times the bulkhead's
// capacity (max_concurrent / the mean service time). Each call's user
// waits -patience for an answer: the call's context ends then, which ends
// the SDK's retries and cuts the call where it is (in the queue, or at the
// upstream, whose work is then wasted). For each load, three gateways:
//
//   - attempts not told apart: the gateway reads no attempt header, as
//     before retry-aware admission;
//   - first attempts first: retries wait behind first attempts in the
//     queue (the default), no budget;
//   - retry budget: the same, and retry_budget {ratio: 0.1, min_retries: 3}.
//
// It prints, per run: the calls offered; the attempts that reached the
// gateway and the upstream (each per call); the upstream attempts cut by
// the client's patience (work wasted); goodput (calls answered 200 within
// their patience, per second); and the p50 and p99 of the served calls'
// latency, from the call's first attempt to its answer.
//
// The machine is shared: compare the figures of one run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/llmbulkhead/bulkhead/gateway"
)

// options are the command's flags.
type options struct {
	capacity, queue int
	service         time.Duration
	queueTimeout    time.Duration
	patience        time.Duration
	dur, warmup     time.Duration
	factors         []float64
	seed            uint64
}

func main() {
	var o options
	var factors string
	flag.IntVar(&o.capacity, "capacity", 16, "the bulkhead's max_concurrent")
	flag.IntVar(&o.queue, "queue", 16, "the bulkhead's max_queue")
	flag.DurationVar(&o.queueTimeout, "queue-timeout", 0, "the bulkhead's queue_timeout (0: a queued call waits until its client gives up)")
	flag.DurationVar(&o.service, "service", time.Second, "the upstream's mean service time per call (uniform within ±50%)")
	flag.DurationVar(&o.patience, "patience", 3*time.Second, "how long a call's user waits for its answer, retries included")
	flag.DurationVar(&o.dur, "dur", 30*time.Second, "how long calls arrive, per run")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "the start of each run left out of the figures")
	flag.StringVar(&factors, "factors", "2,4", "offered loads, as multiples of the bulkhead's capacity")
	flag.Uint64Var(&o.seed, "seed", 1, "the seed of arrivals, service times and jitter")
	flag.Parse()
	for _, f := range strings.Split(factors, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "retries: bad -factors %q\n", factors)
			os.Exit(2)
		}
		o.factors = append(o.factors, v)
	}
	if o.warmup >= o.dur {
		fmt.Fprintln(os.Stderr, "retries: -warmup must be shorter than -dur")
		os.Exit(2)
	}
	up, err := startUpstream(o.service, o.seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "retries:", err)
		os.Exit(1)
	}
	defer up.close()
	capacity := float64(o.capacity) / o.service.Seconds()
	fmt.Printf("capacity %d slots, service %v mean: %.0f calls/s; queue %d, patience %v, %v per run (first %v left out)\n\n",
		o.capacity, o.service, capacity, o.queue, o.patience, o.dur, o.warmup)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tgateway\tcalls\tattempts at gateway (per call)\tattempts at upstream (per call)\tupstream cut by patience\tgoodput (calls/s)\tserved p50\tserved p99\t")
	for _, f := range o.factors {
		for _, mode := range modes {
			r, err := run(o, up, mode, f*capacity)
			if err != nil {
				fmt.Fprintln(os.Stderr, "retries:", err)
				os.Exit(1)
			}
			fmt.Fprintf(tw, "%gx\t%s\t%d\t%d (%.2f)\t%d (%.2f)\t%d\t%.1f\t%s\t%s\t\n", f, mode.name, r.calls,
				r.gatewayAttempts, per(r.gatewayAttempts, r.calls), r.upstreamAttempts, per(r.upstreamAttempts, r.calls),
				r.upstreamCut, r.goodput, ms(r.p50), ms(r.p99))
			fmt.Fprintf(os.Stderr, "%gx %s: done\n", f, mode.name)
		}
	}
	tw.Flush()
}

func per(n int64, calls int) float64 { return float64(n) / float64(max(calls, 1)) }

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
}

// mode is one gateway's configuration: its bulkhead section's extra keys,
// and the attempt header it reads.
type mode struct {
	name          string
	bulkhead      string
	attemptHeader string
}

var modes = []mode{
	{name: "attempts not told apart", attemptHeader: "X-Not-Sent"},
	{name: "first attempts first"},
	{name: "retry budget 0.1, min 3", bulkhead: "    retry_budget: {ratio: 0.1, min_retries: 3}\n"},
}

// result is one run's figures, over the calls that arrived after the
// warm-up.
type result struct {
	calls                              int
	gatewayAttempts, upstreamAttempts  int64
	upstreamCut                        int64
	goodput                            float64
	p50, p99                           time.Duration
	succeeded, gaveUp, failedOtherwise int
}

// run runs the load of rate calls per second against a gateway of mode m.
func run(o options, up *upstream, m mode, rate float64) (result, error) {
	text := fmt.Sprintf(`log: {requests: none}
attempt_header: %q
upstreams:
  fake: {base_url: "%s"}
bulkheads:
  main:
    model: gpt-4o-mini
    max_concurrent: %d
    max_queue: %d
    queue_timeout: %s
%sroutes:
  - {api: openai-chat, upstream: fake, bulkhead: main}
`, m.attemptHeader, up.url, o.capacity, o.queue, o.queueTimeout, m.bulkhead)
	if m.attemptHeader == "" {
		text = strings.Replace(text, "attempt_header: \"\"\n", "", 1)
	}
	cfg, err := gateway.ParseConfig("bench.yaml", []byte(text))
	if err != nil {
		return result{}, err
	}
	g, err := gateway.Build(cfg, "bench.yaml", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		return result{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	var gatewayAttempts atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(measuredHeader) != "" {
			gatewayAttempts.Add(1)
		}
		g.Handler.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		g.Shutdown(ctx)
	}()
	up.reset()
	client := newSDK("http://"+ln.Addr().String(), o.seed)
	defer client.close()

	rng := rand.New(rand.NewPCG(o.seed, 0xa55))
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	res := result{}
	for at := time.Duration(0); at < o.dur; at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) {
		if d := time.Until(start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		measured := at >= o.warmup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), o.patience)
			defer cancel()
			t0 := time.Now()
			out := client.call(ctx, measured)
			if !measured {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			res.calls++
			switch out {
			case outcomeOK:
				res.succeeded++
				lat = append(lat, time.Since(t0))
			case outcomeGaveUp:
				res.gaveUp++
			default:
				res.failedOtherwise++
			}
		}()
	}
	wg.Wait()
	res.gatewayAttempts = gatewayAttempts.Load()
	res.upstreamAttempts, res.upstreamCut = up.counts()
	res.goodput = float64(res.succeeded) / (o.dur - o.warmup).Seconds()
	slices.Sort(lat)
	res.p50, res.p99 = quantile(lat, 0.5), quantile(lat, 0.99)
	return res, nil
}

// measuredHeader marks the attempts of the calls that count.
const measuredHeader = "X-Bench-Measured"

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(math.Ceil(q*float64(len(sorted))))-1)]
}

// upstream is the fake provider: it answers a chat completion after a
// service time drawn uniformly within ±50% of its mean, and counts the
// measured attempts it was sent and those whose client went away first.
type upstream struct {
	url  string
	srv  *http.Server
	mean time.Duration
	mu   sync.Mutex
	rng  *rand.Rand
	sent atomic.Int64
	cut  atomic.Int64
}

const answer = `{"id":"chatcmpl-bench","object":"chat.completion","created":1755137933,"model":"gpt-4o-mini",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`

func startUpstream(mean time.Duration, seed uint64) (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{url: "http://" + ln.Addr().String(), mean: mean, rng: rand.New(rand.NewPCG(seed, 0x5e7))}
	u.srv = &http.Server{Handler: http.HandlerFunc(u.serve)}
	go u.srv.Serve(ln)
	return u, nil
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	measured := r.Header.Get(measuredHeader) != ""
	if measured {
		u.sent.Add(1)
	}
	u.mu.Lock()
	d := time.Duration(float64(u.mean) * (0.5 + u.rng.Float64()))
	u.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		if measured {
			u.cut.Add(1)
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, answer)
}

// reset starts a run.
func (u *upstream) reset() {
	u.sent.Store(0)
	u.cut.Store(0)
}

func (u *upstream) counts() (sent, cut int64) { return u.sent.Load(), u.cut.Load() }

func (u *upstream) close() { _ = u.srv.Close() }
