// Package simprovider simulates one LLM provider account, for the bulkhead
// demo and gateway and for tests. It calls no network.
//
// A Provider answers completion requests the way a hosted model API does:
//
//   - Latency is a network round trip, then time to first token (growing
//     with the prompt), then a per-output-token time, each with a lognormal
//     spread, and all of it slower as the account nears saturation.
//   - Output lengths follow a lognormal distribution capped at the request's
//     max_tokens, unless the request fixes them.
//   - The account has a concurrency limit and per-minute limits: requests
//     (RPM), tokens (TPM), input tokens (ITPM) and output tokens (OTPM), each
//     optional. A request over any of them is answered 429 (a
//     *RateLimitError) after a round trip. The per-minute limits are sliding
//     windows over the requests accepted in the last minute: TPM counts each
//     one's input plus its max_tokens on entry, as real providers do, and
//     refunds nothing; ITPM counts its input; OTPM reserves its max_tokens on
//     entry and is corrected to the output it wrote when it ends, as
//     Anthropic estimates output tokens.
//
// Every random draw of a request comes from a generator seeded by
// Config.Seed and the request's ID, so a given request gets the same output
// length and latency noise whatever the scheduling; with a mock clock the
// whole provider is deterministic. Time comes from Config.Clock and every
// duration is multiplied by Config.TimeScale, so a demo can run a simulated
// minute in a few seconds and a test in milliseconds.
package simprovider

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// Config describes a simulated provider account. DefaultConfig returns a
// realistic one; New uses every field as given except where a zero value is
// documented otherwise. Durations are simulated time, before TimeScale.
type Config struct {
	// MaxConcurrent is the account's concurrency limit: a request that finds
	// this many requests in flight is answered 429. Zero means unlimited.
	MaxConcurrent int

	// RequestsPerMinute is the account's RPM limit: a request that finds
	// this many accepted requests in the window is answered 429. Zero means
	// unlimited.
	RequestsPerMinute int64

	// TokensPerMinute is the account's TPM limit: a request whose input plus
	// max_tokens does not fit in what the window has left is answered 429.
	// Zero means unlimited.
	TokensPerMinute int64

	// InputTokensPerMinute is the account's input-token limit (ITPM): a
	// request whose input does not fit in what the window has left is
	// answered 429. Zero means unlimited.
	InputTokensPerMinute int64

	// OutputTokensPerMinute is the account's output-token limit (OTPM): a
	// request reserves its max_tokens in the window on entry, corrected to
	// the output it wrote when it completes (a cancelled request keeps its
	// reservation); a request whose max_tokens does not fit is answered
	// 429. Zero means unlimited.
	OutputTokensPerMinute int64

	// Window is the length of the sliding windows of the per-minute limits.
	// Zero means one minute.
	Window time.Duration

	// RoundTrip is the median network round trip, paid by every answer,
	// 429s included.
	RoundTrip time.Duration

	// TimeToFirstToken is the median time from the request reaching the
	// model to its first output token, for an empty prompt.
	TimeToFirstToken time.Duration

	// PrefillPer1K is the time to first token added per 1000 input tokens.
	PrefillPer1K time.Duration

	// PerOutputToken is the median time to generate one output token.
	PerOutputToken time.Duration

	// LatencySpread is the sigma of the lognormal noise on latencies: 0 means
	// none, 0.3 is a typical API.
	LatencySpread float64

	// OutputMedian is the median output length in tokens of a request that
	// does not fix its own. It must be positive.
	OutputMedian int64

	// OutputSpread is the sigma of the lognormal output-length distribution.
	OutputSpread float64

	// Degradation is how much slower the account answers at saturation:
	// latency is multiplied by 1 + Degradation*load³, where load is the
	// larger of the concurrency and TPM utilisations (0..1). Zero means no
	// slowdown.
	Degradation float64

	// ChunkTokens is how many tokens each streamed chunk carries. Zero means
	// 16.
	ChunkTokens int64

	// TimeScale multiplies every duration, so 0.05 runs the simulation 20
	// times faster than real time. Zero means 1.
	TimeScale float64

	// Seed seeds the per-request random draws.
	Seed uint64

	// Clock is the time source. Nil means the wall clock.
	Clock clock.Clock

	// CapacityChange, when not nil, resizes the account's limits during the
	// run, as a provider shedding capacity in an incident does.
	CapacityChange *CapacityChange
}

