package gateway_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
	g, err := gateway.Build(cfg, "gw.yaml", func(k string) string { return map[string]string{"TEST_OPENAI_KEY": "sk-env"}[k] },
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
		{"bad duration", "shutdown_timeout: 5s", "gw.yaml:2: want a duration such as 2s or 1m30s"},
		{"bad api", "api: openai-chat", "gw.yaml:22: routes.0.api: want openai-chat"},
		{"no upstream", "upstream: openai, bulk", "gw.yaml:22: routes.0.upstream: no upstream"},
		{"bad url", "base_url: UPSTREAM", "gw.yaml:6: upstreams.openai.base_url: want an absolute URL"},
		{"bad limit", "max_concurrent: 2", "gw.yaml:12: bulkheads.gpt4o.max_concurrent: must be >= 0, got -2"},
		{"no key", "api_key_env: TEST_OPENAI_KEY", "gw.yaml:7: upstreams.openai.api_key_env: the environment variable NOT_SET is not set"},
		{"bad weight", "", "gw.yaml:20: bulkheads.gpt4o.queue.weights: class \"web\": must be between 1 and 1000000, got 0"},
		{"adaptive unknown key", "", `gw.yaml:21: bulkheads.gpt4o.adaptive: unknown key "min_concurent" (did you mean min_concurrent?)`},
		{"adaptive rule", "", "gw.yaml:21: bulkheads.gpt4o.adaptive.rule: want aimd or gradient, got \"vegas\""},
		{"adaptive cooldown", "", "gw.yaml:21: bulkheads.gpt4o.adaptive.cooldown: want hold or shed, got \"wait\""},
		{"adaptive bounds", "", "gw.yaml:21: bulkheads.gpt4o.adaptive.max_concurrent: must be >= MinConcurrent (4)"},
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
	g, err := gateway.Build(cfg, "gw.yaml", func(string) string { return "sk" }, slog.New(slog.DiscardHandler))
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
