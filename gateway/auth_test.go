package gateway_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// anyProvider is an upstream of every API that counts its requests and
// records the credentials each carried: the key headers and the query.
type anyProvider struct {
	srv  *httptest.Server
	hits atomic.Int64

	mu    sync.Mutex
	creds []string // "authorization|x-api-key|x-goog-api-key|query" of each request
}

func newAnyProvider(t *testing.T) *anyProvider {
	p := &anyProvider{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		io.Copy(io.Discard, r.Body)
		p.mu.Lock()
		p.creds = append(p.creds, strings.Join([]string{r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), r.Header.Get("X-Goog-Api-Key"), r.URL.RawQuery}, "|"))
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/chat/completions"):
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
		case strings.HasSuffix(r.URL.Path, "/messages"):
			fmt.Fprint(w, `{"id":"m1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":9,"output_tokens":2}}`)
		default:
			fmt.Fprint(w, `{"candidates":[],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":2,"totalTokenCount":11}}`)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *anyProvider) lastCreds() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creds[len(p.creds)-1]
}

const (
	webKey   = "gw-web-0123456789abcdef"
	batchKey = "gw-batch-fedcba9876543210"
)

func digest(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}

// authConfig is a gateway with two clients, web (its key from the
// environment, allowed high priority) and batch (its key's digest in the
// file), in front of an upstream of every API.
func authConfig(upstream string) string {
	return `clients:
  web: {key_env: WEB_KEY, tenant: web, allow_high_priority: true}
  batch: {key_sha256: "` + digest(batchKey) + `", tenant: batch}
upstreams: {up: {base_url: "` + upstream + `", api_key_env: UP_KEY}}
bulkheads:
  main:
    max_concurrent: 4
    classes: {default: web, limits: {web: {}, batch: {max_concurrent: 2}}}
routes:
  - {api: openai-chat, upstream: up, bulkhead: main}
  - {api: anthropic-messages, upstream: up, bulkhead: main}
  - {api: gemini, upstream: up, bulkhead: main}
priority: {header: X-Priority}
`
}

// buildGateway builds and serves the gateway of the configuration text,
// with env as its environment and its request log in logs: JSON lines when
// the configuration says log: {format: json, ...}, else text.
func buildGateway(t *testing.T, text string, env map[string]string, logs io.Writer) (*gateway.Gateway, *httptest.Server) {
	t.Helper()
	cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	format := "text" // the lines these tests read, unless the configuration asks for JSON
	if cfg.Log.Format == "json" {
		format = "json"
	}
	g, err := gateway.Build(cfg, "gw.yaml", lookup(env), gateway.NewLogger(logs, format))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler)
	t.Cleanup(func() {
		srv.Close()
		if left := g.Shutdown(context.Background()); len(left) != 0 {
			t.Errorf("left in flight: %v", left)
		}
	})
	return g, srv
}