// CapacityChange resizes an account's limits once, part way through.
type CapacityChange struct {
	// After is how long after New the limits change (simulated time).
	After time.Duration
	// Factor multiplies every limit from then on: 0.5 halves them. It must
	// be in (0, 1]; a limit never drops below 1.
	Factor float64
}

// DefaultConfig returns a realistic account: 40 concurrent requests, 200,000
// tokens per minute, a 60 ms round trip, 400 ms to first token plus 30 ms
// per 1000 prompt tokens, about 65 output tokens a second, outputs of about
// 250 tokens (median), and latency up to twice as long at saturation.
func DefaultConfig() Config {
	return Config{
		MaxConcurrent:    40,
		TokensPerMinute:  200_000,
		Window:           time.Minute,
		RoundTrip:        60 * time.Millisecond,
		TimeToFirstToken: 400 * time.Millisecond,
		PrefillPer1K:     30 * time.Millisecond,
		PerOutputToken:   15 * time.Millisecond,
		LatencySpread:    0.3,
		OutputMedian:     250,
		OutputSpread:     0.9,
		Degradation:      1,
		ChunkTokens:      16,
		TimeScale:        1,
	}
}

func (c *Config) validate() error {
	switch {
	case c.MaxConcurrent < 0:
		return fmt.Errorf("simprovider: MaxConcurrent must be >= 0, got %d", c.MaxConcurrent)
	case c.RequestsPerMinute < 0 || c.TokensPerMinute < 0 || c.InputTokensPerMinute < 0 || c.OutputTokensPerMinute < 0:
		return fmt.Errorf("simprovider: per-minute limits must be >= 0, got %d requests, %d tokens, %d input tokens, %d output tokens",
			c.RequestsPerMinute, c.TokensPerMinute, c.InputTokensPerMinute, c.OutputTokensPerMinute)
	case c.Window < 0:
		return fmt.Errorf("simprovider: Window must be >= 0, got %v", c.Window)
	case c.RoundTrip < 0 || c.TimeToFirstToken < 0 || c.PrefillPer1K < 0 || c.PerOutputToken < 0:
		return errors.New("simprovider: latencies must be >= 0")
	case !(c.LatencySpread >= 0) || !(c.OutputSpread >= 0) || math.IsInf(c.LatencySpread, 0) || math.IsInf(c.OutputSpread, 0):
		return errors.New("simprovider: spreads must be finite and >= 0")
	case c.OutputMedian <= 0:
		return fmt.Errorf("simprovider: OutputMedian must be > 0, got %d", c.OutputMedian)
	case !(c.Degradation >= 0) || math.IsInf(c.Degradation, 0):
		return fmt.Errorf("simprovider: Degradation must be finite and >= 0, got %v", c.Degradation)
	case c.ChunkTokens < 0:
		return fmt.Errorf("simprovider: ChunkTokens must be >= 0, got %d", c.ChunkTokens)
	case !(c.TimeScale >= 0) || math.IsInf(c.TimeScale, 0):
		return fmt.Errorf("simprovider: TimeScale must be finite and >= 0, got %v", c.TimeScale)
	case c.CapacityChange != nil && (c.CapacityChange.After < 0 || !(c.CapacityChange.Factor > 0 && c.CapacityChange.Factor <= 1)):
		return fmt.Errorf("simprovider: CapacityChange needs After >= 0 and Factor in (0, 1], got %+v", *c.CapacityChange)
	}
	return nil
}

