package demo

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// scenario is one row of the table: the calls of one or more tenants, and
// what happens to the provider.
type scenario struct {
	// key names the scenario for -scenario; name is its label in the table.
	key, name string
	tenants   []tenantLoad
	// change resizes the provider's limits part way through.
	change *simprovider.CapacityChange
	// unloaded, for a scenario with a quiet tenant, is the same scenario
	// without the burst: the quiet tenant's latency on its own.
	unloaded *scenario
}

// tenantLoad is one tenant's calls: a burst of calls arriving uniformly
// over ramp from start, or, with every set, one call every every from
// start.
type tenantLoad struct {
	name  string
	calls int
	start time.Duration
	ramp  time.Duration
	every time.Duration
}

// quiet is the index of the quiet tenant in a two-tenant scenario.
const quiet = 0

// scenarios returns the table's rows: bursts of 50, 100, 400 and 1,000
// calls at once; a steady stream while the provider's capacity halves; a
// quiet tenant beside one that bursts. With cfg.Calls set, the table is one
// burst of that many calls over cfg.Ramp.
func scenarios(cfg *Config) []*scenario {
	burst := func(n int, ramp time.Duration) *scenario {
		key, name := fmt.Sprintf("burst-%d", n), "burst of "+commas(int64(n))
		if ramp > 0 {
			key, name = key+"-over-"+ramp.String(), name+" over "+ramp.String()
		}
		return &scenario{key: key, name: name, tenants: []tenantLoad{{calls: n, ramp: ramp}}}
	}
	if cfg.Calls > 0 {
		return []*scenario{burst(cfg.Calls, cfg.Ramp)}
	}
	halves := &scenario{key: "capacity-halves", name: "capacity halves at 1m",
		tenants: []tenantLoad{{calls: 300, every: 650 * time.Millisecond}},
		change:  &simprovider.CapacityChange{After: time.Minute, Factor: 0.5}}
	twoTenants := func(burstCalls int) *scenario {
		return &scenario{key: "two-tenants", name: "two tenants",
			tenants: []tenantLoad{
				{name: "quiet", calls: 90, every: 2 * time.Second},
				{name: "bursty", calls: burstCalls, start: 30 * time.Second},
			}}
	}
	tenants := twoTenants(400)
	tenants.unloaded = twoTenants(0)
	return []*scenario{burst(50, 0), burst(100, 0), burst(400, 0), burst(1000, 0), halves, tenants}
}

// Scenarios returns the names of the table's scenarios, for
// Config.Scenario, in the table's order.
func Scenarios() []string {
	var keys []string
	for _, sc := range scenarios(&Config{}) {
		keys = append(keys, sc.key)
	}
	return keys
}

// pickScenarios returns the scenarios cfg asks for: every one, or the one
// cfg.Scenario names.
func pickScenarios(cfg *Config) ([]*scenario, error) {
	all := scenarios(cfg)
	if cfg.Scenario == "" || cfg.Calls > 0 {
		return all, nil
	}
	for _, sc := range all {
		if sc.key == cfg.Scenario {
			return []*scenario{sc}, nil
		}
	}
	return nil, fmt.Errorf("-scenario %q is not one of %s", cfg.Scenario, strings.Join(Scenarios(), ", "))
}

// calls builds the scenario's calls, in arrival order of each tenant, the
// tenants one after the other. Request IDs, sizes and arrival times depend
// only on the seed.
func (sc *scenario) calls(cfg *Config, st *strategy) ([]*simCall, error) {
	total := 0
	for _, t := range sc.tenants {
		total += t.calls
	}
	reqs, err := cfg.Workload.Generate(cfg.Seed, total)
	if err != nil {
		return nil, err
	}
	breqs := bulkheadRequests(*cfg, reqs)
	calls := make([]*simCall, 0, total)
	for ti, t := range sc.tenants {
		arrive := arrivalTimes(cfg.Seed+uint64(ti), t.calls, t.ramp)
		var opts []bulkhead.Option
		if st.options != nil {
			opts = st.options(t.name)
		}
		for k := range t.calls {
			i := len(calls)
			at := t.start + arrive[k]
			if t.every > 0 {
				at = t.start + time.Duration(k)*t.every
			}
			calls = append(calls, &simCall{idx: i, tenant: ti, req: reqs[i], breq: &breqs[i], opts: opts, arrive: at,
				rng: rand.New(rand.NewPCG(cfg.Seed^0x5eed, reqs[i].ID))})
		}
	}
	return calls, nil
}

// strategy is one column of the table: how the clients' calls are
// admitted before they reach the provider.
type strategy struct {
	name string
	// bulkheads returns the Configs of the bulkheads the calls of sc go
	// through (their Clock is replaced by the simulation's), and for each
	// tenant of sc the index of its bulkhead; no Configs for none.
	bulkheads func(cfg *Config, sc *scenario) (cfgs []bulkhead.Config, route []int)
	// options, when not nil, returns the per-call options of a call from
	// tenant ("" in a scenario with one tenant), such as its class.
	options func(tenant string) []bulkhead.Option
	// feedback, when not nil, is told how the provider answered each
	// admitted call, just before its permit is released.
	// The provider's headroom with the answer is h, nil when it says none.
	feedback func(p *bulkhead.Permit, o providerOutcome, retryAfter time.Duration, h *bulkhead.Headroom)
	// sdk makes the clients retry as the official SDKs do instead of as
	// Config.Attempts says: sdkAttempts attempts at most, after their
	// backoff, each numbered (WithAttempt), and none after a retry budget's
	// refusal (the gateway's x-should-retry: false).
	sdk bool
}

// sdkAttempts is how many times the official SDKs try a call: the first
// attempt and two retries.
const sdkAttempts = 3

