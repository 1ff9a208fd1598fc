package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// startProvider runs the provider command with args on a free loopback
// port until ctx ends, and waits for it to listen.
func startProvider(t *testing.T, ctx context.Context, args ...string) *runningCommand {
	t.Helper()
	return startCommand(t, ctx, append([]string{"provider", "-listen", "127.0.0.1:0"}, args...)...)
}

// postJSON posts body to url and returns the status and the decoded answer.
func postJSON(t *testing.T, url, body string, header ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%d %q: %v", res.StatusCode, raw, err)
	}
	return res.StatusCode, m
}

// TestProviderCommand serves the simulated provider, answers a chat
// completion with any key, and stops cleanly when its context ends (as on
// SIGINT or SIGTERM), saying what it served.
func TestProviderCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := startProvider(t, ctx, "-time-scale", "0.001", "-rpm", "10")
	status, m := postJSON(t, p.url+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		"Authorization", "Bearer any-key-at-all")
	if status != 200 || m["object"] != "chat.completion" {
		t.Fatalf("%d %v", status, m)
	}
	if !strings.Contains(p.err.String(), "path=/v1/chat/completions model=gpt-4o status=200") {
		t.Errorf("request log %q", p.err.String())
	}
	cancel()
	if code := <-p.done; code != 0 || !strings.Contains(p.out.String(), "bulkhead provider: stopped: 1 request, 1 answered, 0 over a limit") {
		t.Fatalf("exit %d: %s%s", code, p.out.String(), p.err.String())
	}
}

func TestProviderHelpAndUsageErrors(t *testing.T) {
	code, _, errOut := runArgs("provider", "-h")
	if code != 0 {
		t.Errorf("provider -h: exit %d", code)
	}
	for _, want := range []string{"Any API key is accepted", "-listen", "127.0.0.1:8081", "-rpm", "-tpm", "-itpm", "-otpm", "-concurrency", "-time-scale", "-seed", "-default-max-tokens", "-quiet"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("provider -h lacks %q:\n%s", want, errOut)
		}
	}
	if _, out, _ := runArgs("-h"); !strings.Contains(out, "provider") {
		t.Errorf("usage does not list the provider command:\n%s", out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"provider", "-rpm", "-1"}, "-rpm must be >= 0"},
		{[]string{"provider", "-otpm", "-5"}, "-otpm must be >= 0"},
		{[]string{"provider", "-concurrency", "-1"}, "-concurrency must be >= 0"},
		{[]string{"provider", "-time-scale", "0"}, "-time-scale must be > 0"},
		{[]string{"provider", "-default-max-tokens", "0"}, "-default-max-tokens must be from 1 to"},
		{[]string{"provider", "-nope"}, "flag provided but not defined"},
		{[]string{"provider", "extra"}, "unexpected arguments: extra"},
	} {
		code, out, errOut := runArgs(tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	code, _, errOut = runArgs("provider", "-listen", "256.0.0.1:1")
	if code != 1 || !strings.Contains(errOut, "bulkhead provider: listen tcp") {
		t.Errorf("a bad address: exit %d, %q", code, errOut)
	}
}

// TestQuickStartWithProvider runs the gateway quick start the README
// gives, end to end: the provider command in one place, the gateway
// command with examples/provider.yaml in another (its address set to the
// provider's, as its comment says), then the curl, which gets a chat
// completion with the provider's usage.
func TestQuickStartWithProvider(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := startProvider(t, ctx, "-time-scale", "0.001", "-quiet")
	example, err := os.ReadFile("../../examples/provider.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(example)
	for _, want := range []string{`base_url: "http://127.0.0.1:8081"`, `listen: "127.0.0.1:8080"`, "go run ./cmd/bulkhead provider", "go run ./cmd/bulkhead gateway -config examples/provider.yaml", "curl "} {
		if !strings.Contains(text, want) {
			t.Fatalf("examples/provider.yaml lacks %q", want)
		}
	}
	text = strings.Replace(text, `base_url: "http://127.0.0.1:8081"`, `base_url: "`+p.url+`"`, 1)
	text = strings.Replace(text, `listen: "127.0.0.1:8080"`, `listen: "127.0.0.1:0"`, 1)
	gw := startGateway(t, ctx, writeConfig(t, text))

	// The curl of the file's comment and of the README.
	status, m := postJSON(t, gw.url+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	if status != 200 || m["object"] != "chat.completion" {
		t.Fatalf("%d %v", status, m)
	}
	u := m["usage"].(map[string]any)
	if u["prompt_tokens"].(float64) <= 0 || u["completion_tokens"].(float64) <= 0 || u["total_tokens"] != u["prompt_tokens"].(float64)+u["completion_tokens"].(float64) {
		t.Errorf("usage %v", u)
	}
	// Every API of the file goes through to the provider.
	for path, body := range map[string]string{
		"/v1/responses": `{"model":"gpt-4o","input":"hi"}`,
		"/v1/messages":  `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`,
		"/v1beta/models/gemini-2.5-flash:generateContent": `{"contents":[{"parts":[{"text":"hi"}]}]}`,
	} {
		if status, m := postJSON(t, gw.url+path, body, "X-Api-Key", "anything"); status != 200 {
			t.Errorf("%s: %d %v", path, status, m)
		}
	}
	cancel()
	if code := <-gw.done; code != 0 {
		t.Errorf("gateway exit %d: %s%s", code, gw.out.String(), gw.err.String())
	}
	if code := <-p.done; code != 0 {
		t.Errorf("provider exit %d: %s%s", code, p.out.String(), p.err.String())
	}
}