// Request is one completion request, reduced to what the account limits
// and the latency model read.
type Request struct {
	// ID identifies the request. With Config.Seed it seeds the request's
	// random draws: the same ID always gets the same output length and
	// latency noise, and a retry of a request (same ID) behaves the same.
	ID uint64

	// InputTokens is the prompt size in tokens. It must be >= 0.
	InputTokens int64

	// MaxTokens is the output cap (max_tokens). It must be > 0.
	MaxTokens int64

	// OutputTokens is how many tokens the model will write, capped at
	// MaxTokens. Zero means drawn from the output distribution.
	OutputTokens int64
}

// Cost returns what the request counts against the TPM limit on entry:
// InputTokens + MaxTokens.
func (r Request) Cost() int64 { return r.InputTokens + r.MaxTokens }

func (r Request) validate() error {
	if r.InputTokens < 0 {
		return fmt.Errorf("simprovider: InputTokens must be >= 0, got %d", r.InputTokens)
	}
	if r.MaxTokens <= 0 {
		return fmt.Errorf("simprovider: MaxTokens must be > 0, got %d", r.MaxTokens)
	}
	if r.OutputTokens < 0 {
		return fmt.Errorf("simprovider: OutputTokens must be >= 0, got %d", r.OutputTokens)
	}
	return nil
}

// Usage is what a request consumed, as the provider reports it.
type Usage struct {
	// Input is the prompt's tokens.
	Input int64
	// Output is the tokens generated.
	Output int64
}

// Response is a completed request.
type Response struct {
	// ID is the request's ID.
	ID uint64
	// Usage is the request's input and output tokens.
	Usage Usage
	// StopReason is "end_turn", or "max_tokens" when the output hit the cap.
	StopReason string
	// TimeToFirstToken is the clock time from the call to the first token.
	TimeToFirstToken time.Duration
	// Latency is the clock time from the call to its answer, as scheduled
	// (a late wake-up of the caller's goroutine is not counted).
	Latency time.Duration
	// Slowdown is the saturation multiplier applied to the latency (>= 1).
	Slowdown float64
}

// Chunk is one streamed piece of a response.
type Chunk struct {
	// Tokens is the number of output tokens in this chunk.
	Tokens int64
	// Usage is the cumulative usage so far, as providers report in streams.
	Usage Usage
}

// Limit names the account limit a 429 was for.
type Limit uint8

// The account limits.
const (
	// ConcurrencyLimit is the limit on requests in flight.
	ConcurrencyLimit Limit = iota + 1
	// TokenLimit is the tokens-per-minute limit.
	TokenLimit
	// RequestLimit is the requests-per-minute limit.
	RequestLimit
	// InputTokenLimit is the input-tokens-per-minute limit.
	InputTokenLimit
	// OutputTokenLimit is the output-tokens-per-minute limit.
	OutputTokenLimit
)

// String returns "concurrency", "tokens_per_minute", "requests_per_minute",
// "input_tokens_per_minute" or "output_tokens_per_minute".
func (l Limit) String() string {
	switch l {
	case ConcurrencyLimit:
		return "concurrency"
	case TokenLimit:
		return "tokens_per_minute"
	case RequestLimit:
		return "requests_per_minute"
	case InputTokenLimit:
		return "input_tokens_per_minute"
	case OutputTokenLimit:
		return "output_tokens_per_minute"
	}
	return fmt.Sprintf("limit(%d)", uint8(l))
}

// ErrRateLimited matches every *RateLimitError.
var ErrRateLimited = errors.New("simprovider: 429 too many requests")

// RateLimitError is a 429 answer.
type RateLimitError struct {
	// Limit is the limit the request exceeded.
	Limit Limit
	// RetryAfter is the clock time after which the request would fit, as a
	// Retry-After header says: exact for the per-minute limits, one
	// simulated second for concurrency.
	RetryAfter time.Duration
	// Used and Max are the limit's usage and size when the request came:
	// requests in flight or in the window, or tokens in the window.
	Used, Max int64
	// Requested is what the request needed: 1 request, its Cost, its
	// input or its max_tokens.
	Requested int64
}

