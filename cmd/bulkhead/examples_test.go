package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// TestExamples checks every configuration in examples/ as
// 'bulkhead gateway -check' does, with exactly the variables its header
// comment exports set, and nothing else to create: each passes as its
// reader would first run it.
func TestExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("examples: %v, %v", files, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			text, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(text), "#") {
				t.Errorf("%s does not start with a comment saying what it is for", file)
			}
			setExactEnv(t, file, headerExports(t, string(text)))
			code, out, errOut := runArgs("gateway", "-config", file, "-check")
			if code != 0 || !strings.Contains(out, "is valid") {
				t.Fatalf("with the header's variables: exit %d: %s%s", code, out, errOut)
			}
			t.Log(strings.TrimSpace(out))
		})
	}
}

// exampleKeys are the keys whose digests the examples hold (key_sha256),
// by digest: the plain key is in the file's comment.
var exampleKeys = map[string]string{
	"09a953359c3190def15a00d6ebbb375119e631cb91d309e79eb0b9d3b4de84fe": "replace-me-with-the-batch-key",
}

// headerExports returns the variables an example's header comment tells
// its reader to export, with values for them: 48 hex digits for
// `$(openssl rand -hex 24)`, the written value otherwise.
func headerExports(t *testing.T, text string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		rest, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(line, "#")), "export ")
		if !ok {
			continue
		}
		rest, _, _ = strings.Cut(rest, "#") // a comment after the command
		rest = strings.ReplaceAll(rest, "$(openssl rand -hex 24)", "$(openssl)")
		for _, f := range strings.Fields(rest) {
			name, value, ok := strings.Cut(f, "=")
			if !ok {
				t.Fatalf("header line %q: %q is not NAME=value", line, f)
			}
			if value == "$(openssl)" {
				value = fmt.Sprintf("%x", sha256.Sum256([]byte(name)))[:48]
			}
			env[name] = value
		}
	}
	return env
}

