package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

const sample = `listen: "127.0.0.1:9090"
shutdown_timeout: 5s
log: {format: text}
upstreams:
  openai:
    base_url: UPSTREAM
    api_key_env: TEST_OPENAI_KEY
    header_timeout: 30s
bulkheads:
  gpt4o:
    model: gpt-4o
    max_concurrent: 2
    max_queue: 0
    token_budget: 100000
    classes:
      default: web
      limits:
        web: {}
        batch: {max_concurrent: 1}
    rate_limits: {requests_per_minute: 600, request_burst: 10}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: gpt4o}
class: {header: X-Tenant}
priority: {header: X-Priority}
trust_headers: true
`

func TestConfigBuildAndServe(t *testing.T) {
	up := newFakeOpenAI(t)
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(strings.Replace(sample, "UPSTREAM", up.srv.URL, 1)))
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	g, err := gateway.Build(cfg, "gw.yaml", lookup(map[string]string{"TEST_OPENAI_KEY": "sk-env"}),
		slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if g.Listen != "127.0.0.1:9090" || g.ShutdownTimeout.String() != "5s" || len(g.Bulkheads) != 1 {
		t.Fatalf("gateway %+v", g)
	}
	srv := httptest.NewServer(g.Handler)
	defer srv.Close()
	for _, path := range []string{"/healthz", "/readyz"} {
		res, err := http.Get(srv.URL + path)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, res, err)
		}
		res.Body.Close()
	}
	defer func() {
		// The calls below show in /metrics, labelled with the bulkhead's name.
		res, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(res.Body)
		res.Body.Close()
		for _, want := range []string{`bulkhead_admitted_total{bulkhead="gpt4o"} 1`, `bulkhead_rejected_total{bulkhead="gpt4o",class="batch",reason="concurrency_limit"} 1`} {
			if !strings.Contains(string(text), want) {
				t.Errorf("/metrics lacks %s:\n%s", want, text)
			}
		}
	}()
	// A batch call (class from the header) and a call: the batch class's
	// ceiling of 1 sheds a second batch call as the tenant's own quota.
	body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}],"max_tokens":5}`
	req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Tenant", "batch")
	held, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-up.auth; got != "Bearer sk-env" {
		t.Fatalf("upstream key %q", got)
	}
	req, _ = http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Tenant", "batch")
	req.Header.Set("X-Request-Id", "second")
	req.Header.Set("X-Stainless-Retry-Count", "2")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("X-Bulkhead-Reason") != "concurrency_limit" || res.Header.Get("X-Request-Id") != "second" {
		t.Fatalf("second batch call: %d %v", res.StatusCode, res.Header)
	}
	close(up.release)
	io.Copy(io.Discard, held.Body)
	held.Body.Close()
	id := held.Header.Get(stream.AdmissionIDHeader)
	if len(id) != 36 {
		t.Fatalf("admission ID header %q", id)
	}
	testutil.WaitFor(t, "both log lines", func() bool { return strings.Count(logs.String(), "msg=request") == 2 })
	// The first call had no request ID: the gateway gave it one, sent it
	// upstream, returned it and logged it as the call's tag.
	gen := held.Header.Get("X-Request-Id")
	if ids := up.requestIDs(); len(gen) != 16 || strings.Trim(gen, "0123456789abcdef") != "" || len(ids) != 1 || ids[0] != gen {
		t.Fatalf("generated request ID %q; upstream saw %q", gen, ids)
	}
	for _, want := range []string{"status=429", "tag=second", "shed=concurrency_limit", "admission_id=" + id, "tag=" + gen, "retry=2"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %s:\n%s", want, logs.String())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.ShutdownTimeout)
	defer cancel()
	if left := g.Shutdown(ctx); len(left) != 0 {
		t.Fatalf("left in flight: %v", left)
	}
	res, _ = http.Get(srv.URL + "/readyz")
	res.Body.Close()
	if res.StatusCode != 503 {
		t.Fatalf("/readyz after Shutdown: %d", res.StatusCode)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, edit, want string
	}{
		{"unknown key", "max_queue: 0", `gw.yaml:13: bulkheads.gpt4o: unknown key "max_qeue" (did you mean max_queue?)`},
		{"unknown top-level key", "", `gw.yaml:1: unknown key "lsten" (did you mean listen?)`},
		{"unknown key in a list", "", `gw.yaml:22: routes.0: unknown key "bulkhed" (did you mean bulkhead?)`},
		{"unknown key in a map", "", `gw.yaml:19: bulkheads.gpt4o.classes.limits.batch: unknown key "ceiling"`},
		{"bad duration", "shutdown_timeout: 5s", "gw.yaml:2: shutdown_timeout: want a duration such as 2s or 1m30s"},
		{"bad api", "api: openai-chat", "gw.yaml:22: routes.0.api: want openai-chat"},
		{"no upstream", "upstream: openai, bulk", "gw.yaml:22: routes.0.upstream: no upstream"},
		{"bad url", "base_url: UPSTREAM", "gw.yaml:6: upstreams.openai.base_url: want an absolute URL"},
		{"bad limit", "max_concurrent: 2", "gw.yaml:12: bulkheads.gpt4o.max_concurrent: must be >= 0, got -2"},
		{"no key", "api_key_env: TEST_OPENAI_KEY", "gw.yaml:7: upstreams.openai.api_key_env: the environment variable NOT_SET is not set"},
		{"bad weight", "", "gw.yaml:20: bulkheads.gpt4o.queue.weights: class \"web\": must be between 1 and 1000000, got 0"},
		{"adaptive unknown key", "", `gw.yaml:21: bulkheads.gpt4o.adaptive: unknown key "min_concurent" (did you mean min_concurrent?)`},
		{"adaptive rule", "", "gw.yaml:21: bulkheads.gpt4o.adaptive.rule: want aimd or gradient, got \"vegas\""},
		{"adaptive cooldown", "", "gw.yaml:21: bulkheads.gpt4o.adaptive.cooldown: want hold or shed, got \"wait\""},
		{"adaptive bounds", "", "gw.yaml:21: bulkheads.gpt4o.adaptive.max_concurrent: must be >= min_concurrent (4)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.Replace(sample, "UPSTREAM", "https://api.openai.com", 1)
			switch tc.name {
			case "unknown key":
				text = strings.Replace(text, "max_queue: 0", "max_qeue: 0", 1)
			case "unknown top-level key":
				text = strings.Replace(text, "listen:", "lsten:", 1)
			case "unknown key in a list":
				text = strings.Replace(text, "bulkhead: gpt4o}", "bulkhed: gpt4o}", 1)
			case "unknown key in a map":
				text = strings.Replace(text, "batch: {max_concurrent: 1}", "batch: {ceiling: 1}", 1)
			case "bad duration":
				text = strings.Replace(text, "shutdown_timeout: 5s", "shutdown_timeout: five", 1)
			case "bad api":
				text = strings.Replace(text, "api: openai-chat", "api: openai", 1)
			case "no upstream":
				text = strings.Replace(text, "upstream: openai, bulk", "upstream: azure, bulk", 1)
			case "bad url":
				text = strings.Replace(sample, "UPSTREAM", "api.openai.com", 1)
			case "bad limit":
				text = strings.Replace(text, "max_concurrent: 2", "max_concurrent: -2", 1)
			case "no key":
				text = strings.Replace(text, "TEST_OPENAI_KEY", "NOT_SET", 1)
			case "bad weight":
				text = strings.Replace(text, "    rate_limits:", "    queue: {fair: true, wait_for_capacity: true, weights: {web: 0}}\n    rate_limits:", 1)
			case "adaptive unknown key":
				text = withAdaptive(text, "{min_concurent: 1}")
			case "adaptive rule":
				text = withAdaptive(text, "{rule: vegas}")
			case "adaptive cooldown":
				text = withAdaptive(text, "{cooldown: wait}")
			case "adaptive bounds":
				text = withAdaptive(text, "{min_concurrent: 4}")
			}
			cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
			if err == nil {
				_, err = gateway.Build(cfg, "gw.yaml", nil, slog.New(slog.DiscardHandler))
			}
			var ce *gateway.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}

// withAdaptive adds an adaptive section to the sample's bulkhead, on line
// 21.
func withAdaptive(text, section string) string {
	return strings.Replace(text, "    rate_limits: {requests_per_minute: 600, request_burst: 10}\n",
		"    rate_limits: {requests_per_minute: 600, request_burst: 10}\n    adaptive: "+section+"\n", 1)
}

func TestConfigAdaptive(t *testing.T) {
	text := withAdaptive(strings.Replace(sample, "UPSTREAM", "https://api.openai.com", 1),
		"{rule: gradient, min_concurrent: 1, max_concurrent: 4, min_budget: 1000, max_budget: 200000, cooldown: shed}")
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.Build(cfg, "gw.yaml", lookup(map[string]string{"TEST_OPENAI_KEY": "sk"}), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	b := g.Bulkheads["gpt4o"]
	a := b.Stats().Adaptive
	if a == nil || a.Rule != bulkhead.Gradient || a.MinConcurrent != 1 || a.MaxConcurrentBound != 4 || a.MinBudget != 1000 || a.MaxBudget != 200000 {
		t.Fatalf("adaptive stats %+v", a)
	}
	_ = b.Feedback(bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: time.Minute})
	_, err = b.Acquire(context.Background(), &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}})
	testutil.WantReason(t, err, bulkhead.Cooldown) // shed, not held
}

// TestConfigFleetAndSharedRates builds a gateway whose bulkhead keeps its
// rates and a fleet pool in Redis, and checks both decide its calls.
func TestConfigFleetAndSharedRates(t *testing.T) {
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	up := newFakeOpenAI(t)
	text := `upstreams: {openai: {base_url: "` + up.srv.URL + `"}}