// Error returns a one-line message naming the limit.
func (e *RateLimitError) Error() string {
	return fmt.Sprintf("simprovider: 429 too many requests: %s limit (%d used + %d requested > %d)",
		e.Limit, e.Used, e.Requested, e.Max)
}

// Is reports whether target is ErrRateLimited.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// StatusCode returns the HTTP status of the answer, 429.
func (e *RateLimitError) StatusCode() int { return 429 }

// Stats is a copy of the provider's counters and gauges.
type Stats struct {
	// Requests counts every request received, 429s included.
	Requests int64
	// Completed counts requests answered with a response.
	Completed int64
	// Canceled counts accepted requests whose context ended first.
	Canceled int64
	// RateLimited counts 429 answers; the next five split them by limit.
	RateLimited             int64
	RateLimitedConcurrency  int64
	RateLimitedTokens       int64
	RateLimitedRequests     int64
	RateLimitedInputTokens  int64
	RateLimitedOutputTokens int64

	// InFlight is the number of accepted requests running now, and
	// PeakInFlight its highest value.
	InFlight     int
	PeakInFlight int
	// InFlightTokens is the input + max_tokens of the requests running now,
	// and PeakInFlightTokens its highest value.
	InFlightTokens     int64
	PeakInFlightTokens int64
	// WindowTokens is the input + max_tokens of the requests in the window
	// now, and PeakWindowTokens its highest value. The window is kept when
	// the account has a per-minute limit.
	WindowTokens     int64
	PeakWindowTokens int64

	// InputTokens and OutputTokens are the tokens billed: input of every
	// accepted request, output of every completed one.
	InputTokens  int64
	OutputTokens int64
}

// windowEntry is an accepted request in the per-minute windows.
type windowEntry struct {
	at     time.Time
	tokens int64 // input + max_tokens
	input  int64
	output int64 // max_tokens, then the output written once completed
	gone   bool  // pruned from the window
}

// windowSums is what the windows hold: the sum of their entries.
type windowSums struct {
	requests, input, output int64
}

// Provider is a simulated provider account. Its methods are safe for
// concurrent use. It owns no goroutine.
type Provider struct {
	cfg    Config
	clk    clock.Clock
	window time.Duration
	// changeAt is when CapacityChange applies (clock time), zero for never.
	changeAt time.Time

	mu      sync.Mutex
	entries []*windowEntry // accepted requests in the window, oldest first
	sums    windowSums     // of entries, beside stats.WindowTokens
	stats   Stats
}

// New returns a provider for cfg, or an error naming an invalid field.
func New(cfg Config) (*Provider, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	if cfg.ChunkTokens == 0 {
		cfg.ChunkTokens = 16
	}
	p := &Provider{cfg: cfg, clk: clock.OrReal(cfg.Clock)}
	p.window = p.Scale(cfg.Window)
	if ch := cfg.CapacityChange; ch != nil {
		p.changeAt = p.clk.Now().Add(p.Scale(ch.After))
	}
	return p, nil
}

// Account is an account's limits at one time, as Config names them; zero
// means unlimited.
type Account struct {
	// MaxConcurrent is the limit on requests in flight.
	MaxConcurrent int
	// RequestsPerMinute, TokensPerMinute, InputTokensPerMinute and
	// OutputTokensPerMinute are the per-minute limits.
	RequestsPerMinute, TokensPerMinute, InputTokensPerMinute, OutputTokensPerMinute int64
}

// windowed reports whether a has a per-minute limit.
func (a Account) windowed() bool {
	return a.RequestsPerMinute > 0 || a.TokensPerMinute > 0 || a.InputTokensPerMinute > 0 || a.OutputTokensPerMinute > 0
}

