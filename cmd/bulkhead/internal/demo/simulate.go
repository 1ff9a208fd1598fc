package demo

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/cmd/bulkhead/internal/sim"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// epoch is where every simulation's virtual clock starts.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// TenantResult is what one tenant's calls came to in one simulated run.
type TenantResult struct {
	// Tenant is the tenant's name, "" for a scenario with one.
	Tenant string
	// Calls is the number of calls; Completed and Failed split them.
	Calls, Completed, Failed int
	// Provider429 counts every 429 the provider answered these calls,
	// retries included.
	Provider429 int
	// Rejections counts every bulkhead rejection, retries included.
	Rejections int
	// Latency is the distribution of the successes' latencies, first
	// attempt to success, in simulated time.
	Latency Latencies
	// Tokens is the input + output tokens of the successes.
	Tokens int64
}

// SimResult is one strategy's run of one scenario.
type SimResult struct {
	// Strategy is the column's name.
	Strategy string
	// Total is every tenant's calls together; Tenants splits them by
	// tenant, in the scenario's order.
	Total   TenantResult
	Tenants []TenantResult
	// Duration is the simulated time from the start to the last answer.
	Duration time.Duration
	// TPM is the tokens per minute used: Total.Tokens per minute of
	// Duration, or of the provider's TPM window when Duration is shorter.
	TPM int64
	// PeakWindow is the most tokens the provider's TPM window held
	// (input + max_tokens of accepted requests, as it counts them).
	PeakWindow int64
	// TPMLimit is the account's TPM limit at the start.
	TPMLimit int64
	// Provider is the provider's counters at the end.
	Provider simprovider.Stats
	// Bulkheads is the Stats of each of the strategy's bulkheads at the
	// end; none for the bare run.
	Bulkheads []bulkhead.Stats
	// Events is the number of simulation events the run took.
	Events int64
}

// providerOutcome is how the provider answered an admitted call, for a
// strategy's feedback. It mirrors the outcomes the adaptive controller will
// take (bulkhead.OutcomeSuccess, OutcomeRateLimited, OutcomeOverloaded,
// OutcomeTimeout); the simulated provider answers only the first two.
type providerOutcome uint8

const (
	outcomeSuccess providerOutcome = iota + 1
	outcomeRateLimited
)

// simCall is one client call: its request and where its attempts stand.
type simCall struct {
	idx    int
	tenant int
	req    simprovider.Request
	breq   *bulkhead.Request
	b      *bulkhead.Bulkhead // nil for none
	opts   []bulkhead.Option
	arrive time.Duration
	rng    *rand.Rand // backoff jitter, seeded per call

	first   time.Time
	attempt int
	fut     *bulkhead.AcquireFuture
	permit  *bulkhead.Permit
}

// runner drives one simulated run. Everything in it runs on the goroutine
// that called simulate: the simulation's driver.
type runner struct {
	s        *sim.Sim
	prov     *simprovider.Provider
	st       *strategy
	attempts int

	// waiting holds the calls whose admission future is outstanding,
	// ordered by call index, so they are collected in the same order
	// every run.
	waiting []*simCall
	held    map[int]*simCall // calls holding a permit, by index (released in no particular order if the run is cancelled)
	tenants []TenantResult
	lat     [][]time.Duration
	last    time.Time
}