redis: {main: {addr: "` + srv.Addr() + `", timeout: 2s}}
bulkheads:
  gpt4o:
    model: gpt-4o
    max_concurrent: 4
    token_budget: 100000
    rate_limits: {redis: main, requests_per_minute: 60, request_burst: 0}
    fleet: {redis: main, pool: gw-test, max_concurrent: 8, token_budget: 50000}
routes: [{api: openai-chat, upstream: openai, bulkhead: gpt4o}]
`
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.Build(cfg, "gw.yaml", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srvGW := httptest.NewServer(g.Handler)
	defer srvGW.Close()
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	post := func() int {
		res, err := http.Post(srvGW.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	// A new fleet pool admits nothing for its first relearn window (Redis
	// cannot tell it from a pool whose state it lost): 503, spending no
	// rate.
	unavailable, start := int64(0), time.Now()
	for i, want := range []int{200, 429} { // 60 per minute, no burst: the second call waits a second
		status := post()
		for i == 0 && status == http.StatusServiceUnavailable && time.Since(start) < 5*time.Second {
			unavailable++
			time.Sleep(20 * time.Millisecond) // the pool's first relearn window
			status = post()
		}
		if status != want {
			t.Fatalf("call %d: %d, want %d", i, status, want)
		}
		if i == 0 {
			<-up.auth
		}
	}
	st := g.Bulkheads["gpt4o"].Stats()
	if st.Fleet == nil || st.Fleet.Checked != 2+unavailable || st.Fleet.Admitted != 2 || st.Rate == nil || st.Rate.Checked != 2 {
		t.Fatalf("fleet %+v, rate %+v", st.Fleet, st.Rate)
	}
	if left := g.Shutdown(context.Background()); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	if n, _ := srv.Do("ZCARD", "bh:{gw-test}:holds"); n != "0" {
		t.Fatalf("%s fleet holds left after Shutdown", n)
	}

	bad := strings.Replace(text, "fleet: {redis: main", "fleet: {redis: other", 1)
	if _, err := gateway.ParseConfig("gw.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "gw.yaml:9: bulkheads.gpt4o.fleet.redis: no redis server \"other\"") {
		t.Fatalf("unknown redis: %v", err)
	}
}

// TestFleetEventsLoggedAndCounted: what a bulkhead's fleet pool has to
// tell an operator (Redis losing the pool's state, the circuit breaker
// opening when Redis fails) is a warning in the gateway's log, naming the
// pool, and counted by pool and kind in /metrics.
func TestFleetEventsLoggedAndCounted(t *testing.T) {
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	up := newFakeOpenAI(t)
	logs := &testutil.Buffer{}
	_, gw := buildGateway(t, `log: {format: json}
