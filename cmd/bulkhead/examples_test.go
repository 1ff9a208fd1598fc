package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamples checks every configuration in examples/ as
// 'bulkhead gateway -check' does, with its keys in the environment (and,
// for a file that serves TLS, a certificate made for the test in place of
// its own).
func TestExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("examples: %v, %v", files, err)
	}
	for _, k := range []string{"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "REDIS_PASSWORD"} {
		t.Setenv(k, "provider-key")
	}
	for _, k := range []string{"APP_CLIENT_KEY", "ANALYTICS_CLIENT_KEY", "WEB_CLIENT_KEY", "BATCH_CLIENT_KEY"} {
		t.Setenv(k, "client-key-"+strings.ToLower(k))
	}
	certFile, keyFile, _ := selfSigned(t, t.TempDir())
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			text, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(text), "#") {
				t.Errorf("%s does not start with a comment saying what it is for", file)
			}
			path := file
			if s := strings.NewReplacer("/etc/bulkhead/tls.crt", certFile, "/etc/bulkhead/tls.key", keyFile).Replace(string(text)); s != string(text) {
				path = writeConfig(t, s)
			}
			code, out, errOut := runArgs("gateway", "-config", path, "-check")
			if code != 0 || !strings.Contains(out, "is valid") {
				t.Fatalf("exit %d: %s%s", code, out, errOut)
			}
			t.Log(strings.TrimSpace(out))
		})
	}
}
