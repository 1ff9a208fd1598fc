package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/cmd/bulkhead/internal/demo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tiny is a small gateway-mode burst at 500x speed: each pass takes tens
// of milliseconds.
func tiny() demo.Config {
	cfg := demo.DefaultConfig()
	cfg.Gateway = true
	cfg.Calls = 80
	cfg.Ramp = 2 * time.Second
	cfg.TimeScale = 0.002
	cfg.ProviderConcurrency = 10
	cfg.ProviderTPM = 60_000
	cfg.MaxConcurrent = 9
	cfg.MaxQueue = 4
	cfg.QueueTimeout = 2 * time.Second
	cfg.TokenBudget = 18_000
	return cfg
}

func TestGatewayEndToEnd(t *testing.T) {
	cfg := tiny()
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	text := out.String()
	t.Logf("output:\n%s", text)

	bare, guard := rep.Bare, rep.Guard
	for _, r := range []demo.Result{bare, guard} {
		if r.Calls != cfg.Calls || r.OK+r.Failed429+r.Shed+r.Failed != r.Calls {
			t.Fatalf("%s: outcomes do not add up: %+v", r.Name, r)
		}
		if r.Failed != 0 {
			t.Fatalf("%s: %d calls failed otherwise", r.Name, r.Failed)
		}
		if r.OK == 0 {
			t.Fatalf("%s: nothing completed", r.Name)
		}
		p := r.Provider
		if p.InFlight != 0 || p.Requests != p.Completed+p.RateLimited || p.PeakInFlight > cfg.ProviderConcurrency {
			t.Fatalf("%s: provider stats inconsistent: %+v", r.Name, p)
		}
	}

	// Bare, the burst is a 429 storm.
	if bare.Provider.RateLimited < int64(cfg.Calls)/2 || bare.Failed429 == 0 || bare.Shed != 0 || bare.Bulkhead != nil {
		t.Fatalf("bare pass: want a storm of 429s, got %+v", bare)
	}
	// Through the gateway, the excess is shed and the provider sees far
	// fewer 429s: none over concurrency, as the bulkhead's slots are fewer
	// than the provider's.
	if guard.Provider.RateLimitedConcurrency != 0 {
		t.Fatalf("guarded pass: %d concurrency 429s", guard.Provider.RateLimitedConcurrency)
	}
	if guard.Provider.RateLimited*10 > bare.Provider.RateLimited {
		t.Fatalf("guarded pass: %d provider 429s, bare %d: want far fewer", guard.Provider.RateLimited, bare.Provider.RateLimited)
	}
	if guard.Shed == 0 || guard.Provider.PeakInFlight > cfg.MaxConcurrent || guard.Provider.PeakInFlightTokens > cfg.TokenBudget*11/10 {
		t.Fatalf("guarded pass: %+v", guard)
	}
	st := guard.Bulkhead
	if st == nil || st.Calls.Admitted != int64(guard.OK+guard.Failed429) || st.Calls.InFlight != 0 {
		t.Fatalf("bulkhead stats %+v, result %+v", st, guard)
	}
	var shed int64
	for r, n := range guard.ShedByReason {
		if r == bulkhead.Aborted || r == bulkhead.Shutdown {
			t.Fatalf("unexpected reason %v", r)
		}
		shed += n
	}
	if shed != int64(guard.Shed) {
		t.Fatalf("reasons %v sum to %d, want %d", guard.ShedByReason, shed, guard.Shed)
	}
	if guard.ShedLatency.N != guard.Shed || bare.FailLatency.N != bare.Failed429 {
		t.Fatalf("latency samples: shed %+v, bare failures %+v", guard.ShedLatency, bare.FailLatency)
	}

	for _, want := range []string{
		"bulkhead demo: a burst of 80 gpt-4o calls",
		"bulkhead  MaxConcurrent 9, MaxQueue 4, QueueTimeout 2s, TokenBudget 18,000",
		"through gateway",
		"over real HTTP, on the wall clock",
		"completed OK",
		"shed by the bulkhead",
		"provider 429s",
		"latency of OK calls p50 / p99",
		"peak calls in flight at provider",
		"wall time",
		"Bare: the burst became a storm of",
		"Through the gateway (over HTTP):",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	row := func(label string) []string {
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), label) {
				return strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), label))
			}
		}
		t.Fatalf("no row %q", label)
		return nil
	}
	if got := row("provider 429s"); len(got) != 2 || got[0] == "0" {
		t.Errorf("provider 429s row = %v, want bare > 0", got)
	}
	if got := row("calls sent"); len(got) != 2 || got[0] != "80" || got[1] != "80" {
		t.Errorf("calls sent row = %v", got)
	}
}

// TestGatewayModeProviderSpeaksOpenAI: in gateway mode the simulated
// provider is served as 'bulkhead provider' serves it, with OpenAI's
// rate-limit headers on every answer, which the gateway reads: its
// bulkhead learns the account's headroom.
func TestGatewayModeProviderSpeaksOpenAI(t *testing.T) {
	cfg := tiny()
	cfg.Calls = 10
	rep, err := demo.Run(context.Background(), cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if st := rep.Guard.Bulkhead; st == nil || st.Cooldown.HeadroomReports == 0 {
		t.Fatalf("the gateway's bulkhead had no headroom report from the provider: %+v", st)
	}
}

func TestGatewayCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := demo.Run(ctx, tiny(), &bytes.Buffer{}); err == nil {
		t.Fatal("Run with a cancelled context = nil error")
	}
}

func TestGatewayCancelledMidway(t *testing.T) {
	cfg := tiny()
	cfg.TimeScale = 1 // far too slow to finish
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		_, err := demo.Run(ctx, cfg, &out)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run = nil error after cancel")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop after cancel")
	}
}

func TestValidate(t *testing.T) {
	def := demo.DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for name, edit := range map[string]func(*demo.Config){
		"-calls":          func(c *demo.Config) { c.Calls = -1 },
		"-scenario":       func(c *demo.Config) { c.Scenario = "no-such" },
		"-attempts":       func(c *demo.Config) { c.Attempts = 0 },
		"-time-scale":     func(c *demo.Config) { c.TimeScale = 0 },
		"-max-concurrent": func(c *demo.Config) { c.MaxConcurrent = 0 },
		"-max-queue":      func(c *demo.Config) { c.MaxQueue = -1 },
		"-token-budget":   func(c *demo.Config) { c.TokenBudget = -1 },
		"-model":          func(c *demo.Config) { c.Model = " " },
		"-retries":        func(c *demo.Config) { c.Retries = -1 },
	} {
		cfg := demo.DefaultConfig()
		edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error = %v", name, err)
		}
		if _, err := demo.Run(context.Background(), cfg, &bytes.Buffer{}); err == nil {
			t.Errorf("%s: Run accepted an invalid config", name)
		}
	}
}

func TestGatewayNoTokenBudget(t *testing.T) {
	cfg := tiny()
	cfg.TokenBudget = 0
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Guard.Bulkhead.TokenBudget != nil || rep.Guard.ShedByReason[bulkhead.BudgetLimit] != 0 {
		t.Fatalf("token budget present: %+v", rep.Guard.Bulkhead)
	}
	if !strings.Contains(out.String(), "no token budget") {
		t.Fatalf("output:\n%s", out.String())
	}
}