upstreams: {openai: {base_url: "`+up.srv.URL+`"}}
redis: {main: {addr: "`+srv.Addr()+`", timeout: 1s}}
bulkheads:
  gpt4o:
    model: gpt-4o
    max_concurrent: 4
    fleet: {redis: main, pool: gw-events, max_concurrent: 8, on_failure: open}
routes: [{api: openai-chat, upstream: openai, bulkhead: gpt4o}]
`, nil, logs)
	post := func() int {
		res, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode == 200 {
			<-up.auth
		}
		return res.StatusCode
	}
	counter := func(kind string) string {
		return metric(t, gw.URL, `bulkhead_gateway_fleet_events_total{kind="`+kind+`",pool="gw-events"}`)
	}
	if c := counter("state_lost"); !strings.HasSuffix(c, " 0") {
		t.Fatalf("before any event: %q; want the counter at 0", c)
	}
	post() // the pool's first use: answered by Redis (its first relearn window may refuse it)
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	post() // Redis lost the pool's state
	srv.Stop()
	for range 3 { // three failures in a row open the breaker; the calls go on (on_failure: open)
		if st := post(); st != 200 {
			t.Fatalf("a call while Redis is down: %d; want it admitted by the failure policy", st)
		}
	}
	for _, kind := range []string{"state_lost", "breaker_opened"} {
		if c := counter(kind); !strings.HasSuffix(c, " 1") {
			t.Errorf("%s: %q; want 1", kind, c)
		}
	}
	srv.Restart() // the gateway's shutdown releases the holds of the calls admitted meanwhile
	testutil.WaitFor(t, "the fleet's warnings in the log", func() bool { return strings.Count(logs.String(), `"pool":"gw-events"`) >= 2 })
	var warnings []string
	for _, l := range logLines(t, logs) {
		if l["pool"] == "gw-events" && l["level"] == "WARN" {
			warnings = append(warnings, fmt.Sprint(l["msg"]))
		}
	}
	if w := strings.Join(warnings, "\n"); !strings.Contains(w, "state in Redis is new") || !strings.Contains(w, "circuit breaker open") {
		t.Errorf("the fleet's warnings in the log: %q", w)
	}
}

// TestConfigMergeKeys: a YAML merge (<<: *anchor) is a key like any other
// section's: its mapping's keys are checked where they are written.
func TestConfigMergeKeys(t *testing.T) {
	text := `upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads:
  a: &defaults {model: gpt-4o, max_concurrent: 4, max_queue: 2}
  b:
    <<: *defaults
    max_concurrent: 8
  c:
    <<: [*defaults]
routes: [{api: openai-chat, upstream: openai, bulkhead: b}]
`
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if b := cfg.Bulkheads["b"]; b.MaxConcurrent != 8 || b.MaxQueue != 2 || cfg.Bulkheads["c"].Model != "gpt-4o" {
		t.Fatalf("merged: %+v %+v", b, cfg.Bulkheads["c"])
	}
	_, err = gateway.ParseConfig("gw.yaml", []byte(strings.Replace(text, "max_queue: 2", "max_qeue: 2", 1)))
	if err == nil || !strings.Contains(err.Error(), `gw.yaml:3: bulkheads.a: unknown key "max_qeue" (did you mean max_queue?)`) {
		t.Fatalf("a misspelt key in an anchor: %v", err)
	}
}

// TestConfigRefusesVersionInBaseURL: a base URL that ends in an API
// version would send every call to /v1/v1/...; -check says so, and what to
// write instead.
func TestConfigRefusesVersionInBaseURL(t *testing.T) {
	for _, c := range []struct{ url, version, fix string }{
		{"https://api.openai.com/v1", "v1", "https://api.openai.com"},
		{"https://api.openai.com/v1/", "v1", "https://api.openai.com"},
		{"https://api.anthropic.com/v1", "v1", "https://api.anthropic.com"},
		{"https://generativelanguage.googleapis.com/v1beta", "v1beta", "https://generativelanguage.googleapis.com"},
		{"https://proxy.internal/openai/v1", "v1", "https://proxy.internal/openai"},
		{"http://127.0.0.1:9000/V2", "V2", "http://127.0.0.1:9000"},
	} {
		text := strings.Replace(sample, "UPSTREAM", c.url, 1)
		_, err := gateway.ParseConfig("gw.yaml", []byte(text))
		want := `gw.yaml:6: upstreams.openai.base_url: "` + c.url + `" ends in the API version ` + c.version +
			`, but a call's path brings its own (such as /v1/chat/completions), so every call would go to .../` +
			c.version + "/" + c.version + `/...: write "` + c.fix + `"`
		if !errors.Is(err, bulkhead.ErrInvalid) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("base_url %s: error %v\nwant one ending %s", c.url, err, want)
		}
	}
	for _, url := range []string{"https://api.openai.com", "https://api.openai.com/", "https://proxy.internal/openai", "https://host/v1/openai", "https://host/vault"} {
		if _, err := gateway.ParseConfig("gw.yaml", []byte(strings.Replace(sample, "UPSTREAM", url, 1))); err != nil {
			t.Errorf("base_url %s: %v", url, err)
		}
	}
}

