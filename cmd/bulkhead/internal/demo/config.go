// Package demo is the `bulkhead demo` command: it runs scenarios of LLM
// calls (bursts of 50 to 1,000 calls, a provider whose capacity halves, a
// quiet tenant beside a bursting one) against a simulated provider account,
// bare, through a static bulkhead and through the adaptive + fair one, and
// prints one table with a verdict under it.
//
// The scenarios run on simulated time (package sim): a discrete-event
// simulation on one goroutine, so the same seed prints the same table on
// any machine, in well under a second. The clients retry a provider 429 and
// a bulkhead rejection alike, like an SDK does.
//
// With Config.Gateway the demo is the older comparison over real HTTP, on
// the wall clock: one burst bare, then through the gateway in front of the
// provider served on loopback.
package demo

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// Config is one demo run's parameters. Durations are simulated time; in
// gateway mode the demo multiplies them by TimeScale, like every latency of
// the provider.
type Config struct {
	// Scenario names the one scenario of the table to run (see
	// Scenarios); "" runs them all.
	Scenario string
	// Calls, when positive, replaces the table's scenarios by one burst of
	// that many calls arriving over Ramp. In gateway mode it is the size
	// of the burst, 400 when zero.
	Calls int
	// Ramp is how long the burst of Calls takes to arrive: arrival times
	// are drawn uniformly over it. Zero fires every call at once. The
	// table's own bursts arrive at once.
	Ramp time.Duration
	// Model is the model name the bulkhead estimates tokens for.
	Model string
	// Seed makes the workload, the provider and the clients' jitter
	// deterministic.
	Seed uint64
	// TimeScale multiplies every simulated duration: 0.05 runs 20 times
	// faster than real time.
	TimeScale float64
	// Attempts is how many times a simulated client tries a call: a
	// provider 429 and a bulkhead rejection are retried alike, after their
	// Retry-After when they give one, else after an exponential backoff
	// with full jitter from 0.5 s.
	Attempts int
	// Retries is how many times a gateway-mode client retries a provider
	// 429, with jittered exponential backoff from 0.5 s, like an SDK's
	// defaults.
	Retries int

	// ProviderConcurrency is the account's concurrency limit.
	ProviderConcurrency int
	// ProviderTPM is the account's tokens-per-minute limit.
	ProviderTPM int64

	// MaxConcurrent, MaxQueue and QueueTimeout configure the static
	// bulkhead's gate (bulkhead.Config fields of the same names), and the
	// gateway's in gateway mode.
	MaxConcurrent int
	MaxQueue      int
	QueueTimeout  time.Duration
	// TokenBudget is the bulkhead's in-flight token budget. Zero means no
	// token budget.
	TokenBudget int64

	// Provider is the rest of the simulated account (latency and output
	// distributions). Its limits, seed, time scale and clock are replaced
	// by the fields above.
	Provider simprovider.Config
	// Workload is the prompt-size and max_tokens mix of the burst.
	Workload simprovider.Workload

	// Gateway runs the guarded pass over HTTP through the bulkhead's
	// gateway: the simulated provider is served as an OpenAI-compatible API
	// on loopback, the gateway sits in front of it, and the clients post
	// chat completions to the gateway.
	Gateway bool
}

// DefaultConfig returns the demo's defaults: the table's scenarios at an
// account of 40 concurrent requests and 200,000 tokens per minute, clients
// that try a call up to 6 times, and a static bulkhead of 36 slots, a queue
// of 16 with a 2 s timeout and a budget of 70,000 tokens in flight. In
// gateway mode: 400 calls arriving over 10 s at a time scale of 0.05 (a few
// seconds of wall time), retried twice on a 429.
func DefaultConfig() Config {
	return Config{
		Ramp:                10 * time.Second,
		Model:               "gpt-4o",
		Seed:                1,
		TimeScale:           0.05,
		Attempts:            6,
		Retries:             2,
		ProviderConcurrency: 40,
		ProviderTPM:         200_000,
		MaxConcurrent:       36,
		MaxQueue:            16,
		QueueTimeout:        2 * time.Second,
		TokenBudget:         70_000,
		Provider:            simprovider.DefaultConfig(),
		Workload:            simprovider.DefaultWorkload(),
	}
}