// Account returns the account's limits at t: those of Config, resized by
// CapacityChange once it applies.
func (p *Provider) Account(t time.Time) Account {
	c := &p.cfg
	a := Account{c.MaxConcurrent, c.RequestsPerMinute, c.TokensPerMinute, c.InputTokensPerMinute, c.OutputTokensPerMinute}
	if c.CapacityChange == nil || t.Before(p.changeAt) {
		return a
	}
	f := c.CapacityChange.Factor
	if a.MaxConcurrent > 0 {
		a.MaxConcurrent = max(int(float64(a.MaxConcurrent)*f), 1)
	}
	for _, l := range []*int64{&a.RequestsPerMinute, &a.TokensPerMinute, &a.InputTokensPerMinute, &a.OutputTokensPerMinute} {
		if *l > 0 {
			*l = max(int64(float64(*l)*f), 1)
		}
	}
	return a
}

// Window is what is left of one per-minute limit.
type Window struct {
	// Remaining is what is left of the limit now, and Limit the limit;
	// both zero when the account has no such limit.
	Remaining, Limit int64
	// Reset is how long until the window is full again: until every entry
	// now in it has left (the newest one's time + the window − now); zero
	// when the window is empty.
	Reset time.Duration
}

// Headroom is what the account says is left of its per-minute limits, as a
// real provider's rate-limit headers do with every answer. A limit the
// account does not have is the zero Window.
type Headroom struct {
	// Requests, Tokens, InputTokens and OutputTokens are what is left of
	// the RPM, TPM, ITPM and OTPM limits.
	Requests, Tokens, InputTokens, OutputTokens Window
}

// Headroom returns what is left of the per-minute windows at now, after
// every request accepted by then.
func (p *Provider) Headroom(now time.Time) Headroom {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.Account(now)
	if !a.windowed() {
		return Headroom{}
	}
	p.prune(now)
	var reset time.Duration
	if n := len(p.entries); n > 0 {
		reset = max(0, p.entries[n-1].at.Add(p.window).Sub(now))
	}
	window := func(limit, used int64) Window {
		if limit <= 0 {
			return Window{}
		}
		return Window{Remaining: max(0, limit-used), Limit: limit, Reset: reset}
	}
	return Headroom{
		Requests:     window(a.RequestsPerMinute, p.sums.requests),
		Tokens:       window(a.TokensPerMinute, p.stats.WindowTokens),
		InputTokens:  window(a.InputTokensPerMinute, p.sums.input),
		OutputTokens: window(a.OutputTokensPerMinute, p.sums.output),
	}
}

// Config returns the provider's configuration, defaults filled in.
func (p *Provider) Config() Config { return p.cfg }

// Clock returns the provider's time source.
func (p *Provider) Clock() clock.Clock { return p.clk }

// Scale converts a simulated duration to clock time: d × TimeScale.
func (p *Provider) Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * p.cfg.TimeScale)
}

// Stats returns a copy of the provider's counters.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// plan is a request's random draws, in simulated time before slowdown.
type plan struct {
	output   int64
	stop     string
	rtt      time.Duration
	ttft     time.Duration
	perToken time.Duration
}

// lognormal returns median × e^(sigma·N(0,1)).
func lognormal(rng *rand.Rand, median, sigma float64) float64 {
	return median * math.Exp(sigma*rng.NormFloat64())
}

// Plan returns the output length the request will produce, and why it
// stops. It depends only on the request and Config.Seed.
func (p *Provider) Plan(req Request) (output int64, stopReason string) {
	pl := p.plan(req)
	return pl.output, pl.stop
}