// TestConfigEnvironmentVariables: each key that names an environment
// variable (api_key_env, key_env, password_env) is an error at start when
// the variable is not set, and another when it is set but empty; none is
// read as an empty key or password.
func TestConfigEnvironmentVariables(t *testing.T) {
	text := `upstreams: {openai: {base_url: "https://api.openai.com", api_key_env: UP_KEY}}
clients: {web: {key_env: WEB_KEY}}
redis: {main: {addr: "127.0.0.1:1", password_env: REDIS_PASSWORD}}
bulkheads:
  gpt4o: {max_concurrent: 4, rate_limits: {redis: main, requests_per_minute: 60}}
routes: [{api: openai-chat, upstream: openai, bulkhead: gpt4o}]
`
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]string{"UP_KEY": "sk-up", "WEB_KEY": "a-client-key-of-24-chars", "REDIS_PASSWORD": "pw"}
	build := func(env map[string]string) error {
		g, err := gateway.Build(cfg, "gw.yaml", lookup(env), slog.New(slog.DiscardHandler))
		if err == nil {
			g.Shutdown(context.Background())
		}
		return err
	}
	if err := build(set); err != nil {
		t.Fatalf("every variable set: %v", err)
	}
	for _, c := range []struct{ name, where string }{
		{"UP_KEY", "gw.yaml:1: upstreams.openai.api_key_env"},
		{"WEB_KEY", "gw.yaml:2: clients.web.key_env"},
		{"REDIS_PASSWORD", "gw.yaml:3: redis.main.password_env"},
	} {
		env := maps.Clone(set)
		delete(env, c.name)
		want := c.where + ": the environment variable " + c.name + " is not set"
		if err := build(env); !errors.Is(err, bulkhead.ErrInvalid) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%s not set: error %v\nwant one ending %s", c.name, err, want)
		}
		env[c.name] = ""
		want = c.where + ": the environment variable " + c.name + " is set but empty"
		if err := build(env); !errors.Is(err, bulkhead.ErrInvalid) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%s empty: error %v\nwant one ending %s", c.name, err, want)
		}
	}
}

// lookup is a lookupEnv of the variables of env.
func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
}

// goName matches what would be a Go name in an error: a CamelCase
// identifier, a Config field path, a Go type.
var goName = regexp.MustCompile(`[a-z][A-Z]|\b[A-Z][a-z]+[A-Z]|Config\.|\bgateway\.|\bint64\b|\bfloat64\b|!!`)

