package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fast is one scenario of the table.
var fast = []string{"-scenario", "burst-50"}

// fastGateway is a tiny gateway-mode demo at 1000x speed.
var fastGateway = []string{"-gateway", "-calls", "40", "-ramp", "1s", "-time-scale", "0.001", "-provider-concurrency", "8",
	"-max-concurrent", "7", "-max-queue", "2", "-queue-timeout", "2s", "-token-budget", "15000"}

func runArgs(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDemoCommand(t *testing.T) {
	for name, args := range map[string][]string{
		"demo":       append([]string{"demo"}, fast...),
		"flags only": fast,
	} {
		code, out, errOut := runArgs(args...)
		if code != 0 || errOut != "" {
			t.Fatalf("%s: exit %d, stderr %q", name, code, errOut)
		}
		for _, want := range []string{"on simulated time", "burst of 50", "static bulkhead", "adaptive + fair", "Verdict:"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", name, want, out)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}} {
		code, out, _ := runArgs(args...)
		if code != 0 || !strings.Contains(out, "Commands:") || !strings.Contains(out, "demo") {
			t.Errorf("%v: exit %d, output %q", args, code, out)
		}
	}
	code, _, errOut := runArgs("demo", "-h")
	if code != 0 {
		t.Errorf("demo -h: exit %d", code)
	}
	for _, flag := range []string{"-scenario", "-attempts", "-gateway", "-calls", "-ramp", "-seed", "-time-scale", "-retries", "-provider-concurrency", "-provider-tpm", "-max-concurrent", "-max-queue", "-queue-timeout", "-token-budget"} {
		if !strings.Contains(errOut, flag) {
			t.Errorf("demo -h lacks %s:\n%s", flag, errOut)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"demo", "-no-such-flag"}, "flag provided but not defined"},
		{[]string{"demo", "-calls", "-1"}, "-calls must be >= 0"},
		{[]string{"demo", "-scenario", "nope"}, "-scenario must be one of burst-50"},
		{[]string{"demo", "extra"}, "unexpected arguments: extra"},
	} {
		code, out, errOut := runArgs(tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

func TestGatewayCheck(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/gw.yaml"
	if err := os.WriteFile(good, []byte(`listen: "127.0.0.1:0"
upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {model: gpt-4o, max_concurrent: 4, token_budget: 1000}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runArgs("gateway", "-config", good, "-check")
	if code != 0 || !strings.Contains(out, "is valid: 1 bulkhead, 0 clients, listen http://127.0.0.1:0") {
		t.Fatalf("check: exit %d, %q %q", code, out, errOut)
	}
	// One client, two bulkheads: each count with its own noun.
	t.Setenv("CHECK_UPSTREAM_KEY", "sk-check")
	two := dir + "/two.yaml"
	if err := os.WriteFile(two, []byte(`clients: {app: {key_sha256: "`+strings.Repeat("ab", 32)+`"}}
upstreams: {openai: {base_url: "https://api.openai.com", api_key_env: CHECK_UPSTREAM_KEY}}
bulkheads: {a: {max_concurrent: 4}, b: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: openai, bulkhead: a}, {api: anthropic-messages, upstream: openai, bulkhead: b}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runArgs("gateway", "-config", two, "-check"); code != 0 || !strings.Contains(out, "is valid: 2 bulkheads, 1 client, listen") {
		t.Fatalf("check: exit %d, %q %q", code, out, errOut)
	}
	bad := dir + "/bad.yaml"
	if err := os.WriteFile(bad, []byte("routes: [{api: nope}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runArgs("gateway", "-config", bad, "-check")
	if code != 1 || !strings.Contains(errOut, "bad.yaml:1: routes.0.api") {
		t.Fatalf("bad config: exit %d, %q", code, errOut)
	}
	if code, _, _ := runArgs("gateway"); code != 2 {
		t.Fatalf("no -config: exit %d", code)
	}
}

// TestGatewayServe runs the gateway, checks /healthz, and shuts it down by
// ending its context (as SIGTERM does).
func TestGatewayServe(t *testing.T) {
	dir := t.TempDir()
	cfg := dir + "/gw.yaml"
	if err := os.WriteFile(cfg, []byte(`listen: "127.0.0.1:0"
shutdown_timeout: 2s
log: {format: text}
upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {max_concurrent: 4}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gw := startGateway(t, ctx, cfg)
	res, err := http.Get(gw.url + "/healthz")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("/healthz: %v, %v", res, err)
	}
	res.Body.Close()
	cancel()
	if code := <-gw.done; code != 0 || !strings.Contains(gw.out.String(), "drained") {
		t.Fatalf("exit %d:\n%s", code, gw.out.String())
	}
}

// runningCommand is a serving command (gateway, provider) running in a
// goroutine.
type runningCommand struct {
	url      string // its base URL, such as http://127.0.0.1:43121
	out, err *testutil.Buffer
	done     chan int // its exit code
}

// startCommand runs the command of args until ctx ends, and waits for it
// to say where it listens.
func startCommand(t *testing.T, ctx context.Context, args ...string) *runningCommand {
	t.Helper()
	c := &runningCommand{out: &testutil.Buffer{}, err: &testutil.Buffer{}, done: make(chan int, 1)}
	go func() { c.done <- run(ctx, args, c.out, c.err) }()
	testutil.WaitFor(t, args[0]+" to listen", func() bool {
		s := c.out.String()
		if i := strings.Index(s, "listening on "); i >= 0 {
			c.url, _, _ = strings.Cut(s[i+len("listening on "):], "\n")
			return true
		}
		select {
		case code := <-c.done:
			t.Fatalf("%s exited %d: %s%s", args[0], code, s, c.err.String())
		default:
		}
		return false
	})
	return c
}

// startGateway runs the gateway command on the configuration file cfg
// until ctx ends, and waits for it to listen.
func startGateway(t *testing.T, ctx context.Context, cfg string) *runningCommand {
	t.Helper()
	return startCommand(t, ctx, "gateway", "-config", cfg)
}

// TestDemoGatewayMode runs the demo's guarded pass over HTTP through the
// gateway.
func TestDemoGatewayMode(t *testing.T) {
	code, out, errOut := runArgs(append([]string{"demo"}, fastGateway...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"bulkhead demo: a burst of 40 gpt-4o calls", "on the wall clock", "through gateway", "clients -> gateway -> the provider", "Through the gateway (over HTTP):", "shed by the bulkhead"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