// TestClientsAuthenticate: a call without a client key, or with one no
// client has, is answered 401 in its API's dialect and never reaches the
// upstream; a client's key, in whichever place its API puts it, lets the
// call through with the upstream's key in its place (the client's key never
// goes upstream), in its tenant's class and with the priority it may ask
// for; the log names the client, never its key.
func TestClientsAuthenticate(t *testing.T) {
	up := newAnyProvider(t)
	var logs testutil.Buffer
	g, srv := buildGateway(t, authConfig(up.srv.URL), map[string]string{"WEB_KEY": webKey, "UP_KEY": "sk-upstream"}, &logs)

	chat := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	msgs := `{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	gem := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	const gemPath = "/v1beta/models/gemini-2.5-flash:generateContent"
	call := func(path, body string, header map[string]string) (int, map[string]any, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		return res.StatusCode, m, res.Header
	}

	for _, tc := range []struct {
		name, path, body string
		header           map[string]string
		field, want      string // a field of the 401 body, and its value
	}{
		{"openai missing", "/v1/chat/completions", chat, nil, "error.code", "invalid_api_key"},
		{"openai unknown", "/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer sk-wrong-key-0123456789"}, "error.code", "invalid_api_key"},
		{"openai upstream's key", "/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer sk-upstream"}, "error.type", "invalid_request_error"},
		{"anthropic missing", "/v1/messages", msgs, nil, "error.type", "authentication_error"},
		{"anthropic unknown", "/v1/messages", msgs, map[string]string{"X-Api-Key": "sk-ant-wrong"}, "type", "error"},
		{"gemini missing", gemPath, gem, nil, "error.status", "UNAUTHENTICATED"},
		{"gemini unknown", gemPath + "?key=wrong", gem, nil, "error.code", "401"},
	} {
		status, body, h := call(tc.path, tc.body, tc.header)
		if got := fmt.Sprint(field(body, tc.field)); status != 401 || got != tc.want || h.Get("X-Should-Retry") != "false" {
			t.Errorf("%s: %d, %s = %q, x-should-retry %q; want 401, %q, false (%v)", tc.name, status, tc.field, got, h.Get("X-Should-Retry"), tc.want, body)
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Fatalf("the upstream saw %d unauthenticated calls", n)
	}

	for _, tc := range []struct {
		name, path, body string
		header           map[string]string
		creds            string // what the upstream sees
	}{
		{"openai", "/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer " + webKey}, "Bearer sk-upstream|||"},
		{"anthropic", "/v1/messages", msgs, map[string]string{"X-Api-Key": batchKey}, "|sk-upstream||"},
		{"anthropic auth token", "/v1/messages", msgs, map[string]string{"Authorization": "Bearer " + webKey}, "|sk-upstream||"},
		{"gemini header", gemPath, gem, map[string]string{"X-Goog-Api-Key": webKey}, "||sk-upstream|"},
		{"gemini query", gemPath + "?alt=sse&key=" + batchKey, gem, nil, "||sk-upstream|alt=sse"},
	} {
		hits := up.hits.Load()
		if status, body, _ := call(tc.path, tc.body, tc.header); status != 200 || up.hits.Load() != hits+1 {
			t.Fatalf("%s: %d %v", tc.name, status, body)
		}
		if got := up.lastCreds(); got != tc.creds {
			t.Errorf("%s: the upstream saw credentials %q; want %q", tc.name, got, tc.creds)
		}
	}

	// The tenant is the class; high priority only for a client that may
	// ask for it.
	high := map[string]string{"X-Priority": "high", "X-Request-Id": "web-high", "Authorization": "Bearer " + webKey}
	if status, _, _ := call("/v1/chat/completions", chat, high); status != 200 {
		t.Fatal(status)
	}
	high = map[string]string{"X-Priority": "high", "X-Request-Id": "batch-high", "Authorization": "Bearer " + batchKey}
	if status, _, _ := call("/v1/chat/completions", chat, high); status != 200 {
		t.Fatal(status)
	}
	st := g.Bulkheads["main"].Stats().Classes.Classes
	if st["web"].Admitted != 4 || st["batch"].Admitted != 3 {
		t.Fatalf("admitted by class: web %d, batch %d; want 4 and 3", st["web"].Admitted, st["batch"].Admitted)
	}
	testutil.WaitFor(t, "every call's log line", func() bool { return strings.Count(logs.String(), "msg=request") == 14 })
	lines := logs.String()
	for _, want := range []string{"end=unauthorized", "key_id=web", "key_id=batch", "tenant=batch",
		"tag=web-high key_id=web route=0 bulkhead=main model=gpt-4o tenant=web priority=high",
		"tag=batch-high key_id=batch route=0 bulkhead=main model=gpt-4o tenant=batch admission_id="} {
		if !strings.Contains(lines, want) {
			t.Errorf("the log lacks %q:\n%s", want, lines)
		}
	}
	for _, secret := range []string{webKey, batchKey, "sk-upstream", "sk-wrong", "sk-ant-wrong"} {
		if strings.Contains(lines, secret) {
			t.Errorf("the log holds the key %q:\n%s", secret, lines)
		}
	}
}

// TestUnauthorizedUploadReads401: a client that uploads a large body with
// a wrong key, or none, gets the 401, not a broken connection: the gateway
// reads and discards the body before it answers, so that a client that
// writes its whole body before it reads (as the Python SDKs do) reads the
// 401, and its connection stays usable. A Go client, which reads while it
// writes, gets it too.
func TestUnauthorizedUploadReads401(t *testing.T) {
	up := newAnyProvider(t)
	_, srv := buildGateway(t, authConfig(up.srv.URL), map[string]string{"WEB_KEY": webKey, "UP_KEY": "sk-upstream"}, io.Discard)
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("x", 8<<20) + `"}],"max_tokens":5}`
	small := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	head := func(key string, n int) string {
		h := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + fmt.Sprintf("Content-Length: %d\r\n", n)
		if key != "" {
			h += "Authorization: " + key + "\r\n"
		}
		return h + "\r\n"
	}

	// The whole body, then the answer, as a sequential client.
	for _, key := range []string{"Bearer sk-wrong-key-0123456789", ""} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, head(key, len(big))+big); err != nil {
			t.Fatalf("key %q: writing the body: %v (the gateway closed the connection before reading it)", key, err)
		}
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("key %q: reading the answer: %v", key, err)
		}
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 401 || !strings.Contains(string(body), "invalid_api_key") || res.Close {
			t.Fatalf("key %q: %d close=%v %s; want 401 on a connection kept open", key, res.StatusCode, res.Close, body)
		}
		// The connection goes on.
		if _, err := io.WriteString(conn, head("Bearer "+webKey, len(small))+small); err != nil {
			t.Fatal(err)
		}
		if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
			t.Fatalf("key %q: the next call on the connection: %v, %v", key, res, err)
		}
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for i, key := range []string{"Bearer sk-wrong-key-0123456789", ""} {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(big))
		if key != "" {
			req.Header.Set("Authorization", key)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("Go client, call %d: %v; want a 401", i, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Fatalf("Go client, call %d: %d; want 401", i, res.StatusCode)
		}
	}
	if n := up.hits.Load(); n != 2 {
		t.Fatalf("the upstream saw %d calls; want the 2 with the client's key", n)
	}
}