// retryStory is the scenario of the demo's retries sentence: the steady
// stream while the provider's capacity halves, through the static
// bulkhead, from clients that retry as the official SDKs do, without and
// with a retry budget.
const retryStory = "capacity-halves"

// storyBudget is the retry budget of the sentence's second run.
var storyBudget = bulkhead.RetryBudgets{Bulkhead: bulkhead.RetryLimit{Ratio: 0.1, MinRetries: 3}}

// retryStrategies are the two runs of the retries sentence: the static
// bulkhead with SDK clients, without and with storyBudget.
func retryStrategies() []*strategy {
	static := strategies()[1]
	with := *static
	with.name = "static bulkhead with a retry budget"
	with.bulkheads = func(cfg *Config, sc *scenario) ([]bulkhead.Config, []int) {
		cfgs, route := static.bulkheads(cfg, sc)
		b := storyBudget
		cfgs[0].RetryBudgets = &b
		return cfgs, route
	}
	without := *static
	without.sdk, with.sdk = true, true
	return []*strategy{&without, &with}
}

// one routes every tenant of sc to the one bulkhead bc.
func one(bc bulkhead.Config, sc *scenario) ([]bulkhead.Config, []int) {
	return []bulkhead.Config{bc}, make([]int, len(sc.tenants))
}

// strategies returns the table's columns: bare, a static bulkhead
// configured by the flags, and the adaptive + fair bulkhead.
func strategies() []*strategy {
	bare := &strategy{name: "bare", bulkheads: func(*Config, *scenario) ([]bulkhead.Config, []int) { return nil, nil }}
	static := &strategy{name: "static bulkhead", bulkheads: func(cfg *Config, sc *scenario) ([]bulkhead.Config, []int) {
		bc := bulkhead.Config{Model: cfg.Model, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue, QueueTimeout: cfg.QueueTimeout}
		if cfg.TokenBudget > 0 {
			bc.TokenBudget = &bulkhead.TokenBudget{Budget: cfg.TokenBudget}
		}
		return one(bc, sc)
	}}
	return []*strategy{bare, static, adaptiveFair()}
}

// adaptiveFair is the third column, the adaptive + fair bulkhead: one
// bulkhead sized from the account as a starting point by Little's law (the
// calls in flight that spend 90% of its tokens per minute at the workload's
// average cost and an unloaded latency of about 5 s, never more than 90% of
// its concurrency limit), with a deep queue and a long queue timeout so the
// excess waits instead of burning the clients' attempts, and adaptive
// limits fed every provider answer: a 429 lowers the limit and its
// Retry-After cools the model down (calls are shed with the time left, and
// the clients come back then). With several tenants each is a class with
// an equal share of the slots as its floor, served by the fair queue, and a
// call its class's share holds back waits for it.
func adaptiveFair() *strategy {
	return &strategy{
		name: "adaptive + fair",
		bulkheads: func(cfg *Config, sc *scenario) ([]bulkhead.Config, []int) {
			n := cfg.MaxConcurrent
			if cfg.ProviderTPM > 0 {
				perCall := float64(averageCost(cfg.Workload, cfg.Seed)) * float64(time.Minute) / float64(provisionalLatency)
				n = max(int(float64(cfg.ProviderTPM)*provisionalShare/perCall), 1)
			}
			if cfg.ProviderConcurrency > 0 {
				n = min(n, max(cfg.ProviderConcurrency*9/10, 1))
			}
			bc := bulkhead.Config{Model: cfg.Model, MaxConcurrent: n, MaxQueue: provisionalQueue, QueueTimeout: provisionalQueueTimeout,
				Adaptive: &bulkhead.Adaptive{Cooldown: bulkhead.ShedCooldown}}
			if cfg.ProviderTPM > 0 {
				// A token budget as large as the account's TPM limit: it
				// holds back nothing the limit would not, and gives each
				// call a reservation (input estimate + max_tokens) to spend
				// from the provider's reported headroom.
				bc.TokenBudget = &bulkhead.TokenBudget{Budget: cfg.ProviderTPM}
			}
			if len(sc.tenants) > 1 {
				// A class per tenant, served fairly from one queue.
				bc.Classes = &bulkhead.Classes{Default: sc.tenants[0].name, Limits: map[string]bulkhead.ClassLimits{}}
				for _, t := range sc.tenants {
					bc.Classes.Limits[t.name] = bulkhead.ClassLimits{ProtectedConcurrent: n / len(sc.tenants)} // an equal share each, protected
				}
				bc.Queue = bulkhead.QueuePolicy{Fair: true, WaitForCapacity: true}
			}
			return one(bc, sc)
		},
		options: func(tenant string) []bulkhead.Option {
			if tenant == "" {
				return nil
			}
			return []bulkhead.Option{bulkhead.WithClass(tenant)}
		},
		feedback: func(p *bulkhead.Permit, o providerOutcome, retryAfter time.Duration, h *bulkhead.Headroom) {
			out := bulkhead.OutcomeSuccess
			if o == outcomeRateLimited {
				out = bulkhead.OutcomeRateLimited
			}
			_ = p.FeedbackHeadroom(out, retryAfter, h)
		},
	}
}

// The provisional column's sizing (see adaptiveFair).
const (
	provisionalLatency      = 5 * time.Second
	provisionalShare        = 0.9
	provisionalQueue        = 1000
	provisionalQueueTimeout = time.Minute
)

// averageCost is what a call of the workload costs against the TPM limit
// on average (input + max_tokens), over a sample of 1,000.
func averageCost(w simprovider.Workload, seed uint64) int64 {
	reqs, err := w.Generate(seed, 1000)
	if err != nil || len(reqs) == 0 {
		return 1
	}
	var sum int64
	for _, r := range reqs {
		sum += r.Cost()
	}
	return sum / int64(len(reqs))
}