func (p *Provider) plan(req Request) plan {
	c := &p.cfg
	rng := rand.New(rand.NewPCG(c.Seed, req.ID))
	// The draws always happen in this order, so a request that fixes its
	// output length gets the same latency noise as one that does not.
	drawn := int64(math.Round(lognormal(rng, float64(c.OutputMedian), c.OutputSpread)))
	rttNoise := lognormal(rng, 1, c.LatencySpread/2)
	ttftNoise := lognormal(rng, 1, c.LatencySpread)
	tokNoise := lognormal(rng, 1, c.LatencySpread/2)

	out := req.OutputTokens
	if out == 0 {
		out = max(drawn, 1)
	}
	pl := plan{output: out, stop: "end_turn"}
	if out >= req.MaxTokens {
		pl.output, pl.stop = req.MaxTokens, "max_tokens"
	}
	prefill := float64(c.PrefillPer1K) * float64(req.InputTokens) / 1000
	pl.rtt = time.Duration(float64(c.RoundTrip) * rttNoise)
	pl.ttft = time.Duration((float64(c.TimeToFirstToken) + prefill) * ttftNoise)
	pl.perToken = time.Duration(float64(c.PerOutputToken) * tokNoise)
	return pl
}

// prune drops window entries older than the window. p.mu is held.
func (p *Provider) prune(now time.Time) {
	cut := now.Add(-p.window)
	i := 0
	for i < len(p.entries) && !p.entries[i].at.After(cut) {
		e := p.entries[i]
		p.stats.WindowTokens -= e.tokens
		p.sums.requests--
		p.sums.input -= e.input
		p.sums.output -= e.output
		e.gone = true
		i++
	}
	if i > 0 {
		clear(p.entries[:i])
		p.entries = p.entries[i:]
	}
}

// retryAfter returns how long until need more fits in a window that holds
// used of limit, where of says what each entry holds. p.mu is held and the
// window is pruned.
func (p *Provider) retryAfter(now time.Time, used, need, limit int64, of func(*windowEntry) int64) time.Duration {
	if need > limit {
		return p.window // never fits; a real provider would answer 400
	}
	over := used + need - limit
	for _, e := range p.entries {
		over -= of(e)
		if over <= 0 {
			return e.at.Add(p.window).Sub(now)
		}
	}
	return p.window
}

// admitted is an accepted request's schedule, in clock time.
type admitted struct {
	entry    *windowEntry // nil when the account has no per-minute limit
	start    time.Time
	first    time.Time // first token
	perToken time.Duration
	end      time.Time
	slowdown float64
	timer    clock.Timer // fires at first (streaming) or end
}

// decide applies the account limits to req at now. It returns the accepted
// schedule, or a 429. p.mu is held.
func (p *Provider) decide(req Request, pl plan, now time.Time) (*admitted, *RateLimitError) {
	cost := req.Cost()
	c := &p.cfg
	acct := p.Account(now)
	p.stats.Requests++
	p.prune(now)
	if rl := p.overLimit(now, acct, req); rl != nil {
		p.stats.RateLimited++
		return nil, rl
	}

	s := &p.stats
	s.InFlight++
	s.PeakInFlight = max(s.PeakInFlight, s.InFlight)
	s.InFlightTokens += cost
	s.PeakInFlightTokens = max(s.PeakInFlightTokens, s.InFlightTokens)
	s.InputTokens += req.InputTokens
	var entry *windowEntry
	if acct.windowed() {
		entry = &windowEntry{at: now, tokens: cost, input: req.InputTokens, output: req.MaxTokens}
		p.entries = append(p.entries, entry)
		s.WindowTokens += cost
		s.PeakWindowTokens = max(s.PeakWindowTokens, s.WindowTokens)
		p.sums.requests++
		p.sums.input += entry.input
		p.sums.output += entry.output
	}

	load := 0.0
	if acct.MaxConcurrent > 0 {
		load = float64(s.InFlight) / float64(acct.MaxConcurrent)
	}
	for _, w := range [...]struct{ used, limit int64 }{
		{s.WindowTokens, acct.TokensPerMinute}, {p.sums.requests, acct.RequestsPerMinute},
		{p.sums.input, acct.InputTokensPerMinute}, {p.sums.output, acct.OutputTokensPerMinute},
	} {
		if w.limit > 0 {
			load = max(load, float64(w.used)/float64(w.limit))
		}
	}
	load = min(load, 1)
	a := &admitted{entry: entry, start: now, slowdown: 1 + c.Degradation*load*load*load}
	slow := func(d time.Duration) time.Duration { return p.Scale(time.Duration(float64(d) * a.slowdown)) }
	a.first = now.Add(slow(pl.rtt/2 + pl.ttft))
	a.perToken = slow(pl.perToken)
	a.end = a.first.Add(time.Duration(pl.output)*a.perToken + slow(pl.rtt/2))
	return a, nil
}