// TestConfigSafetyErrors: the configuration cannot leave the gateway open
// by mistake; each error names the line and the key.
func TestConfigSafetyErrors(t *testing.T) {
	base := authConfig("https://api.openai.com")
	env := map[string]string{"WEB_KEY": webKey, "UP_KEY": "sk-upstream", "SHORT": "short"}
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"no clients, every interface", "clients:\n  web: {key_env: WEB_KEY, tenant: web, allow_high_priority: true}\n  batch: {key_sha256: \"" + digest(batchKey) + "\", tenant: batch}\n", "listen: \":8080\"\n",
			`gw.yaml:1: listen: ":8080" is reachable beyond this machine and no clients are set`},
		{"no clients, default listen", "clients:\n  web: {key_env: WEB_KEY, tenant: web, allow_high_priority: true}\n  batch: {key_sha256: \"" + digest(batchKey) + "\", tenant: batch}\n", "listen: \"0.0.0.0:8080\"\n",
			`listen: "0.0.0.0:8080" is reachable beyond this machine`},
		{"bad listen", "clients:", "listen: localhost\nclients:", `gw.yaml:1: listen: want host:port`},
		{"no key", "key_env: WEB_KEY, ", "", "gw.yaml:2: clients.web: needs one of key_env and key_sha256"},
		{"two keys", "key_env: WEB_KEY, ", "key_env: WEB_KEY, key_sha256: \"" + digest(webKey) + "\", ", "gw.yaml:2: clients.web: needs one of key_env and key_sha256"},
		{"bad digest", digest(batchKey), "abc", "gw.yaml:3: clients.batch.key_sha256: want 64 hex digits (a SHA-256 digest), got 3 characters"},
		{"same digest", "key_env: WEB_KEY", "key_sha256: \"" + digest(batchKey) + "\"", "clients.web.key_sha256: is client batch's key too"},
		{"unset key", "WEB_KEY", "NOT_SET", "gw.yaml:2: clients.web.key_env: the environment variable NOT_SET is not set"},
		{"short key", "WEB_KEY", "SHORT", "gw.yaml:2: clients.web.key_env: the key in SHORT has 5 characters; a client key needs at least 16"},
		{"same key", "key_sha256: \"" + digest(batchKey) + "\"", "key_sha256: \"" + digest(webKey) + "\"", "gw.yaml:2: clients.web.key_env: holds client batch's key too"},
		{"tenant not a class", "tenant: batch}", "tenant: bacth}", `gw.yaml:3: clients.batch.tenant: "bacth" is not a class of bulkhead main`},
		{"upstream key passed through", ", api_key_env: UP_KEY", "", "gw.yaml:4: upstreams.up.api_key_env: is needed with clients"},
		{"class header untrusted", "priority: {header", "class: {header: X-Tenant}\npriority: {header", "gw.yaml:13: class.header: counts only with trust_headers: true"},
		{"priority header, nobody may", "allow_high_priority: true", "allow_high_priority: false", "gw.yaml:13: priority.header: counts only with trust_headers: true, or for clients with allow_high_priority"},
		{"body over the budget", "bulkhead: main}\n  - {api: anthropic", "bulkhead: main, max_body_bytes: 268435457}\n  - {api: anthropic", "gw.yaml:10: routes.0.max_body_bytes: 268435457 is over the body budget (body_budget_bytes 268435456)"},
		{"negative body", "bulkhead: main}\n  - {api: anthropic", "bulkhead: main, max_body_bytes: -1}\n  - {api: anthropic", "gw.yaml:10: routes.0.max_body_bytes: must be >= 0, got -1"},
		{"negative budget", "priority: {header", "body_budget_bytes: -5\npriority: {header", "gw.yaml:13: body_budget_bytes: must be >= 0, got -5"},
		{"log requests", "priority: {header", "log: {requests: some}\npriority: {header", `gw.yaml:13: log.requests: want all, errors or none, got "some"`},
		{"tls half", "priority: {header", "tls: {cert_file: c.pem}\npriority: {header", "gw.yaml:13: tls: needs both cert_file and key_file"},
		{"tls unreadable", "priority: {header", "tls: {cert_file: /nonexistent/c.pem, key_file: /nonexistent/k.pem}\npriority: {header", "gw.yaml:13: tls: open /nonexistent/c.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.Replace(base, tc.old, tc.new, 1)
			if text == base {
				t.Fatalf("%q is not in the configuration", tc.old)
			}
			cfg, err := gateway.ParseConfig("gw.yaml", []byte(text))
			if err == nil {
				var g *gateway.Gateway
				if g, err = gateway.Build(cfg, "gw.yaml", lookup(env), slog.New(slog.DiscardHandler)); err == nil {
					g.Shutdown(context.Background())
				}
			}
			var ce *gateway.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
	// Without clients, loopback listens; elsewhere only when the file says so.
	open := strings.Replace(base, "clients:\n  web: {key_env: WEB_KEY, tenant: web, allow_high_priority: true}\n  batch: {key_sha256: \""+digest(batchKey)+"\", tenant: batch}\n", "", 1)
	open = strings.Replace(open, ", api_key_env: UP_KEY", "", 1)
	open = strings.Replace(open, "priority: {header: X-Priority}\n", "", 1)
	for _, head := range []string{"", "listen: \"[::1]:8080\"\n", "listen: localhost:0\n", "listen: \":8080\"\nallow_unauthenticated: true\n"} {
		cfg, err := gateway.ParseConfig("gw.yaml", []byte(head+open))
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		g, err := gateway.Build(cfg, "gw.yaml", nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		if head == "" && g.Listen != "127.0.0.1:8080" {
			t.Errorf("default listen %q", g.Listen)
		}
		g.Shutdown(context.Background())
	}
}
