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

	// A count of one takes the singular.
	cfg.Calls, cfg.Attempts = 1, 1
	if _, out = runTable(t, cfg); !strings.Contains(out, "try a call up to 1 time;") || !strings.Contains(out, "completed 1 call, bare 1") {
		t.Errorf("-calls 1 -attempts 1:\n%s", out)
	}
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

// TestVerdictSaysWhatEachColumnBoughtAndCost judges made-up numbers: for
// each row and each column, the 429s it avoided against bare, the calls it
// finished and the latency it paid; then the last column's targets.
func TestVerdictSaysWhatEachColumnBoughtAndCost(t *testing.T) {
	res := func(done, n429 int, p50 time.Duration) demo.SimResult {
		n := done
		return demo.SimResult{Total: demo.TenantResult{Completed: done, Provider429: n429, Latency: demo.Latencies{N: n, P50: p50}}}
	}
	s := time.Second
	tb := &demo.Table{Strategies: []string{"bare", "static", "adaptive"}, Rows: []demo.Row{
		{Scenario: "a", Results: []demo.SimResult{res(50, 24, 5790*time.Millisecond), res(50, 0, 5880*time.Millisecond), res(50, 0, 23600*time.Millisecond)}},
		{Scenario: "b", Results: []demo.SimResult{res(63, 5707, 7250*time.Millisecond), res(113, 0, 11900*time.Millisecond), res(369, 0, 190*s)}},
		{Scenario: "c", Results: []demo.SimResult{res(214, 706, 7550*time.Millisecond), res(213, 698, 7460*time.Millisecond), res(200, 11, 24700*time.Millisecond)}},
		{Scenario: "d", Results: []demo.SimResult{res(10, 0, s), res(10, 1, s), res(9, 1, s/2)}},
		{Scenario: "e", Results: []demo.SimResult{res(0, 2, 0), res(1, 1, s), res(0, 0, 0)}},
	}}
	want := `Verdict: what each column bought against bare, and what it cost:
  a
    static: avoided all 24 of bare's provider 429s; finished as many calls as bare (50); its median finished call took 5.88s, about as long as bare's 5.79s.
    adaptive: avoided all 24 of bare's provider 429s; finished as many calls as bare (50); its median finished call took 23.6s, 4.1 times bare's 5.79s.
  b
    static: avoided all 5,707 of bare's provider 429s; finished 50 more calls than bare (113 against 63); its median finished call took 11.9s, 1.6 times bare's 7.25s.
    adaptive: avoided all 5,707 of bare's provider 429s; finished 306 more calls than bare (369 against 63); its median finished call took 190s, 26.2 times bare's 7.25s.
  c
    static: avoided 8 of bare's 706 provider 429s (it met 698); finished 1 fewer call than bare (213 against 214); its median finished call took 7.46s, about as long as bare's 7.55s.
    adaptive: avoided 695 of bare's 706 provider 429s (it met 11); finished 14 fewer calls than bare (200 against 214); its median finished call took 24.7s, 3.3 times bare's 7.55s.
  d
    static: met 1 provider 429, where bare met none; finished as many calls as bare (10); its median finished call took 1s, about as long as bare's 1s.
    adaptive: met 1 provider 429, where bare met none; finished 1 fewer call than bare (9 against 10); its median finished call took 500ms, less than bare's 1s.
  e
    static: avoided 1 of bare's 2 provider 429s (it met 1); finished 1 more call than bare (1 against 0); its median finished call took 1s (bare finished none).
    adaptive: avoided all 2 of bare's provider 429s; finished as many calls as bare (0).
  A median counts the finished calls only: a call that did not finish failed after its last attempt, and is in none.
Targets for adaptive, against bare: 4 of 10 do not hold:
  holds:         a: adaptive completed 50 calls, bare 50
  holds:         a: 0 provider 429s against bare's 24 (the target is under 1%)
  holds:         b: adaptive completed 369 calls, bare 63
  holds:         b: 0 provider 429s against bare's 5,707 (the target is under 1%)
  DOES NOT HOLD: c: adaptive completed 200 calls, bare 214
  DOES NOT HOLD: c: 11 provider 429s against bare's 706 (the target is under 1%)
  DOES NOT HOLD: d: adaptive completed 9 calls, bare 10
  DOES NOT HOLD: d: 1 provider 429 against bare's 0 (the target is under 1%)
  holds:         e: adaptive completed 0 calls, bare 0
  holds:         e: 0 provider 429s against bare's 2 (the target is under 1%)
`
	if got := tb.Verdict(); got != want {
		t.Errorf("verdict:\n%s\nwant:\n%s", got, want)
	}
	tb.Rows = tb.Rows[2:3]
	if got := tb.Verdict(); !strings.Contains(got, "Targets for adaptive, against bare: 2 of 2 do not hold:\n") {
		t.Errorf("verdict:\n%s", got)
	}
	tb.Rows[0].Results[2] = res(213, 1, s)
	if got := tb.Verdict(); !strings.Contains(got, "Targets for adaptive, against bare: 1 of 2 does not hold:\n") {
		t.Errorf("verdict:\n%s", got)
	}
}
