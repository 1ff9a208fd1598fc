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
// handler serving the routes, /healthz, /readyz, /status and /metrics.
type Gateway struct {
	// Handler serves the routes, /healthz (200 while the process runs),
	// /readyz (200 until SetReady(false) or Shutdown, then 503), /status
	// (the configuration's revision and digest, and the last reload, as
	// JSON) and /metrics (every bulkhead's Prometheus metrics, labelled
	// bulkhead="<name>", and the gateway's own). It serves each request
	// with the configuration in force when the request arrived (see
	// Reload), and traces it when the configuration's telemetry says so.
	// On the routes it answers a call without a
	// client's key 401 when the configuration has clients (after reading
	// and discarding its body, as the Handler does for a body it
	// refuses), and logs one line per request however it ends. A body
	// not read to its end, whatever the answer, holds its connection no
	// longer than the body timeout.
	Handler http.Handler
	// Bulkheads are the gateway's bulkheads, by name. A reload changes
	// their limits, never the set.
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
	state      atomic.Pointer[served] // what the routes are served with
	tel        *telemetry             // nil: no OpenTelemetry
	lookupEnv  func(string) (string, bool)
	file       string
	transports map[time.Duration]*http.Transport // by header timeout; guarded by reload.mu after Build
	cfg        *Config                           // the configuration in force; guarded by reload.mu
	reload     reloads
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
// errors, lookupEnv reads the environment variables the configuration
// names, the upstreams' API keys, the clients' keys and the Redis
// passwords (os.LookupEnv; nil means none is set), and logger receives one
// line per request, the state changes of the fleet pools (each also
// counted in /metrics as bulkhead_gateway_fleet_events_total) and, as
// warnings, the reverse proxy's own errors (nil: a JSON or text handler on
// standard error, as cfg.Log says), as do the configuration reloads. With
// cfg.Telemetry (or the OTEL_* variables, read with lookupEnv) it makes
// the OTLP exporters, unless opts give providers of the caller's
// (WithTracerProvider, WithMeterProvider). An invalid limit, a variable
// that is not set or is empty, or an unreadable certificate is a
// *ConfigError with the line of its key. Shut the gateway down with
// Shutdown, which also exports the telemetry it still holds.
func Build(cfg *Config, file string, lookupEnv func(string) (string, bool), logger *slog.Logger, opts ...BuildOption) (*Gateway, error) {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	v := &validator{file: file, root: cfg.root}
	g := &Gateway{Bulkheads: map[string]*bulkhead.Bulkhead{}, Listen: cfg.Listen, lookupEnv: lookupEnv, file: file,
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
	if _, err := cfg.clientSet(v, lookupEnv); err != nil { // before anything is started
		return fail(err)
	}
	var err error
	if logger == nil {
		logger = NewLogger(os.Stderr, cfg.Log.Format)
	}
	g.logger = logger
	fleetEvents := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bulkhead_gateway_fleet_events_total",
		Help: "State changes of the bulkheads' fleet pools, by pool and kind (state_lost, breaker_opened, breaker_closed, leases_lapsed, leases_restored, hold_reinstated); each is logged."},
		[]string{"pool", "kind"})
	g.clients = map[string]*redis.Client{}
	client := func(name string) (*redis.Client, error) {
		if c := g.clients[name]; c != nil {
			return c, nil
		}
		rc := cfg.Redis[name]
		password := ""
		if rc.PasswordEnv != "" {
			var err error
			if password, err = v.env(lookupEnv, []string{"redis", name, "password_env"}, rc.PasswordEnv); err != nil {
				return nil, err
			}
		}
		timeout := time.Duration(rc.Timeout)
		if timeout == 0 {
			timeout = 50 * time.Millisecond
		}
		c := redis.NewClient(&redis.Options{Addr: rc.Addr, DB: rc.DB, Password: password,
			MaxRetries: -1, DialTimeout: timeout, DialerRetries: 1, ReadTimeout: timeout, WriteTimeout: timeout,
			PoolTimeout: timeout, ContextTimeoutEnabled: true})
		g.clients[name] = c
		return c, nil
	}
	for _, name := range sortedKeys(cfg.Bulkheads) {
		bc := cfg.Bulkheads[name]
		var store pacer.Store
		if r := bc.RateLimits; r != nil && r.Redis != "" {
			c, err := client(r.Redis)
			if err != nil {
				return fail(err)
			}
			// The server's timeout bounds each decision too (0: the store's 50ms).
			s, err := pacer.NewRedis(c, pacer.RedisOptions{Timeout: time.Duration(cfg.Redis[r.Redis].Timeout)})
			if err != nil {
				return fail(err)
			}
			store = s
		}
		var pool *fleet.Pool
		if f := bc.Fleet; f != nil {
			c, err := client(f.Redis)
			if err != nil {
				return fail(err)
			}
			fc := f.config(c)
			fc.Logger = logger
			fc.OnEvent = func(e fleet.Event) { fleetEvents.WithLabelValues(e.Pool, e.Kind.String()).Inc() }
			for _, k := range fleet.EventKinds() {
				fleetEvents.WithLabelValues(f.Pool, k.String()) // at 0 from the start
			}
			p, err := fleet.New(fc)
			if err != nil {
				var ce *fleet.ConfigError
				if errors.As(err, &ce) {
					return fail(v.at(keyOf("fleet", ce.Field, name), "%s", keyProblem("fleet", ce.Field, ce.Problem)))
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
				return fail(v.at(keyOf("bulkhead", ce.Field, name), "%s", keyProblem("bulkhead", ce.Field, ce.Problem)))
			}
			return fail(err)
		}
		g.Bulkheads[name] = b
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(fleetEvents); err != nil {
		return fail(err)
	}
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
	models, providers := map[string]string{}, map[string]string{}
	for _, name := range sortedKeys(cfg.Bulkheads) {
		models[name] = cfg.Bulkheads[name].Model
	}
	for _, rc := range cfg.Routes {
		p := providerOf(apis[rc.API])
		if old, ok := providers[rc.Bulkhead]; ok && old != p {
			p = "" // a bulkhead in front of several providers
		}
		providers[rc.Bulkhead] = p
	}
	var o buildOptions
	for _, opt := range opts {
		opt(&o)
	}
	if g.tel, err = newTelemetry(&cfg.Telemetry, v, lookupEnv, o, g.Bulkheads, models, providers); err != nil {
		return fail(err)
	}
	g.proxy = &Handler{BodyBudget: cfg.BodyBudgetBytes, BodyTimeout: time.Duration(cfg.BodyTimeout), gates: map[*bulkhead.Bulkhead]*gate{}}
	st, err := g.newServed(cfg, v)
	if err != nil {
		return fail(err)
	}
	st.revision, st.loaded = 1, time.Now()
	g.state.Store(st)
	g.proxy.routes.Store(st.table)
	g.cfg = cfg
	names := map[*bulkhead.Bulkhead]string{}
	for name, b := range g.Bulkheads {
		names[b] = name
	}
	if err := reg.Register(newEarlyCollector(g.proxy, names)); err != nil {
		return fail(err)
	}
	if err := g.registerReloads(reg); err != nil {
		return fail(err)
	}
	f := &front{g: g, logger: logger}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if g.notReady.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /status", g.serveStatus)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", f)
	g.Handler = &router{admin: mux, front: f, h: g.proxy}
	return g, nil
}

// served is what a Build gateway serves its routes with, swapped whole
// when its configuration is reloaded: a request keeps the one it started
// with, with its routes, upstreams and clients, to its end.
type served struct {
	table    *table
	clients  *clientSet // nil: no authentication
	mode     string     // log.requests
	attempt  string     // the attempt header (attempt_header), for the log
	bulkhead []string   // the bulkhead of each route, by index
	upstream []string   // the upstream of each route, by index
	// revision counts the configurations the gateway has served (1 for
	// Build's), digest is the SHA-256 of the file's bytes, and loaded
	// when it was applied.
	revision int64
	digest   [32]byte
	file     string
	loaded   time.Time
}

// newServed makes what the gateway serves cfg's routes with: its
// clients' keys and its upstreams' keys read with the gateway's
// lookupEnv, its routes through the gateway's bulkheads.
func (g *Gateway) newServed(cfg *Config, v *validator) (*served, error) {
	clients, err := cfg.clientSet(v, g.lookupEnv)
	if err != nil {
		return nil, err
	}
	st := &served{clients: clients, mode: cfg.Log.Requests, digest: cfg.digest, file: v.file, attempt: cfg.AttemptHeader}
	if st.attempt == "" {
		st.attempt = stream.DefaultAttemptHeader
	}
	var routes []Route
	for _, rc := range cfg.Routes {
		up := cfg.Upstreams[rc.Upstream]
		u, _ := url.Parse(up.BaseURL)
		key := ""
		if up.APIKeyEnv != "" {
			if key, err = v.env(g.lookupEnv, []string{"upstreams", rc.Upstream, "api_key_env"}, up.APIKeyEnv); err != nil {
				return nil, err
			}
		}
		b := g.Bulkheads[rc.Bulkhead]
		adm := cfg.admission(cfg.Bulkheads[rc.Bulkhead].Classes != nil)
		r := Route{Format: apis[rc.API], Models: rc.Models, Upstream: u, APIKey: key, Bulkhead: b,
			Options: options(adm), MaxBodyBytes: rc.MaxBodyBytes, admission: adm, Transport: g.transport(time.Duration(up.HeaderTimeout)),
			AttemptHeader: cfg.AttemptHeader}
		if t := g.tel; t != nil && t.tracer != nil {
			base := r.Transport
			if base == nil {
				base = defaultTransport
			}
			r.Transport = &tracedTransport{base: base, tracer: t.tracer, prop: t.prop}
			r.acquire, r.recordResponse = t.tracers[b].Acquire, true
		}
		routes = append(routes, r)
		st.bulkhead = append(st.bulkhead, rc.Bulkhead)
		st.upstream = append(st.upstream, rc.Upstream)
	}
	if st.table, err = g.proxy.newTable(routes); err != nil {
		var ce *bulkhead.ConfigError
		if errors.As(err, &ce) {
			return nil, v.at(keyOf("gateway", ce.Field), "%s", keyProblem("gateway", ce.Field, ce.Problem))
		}
		return nil, err
	}
	st.table.logProxyErrors(g.logger)
	return st, nil
}

// transport returns the transport of the upstreams whose header timeout is
// d, made once: nil (the Handler's default) for none.
func (g *Gateway) transport(d time.Duration) http.RoundTripper {
	if d <= 0 {
		return nil
	}
	if t := g.transports[d]; t != nil {
		return t
	}
	t := defaultTransport.Clone()
	t.ResponseHeaderTimeout = d
	if g.transports == nil {
		g.transports = map[time.Duration]*http.Transport{}
	}
	g.transports[d] = t
	return t
}

// router sends the requests for the health and metrics endpoints to admin,
// and every other to front at once, without the pattern matching (and its
// allocations) a ServeMux does for each request. It bounds the wait for
// every request's body first (see guardedBody), whatever answers it; the
// endpoints, which take no body, answer once it is dropped.
type router struct {
	admin, front http.Handler
	h            *Handler
}

func (r *router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.h.guard(w, req)
	switch req.URL.Path {
	case "/healthz", "/readyz", "/metrics", "/status":
		r.h.dropBody(w, req, 0)
		r.admin.ServeHTTP(w, req)
	default:
		r.front.ServeHTTP(w, req)
	}
}

// clientSet is the configuration's clients, their keys read with
// lookupEnv; nil when it has none.
func (c *Config) clientSet(v *validator, lookupEnv func(string) (string, bool)) (*clientSet, error) {
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
			key, err := v.env(lookupEnv, p, cc.KeyEnv)
			switch {
			case err != nil:
				return nil, err
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

// env reads the environment variable name, which the key at path names: a
// variable that is not set, or is set but empty, is an error (an empty key
// or password is never what the file meant).
func (v *validator) env(lookupEnv func(string) (string, bool), path []string, name string) (string, error) {
	val, ok := lookupEnv(name)
	switch {
	case !ok:
		return "", v.at(path, "the environment variable %s is not set", name)
	case val == "":
		return "", v.at(path, "the environment variable %s is set but empty", name)
	}
	return val, nil
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
		Queue: b.Queue.policy()}
	if r := b.RetryBudget; r != nil {
		c.RetryBudgets = r.budgets()
	}
	if b.TokenBudget != nil {
		c.TokenBudget = &bulkhead.TokenBudget{Budget: *b.TokenBudget, HighPriorityReserve: b.HighPriorityReserve, OutputCap: b.OutputCap}
	}
	if k := b.Classes; k != nil {
		c.Classes = &bulkhead.Classes{Default: k.Default, Limits: map[string]bulkhead.ClassLimits{}}
		for name, l := range k.Limits {
			c.Classes.Limits[name] = l.limits()
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

// limits is l as a bulkhead's class limits.
func (l ClassLimits) limits() bulkhead.ClassLimits {
	cl := bulkhead.ClassLimits{ProtectedConcurrent: l.ProtectedConcurrent, ProtectedInFlightTokens: l.ProtectedInFlightTokens}
	if l.MaxConcurrent != nil {
		cl.MaxConcurrent = bulkhead.Ceiling(*l.MaxConcurrent)
	}
	if l.MaxInFlightTokens != nil {
		cl.MaxInFlightTokens = bulkhead.Ceiling(*l.MaxInFlightTokens)
	}
	return cl
}

// config is the fleet.Config of f, its pool on client c.
func (f *FleetConfig) config(c redis.UniversalClient) fleet.Config {
	fc := fleet.Config{Client: c, Pool: f.Pool, MaxConcurrent: -1, TokenBudget: -1, LeaseTTL: time.Duration(f.LeaseTTL),
		LocalShare: fleet.Share{Slots: f.LocalShare.Slots, Tokens: f.LocalShare.Tokens}}
	if f.MaxConcurrent != nil {
		fc.MaxConcurrent = *f.MaxConcurrent
	}
	if f.TokenBudget != nil {
		fc.TokenBudget = *f.TokenBudget
	}
	fc.OnFailure = failurePolicies[f.OnFailure]
	return fc
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
	g.reload.closed.Store(true)
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
	if err := g.tel.close(); err != nil && g.logger != nil {
		g.logger.Warn("opentelemetry: the last export failed", "error", err.Error())
	}
	for _, c := range g.collectors {
		c.Close()
	}
	g.reload.mu.Lock()
	for _, t := range g.transports {
		t.CloseIdleConnections()
	}
	g.reload.mu.Unlock()
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