// overLimit returns the 429 for req at now under the account's limits acct,
// nil when it fits, and counts it in Stats. The limits are checked in
// order: concurrency, requests, tokens, input tokens, output tokens. p.mu
// is held and the window is pruned.
func (p *Provider) overLimit(now time.Time, acct Account, req Request) *RateLimitError {
	s := &p.stats
	if acct.MaxConcurrent > 0 && s.InFlight >= acct.MaxConcurrent {
		s.RateLimitedConcurrency++
		return &RateLimitError{Limit: ConcurrencyLimit, RetryAfter: p.Scale(time.Second),
			Used: int64(s.InFlight), Max: int64(acct.MaxConcurrent), Requested: 1}
	}
	for _, w := range [...]struct {
		limit      Limit
		used, need int64
		max        int64
		counter    *int64
		of         func(*windowEntry) int64
	}{
		{RequestLimit, p.sums.requests, 1, acct.RequestsPerMinute, &s.RateLimitedRequests, func(*windowEntry) int64 { return 1 }},
		{TokenLimit, s.WindowTokens, req.Cost(), acct.TokensPerMinute, &s.RateLimitedTokens, func(e *windowEntry) int64 { return e.tokens }},
		{InputTokenLimit, p.sums.input, req.InputTokens, acct.InputTokensPerMinute, &s.RateLimitedInputTokens, func(e *windowEntry) int64 { return e.input }},
		{OutputTokenLimit, p.sums.output, req.MaxTokens, acct.OutputTokensPerMinute, &s.RateLimitedOutputTokens, func(e *windowEntry) int64 { return e.output }},
	} {
		if w.max > 0 && w.used+w.need > w.max {
			*w.counter++
			return &RateLimitError{Limit: w.limit, RetryAfter: p.retryAfter(now, w.used, w.need, w.max, w.of),
				Used: w.used, Max: w.max, Requested: w.need}
		}
	}
	return nil
}

// enter applies the account limits to req at the current time. It returns
// the accepted schedule, or a 429 with the timer of its round trip. The
// first timer is created under p.mu, so whoever sees the request counted in
// Stats knows its timer exists (tests on a mock clock rely on this).
func (p *Provider) enter(req Request, pl plan, streaming bool) (*admitted, *RateLimitError, clock.Timer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clk.Now()
	a, rl := p.decide(req, pl, now)
	if rl != nil {
		return nil, rl, p.clk.NewTimer(p.Scale(pl.rtt))
	}
	if streaming {
		a.timer = p.clk.NewTimer(a.first.Sub(now))
	} else {
		a.timer = p.clk.NewTimer(a.end.Sub(now))
	}
	return a, nil, nil
}

// Ticket is the answer Enter decided for a request, due at a later time.
type Ticket struct {
	// At is when the answer arrives: the end of the response, or one round
	// trip after Enter for a 429.
	At time.Time
	// Response is an accepted request's response; zero for a 429.
	Response Response

	entry *windowEntry
}

// Enter is the non-blocking form of Complete, for a caller that keeps its
// own time (a discrete-event simulation): it applies the account limits to
// req at now, as Complete does on arrival, and returns at once with the
// answer and when it arrives. For a 429 the error is a *RateLimitError, due
// at Ticket.At; for an accepted request the caller must call Leave at
// Ticket.At. It starts no timer. Invalid requests are an error and count
// nothing.
func (p *Provider) Enter(req Request, now time.Time) (Ticket, error) {
	if err := req.validate(); err != nil {
		return Ticket{}, err
	}
	pl := p.plan(req)
	p.mu.Lock()
	a, rl := p.decide(req, pl, now)
	p.mu.Unlock()
	if rl != nil {
		return Ticket{At: now.Add(p.Scale(pl.rtt))}, rl
	}
	return Ticket{At: a.end, Response: response(req, pl, a), entry: a.entry}, nil
}