// setExactEnv sets the variables of env and unsets every other variable
// the example file reads (its keys' and passwords' _env names).
func setExactEnv(t *testing.T, file string, env map[string]string) {
	t.Helper()
	cfg, err := gateway.LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	var reads []string
	for _, u := range cfg.Upstreams {
		reads = append(reads, u.APIKeyEnv)
	}
	for _, c := range cfg.Clients {
		reads = append(reads, c.KeyEnv)
	}
	for _, r := range cfg.Redis {
		reads = append(reads, r.PasswordEnv)
	}
	for _, k := range reads {
		if _, ok := env[k]; !ok && k != "" {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// fakeProvider is a provider for the examples: it holds every call until
// open is called, then answers it with a short completion and its usage
// in the call's own dialect (OpenAI chat or responses, Anthropic
// messages, Gemini generateContent). held counts the calls it has held.
type fakeProvider struct {
	url  string
	held atomic.Int64
	mu   sync.Mutex
	gate chan struct{}
}

// open answers every call held now.
func (p *fakeProvider) open() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.gate)
	p.gate = make(chan struct{})
}

// exampleUpstream starts the provider the examples run against. (One
// helper, so that the examples can run against another provider with one
// edit.)
func exampleUpstream(t *testing.T) *fakeProvider {
	p := &fakeProvider{gate: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		p.held.Add(1)
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch path := r.URL.Path; {
		case strings.HasSuffix(path, "/chat/completions"):
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
		case strings.HasSuffix(path, "/responses"):
			fmt.Fprint(w, `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]}],"usage":{"input_tokens":9,"output_tokens":2,"total_tokens":11}}`)
		case strings.HasSuffix(path, "/messages"):
			fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":2}}`)
		case strings.Contains(path, ":generateContent"):
			fmt.Fprint(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"hello"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":2,"totalTokenCount":11}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(p.open)
	p.url = srv.URL
	return p
}

// exampleCall is a call without max_tokens for a route of api and a model,
// carrying key where api puts a key.
func exampleCall(t *testing.T, base, api, model, key string) *http.Request {
	t.Helper()
	var path, body string
	switch api {
	case "openai-chat":
		path, body = "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`
	case "openai-responses":
		path, body = "/v1/responses", `{"model":"`+model+`","input":"hi"}`
	case "anthropic-messages":
		path, body = "/v1/messages", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`
	case "gemini":
		path, body = "/v1beta/models/"+model+":generateContent", `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	default:
		t.Fatalf("no call for api %q", api)
	}
	req, err := http.NewRequest("POST", base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		switch api {
		case "anthropic-messages":
			req.Header.Set("x-api-key", key)
		case "gemini":
			req.Header.Set("x-goog-api-key", key)
		default:
			req.Header.Set("Authorization", "Bearer "+key)
		}
	}
	return req
}

var (
	baseURLKey      = regexp.MustCompile(`base_url:\s*"[^"]*"`)
	redisAddrKey    = regexp.MustCompile(`addr:\s*"[^"]*"`)
	redisTimeoutKey = regexp.MustCompile(`(addr:[^\n]*)timeout:\s*\w+`)
	listenKey       = regexp.MustCompile(`(?m)^listen:\s*"[^"]*"`)
)

// TestExamplesAdmitMaxConcurrent: every example, run against a fake
// provider (its base_url pointed at it, its Redis at one on loopback with
// a generous timeout, its listen address a free loopback port: nothing
// else changed), lets
// max_concurrent parallel calls without max_tokens through each of its
// bulkheads at once: all of them reach the provider together and are
// answered 200, none refused by the gateway's own limits.
func TestExamplesAdmitMaxConcurrent(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("examples: %v, %v", files, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			env := headerExports(t, string(raw))
			setExactEnv(t, file, env)
			up := exampleUpstream(t)
			text := baseURLKey.ReplaceAllString(string(raw), `base_url: "`+up.url+`"`)
			text = listenKey.ReplaceAllString(text, `listen: "127.0.0.1:0"`)
			if redisAddrKey.MatchString(text) {
				srv := redistest.Start(t)
				if pw := env["REDIS_PASSWORD"]; pw != "" {
					if _, err := srv.Do("CONFIG", "SET", "requirepass", pw); err != nil {
						t.Fatal(err)
					}
				}
				text = redisAddrKey.ReplaceAllString(text, `addr: "`+srv.Addr()+`"`)
				// The file's timeout is for a Redis next door, not for one
				// shared with the race detector on a loaded test machine.
				text = redisTimeoutKey.ReplaceAllString(text, "${1}timeout: 10s")
			}
			path := writeConfig(t, text)
			cfg, err := gateway.LoadConfig(path)
			if err != nil {
				t.Fatal(err)
			}
			createFleetPools(t, cfg)
			mock := mockGatewayClock(t) // the shutdown delay passes at once
			ctx, cancel := context.WithCancel(context.Background())
			gw := startGateway(t, ctx, path)
			defer func() {
				cancel()
				if d := time.Duration(cfg.ShutdownDelay); d > 0 {
					testutil.WaitFor(t, "/readyz to answer 503", func() bool { return status(gw.url+"/readyz") == 503 })
					mock.Add(d)
				}
				if code := <-gw.done; code != 0 {
					t.Errorf("the gateway exited %d:\n%s", code, gw.out.String())
				}
			}()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			defer client.CloseIdleConnections()
			for _, name := range slices.Sorted(maps.Keys(cfg.Bulkheads)) {
				b := cfg.Bulkheads[name]
				i := slices.IndexFunc(cfg.Routes, func(r gateway.RouteConfig) bool { return r.Bulkhead == name })
				if i < 0 {
					continue
				}
				route := cfg.Routes[i]
				model := b.Model
				if len(route.Models) > 0 {
					model = route.Models[0]
				}
				key := exampleClientKey(t, cfg, b)
				n := b.MaxConcurrent
				before := up.held.Load()
				answers := make(chan string, n)
				for range n {
					req := exampleCall(t, gw.url, route.API, model, key)
					go func() {
						res, err := client.Do(req)
						if err != nil {
							answers <- err.Error()
							return
						}
						body, _ := io.ReadAll(res.Body)
						res.Body.Close()
						answers <- fmt.Sprintf("%d %s", res.StatusCode, bytes.TrimSpace(body))
					}()
				}
				// Every call reaches the provider before any is answered,
				// unless the gateway answers it itself.
				var early []string
				waitErr := testutil.Poll("the calls to reach the provider", func() (bool, error) {
					for len(answers) > 0 {
						early = append(early, <-answers)
					}
					return up.held.Load()-before+int64(len(early)) >= int64(n), nil
				})
				up.open()
				got := map[string]int{}
				for _, a := range early {
					got["refused: "+a]++
				}
				for range n - len(early) {
					if a := <-answers; strings.HasPrefix(a, "200 ") {
						got["200"]++
					} else {
						got["late: "+a]++
					}
				}
				if got["200"] != n || waitErr != nil {
					t.Errorf("bulkhead %s (%s, %d calls at once): %v; want all %d answered 200 together (%v)", name, route.API, n, got, n, waitErr)
				}
			}
		})
	}
}

// createFleetPools makes the fleet pools of cfg as a deployment step
// would, before any replica runs (see the fleet guide: a pool's first use
// otherwise holds every replica back for its relearn window).
func createFleetPools(t *testing.T, cfg *gateway.Config) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(cfg.Bulkheads)) {
		f := cfg.Bulkheads[name].Fleet
		if f == nil {
			continue
		}
		rc := cfg.Redis[f.Redis]
		client := redis.NewClient(&redis.Options{Addr: rc.Addr, Password: os.Getenv(rc.PasswordEnv)})
		p, err := fleet.New(fleet.Config{Client: client, Pool: f.Pool, MaxConcurrent: -1, TokenBudget: -1, RelearnWindow: -1})
		if err == nil {
			var res fleet.Result
			if res, err = p.Reserve(context.Background(), fleet.ID{1}, fleet.Hold{}, false); err == nil && !res.Admitted {
				err = fmt.Errorf("not admitted: %v", res.Reason)
			}
			p.Release(fleet.ID{1})
			if cerr := p.Close(context.Background()); err == nil {
				err = cerr
			}
		}
		client.Close()
		if err != nil {
			t.Fatalf("creating fleet pool %s: %v", f.Pool, err)
		}
	}
}

// exampleClientKey is the key of a client whose calls may use the whole of
// b: one without a tenant, or whose tenant is b's default class; "" when
// the example has no clients.
func exampleClientKey(t *testing.T, cfg *gateway.Config, b gateway.BulkheadConfig) string {
	t.Helper()
	if len(cfg.Clients) == 0 {
		return ""
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Clients)) {
		c := cfg.Clients[name]
		if c.Tenant != "" && (b.Classes == nil || c.Tenant != b.Classes.Default) {
			continue
		}
		if c.KeyEnv != "" {
			return os.Getenv(c.KeyEnv)
		}
		if key, ok := exampleKeys[c.KeySHA256]; ok {
			return key
		}
	}
	t.Fatal("no client of the example may use a whole bulkhead")
	return ""
}