// simulate runs scenario sc once under strategy st, on a virtual clock:
// it returns when every call has completed or failed, or early with ctx's
// error.
func simulate(ctx context.Context, cfg *Config, sc *scenario, st *strategy) (SimResult, error) {
	if err := ctx.Err(); err != nil {
		return SimResult{}, err
	}
	s := sim.New(epoch)
	pcfg := cfg.Provider
	pcfg.MaxConcurrent = cfg.ProviderConcurrency
	pcfg.TokensPerMinute = cfg.ProviderTPM
	pcfg.Seed = cfg.Seed
	pcfg.TimeScale = 1
	pcfg.Clock = s
	pcfg.CapacityChange = sc.change
	prov, err := simprovider.New(pcfg)
	if err != nil {
		return SimResult{}, err
	}
	r := &runner{s: s, prov: prov, st: st, attempts: cfg.Attempts, held: map[int]*simCall{}}
	if st.sdk {
		r.attempts = sdkAttempts
	}
	calls, err := sc.calls(cfg, st)
	if err != nil {
		return SimResult{}, err
	}
	cfgs, route := st.bulkheads(cfg, sc)
	var bs []*bulkhead.Bulkhead
	defer func() {
		// Nothing is in flight or queued by now, unless the run was
		// cancelled: Close rejects what it queued; what it was admitted,
		// collected or not, goes back.
		for _, b := range bs {
			b.Close()
		}
		for _, c := range r.waiting {
			if p, err := c.fut.Result(); err == nil {
				_ = p.Release(nil)
			}
		}
		for _, c := range r.held {
			_ = c.permit.Release(nil)
		}
		// The simulation is over: a wall-clock bound on the wait is safe,
		// and keeps a bug from hanging the command.
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, b := range bs {
			_, _ = b.Drain(dctx)
		}
	}()
	for _, bc := range cfgs {
		bc.Clock = s
		b, err := bulkhead.New(bc)
		if err != nil {
			return SimResult{}, err
		}
		bs = append(bs, b)
	}
	for _, c := range calls {
		if len(bs) > 0 {
			c.b = bs[route[c.tenant]]
		}
	}
	r.tenants = make([]TenantResult, len(sc.tenants))
	r.lat = make([][]time.Duration, len(sc.tenants))
	for i, t := range sc.tenants {
		r.tenants[i].Tenant = t.name
	}
	for _, c := range calls {
		r.tenants[c.tenant].Calls++
		s.At(epoch.Add(c.arrive), func() {
			c.first = s.Now()
			r.attempt(c)
		})
	}
	var cancelled error
	s.Run(func() {
		if cancelled != nil {
			return
		}
		if s.Steps()%1024 == 0 {
			if cancelled = ctx.Err(); cancelled != nil {
				r.stop()
				return
			}
		}
		r.collect()
	})
	if cancelled != nil {
		return SimResult{}, cancelled
	}

	res := SimResult{Strategy: st.name, Duration: r.last.Sub(epoch), Provider: prov.Stats(), Events: s.Steps()}
	res.PeakWindow = res.Provider.PeakWindowTokens
	res.TPMLimit = prov.Account(epoch).TokensPerMinute
	var all []time.Duration
	for i := range r.tenants {
		t := &r.tenants[i]
		t.Latency = summarise(r.lat[i])
		all = append(all, r.lat[i]...)
		res.Total.Calls += t.Calls
		res.Total.Completed += t.Completed
		res.Total.Failed += t.Failed
		res.Total.Provider429 += t.Provider429
		res.Total.Rejections += t.Rejections
		res.Total.Tokens += t.Tokens
	}
	res.Total.Latency = summarise(all)
	res.Tenants = r.tenants
	// Per minute of the run, a run shorter than the provider's window
	// counting as one window: the limit is what one window may hold.
	res.TPM = int64(math.Round(float64(res.Total.Tokens) / max(res.Duration, prov.Config().Window).Minutes()))
	for _, b := range bs {
		res.Bulkheads = append(res.Bulkheads, b.Stats())
	}
	return res, nil
}

// stop ends a cancelled run: no event is left. What the run holds and
// queues is given back when simulate returns.
func (r *runner) stop() { r.s.Discard() }

// attempt makes one attempt of c: through the bulkhead when there is one,
// else straight at the provider.
func (r *runner) attempt(c *simCall) {
	c.attempt++
	if c.b == nil {
		r.callProvider(c)
		return
	}
	// context.Background: a cancellable context's end would be delivered
	// on a goroutine of its own. Queue timeouts come from the config and
	// fire through the virtual clock.
	opts := c.opts
	if r.st.sdk {
		// The SDKs number their attempts; the gateway passes the number on.
		opts = append(slices.Clip(opts), bulkhead.WithAttempt(c.attempt-1))
	}
	c.fut = c.b.AcquireAsync(context.Background(), c.breq, opts...)
	i, _ := slices.BinarySearchFunc(r.waiting, c.idx, func(w *simCall, idx int) int { return w.idx - idx })
	r.waiting = slices.Insert(r.waiting, i, c)
}

// collect answers every call whose admission is in, in call order, until
// none is.
func (r *runner) collect() {
	for {
		n := 0
		kept := r.waiting[:0]
		var ready []*simCall
		for _, c := range r.waiting {
			select {
			case <-c.fut.Done():
				ready = append(ready, c)
			default:
				kept = append(kept, c)
			}
		}
		clear(r.waiting[len(kept):])
		r.waiting = kept
		for _, c := range ready {
			n++
			p, err := c.fut.Result()
			c.fut = nil
			if err == nil {
				c.permit = p
				r.held[c.idx] = c
				r.callProvider(c)
				continue
			}
			r.rejected(c, err)
		}
		if n == 0 {
			return
		}
	}
}

