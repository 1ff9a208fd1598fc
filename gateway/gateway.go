package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
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
	DefaultListen          = "127.0.0.1:8080"
	DefaultShutdownTimeout = 30 * time.Second
)

// Gateway is a gateway built from a Config: its bulkheads and the HTTP
// handler serving the routes, /healthz, /readyz and /metrics.
type Gateway struct {
	// Handler serves the routes, /healthz (200 while the process runs),
	// /readyz (200 until SetReady(false) or Shutdown, then 503) and
	// /metrics (every bulkhead's Prometheus metrics, labelled
	// bulkhead="<name>"). On the routes it answers a call without a
	// client's key 401 when the configuration has clients, and logs one
	// line per request however it ends.
	Handler http.Handler
	// Bulkheads are the gateway's bulkheads, by name.
	Bulkheads map[string]*bulkhead.Bulkhead
	// Listen, ShutdownDelay and ShutdownTimeout are the configuration's,
	// defaults applied.
	Listen          string
	ShutdownDelay   time.Duration
	ShutdownTimeout time.Duration
	// TLSConfig holds the configuration's certificate; nil when it serves
	// plain HTTP.
	TLSConfig *tls.Config

	proxy      *Handler
	notReady   atomic.Bool
	requests   inflight           // the requests being served on the routes
	cut        context.Context    // ended at the shutdown deadline
	cutCalls   context.CancelFunc // ends cut
	collectors []*metrics.Collector
	pools      []*fleet.Pool
	clients    map[string]*redis.Client
	logger     *slog.Logger // the request log
}

