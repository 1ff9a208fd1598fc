package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/metrics"
	"github.com/llmbulkhead/bulkhead/pacer"
	"github.com/llmbulkhead/bulkhead/stream"
)

// DefaultListen and DefaultShutdownTimeout are a Config's defaults.
const (
	DefaultListen          = ":8080"
	DefaultShutdownTimeout = 30 * time.Second
)

// Gateway is a gateway built from a Config: its bulkheads and the HTTP
// handler serving the routes, /healthz, /readyz and /metrics.
type Gateway struct {
	// Handler serves the routes, /healthz (200 while the process runs),
	// /readyz (200 until Shutdown begins, then 503) and /metrics (every
	// bulkhead's Prometheus metrics, labelled bulkhead="<name>"), and logs
	// one line per call.
	Handler http.Handler
	// Bulkheads are the gateway's bulkheads, by name.
	Bulkheads map[string]*bulkhead.Bulkhead
	// Listen and ShutdownTimeout are the configuration's, defaults applied.
	Listen          string
	ShutdownTimeout time.Duration

	ready      chan struct{} // closed when Shutdown begins
	collectors []*metrics.Collector
	pools      []*fleet.Pool
	clients    map[string]*redis.Client
}

// Build makes the gateway cfg describes: file names the configuration for
// errors, getenv reads the upstreams' API keys (os.Getenv; nil means none
// is set), and logger receives one line per call (nil: a JSON or text
// handler on standard error, as cfg.Log says). An invalid limit is a
// *ConfigError with the line of its key. Shut the gateway down with
// Shutdown.
func Build(cfg *Config, file string, getenv func(string) string, logger *slog.Logger) (*Gateway, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	v := &validator{file: file, root: cfg.root}
	g := &Gateway{Bulkheads: map[string]*bulkhead.Bulkhead{}, Listen: cfg.Listen, ShutdownTimeout: time.Duration(cfg.ShutdownTimeout), ready: make(chan struct{})}
	if g.Listen == "" {
		g.Listen = DefaultListen
	}
	if g.ShutdownTimeout == 0 {
		g.ShutdownTimeout = DefaultShutdownTimeout
	}
	fail := func(err error) (*Gateway, error) {
		g.closeAll(context.Background())
		return nil, err
	}
	g.clients = map[string]*redis.Client{}
	client := func(name string) *redis.Client {
		if c := g.clients[name]; c != nil {
			return c
		}
		rc := cfg.Redis[name]
		timeout := time.Duration(rc.Timeout)
		if timeout == 0 {
			timeout = 50 * time.Millisecond
		}
		c := redis.NewClient(&redis.Options{Addr: rc.Addr, DB: rc.DB, Password: getenv(rc.PasswordEnv),
			MaxRetries: -1, DialTimeout: timeout, DialerRetries: 1, ReadTimeout: timeout, WriteTimeout: timeout,
			PoolTimeout: timeout, ContextTimeoutEnabled: true})
		g.clients[name] = c
		return c
	}
	for _, name := range sortedKeys(cfg.Bulkheads) {
		bc := cfg.Bulkheads[name]
		var store pacer.Store
		if r := bc.RateLimits; r != nil && r.Redis != "" {
			s, err := pacer.NewRedis(client(r.Redis), pacer.RedisOptions{})
			if err != nil {
				return fail(err)
			}
			store = s
		}
		var pool *fleet.Pool
		if f := bc.Fleet; f != nil {
			fc := fleet.Config{Client: client(f.Redis), Pool: f.Pool, MaxConcurrent: -1, TokenBudget: -1, LeaseTTL: time.Duration(f.LeaseTTL),
				LocalShare: fleet.Share{Slots: f.LocalShare.Slots, Tokens: f.LocalShare.Tokens}}
			if f.MaxConcurrent != nil {
				fc.MaxConcurrent = *f.MaxConcurrent
			}
			if f.TokenBudget != nil {
				fc.TokenBudget = *f.TokenBudget
			}
			fc.OnFailure = map[string]fleet.FailurePolicy{"": fleet.FailClosed, "closed": fleet.FailClosed, "open": fleet.FailOpen, "local_share": fleet.FailLocalShare}[f.OnFailure]
			p, err := fleet.New(fc)
			if err != nil {
				var ce *fleet.ConfigError
				if errors.As(err, &ce) {
					return fail(v.at([]string{"bulkheads", name, "fleet"}, "%s: %s", ce.Field, ce.Problem))
				}
				return fail(err)
			}
			pool = p
			g.pools = append(g.pools, p)
		}
		b, err := bulkhead.New(bc.config(store, pool))
		if err != nil {
			var ce *bulkhead.ConfigError
			if errors.As(err, &ce) {
				return fail(v.at(append([]string{"bulkheads", name}, strings.Split(yamlKey(ce.Field), ".")...), "%s", ce.Problem))
			}
			return fail(err)
		}
		g.Bulkheads[name] = b
	}
	reg := prometheus.NewRegistry()
	for _, name := range sortedKeys(g.Bulkheads) {
		c, err := metrics.New(g.Bulkheads[name], metrics.Options{Name: name})
		if err == nil {
			err = reg.Register(c)
		}
		if err != nil {
			return fail(err)
		}
		g.collectors = append(g.collectors, c)
	}
	var routes []Route
	opts := cfg.options()
	for _, rc := range cfg.Routes {
		up := cfg.Upstreams[rc.Upstream]
		u, _ := url.Parse(up.BaseURL)
		key := ""
		if up.APIKeyEnv != "" {
			if key = getenv(up.APIKeyEnv); key == "" {
				return fail(v.at([]string{"upstreams", rc.Upstream, "api_key_env"}, "the environment variable %s is not set", up.APIKeyEnv))
			}
		}
		r := Route{Format: apis[rc.API], Models: rc.Models, Upstream: u, APIKey: key, Bulkhead: g.Bulkheads[rc.Bulkhead], Options: opts}
		if up.HeaderTimeout > 0 {
			t := defaultTransport.Clone()
			t.ResponseHeaderTimeout = time.Duration(up.HeaderTimeout)
			r.Transport = t
		}
		routes = append(routes, r)
	}
	h, err := New(routes...)
	if err != nil {
		var ce *bulkhead.ConfigError
		if errors.As(err, &ce) {
			return fail(&ConfigError{File: file, Key: "routes", Problem: ce.Field + ": " + ce.Problem})
		}
		return fail(err)
	}
	if logger == nil {
		logger = newLogger(cfg.Log.Format)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-g.ready:
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", logged(h, logger))
	g.Handler = mux
	return g, nil
}

// at is a ConfigError at path, with the line when the validator has the
// file's nodes.
func (v *validator) at(path []string, format string, args ...any) *ConfigError {
	v.failf(path, format, args...)
	return v.err
}

// config is the bulkhead.Config of b, with its rates on store (nil:
// in-process) and its fleet pool.
func (b BulkheadConfig) config(store pacer.Store, pool *fleet.Pool) bulkhead.Config {
	c := bulkhead.Config{Model: b.Model, MaxConcurrent: b.MaxConcurrent, MaxQueue: b.MaxQueue, QueueTimeout: time.Duration(b.QueueTimeout), Fleet: pool,
		Queue: bulkhead.QueuePolicy(b.Queue)}
	if b.TokenBudget != nil {
		c.TokenBudget = &bulkhead.TokenBudget{Budget: *b.TokenBudget, HighPriorityReserve: b.HighPriorityReserve, OutputCap: b.OutputCap}
	}
	if k := b.Classes; k != nil {
		c.Classes = &bulkhead.Classes{Default: k.Default, Limits: map[string]bulkhead.ClassLimits{}}
		for name, l := range k.Limits {
			cl := bulkhead.ClassLimits{ProtectedConcurrent: l.ProtectedConcurrent, ProtectedInFlightTokens: l.ProtectedInFlightTokens}
			if l.MaxConcurrent != nil {
				cl.MaxConcurrent = bulkhead.Ceiling(*l.MaxConcurrent)
			}
			if l.MaxInFlightTokens != nil {
				cl.MaxInFlightTokens = bulkhead.Ceiling(*l.MaxInFlightTokens)
			}
			c.Classes.Limits[name] = cl
		}
	}
	if a := b.Adaptive; a != nil {
		c.Adaptive = &bulkhead.Adaptive{Rule: adaptiveRules[a.Rule], Cooldown: cooldownModes[a.Cooldown],
			MinConcurrent: a.MinConcurrent, MaxConcurrent: a.MaxConcurrent, MinBudget: a.MinBudget, MaxBudget: a.MaxBudget}
	}
	if r := b.RateLimits; r != nil {
		c.RateLimits = &bulkhead.RateLimits{Store: store, Pace: r.Pace, PerModel: bulkhead.Rate(Rate{r.RequestsPerMinute, r.TokensPerMinute, r.RequestBurst, r.TokenBurst})}
		if len(r.PerClass) > 0 {
			c.RateLimits.PerClass = map[string]bulkhead.Rate{}
			for name, cr := range r.PerClass {
				c.RateLimits.PerClass[name] = bulkhead.Rate(cr)
			}
		}
	}
	return c
}

// yamlKey turns a bulkhead.Config field path into the file's key (a dotted
// path for a nested key).
func yamlKey(field string) string {
	for _, m := range []struct{ prefix, key string }{
		{"Config.TokenBudget.HighPriorityReserve", "high_priority_reserve"},
		{"Config.TokenBudget.OutputCap", "output_cap"},
		{"Config.TokenBudget", "token_budget"},
		{"Config.Classes", "classes"},
		{"Config.Queue.WaitForCapacity", "queue.wait_for_capacity"},
		{"Config.Queue.Weights", "queue.weights"},
		{"Config.Queue.Fair", "queue.fair"},
		{"Config.RateLimits", "rate_limits"},
		{"Config.Fleet", "fleet"},
		{"Config.Adaptive.MinConcurrent", "adaptive.min_concurrent"},
		{"Config.Adaptive.MaxConcurrent", "adaptive.max_concurrent"},
		{"Config.Adaptive.MinBudget", "adaptive.min_budget"},
		{"Config.Adaptive.MaxBudget", "adaptive.max_budget"},
		{"Config.Adaptive", "adaptive"},
		{"Config.MaxConcurrent", "max_concurrent"},
		{"Config.MaxQueue", "max_queue"},
		{"Config.QueueTimeout", "queue_timeout"},
		{"Config.Model", "model"},
	} {
		if strings.HasPrefix(field, m.prefix) {
			return m.key
		}
	}
	return field
}

// options returns the admission options of a call: its class from a
// header or the client's API key, its priority from a header, and its tag
// from X-Request-Id.
func (c *Config) options() func(*http.Request, *stream.Call) []bulkhead.Option {
	classHeader, keys, prioHeader := c.Class.Header, c.Class.APIKeys, c.Priority.Header
	return func(r *http.Request, _ *stream.Call) []bulkhead.Option {
		var opts []bulkhead.Option
		class := ""
		if classHeader != "" {
			class = r.Header.Get(classHeader)
		}
		if class == "" && len(keys) > 0 {
			class = keys[clientKey(r)]
		}
		if class != "" {
			opts = append(opts, bulkhead.WithClass(class))
		}
		if prioHeader != "" && strings.EqualFold(r.Header.Get(prioHeader), "high") {
			opts = append(opts, bulkhead.WithPriority(bulkhead.High))
		}
		if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= bulkhead.MaxTagLen {
			opts = append(opts, bulkhead.WithTag(id))
		}
		return opts
	}
}

// clientKey is the API key the client sent, in whichever API's header.
func clientKey(r *http.Request) string {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	if k := r.Header.Get("X-Goog-Api-Key"); k != "" {
		return k
	}
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// Shutdown stops the gateway's bulkheads taking calls (/readyz answers 503
// from then on), then waits, until ctx ends, for the calls in flight to
// finish. It returns what was still in flight, by bulkhead, when ctx ended
// first (empty when everything drained).
func (g *Gateway) Shutdown(ctx context.Context) map[string]bulkhead.DrainResult {
	select {
	case <-g.ready:
	default:
		close(g.ready)
	}
	return g.closeAll(ctx)
}

func (g *Gateway) closeAll(ctx context.Context) map[string]bulkhead.DrainResult {
	left := map[string]bulkhead.DrainResult{}
	for _, c := range g.collectors {
		c.Close()
	}
	for _, b := range g.Bulkheads {
		b.Close()
	}
	for name, b := range g.Bulkheads {
		if res, err := b.Drain(ctx); err != nil || !res.Drained {
			left[name] = res
		}
	}
	for _, p := range g.pools {
		_ = p.Close(ctx) // releases what this replica still holds
	}
	for _, c := range g.clients {
		_ = c.Close()
	}
	return left
}