// TestConfigErrorsNameYAMLKeys: an error found by the bulkhead, the fleet
// pool or the YAML decoder names the file's keys, never Go's fields or
// types: the key at its line, and the keys its problem mentions.
func TestConfigErrorsNameYAMLKeys(t *testing.T) {
	const head = "upstreams: {openai: {base_url: \"https://api.openai.com\"}}\nredis: {main: {addr: \"127.0.0.1:1\"}}\nbulkheads:\n  b:\n    model: gpt-4o\n"
	const routes = "routes: [{api: openai-chat, upstream: openai, bulkhead: b}]\n"
	for _, c := range []struct{ section, want string }{
		// From bulkhead.New.
		{"    max_concurrent: 2\n    rate_limits: {tokens_per_minute: 1000}\n",
			"gw.yaml:7: bulkheads.b.rate_limits.tokens_per_minute: needs token_budget: its estimator makes the reservations that tokens per minute count"},
		{"    rate_limits: {request_burst: 5}\n", "gw.yaml:6: bulkheads.b.rate_limits.request_burst: applies only with requests_per_minute set"},
		{"    rate_limits: {requests_per_minute: -1}\n", "gw.yaml:6: bulkheads.b.rate_limits.requests_per_minute: must be in [0, 6e+07], got -1"},
		{"    rate_limits: {pace: true}\n", "gw.yaml:6: bulkheads.b.rate_limits: sets no rate: set a rate per minute, or per_class"},
		{"    rate_limits: {per_class: {batch: {requests_per_minute: 5}}}\n", "gw.yaml:6: bulkheads.b.rate_limits.per_class: needs classes"},
		{"    classes: {default: web, limits: {web: {}}}\n    rate_limits:\n      per_class:\n        batch: {requests_per_minute: 5}\n",
			"gw.yaml:9: bulkheads.b.rate_limits.per_class.batch: is not one of classes"},
		{"    classes: {default: web, limits: {web: {}}}\n    rate_limits:\n      per_class:\n        web: {requests_per_minute: 5, token_burst: 3}\n",
			"gw.yaml:9: bulkheads.b.rate_limits.per_class.web.token_burst: applies only with tokens_per_minute set"},
		{"    max_concurrent: 4\n    classes:\n      default: web\n      limits: {web: {protected_concurrent: 3}, batch: {protected_concurrent: 3}}\n",
			"gw.yaml:9: bulkheads.b.classes.limits: the protected_concurrent floors sum to 6, above max_concurrent 4"},
		{"    max_concurrent: 4\n    classes:\n      default: web\n      limits:\n        web: {protected_concurrent: 3, max_concurrent: 2}\n",
			"gw.yaml:10: bulkheads.b.classes.limits.web.protected_concurrent: must not exceed the class's max_concurrent (2), got 3"},
		{"    max_concurrent: 4\n    classes:\n      default: web\n      limits:\n        web: {protected_tokens: 10, max_tokens: 5}\n    token_budget: 100\n",
			"gw.yaml:10: bulkheads.b.classes.limits.web.protected_tokens: must not exceed the class's max_tokens (5), got 10"},
		{"    classes: {default: nope, limits: {web: {}}}\n", `gw.yaml:6: bulkheads.b.classes.default: names no class: "nope" is not one of ["web"]`},
		{"    classes: {default: web, limits: {web: {}}}\n    queue: {weights: {web: 2}}\n",
			"gw.yaml:7: bulkheads.b.queue.weights: apply to the fair queue only; set queue.fair"},
		{"    queue: {fair: true}\n", "gw.yaml:6: bulkheads.b.queue.fair: needs classes: the fair queue serves class by class"},
		{"    token_budget: 100\n    high_priority_reserve: 200\n", "gw.yaml:7: bulkheads.b.high_priority_reserve: must not exceed token_budget (100), got 200"},
		{"    token_budget: -1\n", "gw.yaml:6: bulkheads.b.token_budget: must be >= 0, got -1"},
		{"    token_budget: 100\n    output_cap: -1\n", "gw.yaml:7: bulkheads.b.output_cap: must be >= 0, got -1"},
		{"    max_queue: -1\n", "gw.yaml:6: bulkheads.b.max_queue: must be >= 0, got -1"},
		{"    max_concurrent: 8\n    adaptive: {min_concurrent: 4, max_concurrent: 2}\n",
			"gw.yaml:7: bulkheads.b.adaptive.max_concurrent: must be >= min_concurrent (4), got 2 (zero means max_concurrent)"},
		{"    max_concurrent: 4\n    adaptive: {min_budget: 10}\n", "gw.yaml:7: bulkheads.b.adaptive.min_budget: applies only with token_budget"},
		{"    max_concurrent: 4\n    token_budget: 1000\n    adaptive: {min_budget: 100, max_budget: 10}\n", "gw.yaml:8: bulkheads.b.adaptive.min_budget: must not exceed max_budget (10), got 100"},
		{"    retry_budget: {ratio: 2}\n", "gw.yaml:6: bulkheads.b.retry_budget.ratio: must be between 0 and 1, got 2"},
		{"    retry_budget: {window: 10s}\n", "gw.yaml:6: bulkheads.b.retry_budget: sets no budget: set ratio or min_retries, or per_class"},
		{"    retry_budget: {ratio: 0.1, window: 100ms}\n", "gw.yaml:6: bulkheads.b.retry_budget.window: must be between 1s and 1h0m0s (or 0 for 10s), got 100ms"},
		{"    retry_budget: {min_retries: -1}\n", "gw.yaml:6: bulkheads.b.retry_budget.min_retries: must be >= 0, got -1"},
		{"    retry_budget: {per_class: {web: {ratio: 0.1}}}\n", "gw.yaml:6: bulkheads.b.retry_budget.per_class: needs classes"},
		{"    classes: {default: web, limits: {web: {}}}\n    retry_budget:\n      per_class:\n        gold: {ratio: 0.1}\n",
			"gw.yaml:9: bulkheads.b.retry_budget.per_class.gold: is not one of classes"},
		{"    classes: {default: web, limits: {web: {}}}\n    retry_budget:\n      per_class:\n        web: {ratio: -0.5}\n",
			"gw.yaml:9: bulkheads.b.retry_budget.per_class.web.ratio: must be between 0 and 1, got -0.5"},
		{"    queue: {retry_aging: -1s}\n", `gw.yaml:6: bulkheads.b.queue.retry_aging: want a duration such as 2s or 1m30s, got "-1s"`},
		{"    fleet: {redis: main, pool: p, token_budget: 1000}\n",
			"gw.yaml:6: bulkheads.b.fleet: has a token budget (1000), which needs token_budget: its estimator makes the reservations the pool holds"},
		// From the gateway's own checks, where the bulkhead's would name Go.
		{"    model: \" \"\n    token_budget: 100\n", `gw.yaml:5: bulkheads.b.model: is needed with token_budget: the estimator reads it`},
		// From fleet.New.
		{"    fleet: {redis: main, pool: \"\"}\n", "gw.yaml:6: bulkheads.b.fleet.pool: must not be empty"},
		{"    fleet: {redis: main, pool: p, max_concurrent: -2}\n", "gw.yaml:6: bulkheads.b.fleet.max_concurrent: must be -1 or in [0, 2^53), got -2"},
		{"    fleet: {redis: main, pool: p, local_share: {slots: -1}}\n", "gw.yaml:6: bulkheads.b.fleet.local_share: must not be negative, got {slots:-1 tokens:0}"},
		// From the YAML decoder.
		{"    max_concurrent: many\n", `gw.yaml:6: bulkheads.b.max_concurrent: want a whole number, got "many"`},
		{"    rate_limits: {requests_per_minute: x}\n", `gw.yaml:6: bulkheads.b.rate_limits.requests_per_minute: want a number, got "x"`},
		{"    classes: [a, b]\n", "gw.yaml:6: bulkheads.b.classes: want a mapping, got a list"},
		{"    queue: {fair: sometimes}\n", `gw.yaml:6: bulkheads.b.queue.fair: want true or false, got "sometimes"`},
		{"    queue_timeout: soon\n", `gw.yaml:6: bulkheads.b.queue_timeout: want a duration such as 2s or 1m30s, got "soon"`},
		{"    rate_limits: {pace: true, requests_per_minute: 5, per_class: {a: {requests_per_minute: [1]}}}\n",
			"gw.yaml:6: bulkheads.b.rate_limits.per_class.a.requests_per_minute: want a number, got a list"},
	} {
		text := head + c.section + routes
		if strings.HasPrefix(c.section, "    model:") {
			text = strings.Replace(text, "    model: gpt-4o\n", "", 1)
		}
		cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
		if err == nil {
			var g *gateway.Gateway
			if g, err = gateway.Build(cfg, "gw.yaml", nil, slog.New(slog.DiscardHandler)); err == nil {
				g.Shutdown(context.Background())
			}
		}
		var ce *gateway.ConfigError
		if !errors.As(err, &ce) || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("%s: error %v\nwant one ending %s", c.section, err, c.want)
		}
		if err != nil && goName.MatchString(err.Error()) {
			t.Errorf("%s: error %v names Go", c.section, err)
		}
	}
}

