package demo_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/cmd/bulkhead/internal/demo"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run go test -update if the change is meant):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func runTable(t *testing.T, cfg demo.Config) (*demo.Report, string) {
	t.Helper()
	var out bytes.Buffer
	rep, err := demo.Run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep, out.String()
}

// TestTableGolden pins the default table, at the default seed, byte for
// byte: the demo's numbers are a pure function of the seed.
func TestTableGolden(t *testing.T) {
	rep, out := runTable(t, demo.DefaultConfig())
	golden(t, "table.golden", []byte(out))
	checkTable(t, rep.Table)
}

// TestTableDeterministic runs the same scenarios twice at another seed and
// wants the same bytes.
func TestTableDeterministic(t *testing.T) {
	for _, sc := range []string{"burst-100", "two-tenants"} {
		cfg := demo.DefaultConfig()
		cfg.Seed, cfg.Scenario = 7, sc
		_, a := runTable(t, cfg)
		_, b := runTable(t, cfg)
		if a != b {
			t.Fatalf("%s: two runs at seed 7 differ:\n%s\n---\n%s", sc, a, b)
		}
		cfg.Seed = 8
		if _, c := runTable(t, cfg); c == a {
			t.Errorf("%s: seeds 7 and 8 print the same table", sc)
		}
	}
}

// checkTable checks what every run must satisfy, whatever the numbers.
func checkTable(t *testing.T, tb *demo.Table) {
	t.Helper()
	if tb == nil || len(tb.Rows) == 0 {
		t.Fatal("no table")
	}
	for _, row := range tb.Rows {
		if len(row.Results) != len(tb.Strategies) {
			t.Fatalf("%s: %d results for %d strategies", row.Scenario, len(row.Results), len(tb.Strategies))
		}
		for _, r := range append(append([]demo.SimResult(nil), row.Results...), row.Unloaded...) {
			name := row.Scenario + "/" + r.Strategy
			tot := r.Total
			if tot.Completed+tot.Failed != tot.Calls || tot.Latency.N != tot.Completed {
				t.Errorf("%s: outcomes do not add up: %+v", name, tot)
			}
			p := r.Provider
			if p.InFlight != 0 || p.Requests != p.Completed+p.RateLimited || p.RateLimited != int64(tot.Provider429) || p.Completed != int64(tot.Completed) {
				t.Errorf("%s: provider %+v, clients %+v", name, p, tot)
			}
			if r.Strategy == "bare" && (len(r.Bulkheads) != 0 || tot.Rejections != 0) {
				t.Errorf("%s: bare run went through a bulkhead", name)
			}
			var admitted, rejected int64
			for _, st := range r.Bulkheads {
				if st.Calls.InFlight != 0 || st.Gate.Pending != 0 {
					t.Errorf("%s: bulkhead not idle at the end: %+v", name, st.Calls)
				}
				admitted += st.Calls.Admitted
				for _, n := range st.Calls.RejectedByReason {
					rejected += n
				}
			}
			if len(r.Bulkheads) > 0 && (admitted != p.Requests || rejected != int64(tot.Rejections)) {
				t.Errorf("%s: %d admitted for %d provider requests, %d rejected for %d seen by clients", name, admitted, p.Requests, rejected, tot.Rejections)
			}
		}
	}
}

func TestOneScenario(t *testing.T) {
	cfg := demo.DefaultConfig()
	cfg.Scenario = "two-tenants"
	rep, out := runTable(t, cfg)
	if len(rep.Table.Rows) != 1 || rep.Table.Rows[0].Key != "two-tenants" || rep.Table.Rows[0].Unloaded == nil {
		t.Fatalf("rows %+v", rep.Table.Rows)
	}
	for _, want := range []string{"two tenants", "quiet tenant", "p99 alone", "Verdict:", "a class per tenant (3 slots protected each), fair queue, waits for capacity"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "burst of 50") {
		t.Errorf("output has other scenarios:\n%s", out)
	}
	checkTable(t, rep.Table)

	// -calls runs one burst of its own, over -ramp.
	cfg = demo.DefaultConfig()
	cfg.Calls, cfg.Ramp = 50, 0
	rep, out = runTable(t, cfg)
	if len(rep.Table.Rows) != 1 || !strings.Contains(out, "burst of 50 ") {
		t.Fatalf("-calls 50: %s", out)
	}
	checkTable(t, rep.Table)
}

func TestTableCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := demo.RunTable(ctx, demo.DefaultConfig()); err == nil {
		t.Fatal("RunTable with a cancelled context = nil error")
	}
}

// endsLater is a context whose Err turns non-nil at its n-th call: the
// simulation checks it every 1,024 events, on its own goroutine, so the run
// is cancelled midway, deterministically.
type endsLater struct {
	context.Context
	n int
}

func (c *endsLater) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// TestTableCancelledMidway cancels runs that hold permits and queue calls;
// goleak (TestMain) checks that their bulkheads are shut down.
func TestTableCancelledMidway(t *testing.T) {
	cfg := demo.DefaultConfig()
	cfg.Scenario = "burst-1000"
	tb, err := demo.RunTable(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Each run checks once at its start and once every 1,024 events.
	checks := 0
	for i, r := range tb.Rows[0].Results {
		n := checks + 1 + int(r.Events/1024)/2 // halfway through run i
		_, err := demo.RunTable(&endsLater{Context: context.Background(), n: n}, cfg)
		if err != context.Canceled {
			t.Fatalf("cancelled halfway through %s: err = %v, want context.Canceled", tb.Strategies[i], err)
		}
		checks += 1 + int(r.Events/1024)
	}
}

func TestScenarios(t *testing.T) {
	got := strings.Join(demo.Scenarios(), " ")
	if got != "burst-50 burst-100 burst-400 burst-1000 capacity-halves two-tenants" {
		t.Fatalf("Scenarios() = %s", got)
	}
}

// TestChecks judges made-up numbers: the verdict is computed from them.
func TestChecks(t *testing.T) {
	res := func(done, n429 int) demo.SimResult {
		return demo.SimResult{Total: demo.TenantResult{Completed: done, Provider429: n429}}
	}
	quiet := func(r demo.SimResult, p99 time.Duration) demo.SimResult {
		r.Tenants = []demo.TenantResult{{Latency: demo.Latencies{P99: p99}}}
		return r
	}
	tb := &demo.Table{Strategies: []string{"bare", "static", "adaptive"}, Rows: []demo.Row{
		{Scenario: "a", Results: []demo.SimResult{res(50, 200), res(0, 0), res(50, 1)}}, // 1 < 1% of 200: holds
		{Scenario: "b", Results: []demo.SimResult{res(50, 100), res(0, 0), res(49, 1)}}, // fewer; 1 is 1%: fails
		{Scenario: "c", Results: []demo.SimResult{res(10, 0), res(0, 0), res(10, 0)}},   // no 429s at all: holds
		{Scenario: "d", Results: []demo.SimResult{res(10, 0), res(0, 0), res(11, 1)}},   // bare had none: fails
		{Scenario: "e", Results: []demo.SimResult{quiet(res(5, 9), 0), res(0, 0), quiet(res(5, 0), 20*time.Second)},
			Unloaded: []demo.SimResult{{}, {}, quiet(res(5, 0), 10*time.Second)}}, // exactly twice: holds
		{Scenario: "f", Results: []demo.SimResult{quiet(res(5, 9), 0), res(0, 0), quiet(res(5, 0), 21*time.Second)},
			Unloaded: []demo.SimResult{{}, {}, quiet(res(5, 0), 10*time.Second)}},
	}}
	var got []string
	for _, c := range tb.Checks() {
		got = append(got, fmt.Sprintf("%s:%v", c.Row, c.Holds))
	}
	want := "a:true a:true b:false b:false c:true c:true d:true d:false e:true e:true e:true f:true f:true f:false"
	if strings.Join(got, " ") != want {
		t.Fatalf("checks = %s\nwant     %s", strings.Join(got, " "), want)
	}
}
