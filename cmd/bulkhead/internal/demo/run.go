package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// gatewayCalls is the size of gateway mode's burst when Config.Calls is
// zero.
const gatewayCalls = 400

// Result is what one pass of the gateway-mode burst did.
type Result struct {
	// Name is "bare" or "through gateway".
	Name string
	// Calls is the number of calls sent.
	Calls int
	// OK counts calls that completed.
	OK int
	// Failed429 counts calls that ended with a provider 429, after the
	// client's retries.
	Failed429 int
	// Shed counts calls the bulkhead rejected, and ShedByReason splits them
	// by the reason each caller was given (the gateway turns some calls
	// away before their body is read: the bulkhead's Stats do not count
	// those).
	Shed         int
	ShedByReason map[bulkhead.Reason]int64
	// Failed counts calls that failed otherwise (the run was cancelled).
	Failed int
	// OKLatency is the distribution of the completed calls' latency, from
	// arrival to answer, wall-clock.
	OKLatency Latencies
	// FailLatency is the distribution of the time it took the other calls
	// to learn that they failed: a provider 429 after retries, or a
	// bulkhead rejection.
	FailLatency Latencies
	// ShedLatency is the distribution of the bulkhead rejections' latency.
	ShedLatency Latencies
	// Provider is the provider's counters at the end.
	Provider simprovider.Stats
	// Bulkhead is the bulkhead's Stats at the end, nil for the bare pass.
	Bulkhead *bulkhead.Stats
	// Wall is the wall time of the pass, first arrival to last answer.
	Wall time.Duration
}

// Latencies summarises a set of durations.
type Latencies struct {
	// N is the number of samples.
	N int
	// P50 and P99 are the median and the 99th percentile (nearest rank).
	P50, P99 time.Duration
}

func summarise(ds []time.Duration) Latencies {
	if len(ds) == 0 {
		return Latencies{}
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return ds[min(max(i, 0), len(ds)-1)]
	}
	return Latencies{N: len(ds), P50: at(0.50), P99: at(0.99)}
}

// Report is the outcome of a demo: the configuration and the table, or in
// gateway mode both passes of the burst.
type Report struct {
	// Config is the configuration the demo ran with.
	Config Config
	// Table is the scenarios' table; nil in gateway mode.
	Table *Table
	// Bare is gateway mode's pass straight at the provider.
	Bare Result
	// Guard is gateway mode's pass through the gateway.
	Guard Result
}

// Run runs the demo and writes it to w: the table of scenarios, on
// simulated time, with its verdict; or with cfg.Gateway, the same burst
// bare and then through the gateway, over HTTP on the wall clock. It
// returns early with ctx's error when ctx ends.
func Run(ctx context.Context, cfg Config, w io.Writer) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Gateway {
		t, err := RunTable(ctx, cfg)
		if err != nil {
			return nil, err
		}
		printTable(w, t)
		return &Report{Config: cfg, Table: t}, nil
	}
	if cfg.Calls == 0 {
		cfg.Calls = gatewayCalls
	}
	reqs, err := cfg.Workload.Generate(cfg.Seed, cfg.Calls)
	if err != nil {
		return nil, err
	}
	arrivals := arrivalTimes(cfg.Seed, cfg.Calls, cfg.Ramp)
	bReqs := bulkheadRequests(cfg, reqs)

	rep := &Report{Config: cfg}
	printHeader(w, &cfg, reqs)
	fmt.Fprintf(w, "running the burst bare ...\n")
	if rep.Bare, err = runPass(ctx, &cfg, "bare", reqs, bReqs, arrivals, false); err != nil {
		return nil, err
	}
	guard := "through gateway"
	fmt.Fprintf(w, "running the burst %s ...\n\n", guard)
	if rep.Guard, err = runPass(ctx, &cfg, guard, reqs, bReqs, arrivals, true); err != nil {
		return nil, err
	}
	printComparison(w, rep)
	return rep, nil
}

// arrivalTimes draws n arrival offsets uniformly over ramp, sorted.
func arrivalTimes(seed uint64, n int, ramp time.Duration) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, math.MaxUint64-1))
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = time.Duration(rng.Float64() * float64(ramp))
	}
	slices.Sort(at)
	return at
}

// filler is plain ASCII prose whose prefixes serve as prompts, so a prompt
// of n characters costs one slice, not an allocation.
var filler = strings.Repeat("The quick brown fox jumps over the lazy dog while the bulkhead keeps the provider calm. ", 800)

// bulkheadRequests builds the request each simulated call shows the
// bulkhead: a prompt whose length in characters is its true token count
// times a characters-per-token ratio between 3.4 and 4.1, so the model-aware
// estimator is close but not exact, as with real text.
func bulkheadRequests(cfg Config, reqs []simprovider.Request) []bulkhead.Request {
	rng := rand.New(rand.NewPCG(cfg.Seed, math.MaxUint64-2))
	out := make([]bulkhead.Request, len(reqs))
	for i, r := range reqs {
		ratio := 3.4 + 0.7*rng.Float64()
		n := min(int(math.Round(float64(r.InputTokens)*ratio)), len(filler))
		out[i] = bulkhead.Request{
			Model:     cfg.Model,
			Messages:  []bulkhead.Message{{Role: "user", Content: filler[:n]}},
			MaxTokens: r.MaxTokens,
		}
	}
	return out
}

