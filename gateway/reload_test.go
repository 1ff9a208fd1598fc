package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// holdingUpstream is an OpenAI chat upstream named name: a plain call is
// answered at once; a stream sends its first event, then (for a message
// "hold") waits for release, then ends. Each answer says which upstream
// sent it.
type holdingUpstream struct {
	srv     *httptest.Server
	release chan struct{}
	calls   atomic.Int64
}

func newHoldingUpstream(t *testing.T, name string) *holdingUpstream {
	u := &holdingUpstream{release: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, name)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}\n\n", name)
		w.(http.Flusher).Flush()
		if strings.Contains(string(body), `"hold"`) {
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "data: {\"id\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n", name)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// reloadRig is a gateway built from a file, served, with its request log.
type reloadRig struct {
	g    *gateway.Gateway
	srv  *httptest.Server
	path string
	env  map[string]string
	logs *testutil.Buffer
}

func newReloadRig(t *testing.T, text string, env map[string]string) *reloadRig {
	t.Helper()
	r := &reloadRig{path: filepath.Join(t.TempDir(), "gw.yaml"), env: env, logs: &testutil.Buffer{}}
	r.write(t, text)
	cfg, err := gateway.LoadConfig(r.path)
	if err != nil {
		t.Fatal(err)
	}
	if r.g, err = gateway.Build(cfg, r.path, lookup(env), gateway.NewLogger(r.logs, "json")); err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewServer(r.g.Handler)
	t.Cleanup(func() {
		r.srv.Close()
		if left := r.g.Shutdown(context.Background()); len(left) != 0 {
			t.Errorf("left in flight: %v", left)
		}
	})
	return r
}