// TestConfigRoutesErrors: two routes of one API without models, or one
// model in two routes of an API, are errors naming the second's key.
func TestConfigRoutesErrors(t *testing.T) {
	const head = "upstreams: {openai: {base_url: \"https://api.openai.com\"}}\nbulkheads: {b: {max_concurrent: 2}}\nroutes:\n"
	for _, c := range []struct{ routes, want string }{
		{"  - {api: openai-chat, upstream: openai, bulkhead: b}\n  - {api: openai-chat, upstream: openai, bulkhead: b}\n",
			"gw.yaml:5: routes.1: openai-chat has a route without models already (routes.0): a call whose model no route lists goes there"},
		{"  - {api: openai-chat, models: [a, b], upstream: openai, bulkhead: b}\n  - {api: openai-responses, models: [b], upstream: openai, bulkhead: b}\n  - {api: openai-chat, models: [c, b], upstream: openai, bulkhead: b}\n",
			`gw.yaml:6: routes.2.models.1: openai-chat model "b" has a route already (routes.0)`},
	} {
		_, err := gateway.ParseConfig("gw.yaml", []byte(head+c.routes))
		if !errors.Is(err, bulkhead.ErrInvalid) || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("error %v\nwant one ending %s", err, c.want)
		}
	}
}

// FuzzParseConfig: whatever the file, ParseConfig returns a configuration
// or a *ConfigError (matching bulkhead.ErrInvalid) whose line is in the
// file; it never panics.
func FuzzParseConfig(f *testing.F) {
	f.Add(strings.Replace(sample, "UPSTREAM", "https://api.openai.com", 1))
	f.Add("bulkheads: {b: {max_concurrent: many, queue_timeout: soon}}\n")
	f.Add("bulkheads: {b: {rate_limits: {per_class: {a: {requests_per_minute: [1]}}}, classes: [a]}}\n")
	f.Add("routes:\n  - {api: gemini, models: [a, a]}\n  - {api: gemini}\n  - {api: gemini}\n")
	f.Add("a: &x {b: 1}\nbulkheads: {c: *x}\n")
	f.Add("telemetry: {traces: true, endpoint: \"http://c:4318/p\", protocol: grpc, sample_ratio: 2, metrics_interval: 1s}\n")
	f.Add("telemetry: {endpoint: \"http://[::1\", service_name: \" x\"}\n")
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
		if err == nil {
			if cfg == nil {
				t.Fatal("no configuration and no error")
			}
			return
		}
		var ce *gateway.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Fatalf("error %v (%T) is not a *ConfigError", err, err)
		}
		if lines := yamlLines(text); ce.Line < 0 || ce.Line > lines {
			t.Fatalf("error %v: line %d of %d", err, ce.Line, lines)
		}
	})
}

// yamlLines is the number of lines of text as YAML counts them: a CR LF, a
// lone CR or LF, NEL, LS and PS each end one.
func yamlLines(text string) int {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	return 1 + strings.Count(text, "\n") + strings.Count(text, "\r") + strings.Count(text, "\u0085") + strings.Count(text, "\u2028") + strings.Count(text, "\u2029")
}

// buildRates builds a gateway with one bulkhead, b, whose rate_limits are
// rates, behind a route of api.
func buildRates(t *testing.T, api, rates string) (*gateway.Gateway, error) {
	t.Helper()
	text := `upstreams: {up: {base_url: "https://api.example.com"}}
bulkheads:
  b:
    model: gpt-4o
    max_concurrent: 200
    token_budget: 10000000
    rate_limits: ` + rates + `
routes: [{api: ` + api + `, upstream: up, bulkhead: b}]
`
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		return nil, err
	}
	g, err := gateway.Build(cfg, "gw.yaml", nil, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Cleanup(func() { g.Shutdown(context.Background()) })
	}
	return g, err
}