// outcome is how one call ended.
type outcome struct {
	latency time.Duration
	err     error
}

// runPass fires the burst once, bare or through a fresh gateway and
// bulkhead, at a fresh provider, on the wall clock.
func runPass(ctx context.Context, cfg *Config, name string, reqs []simprovider.Request, bReqs []bulkhead.Request, arrivals []time.Duration, guarded bool) (Result, error) {
	pcfg := cfg.Provider
	pcfg.MaxConcurrent = cfg.ProviderConcurrency
	pcfg.TokensPerMinute = cfg.ProviderTPM
	pcfg.Seed = cfg.Seed
	pcfg.TimeScale = cfg.TimeScale
	pcfg.Clock = nil
	prov, err := simprovider.New(pcfg)
	if err != nil {
		return Result{}, err
	}
	cl := &client{p: prov, retries: cfg.Retries, seed: cfg.Seed}

	var b *bulkhead.Bulkhead
	if guarded {
		bcfg := bulkhead.Config{
			Model:         cfg.Model,
			MaxConcurrent: cfg.MaxConcurrent,
			MaxQueue:      cfg.MaxQueue,
			QueueTimeout:  cfg.scale(cfg.QueueTimeout),
		}
		if cfg.TokenBudget > 0 {
			bcfg.TokenBudget = &bulkhead.TokenBudget{Budget: cfg.TokenBudget}
		}
		if b, err = bulkhead.New(bcfg); err != nil {
			return Result{}, err
		}
		defer func() {
			b.Close()
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = b.Drain(dctx)
		}()
	}

	var gw *gatewayRig
	if guarded {
		if gw, err = startGateway(prov, b); err != nil {
			return Result{}, err
		}
		defer gw.close()
	}

	outcomes := make([]outcome, len(reqs))
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
dispatch:
	for i := range reqs {
		if d := time.Until(start.Add(cfg.scale(arrivals[i]))); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				break dispatch
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			var err error
			if gw != nil {
				err = gw.call(ctx, cl, reqs[i], &bReqs[i])
			} else {
				_, err = cl.do(ctx, reqs[i])
			}
			outcomes[i] = outcome{latency: time.Since(t0), err: err}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	res := Result{Name: name, Calls: len(reqs), Wall: wall, Provider: prov.Stats()}
	if b != nil {
		res.ShedByReason = map[bulkhead.Reason]int64{}
	}
	var okLat, failLat, shedLat []time.Duration
	for _, o := range outcomes {
		var rej *bulkhead.RejectedError
		var shed *shedError
		switch {
		case o.err == nil:
			res.OK++
			okLat = append(okLat, o.latency)
			continue
		case errors.As(o.err, &rej):
			res.Shed++
			res.ShedByReason[rej.Reason]++
			shedLat = append(shedLat, o.latency)
		case errors.As(o.err, &shed):
			res.Shed++
			res.ShedByReason[reasonNamed(shed.reason)]++
			shedLat = append(shedLat, o.latency)
		case errors.Is(o.err, simprovider.ErrRateLimited):
			res.Failed429++
		default:
			res.Failed++
		}
		failLat = append(failLat, o.latency)
	}
	res.OKLatency, res.FailLatency, res.ShedLatency = summarise(okLat), summarise(failLat), summarise(shedLat)
	if b != nil {
		st := b.Stats()
		res.Bulkhead = &st
	}
	return res, nil
}

// client calls the provider like an SDK with its default retry policy:
// a 429 is retried up to retries times after a jittered exponential
// backoff (0.5 s, 1 s, 2 s ... capped at 8 s, minus up to 25 % jitter),
// ignoring Retry-After.
type client struct {
	p       *simprovider.Provider
	retries int
	seed    uint64
}

func (c *client) do(ctx context.Context, req simprovider.Request) (simprovider.Response, error) {
	var resp simprovider.Response
	err := c.retry(ctx, req.ID, func() error {
		var err error
		resp, err = c.p.Complete(ctx, req)
		return err
	})
	return resp, err
}

// retry calls attempt until it succeeds, fails otherwise than with a
// provider 429, or has been retried c.retries times, backing off between.
func (c *client) retry(ctx context.Context, id uint64, attempt func() error) error {
	var rng *rand.Rand
	for n := 0; ; n++ {
		err := attempt()
		if err == nil || n >= c.retries || !errors.Is(err, simprovider.ErrRateLimited) {
			return err
		}
		if rng == nil {
			rng = rand.New(rand.NewPCG(c.seed^0x5eed, id))
		}
		backoff := min(500*time.Millisecond<<n, 8*time.Second)
		backoff = time.Duration(float64(backoff) * (1 - 0.25*rng.Float64()))
		t := c.p.Clock().NewTimer(c.p.Scale(backoff))
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// reasonNamed returns the Reason whose wire name is name (the gateway's
// X-Bulkhead-Reason), or the zero Reason.
func reasonNamed(name string) bulkhead.Reason {
	for r := bulkhead.Reason(1); r != 0; r++ { // every value of the uint8

		if r.String() == name {
			return r
		}
	}
	return 0
}