// Leave ends a request Enter accepted, at its Ticket.At, as completed.
func (p *Provider) Leave(req Request, t Ticket) { p.leave(req, t.entry, t.Response.Usage.Output, true) }

// response is an accepted request's response.
func response(req Request, pl plan, a *admitted) Response {
	return Response{
		ID:               req.ID,
		Usage:            Usage{Input: req.InputTokens, Output: pl.output},
		StopReason:       pl.stop,
		TimeToFirstToken: a.first.Sub(a.start),
		Latency:          a.end.Sub(a.start),
		Slowdown:         a.slowdown,
	}
}

// leave ends an accepted request, whose window entry (nil for none) a
// completed request corrects to the output it wrote.
func (p *Provider) leave(req Request, entry *windowEntry, output int64, completed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.stats
	s.InFlight--
	s.InFlightTokens -= req.Cost()
	if !completed {
		s.Canceled++
		return
	}
	s.Completed++
	s.OutputTokens += output
	if entry != nil && !entry.gone {
		p.sums.output -= entry.output - output
		entry.output = output
	}
}

// wait waits for t or ctx, whichever comes first.
func wait(ctx context.Context, t clock.Timer) error {
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		t.Stop()
		return context.Cause(ctx)
	}
}

// Complete runs one request to the end and returns its response. Over a
// limit it returns a *RateLimitError after a round trip. When ctx ends
// first it returns ctx's cause; the request's tokens stay counted in the
// TPM window, as with a real provider. Invalid requests are an error at
// once and count nothing.
func (p *Provider) Complete(ctx context.Context, req Request) (Response, error) {
	return p.Stream(ctx, req, nil)
}

// Stream runs one request like Complete, and calls emit (when not nil) with
// each chunk of output as it is generated: the first at the time to first
// token, then one every ChunkTokens tokens. An error from emit ends the
// request and is returned.
func (p *Provider) Stream(ctx context.Context, req Request, emit func(Chunk) error) (Response, error) {
	if err := req.validate(); err != nil {
		return Response{}, err
	}
	if err := context.Cause(ctx); err != nil {
		return Response{}, err
	}
	pl := p.plan(req)
	a, rl, rtt := p.enter(req, pl, emit != nil)
	if rl != nil {
		if err := wait(ctx, rtt); err != nil {
			return Response{}, err
		}
		return Response{}, rl
	}
	completed := false
	defer func() { p.leave(req, a.entry, pl.output, completed) }()

	if err := wait(ctx, a.timer); err != nil {
		return Response{}, err
	}
	if emit != nil {
		if err := p.stream(ctx, req, pl, a, emit); err != nil {
			return Response{}, err
		}
	}
	completed = true
	return response(req, pl, a), nil
}

// stream emits the chunks of an accepted request, from its first token on.
func (p *Provider) stream(ctx context.Context, req Request, pl plan, a *admitted, emit func(Chunk) error) error {
	var sent int64
	for sent < pl.output {
		n := min(p.cfg.ChunkTokens, pl.output-sent)
		if sent > 0 {
			// Chunk deadlines are absolute, so a slow emit does not stretch
			// the response.
			at := a.first.Add(time.Duration(sent+n-1) * a.perToken)
			if err := wait(ctx, p.clk.NewTimer(at.Sub(p.clk.Now()))); err != nil {
				return err
			}
		}
		sent += n
		if err := emit(Chunk{Tokens: n, Usage: Usage{Input: req.InputTokens, Output: sent}}); err != nil {
			return err
		}
	}
	return wait(ctx, p.clk.NewTimer(a.end.Sub(p.clk.Now())))
}