// TestConfigRateBursts: a rate whose burst is left out admits a minute of
// it at once (requests_per_minute calls); request_burst: 0 spaces every
// call; request_burst: N lets N+1 through.
func TestConfigRateBursts(t *testing.T) {
	for _, c := range []struct {
		rates string
		once  int
	}{
		{"{requests_per_minute: 60}", 60},
		{"{requests_per_minute: 60, request_burst: 0}", 1},
		{"{requests_per_minute: 60, request_burst: 4}", 5},
		{"{output_tokens_per_minute: 600}", 61}, // 10 output tokens a call: 600 in the bucket, and the call that overflows it
	} {
		t.Run(c.rates, func(t *testing.T) {
			g, err := buildRates(t, "openai-chat", c.rates)
			if err != nil {
				t.Fatal(err)
			}
			b := g.Bulkheads["b"]
			n := 0
			for ; n < 200; n++ {
				p, err := b.Acquire(context.Background(), &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}, MaxTokens: 10})
				if err != nil {
					testutil.WantReason(t, err, bulkhead.RateLimit)
					break
				}
				_ = p.Release(nil)
			}
			if n != c.once {
				t.Fatalf("%d calls at once, want %d", n, c.once)
			}
		})
	}
}

// TestConfigTokenWeight: tokens_per_minute weighs a call by the rule of
// its routes' API (OpenAI: the larger of input estimate and max output;
// Gemini: the input estimate; Anthropic: both), or by token_weight.
func TestConfigTokenWeight(t *testing.T) {
	res := bulkhead.Reservation{Input: 300, MaxOutput: 100, Reserved: 400}
	for _, c := range []struct {
		api, weight string
		want        float64
	}{
		{"openai-chat", "", 300},
		{"openai-responses", "", 300},
		{"gemini", "", 300},
		{"anthropic-messages", "", 400},
		{"openai-chat", "reservation", 400},
		{"anthropic-messages", "input", 300},
	} {
		t.Run(c.api+"/"+c.weight, func(t *testing.T) {
			rates := "{tokens_per_minute: 60000, token_burst: 0"
			if c.weight != "" {
				rates += ", token_weight: " + c.weight
			}
			g, err := buildRates(t, c.api, rates+"}")
			if err != nil {
				t.Fatal(err)
			}
			b := g.Bulkheads["b"]
			r := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}
			p, err := b.Acquire(context.Background(), r, bulkhead.WithReservation(res))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Release(nil)
			_, err = b.Acquire(context.Background(), r, bulkhead.WithReservation(res))
			if rd := testutil.WantReason(t, err, bulkhead.RateLimit).Detail.Rate; rd.Weight != c.want {
				t.Fatalf("the call weighs %v, want %v", rd.Weight, c.want)
			}
		})
	}
}

// TestConfigRateErrors: a negative or not-a-number burst, an unknown
// token_weight, routes whose providers count tokens per minute
// differently on one bulkhead without token_weight, and a misspelt rate
// key are errors at their key's line.
func TestConfigRateErrors(t *testing.T) {
	for _, c := range []struct {
		rates, want string
	}{
		{"{requests_per_minute: 60, request_burst: -1}", "gw.yaml:7: bulkheads.b.rate_limits.request_burst: want a number >= 0 (0: no burst)"},
		{"{output_tokens_per_minute: 60, output_token_burst: .nan}", "gw.yaml:7: bulkheads.b.rate_limits.output_token_burst: want a number >= 0"},
		{"{requests_per_minute: 60, per_class: {x: {input_tokens_per_minute: 6, input_token_burst: -3}}}", "bulkheads.b.rate_limits.per_class.x.input_token_burst: want a number >= 0"},
		{"{tokens_per_minute: 60, token_weight: output}", "gw.yaml:7: bulkheads.b.rate_limits.token_weight: want larger, input or reservation"},
		{"{input_token_per_minute: 60}", `bulkheads.b.rate_limits: unknown key "input_token_per_minute" (did you mean input_tokens_per_minute?)`},
	} {
		t.Run(c.rates, func(t *testing.T) {
			_, err := buildRates(t, "openai-chat", c.rates)
			var ce *gateway.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v; want one containing %q", err, c.want)
			}
		})
	}
	mixed := `upstreams: {up: {base_url: "https://api.example.com"}}
bulkheads: {b: {model: gpt-4o, max_concurrent: 2, token_budget: 1000, rate_limits: {tokens_per_minute: 600}}}
routes:
  - {api: openai-chat, upstream: up, bulkhead: b}
  - {api: gemini, upstream: up, bulkhead: b}
`
	_, err := gateway.ParseConfig("gw.yaml", []byte(mixed))
	if err == nil || !strings.Contains(err.Error(), "gw.yaml:2: bulkheads.b.rate_limits.token_weight: routes of openai-chat and gemini share this bulkhead") {
		t.Fatalf("mixed routes: %v", err)
	}
	if _, err := gateway.ParseConfig("gw.yaml", []byte(strings.Replace(mixed, "tokens_per_minute: 600", "tokens_per_minute: 600, token_weight: larger", 1))); err != nil {
		t.Fatalf("mixed routes with token_weight: %v", err)
	}
	if _, err := gateway.ParseConfig("gw.yaml", []byte(strings.Replace(mixed, "tokens_per_minute: 600", "requests_per_minute: 600", 1))); err != nil {
		t.Fatalf("mixed routes without a token rate: %v", err)
	}
}

// TestConfigRedisTimeoutBoundsRates: a redis server's timeout bounds the
// rate decisions kept on it, not only the client's commands: a Redis that
// pauses 200 ms delays a call under a 5 s timeout, and does not fail it.
func TestConfigRedisTimeoutBoundsRates(t *testing.T) {
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	text := `upstreams: {up: {base_url: "https://api.example.com"}}
redis: {main: {addr: "` + srv.Addr() + `", timeout: 5s}}
bulkheads: {b: {model: gpt-4o, max_concurrent: 4, rate_limits: {redis: main, requests_per_minute: 60}}}
routes: [{api: openai-chat, upstream: up, bulkhead: b}]
`
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.Build(cfg, "gw.yaml", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	if _, err := srv.Do("CLIENT", "PAUSE", "200"); err != nil {
		t.Fatal(err)
	}
	p, err := g.Bulkheads["b"].Acquire(context.Background(), &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}})
	if err != nil {
		t.Fatalf("a call while Redis pauses 200 ms, under a 5 s timeout: %v", err)
	}
	_ = p.Release(nil)
}

