package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// holdingUpstream is an OpenAI upstream that answers a plain call at once
// and streams a call's first event, then its end once release is closed
// (or its client goes away).
func holdingUpstream(t *testing.T) (url string, release chan struct{}) {
	release = make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL, release
}

// mockGatewayClock makes the gateway command's clock a mock for the test.
func mockGatewayClock(t *testing.T) *clock.Mock {
	m := clock.NewMock()
	gatewayClock = m
	t.Cleanup(func() { gatewayClock = clock.New() })
	return m
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := t.TempDir() + "/gw.yaml"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// openStream starts a streamed call through the gateway and reads its
// first event.
func openStream(t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	res, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(res.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q, %v", line, err)
	}
	return res, br
}

// status is the status of a GET of url on a new connection, 0 when none
// can be made.
func status(url string) int {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := c.Get(url)
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

const shutdownConfig = `listen: "127.0.0.1:0"
shutdown_delay: 5s
shutdown_timeout: 10s
log: {format: json}
upstreams: {openai: {base_url: "UPSTREAM"}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 4}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`

// TestGatewayShutdownDrains: on SIGTERM /readyz answers 503 at once while
// the gateway goes on serving for shutdown_delay, new connections
// included; then it stops accepting, and the stream in flight finishes
// within shutdown_timeout: drained, exit 0.
func TestGatewayShutdownDrains(t *testing.T) {
	mock := mockGatewayClock(t)
	up, release := holdingUpstream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw := startGateway(t, ctx, writeConfig(t, strings.Replace(shutdownConfig, "UPSTREAM", up, 1)))
	held, br := openStream(t, gw.url)
	defer held.Body.Close()

	cancel() // SIGTERM
	testutil.WaitFor(t, "/readyz to answer 503", func() bool { return status(gw.url+"/readyz") == 503 })
	res, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Post(gw.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
	if err != nil {
		t.Fatalf("a call during the shutdown delay: %v", err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("a call during the shutdown delay: %d; want it served", res.StatusCode)
	}

	mock.Add(5e9) // the delay ends: the gateway stops accepting
	addr := strings.TrimPrefix(gw.url, "http://")
	testutil.WaitFor(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case code := <-gw.done:
		t.Fatalf("exited %d with a stream in flight", code)
	default:
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream in flight: %q, %v", rest, err)
	}
	if code := <-gw.done; code != 0 || !strings.Contains(gw.out.String(), "drained") || strings.Contains(gw.out.String(), "bulkhead main") {
		t.Fatalf("exit %d:\n%s", code, gw.out.String())
	}
	if n := strings.Count(gw.err.String(), `"msg":"request"`); n != 2 {
		t.Errorf("%d request lines; want 2:\n%s", n, gw.err.String())
	}
}

// TestGatewayShutdownCuts: a stream still running at the end of
// shutdown_timeout is cut, logged with end=shutdown, and reported by its
// bulkhead (the other bulkhead, idle, is not); exit 1.
func TestGatewayShutdownCuts(t *testing.T) {
	mock := mockGatewayClock(t)
	up, _ := holdingUpstream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	text := strings.Replace(shutdownConfig, "UPSTREAM", up, 1)
	text = strings.Replace(text, "bulkheads: {main: {model: gpt-4o, max_concurrent: 4}}", "bulkheads: {main: {model: gpt-4o, max_concurrent: 4}, idle: {max_concurrent: 4}}", 1)
	text += "  - {api: anthropic-messages, upstream: openai, bulkhead: idle}\n"
	text = strings.Replace(text, "routes: [{api: openai-chat, upstream: openai, bulkhead: main}]\n", "routes:\n  - {api: openai-chat, upstream: openai, bulkhead: main}\n", 1)
	gw := startGateway(t, ctx, writeConfig(t, text))
	held, br := openStream(t, gw.url)
	defer held.Body.Close()
	cancel()
	testutil.WaitFor(t, "/readyz to answer 503", func() bool { return status(gw.url+"/readyz") == 503 })
	mock.Add(5e9)
	testutil.WaitFor(t, "the listener to close", func() bool { return status(gw.url+"/healthz") == 0 })
	mock.Add(10e9) // the deadline
	if _, err := io.ReadAll(br); err == nil {
		t.Fatal("the cut stream ended cleanly")
	}
	code := <-gw.done
	out := gw.out.String()
	if code != 1 || !strings.Contains(out, "bulkhead gateway: bulkhead main: 1 in flight, 0 queued at the deadline") || strings.Contains(out, "bulkhead idle") || strings.Contains(out, "drained") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(gw.err.String(), `"end":"shutdown"`) {
		t.Fatalf("no line for the cut stream:\n%s", gw.err.String())
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir, and returns their paths and a pool that trusts it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "bulkhead test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = dir+"/cert.pem", dir+"/key.pem"
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestGatewayTLS: with tls: the gateway serves HTTPS with the certificate,
// and authenticates its clients over it.
func TestGatewayTLS(t *testing.T) {
	up, _ := holdingUpstream(t)
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	t.Setenv("TEST_CLIENT_KEY", "gw-client-key-0123456789")
	t.Setenv("TEST_UPSTREAM_KEY", "sk-upstream")
	cfg := writeConfig(t, `listen: "127.0.0.1:0"
tls: {cert_file: "`+certFile+`", key_file: "`+keyFile+`"}
clients: {app: {key_env: TEST_CLIENT_KEY}}
upstreams: {openai: {base_url: "`+up+`", api_key_env: TEST_UPSTREAM_KEY}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 4}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`)
	if code, out, errOut := runArgs("gateway", "-config", cfg, "-check"); code != 0 || !strings.Contains(out, "1 client, listen https://127.0.0.1:0") {
		t.Fatalf("check: exit %d, %q %q", code, out, errOut)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw := startGateway(t, ctx, cfg)
	if !strings.HasPrefix(gw.url, "https://") {
		t.Fatalf("listening on %s", gw.url)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, key := range []string{"", "gw-client-key-0123456789"} {
		req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if want := map[bool]int{false: 401, true: 200}[key != ""]; res.StatusCode != want || res.TLS == nil {
			t.Fatalf("key %q: %d over TLS %v; want %d", key, res.StatusCode, res.TLS != nil, want)
		}
	}
	cancel()
	if code := <-gw.done; code != 0 {
		t.Fatalf("exit %d:\n%s", code, gw.out.String())
	}
}

// TestGatewayCheckSafety: without clients, -check refuses an address other
// machines can reach unless the file allows it; listen defaults to
// loopback.
func TestGatewayCheckSafety(t *testing.T) {
	body := `upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`
	for _, tc := range []struct {
		head string
		code int
		want string
	}{
		{"", 0, "listen http://127.0.0.1:8080"},
		{"listen: \":8080\"\n", 1, `gw.yaml:1: listen: ":8080" is reachable beyond this machine and no clients are set`},
		{"listen: \":8080\"\nallow_unauthenticated: true\n", 0, "listen http://:8080"},
	} {
		code, out, errOut := runArgs("gateway", "-config", writeConfig(t, tc.head+body), "-check")
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%q: exit %d, %q %q; want %d and %q", tc.head, code, out, errOut, tc.code, tc.want)
		}
	}
}

// openFDs is the number of descriptors the process has open; -1 where
// /proc/self/fd cannot tell.
func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(entries)
}

// TestRefusedCallersDoNotHoldConnections: hundreds of clients declare a
// body, send part of it and stop, without a key, with a wrong one or with
// the right one, waiting for 100 Continue or not, to a route, a path no
// route serves, /healthz and /metrics. Each gets its answer (401, 404, 408,
// 413, 200) and its connection is closed by the gateway within the body
// timeout, while the client keeps it open: the gateway's descriptors
// return to what they were.
func TestRefusedCallersDoNotHoldConnections(t *testing.T) {
	if openFDs() < 0 {
		t.Skip("no /proc/self/fd")
	}
	const bodyTimeout = time.Second
	up, _ := holdingUpstream(t)
	t.Setenv("TEST_CLIENT_KEY", "gw-client-key-0123456789")
	t.Setenv("TEST_UPSTREAM_KEY", "sk-upstream")
	cfg := writeConfig(t, `listen: "127.0.0.1:0"
body_timeout: 1s
log: {format: json, requests: none}
clients: {app: {key_env: TEST_CLIENT_KEY}}
upstreams: {openai: {base_url: "`+up+`", api_key_env: TEST_UPSTREAM_KEY}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 4}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw := startGateway(t, ctx, cfg)
	addr := strings.TrimPrefix(gw.url, "http://")
	// The first request on a connection sets up what the server keeps for
	// good (its poller, its buffers): count from there.
	if st := status(gw.url + "/healthz"); st != 200 {
		t.Fatalf("/healthz: %d", st)
	}
	baseline := openFDs()

	const (
		key     = "Authorization: Bearer gw-client-key-0123456789\r\n"
		wrong   = "Authorization: Bearer not-a-key-of-this-gateway\r\n"
		expect  = "Expect: 100-continue\r\n"
		chunked = "Transfer-Encoding: chunked\r\n"
	)
	length := func(n int) string { return fmt.Sprintf("Content-Length: %d\r\n", n) }
	variants := []struct {
		name, method, path, headers, part string
		status                            int
	}{
		{"no key", "POST", "/v1/chat/completions", length(1 << 20), `{"model":"gpt-4o"`, 401},
		{"wrong key", "POST", "/v1/chat/completions", wrong + length(1<<20), `{"model":"gpt-4o"`, 401},
		{"no key, 100-continue", "POST", "/v1/chat/completions", expect + length(1<<20), "", 401},
		{"wrong key, 100-continue", "POST", "/v1/chat/completions", wrong + expect + length(100_000), "", 401},
		{"no key, chunked", "POST", "/v1/chat/completions", chunked, "100\r\n{\"model\":", 401},
		{"no key, 1 GiB declared", "POST", "/v1/chat/completions", length(1 << 30), "{", 401},
		{"no route", "POST", "/v1/no/such/api", key + length(100_000), "{", 404},
		{"no route, 100-continue", "POST", "/v1/no/such/api", key + expect + length(100_000), "", 404},
		{"/healthz", "GET", "/healthz", length(100_000), "x", 200},
		{"/metrics", "GET", "/metrics", length(100_000), "x", 200},
		{"/metrics, 100-continue", "GET", "/metrics", expect + length(100_000), "", 200},
		{"body too slow", "POST", "/v1/chat/completions", key + length(100_000), `{"model":`, 408},
		{"body too slow, chunked", "POST", "/v1/chat/completions", key + chunked, "100\r\n{\"model\":", 408},
		{"body too large", "POST", "/v1/chat/completions", key + length(40<<20), `{"model":`, 413},
	}
	const clients = 280
	type outcome struct {
		status int
		held   bool // still open at the deadline
		err    error
	}
	conns := make([]net.Conn, clients)
	outcomes := make([]outcome, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	start := time.Now()
	for i := range conns {
		v := variants[i%len(variants)]
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		conns[i] = c
		if _, err := io.WriteString(c, v.method+" "+v.path+" HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+v.headers+"\r\n"+v.part); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	// Each client reads its answer, then waits for the gateway to close
	// the connection, up to the body timeout and some slack.
	deadline := start.Add(bodyTimeout + 4*time.Second)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(deadline)
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err == nil {
				outcomes[i].status = res.StatusCode
				_, err = io.Copy(io.Discard, res.Body)
				if err == nil {
					_, err = io.Copy(io.Discard, br) // until the gateway closes
				}
			}
			var ne net.Error
			outcomes[i].held = errors.As(err, &ne) && ne.Timeout()
			outcomes[i].err = err
		}()
	}
	wg.Wait()
	for i, o := range outcomes {
		v := variants[i%len(variants)]
		switch {
		case o.held:
			t.Errorf("%s (client %d): the connection is still open %v after the request (answer %d)", v.name, i, time.Since(start).Round(time.Millisecond), o.status)
		case o.status != v.status:
			t.Errorf("%s (client %d): answered %d (%v); want %d", v.name, i, o.status, o.err, v.status)
		}
	}
	// The gateway's own descriptors are back where they were: the clients
	// still hold theirs.
	testutil.WaitFor(t, "the gateway's connections to close", func() bool { return openFDs() <= baseline+clients })
	for _, c := range conns {
		c.Close()
	}
	testutil.WaitFor(t, "the descriptors to return to the baseline", func() bool { return openFDs() <= baseline })
}
