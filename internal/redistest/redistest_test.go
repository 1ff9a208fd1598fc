package redistest_test

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServerLifecycle(t *testing.T) {
	s := redistest.Start(t)
	if !s.Running() {
		t.Fatal("server not running after Start")
	}
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Do("GET", "k"); err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v; want v", got, err)
	}
	if got, _ := s.Do("CONFIG", "GET", "save"); got != "save\n" {
		t.Errorf("CONFIG GET save = %q, want persistence off", got)
	}
	if _, err := s.Do("NOSUCHCOMMAND"); err == nil {
		t.Error("an unknown command returned no error")
	}

	s.Stop()
	if s.Running() {
		t.Fatal("server running after Stop")
	}
	if _, err := redistest.Do(s.Addr(), "PING"); err == nil {
		t.Fatal("PING answered after Stop")
	}
	s.Stop() // idempotent

	s.Restart()
	if got, err := s.Do("GET", "k"); err != nil || got != "" {
		t.Fatalf("after Restart GET k = %q, %v; want an empty dataset", got, err)
	}
}

func TestTwoServersDistinctPorts(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t, "--maxmemory", "10mb")
	if a.Port() == b.Port() {
		t.Fatalf("both servers on port %d", a.Port())
	}
	if got, err := b.Do("CONFIG", "GET", "maxmemory"); err != nil || !strings.HasSuffix(got, "10485760") {
		t.Fatalf("extra arguments not applied: %q, %v", got, err)
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes))
	}
	for _, n := range c.Nodes {
		info, err := n.Do("CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") {
			t.Fatalf("%s: CLUSTER INFO = %q, %v", n.Addr(), info, err)
		}
	}
}