// TestConfigRetryBudget: a bulkhead's retry_budget refuses a retry over it
// (the SDKs' attempt header, or the one attempt_header names) at once,
// with x-should-retry: false and no retry-after, before anything goes
// upstream; the request log shows the attempt and the reason, and
// /metrics the budget.
func TestConfigRetryBudget(t *testing.T) {
	up := newFakeOpenAI(t)
	logs := &testutil.Buffer{}
	g, srv := buildGateway(t, `log: {format: json}
upstreams:
  openai: {base_url: "`+up.srv.URL+`"}
bulkheads:
  main:
    model: gpt-4o
    max_concurrent: 4
    retry_budget: {ratio: 0.5, min_retries: 0, window: 30s}
    queue: {retry_aging: 2s}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: main}
`, nil, logs)
	call := func(tag string, header ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("X-Request-Id", tag)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	for _, tag := range []string{"first-1", "first-2"} {
		if res := call(tag, "X-Stainless-Retry-Count", "0"); res.StatusCode != 200 {
			t.Fatalf("%s: %d", tag, res.StatusCode)
		}
		<-up.auth
	}
	if res := call("retry-ok", "X-Stainless-Retry-Count", "1"); res.StatusCode != 200 { // 1 of 1 allowed
		t.Fatalf("retry within budget: %d", res.StatusCode)
	}
	<-up.auth
	res := call("retry-over", "X-Stainless-Retry-Count", "2")
	if res.StatusCode != 503 || res.Header.Get("X-Should-Retry") != "false" || res.Header.Get("Retry-After") != "" ||
		res.Header.Get("X-Bulkhead-Reason") != "retry_budget" {
		t.Fatalf("retry over budget: %d %v", res.StatusCode, res.Header)
	}
	if res := call("bad-attempt", "X-Stainless-Retry-Count", "x"); res.StatusCode != 400 {
		t.Fatalf("a bad attempt header: %d", res.StatusCode)
	}
	if n := len(up.requestIDs()); n != 3 {
		t.Fatalf("%d calls reached the upstream, want 3", n)
	}
	testutil.WaitFor(t, "the log lines", func() bool { return strings.Count(logs.String(), `"msg":"request"`) == 5 })
	lines := logLines(t, logs)
	if l := lineOf(t, lines, "retry-over"); l["retry"] != 2.0 || l["shed"] != "retry_budget" || l["status"] != 503.0 || l["end"] != "shed" {
		t.Errorf("log line %v", l)
	}
	if l := lineOf(t, lines, "first-1"); l["retry"] != 0.0 {
		t.Errorf("log line %v", l)
	}
	for _, want := range []string{`bulkhead_rejected_total{bulkhead="main",class="",reason="retry_budget"} 1`,
		`bulkhead_retries_admitted_total{bulkhead="main"} 1`, `bulkhead_retry_budget_first_attempts{bulkhead="main"} 2`,
		`bulkhead_retry_budget_allowed{bulkhead="main"} 1`} {
		if m := metric(t, srv.URL, want[:strings.LastIndexByte(want, ' ')]); m != want {
			t.Errorf("/metrics: %q, want %q", m, want)
		}
	}
	if st := g.Bulkheads["main"].Stats(); st.Retries.Budget == nil || st.Retries.Budget.Window != 30*time.Second {
		t.Errorf("budget %+v", st.Retries.Budget)
	}
}

// TestConfigAttemptHeader: attempt_header names the header a gateway reads
// the attempt from (and logs); the SDKs' header then counts for nothing.
// A name that is not a header name is an error.
func TestConfigAttemptHeader(t *testing.T) {
	up := newFakeOpenAI(t)
	logs := &testutil.Buffer{}
	_, srv := buildGateway(t, `log: {format: json}
attempt_header: X-Attempt
upstreams:
  openai: {base_url: "`+up.srv.URL+`"}
bulkheads:
  main: {model: gpt-4o, max_concurrent: 4, retry_budget: {ratio: 0.1}}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: main}
`, nil, logs)
	send := func(tag, header, value string) int {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("X-Request-Id", tag)
		req.Header.Set(header, value)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if got := send("sdk", "X-Stainless-Retry-Count", "1"); got != 200 {
		t.Fatalf("the SDK's header, not read: %d", got)
	}
	<-up.auth
	if got := send("own", "X-Attempt", "1"); got != 503 {
		t.Fatalf("the named header: %d", got)
	}
	testutil.WaitFor(t, "the log lines", func() bool { return strings.Count(logs.String(), `"msg":"request"`) == 2 })
	if l := lineOf(t, logLines(t, logs), "own"); l["retry"] != 1.0 || l["shed"] != "retry_budget" {
		t.Errorf("log line %v", l)
	}
	if l := lineOf(t, logLines(t, logs), "sdk"); l["retry"] != nil {
		t.Errorf("log line %v", l)
	}
	_, err := gateway.ParseConfig("gw.yaml", []byte(`attempt_header: "X Attempt"
upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 1}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`))
	if err == nil || !strings.HasSuffix(err.Error(), `gw.yaml:1: attempt_header: want a header name, such as X-Retry-Attempt, got "X Attempt"`) {
		t.Fatalf("error %v", err)
	}
}
