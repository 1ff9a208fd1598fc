//go:build unix

package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// TestGatewayReloadsOnSIGHUP: SIGHUP makes the gateway read its file again
// and apply it, the stream in flight going on; a file that is not valid
// changes nothing and says why on standard error.
func TestGatewayReloadsOnSIGHUP(t *testing.T) {
	up, release := holdingUpstream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	text := strings.Replace(strings.Replace(shutdownConfig, "UPSTREAM", up, 1), "shutdown_delay: 5s\n", "", 1)
	path := writeConfig(t, text)
	gw := startGateway(t, ctx, path)
	held, br := openStream(t, gw.url)
	defer held.Body.Close()

	hangup := func(text, want string, out *testutil.Buffer) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the reload's message", func() bool { return strings.Contains(out.String(), want) })
	}
	hangup(strings.Replace(text, "max_concurrent: 4", "max_concurrent: 1", 1),
		"bulkhead gateway: reloaded "+path+": revision 2: bulkheads.main.max_concurrent: 4 -> 1\n", gw.out)
	res, err := http.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a call beyond the new limit: %d, want 503", res.StatusCode)
	}
	hangup(text+"bogus: 1\n", "bulkhead gateway: reload invalid: "+path+", revision 2 stays: gateway: "+path+":7: unknown key \"bogus\"", gw.err)

	close(release)
	if rest, err := io.ReadAll(br); err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("the stream in flight: %q, %v", rest, err)
	}
	cancel()
	if code := <-gw.done; code != 0 {
		t.Errorf("exit %d:\n%s", code, gw.out.String())
	}
	for _, want := range []string{`"msg":"configuration reload","result":"applied","revision":2`, `"msg":"configuration reload","result":"invalid","revision":2`} {
		if !strings.Contains(gw.err.String(), want) {
			t.Errorf("the request log has no %s:\n%s", want, gw.err.String())
		}
	}
}