// RegisterFlags defines the demo's flags on fs, with c's values as their
// defaults, writing into c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Scenario, "scenario", c.Scenario, "run one scenario of the table: "+strings.Join(Scenarios(), ", ")+" (default all)")
	fs.IntVar(&c.Calls, "calls", c.Calls, "run one burst of this many calls instead of the table (gateway mode: the burst, default 400)")
	fs.DurationVar(&c.Ramp, "ramp", c.Ramp, "simulated time over which the burst of -calls arrives (0 = all at once)")
	fs.StringVar(&c.Model, "model", c.Model, "model name the bulkhead estimates tokens for")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed for the workload, the provider and the clients")
	fs.Float64Var(&c.TimeScale, "time-scale", c.TimeScale, "gateway mode: real seconds per simulated second (0.05 = 20x faster)")
	fs.IntVar(&c.Attempts, "attempts", c.Attempts, "times a client tries a call, retrying a provider 429 and a bulkhead rejection alike")
	fs.IntVar(&c.Retries, "retries", c.Retries, "gateway mode: times a client retries a provider 429, with backoff")
	fs.IntVar(&c.ProviderConcurrency, "provider-concurrency", c.ProviderConcurrency, "provider account: concurrent requests before 429")
	fs.Int64Var(&c.ProviderTPM, "provider-tpm", c.ProviderTPM, "provider account: tokens per minute (input + max_tokens) before 429")
	fs.IntVar(&c.MaxConcurrent, "max-concurrent", c.MaxConcurrent, "static bulkhead: calls in flight at once")
	fs.IntVar(&c.MaxQueue, "max-queue", c.MaxQueue, "static bulkhead: calls that may wait for a slot (0 = fail fast)")
	fs.DurationVar(&c.QueueTimeout, "queue-timeout", c.QueueTimeout, "static bulkhead: longest simulated wait in the queue (0 = no limit)")
	fs.Int64Var(&c.TokenBudget, "token-budget", c.TokenBudget, "static bulkhead: tokens (input estimate + max_tokens) in flight at once (0 = no token budget)")
	fs.BoolVar(&c.Gateway, "gateway", c.Gateway, "instead of the table: one burst bare and through the gateway, over real HTTP on the wall clock")
}

// Validate returns an error naming the first invalid field.
func (c *Config) Validate() error {
	var errs []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	check(c.Calls >= 0, "-calls must be >= 0, got %d", c.Calls)
	check(c.Scenario == "" || slices.Contains(Scenarios(), c.Scenario), "-scenario must be one of %s, got %q", strings.Join(Scenarios(), ", "), c.Scenario)
	check(c.Ramp >= 0, "-ramp must be >= 0, got %v", c.Ramp)
	check(strings.TrimSpace(c.Model) != "", "-model must not be blank")
	check(c.TimeScale > 0 && !math.IsInf(c.TimeScale, 0), "-time-scale must be > 0, got %v", c.TimeScale)
	check(c.Attempts > 0, "-attempts must be > 0, got %d", c.Attempts)
	check(c.Retries >= 0, "-retries must be >= 0, got %d", c.Retries)
	check(c.ProviderConcurrency >= 0, "-provider-concurrency must be >= 0, got %d", c.ProviderConcurrency)
	check(c.ProviderTPM >= 0, "-provider-tpm must be >= 0, got %d", c.ProviderTPM)
	check(c.MaxConcurrent > 0, "-max-concurrent must be > 0, got %d", c.MaxConcurrent)
	check(c.MaxQueue >= 0, "-max-queue must be >= 0, got %d", c.MaxQueue)
	check(c.QueueTimeout >= 0, "-queue-timeout must be >= 0, got %v", c.QueueTimeout)
	check(c.TokenBudget >= 0, "-token-budget must be >= 0, got %d", c.TokenBudget)
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// scale converts a simulated duration to wall time.
func (c *Config) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.TimeScale)
}