func (r *reloadRig) write(t *testing.T, text string) {
	t.Helper()
	if err := os.WriteFile(r.path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// reload writes text as the file and reloads it.
func (r *reloadRig) reload(t *testing.T, text string) (*gateway.ReloadResult, error) {
	t.Helper()
	r.write(t, text)
	return r.g.ReloadFile(r.path)
}

// call sends a chat call with key, and returns the response, its body not
// read.
func (r *reloadRig) call(t *testing.T, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// status sends a plain call with key and returns its status and the
// answer's reason header and body.
func (r *reloadRig) status(t *testing.T, key string) (int, string, string) {
	t.Helper()
	res := r.call(t, key, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("X-Bulkhead-Reason"), string(b)
}

// openStream starts a held stream with key and reads its first event.
func (r *reloadRig) openStream(t *testing.T, key string) (*http.Response, *bufio.Reader) {
	t.Helper()
	res := r.call(t, key, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold"}]}`)
	t.Cleanup(func() { res.Body.Close() })
	br := bufio.NewReader(res.Body)
	if line, _ := br.ReadString('\n'); res.StatusCode != 200 || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("stream: %d %q", res.StatusCode, line)
	}
	return res, br
}

// statusDoc is what /status answers.
type statusDoc struct {
	Config struct {
		Revision int64  `json:"revision"`
		Digest   string `json:"digest"`
	} `json:"config"`
	LastReload *struct {
		Result  string   `json:"result"`
		Changes []string `json:"changes"`
		Error   string   `json:"error"`
	} `json:"last_reload"`
}

func (r *reloadRig) statusDoc(t *testing.T) statusDoc {
	t.Helper()
	res, err := http.Get(r.srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s statusDoc
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

const (
	reloadWebKey   = "web-key-0123456789abcdef"
	reloadBatchKey = "batch-key-0123456789abcdef"
)

// reloadConfig is a gateway with a web client and, unless removed, a
// batch client, in front of upstream, through one bulkhead of limit
// slots and no queue.
func reloadConfig(upstream string, limit int, batch bool) string {
	text := "clients:\n  web: {key_env: WEB_KEY}\n"
	if batch {
		text += "  batch: {key_sha256: \"" + digest(reloadBatchKey) + "\"}\n"
	}
	return text + fmt.Sprintf(`upstreams: {up: {base_url: %q, api_key_env: UP_KEY}}
bulkheads: {main: {model: gpt-4o, max_concurrent: %d, max_queue: 0, token_budget: 100000}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
`, upstream, limit)
}

var reloadEnv = map[string]string{"WEB_KEY": reloadWebKey, "UP_KEY": "sk-up"}

// TestReloadUnderLoadKeepsStreamsAndAppliesAtOnce: with streams in flight
// and calls arriving, a reload that lowers a bulkhead's limit and removes
// a client applies at once: the next admission is decided under the new
// limit, the removed client's next call is answered 401, and no stream in
// flight is cut (the removed client's included); no call fails for the
// reload itself. It is logged with what it changed, counted, and shown in
// /status.
func TestReloadUnderLoadKeepsStreamsAndAppliesAtOnce(t *testing.T) {
	up := newHoldingUpstream(t, "up")
	r := newReloadRig(t, reloadConfig(up.srv.URL, 4, true), reloadEnv)
	type stream struct {
		res *http.Response
		br  *bufio.Reader
	}
	var streams []stream
	for _, key := range []string{reloadWebKey, reloadWebKey, reloadBatchKey} {
		res, br := r.openStream(t, key)
		streams = append(streams, stream{res, br})
	}

	// Calls arrive while the reload happens: each is served or shed, under
	// the old limit or the new one, never failed otherwise.
	stop := make(chan struct{})
	var load sync.WaitGroup
	var bad atomic.Value
	for range 2 {
		load.Add(1)
		go func() {
			defer load.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
				req.Header.Set("Authorization", "Bearer "+reloadWebKey)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					bad.Store(err.Error())
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 && res.Header.Get("X-Bulkhead-Reason") != "concurrency_limit" {
					bad.Store(fmt.Sprintf("a call during the reload: %d %s", res.StatusCode, res.Header.Get("X-Bulkhead-Reason")))
				}
			}
		}()
	}
	res, err := r.reload(t, reloadConfig(up.srv.URL, 2, false))
	close(stop)
	load.Wait()
	if b := bad.Load(); b != nil {
		t.Error(b)
	}
	if err != nil || res.Outcome != gateway.ReloadApplied || res.Revision != 2 {
		t.Fatalf("Reload: %+v, %v", res, err)
	}
	var changes []string
	for _, c := range res.Changes {
		changes = append(changes, c.String())
	}
	if want := []string{"clients.batch: removed", "bulkheads.main.max_concurrent: 4 -> 2"}; !slices.Equal(changes, want) {
		t.Errorf("changes %q, want %q", changes, want)
	}

	// The next admission is under the new limit: three in flight, two
	// allowed.
	if st, reason, _ := r.status(t, reloadWebKey); st != http.StatusServiceUnavailable || reason != "concurrency_limit" {
		t.Errorf("a call after the reload: %d %s, want 503 concurrency_limit", st, reason)
	}
	if st, _, _ := r.status(t, reloadBatchKey); st != http.StatusUnauthorized {
		t.Errorf("the removed client's call: %d, want 401", st)
	}
	close(up.release)
	for i, s := range streams {
		rest, err := io.ReadAll(s.br)
		if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Errorf("stream %d was cut: %q, %v", i, rest, err)
		}
	}
	b := r.g.Bulkheads["main"]
	testutil.WaitFor(t, "the streams' release", func() bool { return b.Stats().Calls.InFlight == 0 })
	if st, _, body := r.status(t, reloadWebKey); st != http.StatusOK {
		t.Errorf("a call once the streams ended: %d %s", st, body)
	}
	if l := b.Limits(); l.MaxConcurrent != 2 || l.Revision != 1 {
		t.Errorf("limits %v, want max_concurrent 2 at revision 1", l)
	}
	if got := metric(t, r.srv.URL, `bulkhead_gateway_reloads_total{result="applied"}`); got != `bulkhead_gateway_reloads_total{result="applied"} 1` {
		t.Errorf("metrics: %q", got)
	}
	if got := metric(t, r.srv.URL, "bulkhead_gateway_config_revision"); got != "bulkhead_gateway_config_revision 2" {
		t.Errorf("metrics: %q", got)
	}
	if s := r.statusDoc(t); s.Config.Revision != 2 || s.LastReload == nil || s.LastReload.Result != "applied" || len(s.LastReload.Changes) != 2 {
		t.Errorf("/status: %+v", s)
	}
	r.g.Shutdown(context.Background()) // writes the log
	if !strings.Contains(r.logs.String(), `"msg":"configuration reload","result":"applied","revision":2`) ||
		!strings.Contains(r.logs.String(), `"changes":["clients.batch: removed","bulkheads.main.max_concurrent: 4 -> 2"]`) {
		t.Errorf("log: %s", r.logs.String())
	}
}

// TestReloadInvalidFileChangesNothing: a file that cannot be read, does not
// parse, names a variable that is not set, or sets a limit the bulkhead
// refuses changes nothing, and the error names the file, the line and the
// key; the gateway goes on with its configuration, whole.
func TestReloadInvalidFileChangesNothing(t *testing.T) {
	up := newHoldingUpstream(t, "up")
	good := reloadConfig(up.srv.URL, 4, true)
	r := newReloadRig(t, good, reloadEnv)
	for _, c := range []struct {
		name, text, want string
	}{
		{"syntax", good + "routes: [\n", "gw.yaml:7: did not find expected node content"},
		{"unknown key", strings.Replace(good, "max_queue", "max_queeu", 1), `gw.yaml:5: bulkheads.main: unknown key "max_queeu" (did you mean max_queue?)`},
		{"a variable not set", strings.Replace(good, "WEB_KEY", "NEW_KEY", 1), "gw.yaml:2: clients.web.key_env: the environment variable NEW_KEY is not set"},
		{"a limit refused", strings.Replace(reloadConfig(up.srv.URL, 2, false), "token_budget: 100000", "token_budget: -5", 1),
			"gw.yaml:4: bulkheads.main.token_budget: must be >= 0, got -5"},
		{"a route to nowhere", strings.Replace(good, "upstream: up,", "upstream: down,", 1), `gw.yaml:6: routes.0.upstream: no upstream "down"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := r.reload(t, c.text)
			var ce *gateway.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) || res.Outcome != gateway.ReloadInvalid || res.Revision != 1 {
				t.Fatalf("Reload: %+v, %v; want %q", res, err, c.want)
			}
			if l := r.g.Bulkheads["main"].Limits(); l.MaxConcurrent != 4 || l.Revision != 0 {
				t.Errorf("limits %v changed", l)
			}
			if st, _, _ := r.status(t, reloadBatchKey); st != http.StatusOK {
				t.Errorf("the batch client: %d", st)
			}
		})
	}
	res, err := r.g.ReloadFile(filepath.Join(t.TempDir(), "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) || res.Outcome != gateway.ReloadInvalid {
		t.Errorf("a missing file: %+v, %v", res, err)
	}
	if got := metric(t, r.srv.URL, `bulkhead_gateway_reloads_total{result="invalid"}`); got != `bulkhead_gateway_reloads_total{result="invalid"} 6` {
		t.Errorf("metrics: %q", got)
	}
	if s := r.statusDoc(t); s.Config.Revision != 1 || s.LastReload.Result != "invalid" || s.LastReload.Error == "" {
		t.Errorf("/status: %+v", s)
	}
}

// TestReloadRefusesWhatNeedsARestart: a file that changes what a running
// gateway cannot change is refused whole, with a *RestartError naming
// every such key; what it also changes that could be applied is not.
func TestReloadRefusesWhatNeedsARestart(t *testing.T) {
	up := newHoldingUpstream(t, "up")
	good := reloadConfig(up.srv.URL, 4, true)
	r := newReloadRig(t, good, reloadEnv)
	for _, c := range []struct {
		name, text string
		keys       []string
	}{
		{"listen", "listen: 127.0.0.1:9999\n" + strings.Replace(good, "max_concurrent: 4", "max_concurrent: 3", 1), []string{"listen"}},
		{"rates", strings.Replace(good, "token_budget: 100000}", "token_budget: 100000, rate_limits: {requests_per_minute: 60}}", 1), []string{"bulkheads.main.rate_limits"}},
		{"the budget taken away", strings.Replace(good, ", token_budget: 100000", "", 1), []string{"bulkheads.main.token_budget"}},
		{"a retry budget", strings.Replace(good, "token_budget: 100000}", "token_budget: 100000, retry_budget: {ratio: 0.1}}", 1), []string{"bulkheads.main.retry_budget"}},
		{"the model", strings.Replace(good, "model: gpt-4o", "model: gpt-4.1", 1), []string{"bulkheads.main.model"}},
		{"telemetry", good + "telemetry: {traces: true}\n", []string{"telemetry.traces"}},
		{"log format", good + "log: {format: text}\n", []string{"log.format"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := r.reload(t, c.text)
			var re *gateway.RestartError
			if !errors.As(err, &re) || res.Outcome != gateway.ReloadRefused || res.Revision != 1 {
				t.Fatalf("Reload: %+v, %v", res, err)
			}
			var keys []string
			for _, ch := range re.Changes {
				keys = append(keys, ch.Key)
			}
			if !slices.Equal(keys, c.keys) || !strings.Contains(err.Error(), "restart") {
				t.Errorf("refused %q (%v), want %q", keys, err, c.keys)
			}
			if l := r.g.Bulkheads["main"].Limits(); l.MaxConcurrent != 4 {
				t.Errorf("limits %v changed", l)
			}
		})
	}
	text := strings.Replace(good, "bulkheads: {main: {", "bulkheads: {other: {max_concurrent: 1}, main: {", 1)
	res, err := r.reload(t, text)
	var re *gateway.RestartError
	if !errors.As(err, &re) || len(re.Changes) != 1 || re.Changes[0].String() != "bulkheads.other: added" || res.Outcome != gateway.ReloadRefused {
		t.Errorf("a bulkhead added: %+v, %v", res, err)
	}
	if err != nil && !strings.HasPrefix(err.Error(), "gateway: "+r.path+":5: bulkheads.other: added: ") {
		t.Errorf("error %q", err)
	}
}

// TestReloadAppliesRoutesAndUpstreams: a reload that moves a route to
// another upstream sends the next calls there, while a stream in flight
// ends on the upstream it started with; a file that changes nothing, or
// only its comments, is unchanged.
func TestReloadAppliesRoutesAndUpstreams(t *testing.T) {
	one, two := newHoldingUpstream(t, "one"), newHoldingUpstream(t, "two")
	r := newReloadRig(t, reloadConfig(one.srv.URL, 4, false), reloadEnv)
	_, br := r.openStream(t, reloadWebKey)
	res, err := r.reload(t, reloadConfig(two.srv.URL, 4, false))
	if err != nil || res.Outcome != gateway.ReloadApplied || len(res.Changes) != 1 || res.Changes[0].Key != "upstreams.up.base_url" {
		t.Fatalf("Reload: %+v, %v", res, err)
	}
	if _, _, body := r.status(t, reloadWebKey); !strings.Contains(body, `"id":"two"`) {
		t.Errorf("a call after the reload went to %s", body)
	}
	close(one.release)
	if rest, err := io.ReadAll(br); err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || one.calls.Load() != 1 {
		t.Errorf("the stream in flight: %q, %v", rest, err)
	}
	for _, text := range []string{reloadConfig(two.srv.URL, 4, false), "# a comment\n" + reloadConfig(two.srv.URL, 4, false)} {
		if res, err := r.reload(t, text); err != nil || res.Outcome != gateway.ReloadUnchanged || res.Revision != 2 {
			t.Errorf("Reload: %+v, %v", res, err)
		}
	}
}

// TestReloadClassLimitsAndQueue: a reload changes a class's ceiling and
// the queue in one revision of the bulkhead's limits; a client's tenant
// may move to another class.
func TestReloadClassLimitsAndQueue(t *testing.T) {
	up := newHoldingUpstream(t, "up")
	text := func(ceiling, queue int, tenant string) string {
		return fmt.Sprintf(`clients: {web: {key_env: WEB_KEY, tenant: %s}}
upstreams: {up: {base_url: %q, api_key_env: UP_KEY}}
bulkheads:
  main:
    max_concurrent: 4
    max_queue: %d
    classes: {default: web, limits: {web: {max_concurrent: %d}, batch: {max_concurrent: 1}}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
`, tenant, up.srv.URL, queue, ceiling)
	}
	r := newReloadRig(t, text(2, 0, "web"), reloadEnv)
	res, err := r.reload(t, text(3, 2, "batch"))
	if err != nil || res.Outcome != gateway.ReloadApplied {
		t.Fatalf("Reload: %+v, %v", res, err)
	}
	l := r.g.Bulkheads["main"].Limits()
	if l.Revision != 1 || l.MaxQueue != 2 || *l.Classes.Limits["web"].MaxConcurrent != 3 {
		t.Errorf("limits %v", l)
	}
	r.openStream(t, reloadWebKey) // now in class batch, whose one slot it takes
	if st, reason, body := r.status(t, reloadWebKey); st != http.StatusTooManyRequests || reason != "concurrency_limit" || !strings.Contains(body, `"name":"batch"`) {
		t.Errorf("the second call of class batch: %d %s %s", st, reason, body)
	}
	close(up.release)
}

// FuzzReload: whatever the file, a reload applies it, finds it unchanged,
// or refuses it with a *ConfigError or a *RestartError that changed
// nothing; it never panics, and the file in force before can always be
// reloaded again.
func FuzzReload(f *testing.F) {
	up := httptest.NewServer(http.NotFoundHandler())
	defer up.Close()
	base := `clients: {web: {key_env: WEB_KEY, tenant: web}}
upstreams: {up: {base_url: "` + up.URL + `", api_key_env: UP_KEY}}
bulkheads:
  main:
    model: gpt-4o
    max_concurrent: 4
    token_budget: 100000
    classes: {default: web, limits: {web: {max_concurrent: 2}, batch: {}}}
routes: [{api: openai-chat, upstream: up, bulkhead: main}]
`
	f.Add(base)
	f.Add(strings.Replace(base, "max_concurrent: 4", "max_concurrent: 3", 1))
	f.Add(strings.Replace(base, "batch: {}", "batch: {protected_concurrent: 9}", 1))
	f.Add(strings.Replace(base, "token_budget: 100000", "token_budget: 10, high_priority_reserve: 20", 1))
	f.Add(strings.Replace(base, "tenant: web", "tenant: batch", 1) + "log: {requests: errors}\n")
	f.Add(strings.Replace(base, "routes: [", "routes: [{api: gemini, upstream: up, bulkhead: main}, ", 1))
	f.Add("listen: 0.0.0.0:1\n" + base)
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(base))
	if err != nil {
		f.Fatal(err)
	}
	g, err := gateway.Build(cfg, "gw.yaml", lookup(reloadEnv), gateway.NewLogger(io.Discard, "json"))
	if err != nil {
		f.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	f.Fuzz(func(t *testing.T, text string) {
		next, err := gateway.ParseConfig("gw.yaml", []byte(text))
		if err != nil {
			return
		}
		before := g.Bulkheads["main"].Limits()
		res, err := g.Reload(next)
		var ce *gateway.ConfigError
		var re *gateway.RestartError
		switch {
		case err == nil && (res.Outcome == gateway.ReloadApplied) != (len(res.Changes) > 0):
			t.Fatalf("%+v", res)
		case err != nil && !errors.As(err, &ce) && !errors.As(err, &re):
			t.Fatalf("error %v (%T)", err, err)
		case err != nil:
			if l := g.Bulkheads["main"].Limits(); l.Revision != before.Revision {
				t.Fatalf("a refused reload changed the limits: %v -> %v", before, l)
			}
		}
		back, _ := gateway.ParseConfig("gw.yaml", []byte(base))
		if res, err := g.Reload(back); err != nil {
			t.Fatalf("reloading the file in force before: %+v, %v", res, err)
		}
	})
}