// rejected handles a bulkhead rejection like a 429: retried after its
// Retry-After when it has one, else after a backoff. A call that can never
// fit, or an error that is not a rejection, fails at once.
func (r *runner) rejected(c *simCall, err error) {
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || rej.NeverFits() || rej.Reason == bulkhead.RetryBudget {
		// A retry budget's refusal is answered x-should-retry: false: the
		// SDKs give up at once.
		r.fail(c)
		return
	}
	r.tenants[c.tenant].Rejections++
	ra, ok := rej.RetryAfter()
	r.retry(c, ra, ok)
}

// callProvider sends c's request to the provider and schedules its answer.
func (r *runner) callProvider(c *simCall) {
	tk, err := r.prov.Enter(c.req, r.s.Now())
	r.s.At(tk.At, func() { r.answered(c, tk, err) })
}

// answered handles the provider's answer to c: a success, or a 429 to
// retry after its Retry-After.
func (r *runner) answered(c *simCall, tk simprovider.Ticket, err error) {
	t := &r.tenants[c.tenant]
	var rl *simprovider.RateLimitError
	switch {
	case err == nil:
		r.prov.Leave(c.req, tk)
		u := tk.Response.Usage
		r.settle(c, outcomeSuccess, 0, &bulkhead.Usage{Input: u.Input, Output: u.Output})
		t.Completed++
		t.Tokens += u.Input + u.Output
		r.lat[c.tenant] = append(r.lat[c.tenant], r.s.Now().Sub(c.first))
		r.last = r.s.Now()
	case errors.As(err, &rl):
		t.Provider429++
		r.settle(c, outcomeRateLimited, rl.RetryAfter, nil)
		r.retry(c, rl.RetryAfter, true)
	default:
		r.settle(c, 0, 0, nil)
		r.fail(c)
	}
}

// settle gives c's permit back, when it holds one, after telling the
// strategy how the provider answered. This is the seam where the client
// loop reports each provider answer to the bulkhead.
func (r *runner) settle(c *simCall, o providerOutcome, retryAfter time.Duration, usage *bulkhead.Usage) {
	if c.permit == nil {
		return
	}
	if r.st.feedback != nil && o != 0 {
		// What the provider's rate-limit headers would say with this
		// answer: the TPM window as it stands now (requests unsaid: the
		// account limits concurrency, not a request rate).
		h := r.prov.Headroom(r.s.Now()).Tokens
		var hr *bulkhead.Headroom
		if h.Limit > 0 {
			hr = &bulkhead.Headroom{Tokens: h.Remaining, TokensLimit: h.Limit, TokensReset: h.Reset, Requests: -1}
		}
		r.st.feedback(c.permit, o, retryAfter, hr)
	}
	_ = c.permit.Release(usage)
	c.permit = nil
	delete(r.held, c.idx)
}

// backoffBase is the first backoff of a client that retries without a
// Retry-After; it doubles with each attempt.
const backoffBase = 500 * time.Millisecond

// retry schedules c's next attempt, after retryAfter when the answer gave
// one (has), else after an exponential backoff with full jitter from
// 0.5 s, capped at 8 s; a call out of attempts fails.
func (r *runner) retry(c *simCall, retryAfter time.Duration, has bool) {
	if c.attempt >= r.attempts {
		r.fail(c)
		return
	}
	d := retryAfter
	switch {
	case has:
	case r.st.sdk:
		// The SDKs' backoff: 0.5s, 1s, 2s ... at most 8s, less up to a
		// quarter.
		b := min(backoffBase<<(c.attempt-1), 8*time.Second)
		d = b - time.Duration(c.rng.Float64()*float64(b/4))
	default:
		d = time.Duration(c.rng.Float64() * float64(min(backoffBase<<(c.attempt-1), 8*time.Second)))
	}
	r.s.AfterFunc(d, func() { r.attempt(c) })
}

// fail ends c as failed.
func (r *runner) fail(c *simCall) {
	r.tenants[c.tenant].Failed++
	r.last = r.s.Now()
}