// Build makes the gateway cfg describes: file names the configuration for
// errors, getenv reads the upstreams' API keys and the clients' keys
// (os.Getenv; nil means none is set), and logger receives one line per
// request (nil: a JSON or text handler on standard error, as cfg.Log
// says). An invalid limit, a missing key or an unreadable certificate is
// a *ConfigError with the line of its key. Shut the gateway down with
// Shutdown.
func Build(cfg *Config, file string, getenv func(string) string, logger *slog.Logger) (*Gateway, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	v := &validator{file: file, root: cfg.root}
	g := &Gateway{Bulkheads: map[string]*bulkhead.Bulkhead{}, Listen: cfg.Listen,
		ShutdownDelay: time.Duration(cfg.ShutdownDelay), ShutdownTimeout: time.Duration(cfg.ShutdownTimeout)}
	g.cut, g.cutCalls = context.WithCancel(context.Background())
	if g.Listen == "" {
		g.Listen = DefaultListen
	}
	if g.ShutdownTimeout == 0 {
		g.ShutdownTimeout = DefaultShutdownTimeout
	}
	fail := func(err error) (*Gateway, error) {
		g.Shutdown(context.Background())
		return nil, err
	}
	if t := cfg.TLS; t != nil {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return fail(v.at([]string{"tls"}, "%v", err))
		}
		g.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	clients, err := cfg.clientSet(v, getenv)
	if err != nil {
		return fail(err)
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
			// The server's timeout bounds each decision too (0: the store's 50ms).
			s, err := pacer.NewRedis(client(r.Redis), pacer.RedisOptions{Timeout: time.Duration(cfg.Redis[r.Redis].Timeout)})
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
		weight, _ := cfg.tokenWeight(name) // checked by ParseConfig
		b, err := bulkhead.New(bc.config(store, pool, weight))
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
	for _, rc := range cfg.Routes {
		up := cfg.Upstreams[rc.Upstream]
		u, _ := url.Parse(up.BaseURL)
		key := ""
		if up.APIKeyEnv != "" {
			if key = getenv(up.APIKeyEnv); key == "" {
				return fail(v.at([]string{"upstreams", rc.Upstream, "api_key_env"}, "the environment variable %s is not set", up.APIKeyEnv))
			}
		}
		adm := cfg.admission(cfg.Bulkheads[rc.Bulkhead].Classes != nil)
		r := Route{Format: apis[rc.API], Models: rc.Models, Upstream: u, APIKey: key, Bulkhead: g.Bulkheads[rc.Bulkhead],
			Options: options(adm), MaxBodyBytes: rc.MaxBodyBytes, admission: adm}
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
	h.BodyBudget, h.BodyTimeout = cfg.BodyBudgetBytes, time.Duration(cfg.BodyTimeout)
	g.proxy = h
	names := map[*bulkhead.Bulkhead]string{}
	for name, b := range g.Bulkheads {
		names[b] = name
	}
	if err := reg.Register(newEarlyCollector(h, names)); err != nil {
		return fail(err)
	}
	if logger == nil {
		logger = NewLogger(os.Stderr, cfg.Log.Format)
	}
	g.logger = logger
	f := &front{next: h, g: g, clients: clients, logger: logger, mode: cfg.Log.Requests}
	for _, rc := range cfg.Routes {
		f.bulkhead = append(f.bulkhead, rc.Bulkhead)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if g.notReady.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", f)
	g.Handler = &router{admin: mux, front: f}
	return g, nil
}

// router sends the requests for the health and metrics endpoints to admin,
// and every other to front at once, without the pattern matching (and its
// allocations) a ServeMux does for each request.
type router struct{ admin, front http.Handler }

func (r *router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch req.URL.Path {
	case "/healthz", "/readyz", "/metrics":
		r.admin.ServeHTTP(w, req)
	default:
		r.front.ServeHTTP(w, req)
	}
}

// clientSet is the configuration's clients, their keys read with getenv;
// nil when it has none.
func (c *Config) clientSet(v *validator, getenv func(string) string) (*clientSet, error) {
	if len(c.Clients) == 0 {
		return nil, nil
	}
	s := &clientSet{}
	seen := map[[32]byte]string{}
	for _, name := range sortedKeys(c.Clients) {
		cc := c.Clients[name]
		cl := client{name: name, tenant: cc.Tenant, high: cc.AllowHighPriority}
		if cc.KeyEnv != "" {
			p := []string{"clients", name, "key_env"}
			key := getenv(cc.KeyEnv)
			switch {
			case key == "":
				return nil, v.at(p, "the environment variable %s is not set", cc.KeyEnv)
			case len(key) < minClientKeyLen:
				return nil, v.at(p, "the key in %s has %d characters; a client key needs at least %d", cc.KeyEnv, len(key), minClientKeyLen)
			}
			cl.digest = sha256.Sum256([]byte(key))
			if other, dup := seen[cl.digest]; dup {
				return nil, v.at(p, "holds client %s's key too", other)
			}
		} else {
			cl.digest, _ = parseDigest(cc.KeySHA256) // checked by ParseConfig
		}
		seen[cl.digest] = name
		s.list = append(s.list, cl)
	}
	return s, nil
}

// at is a ConfigError at path, with the line when the validator has the
// file's nodes.
func (v *validator) at(path []string, format string, args ...any) *ConfigError {
	v.failf(path, format, args...)
	return v.err
}

// config is the bulkhead.Config of b, with its rates on store (nil:
// in-process), weighing tokens by weight, and its fleet pool.
func (b BulkheadConfig) config(store pacer.Store, pool *fleet.Pool, weight bulkhead.TokenWeight) bulkhead.Config {
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
		c.RateLimits = &bulkhead.RateLimits{Store: store, Pace: r.Pace, TokenWeight: weight, PerModel: r.Rate.rate()}
		if len(r.PerClass) > 0 {
			c.RateLimits.PerClass = map[string]bulkhead.Rate{}
			for name, cr := range r.PerClass {
				c.RateLimits.PerClass[name] = cr.rate()
			}
		}
	}
	return c
}

// rate is r as the bulkhead takes it: a burst left out is the default (a
// minute of the rate), and 0 is none.
func (r Rate) rate() bulkhead.Rate {
	burst := func(b *float64) float64 {
		switch {
		case b == nil:
			return 0
		case *b == 0:
			return bulkhead.NoBurst
		}
		return *b
	}
	return bulkhead.Rate{
		RequestsPerMinute: r.RequestsPerMinute, RequestBurst: burst(r.RequestBurst),
		TokensPerMinute: r.TokensPerMinute, TokenBurst: burst(r.TokenBurst),
		InputTokensPerMinute: r.InputTokensPerMinute, InputTokenBurst: burst(r.InputTokenBurst),
		OutputTokensPerMinute: r.OutputTokensPerMinute, OutputTokenBurst: burst(r.OutputTokenBurst),
	}
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

// admission returns the admission class and priority of a call on a
// bulkhead (with classes or not), from its request alone: its class from
// the class header when headers are trusted, else its client's tenant (on
// a bulkhead with classes); high priority from the priority header when
// headers are trusted or its client may ask for it. It notes them for the
// request log.
func (c *Config) admission(classes bool) func(*http.Request) (class string, high bool) {
	classHeader, prioHeader, trust := c.Class.Header, c.Priority.Header, c.TrustHeaders
	return func(r *http.Request) (string, bool) {
		note := noteOf(r.Context())
		var cl *client
		if note != nil {
			cl = note.client
		}
		class := ""
		if trust && classHeader != "" {
			class = r.Header.Get(classHeader)
		}
		if class == "" && cl != nil && classes {
			class = cl.tenant
		}
		high := prioHeader != "" && strings.EqualFold(r.Header.Get(prioHeader), "high") && (trust || cl != nil && cl.high)
		if note != nil {
			note.class, note.high = class, high
		}
		return class, high
	}
}

// options returns the admission options of a call: its class and
// priority from admission, and its tag from X-Request-Id.
func options(admission func(*http.Request) (string, bool)) func(*http.Request, *stream.Call) []bulkhead.Option {
	return func(r *http.Request, _ *stream.Call) []bulkhead.Option {
		var opts []bulkhead.Option
		class, high := admission(r)
		if class != "" {
			opts = append(opts, bulkhead.WithClass(class))
		}
		if high {
			opts = append(opts, bulkhead.WithPriority(bulkhead.High))
		}
		if id := r.Header.Get(RequestIDHeader); id != "" && len(id) <= bulkhead.MaxTagLen {
			opts = append(opts, bulkhead.WithTag(id))
		}
		return opts
	}
}

// SetReady sets what /readyz answers: 200 when ready, 503 when not (a load
// balancer then takes the gateway out of rotation). Shutdown makes it not
// ready for good.
func (g *Gateway) SetReady(ready bool) { g.notReady.Store(!ready) }

// cutGrace bounds the wait, after the shutdown deadline, for the requests
// Shutdown cut to end (and be logged).
const cutGrace = 2 * time.Second

// Shutdown stops the gateway's bulkheads taking calls (queued ones are
// answered 503, and /readyz answers 503 from then on), then waits, until
// ctx ends, for the requests being served to end. When ctx ends first, it
// cuts the requests still being served (a stream ends mid-way; a call not
// yet answered is answered 503, 529 in the Anthropic dialect; each is
// logged with end=shutdown) and waits a moment for them to end. It returns
// what was still in flight or queued at the deadline, by bulkhead: only the
// bulkheads with work left, empty when everything drained.
//
// Stop the server from accepting connections first (http.Server.Shutdown),
// so that no new call arrives to be turned away.
func (g *Gateway) Shutdown(ctx context.Context) map[string]bulkhead.DrainResult {
	g.SetReady(false)
	for _, b := range g.Bulkheads {
		b.Close()
	}
	g.requests.wait(ctx)
	left := map[string]bulkhead.DrainResult{}
	for name, b := range g.Bulkheads {
		if res, _ := b.Drain(ctx); res.InFlight+res.Pending+res.Bypassed+res.DedupActive > 0 {
			left[name] = res
		}
	}
	closeCtx := ctx
	if ctx.Err() != nil {
		if g.cutCalls != nil {
			g.cutCalls()
		}
		grace, cancel := context.WithTimeout(context.Background(), cutGrace)
		defer cancel()
		g.requests.wait(grace)
		for _, b := range g.Bulkheads {
			_, _ = b.Drain(grace) // the cut calls' releases, before the pools let go
		}
		closeCtx = grace
	}
	for _, c := range g.collectors {
		c.Close()
	}
	for _, p := range g.pools {
		_ = p.Close(closeCtx) // releases what this replica still holds
	}
	for _, c := range g.clients {
		_ = c.Close()
	}
	if g.logger != nil {
		flushLogs(g.logger) // the last calls' lines
	}
	return left
}
