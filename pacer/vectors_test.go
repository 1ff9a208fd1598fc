package pacer

import (
	_ "embed"
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// pacer-vectors.json holds the upstream library's tests as data (a copy of
// /work/shared/reference/pacer-vectors.json).
//
//go:embed testdata/pacer-vectors.json
var vectorsJSON []byte

type vectorFile struct {
	StartEpochMs int64 `json:"startEpochMs"`
	Cases        []struct {
		Name     string  `json:"name"`
		QPS      float64 `json:"qps"`
		MaxBurst float64 `json:"maxBurst"`
		Steps    []struct {
			AdvanceMs   int64   `json:"advanceMs"`
			Method      string  `json:"method"`
			Weight      float64 `json:"weight"`
			WantDelayMs int64   `json:"wantDelayMs"`
			WantReason  string  `json:"wantReason"`
		} `json:"steps"`
	} `json:"cases"`
}

func loadVectors(t *testing.T) vectorFile {
	t.Helper()
	var v vectorFile
	if err := json.Unmarshal(vectorsJSON, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no vectors")
	}
	return v
}

// TestUpstreamVectors replays the upstream test suite on both stores. Each
// case starts from an empty key and a clock frozen at startEpochMs, moved by
// hand before each call.
func TestUpstreamVectors(t *testing.T) {
	v := loadVectors(t)
	for _, b := range backends(t, time.UnixMilli(v.StartEpochMs)) {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range v.Cases {
				t.Run(c.Name, func(t *testing.T) {
					// A fresh name per case is a fresh key on a shared store.
					p := mustNew(t, b.store, Options{Name: b.name + "/" + c.Name, QPS: c.QPS, MaxBurst: c.MaxBurst})
					for i, s := range c.Steps {
						b.clk.Add(time.Duration(s.AdvanceMs) * time.Millisecond)
						var out Outcome
						var err error
						switch s.Method {
						case "pace":
							out, err = p.Pace(bg, "key", s.Weight)
						case "rateLimit":
							out, err = p.RateLimit(bg, "key", s.Weight)
						default:
							t.Fatalf("unknown method %q", s.Method)
						}
						if err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						if out.DelayMs() != s.WantDelayMs {
							t.Errorf("step %d (+%dms %s): delayMs %d, want %d (%s)", i, s.AdvanceMs, s.Method, out.DelayMs(), s.WantDelayMs, out.Reason())
						}
						if s.WantReason != "" && out.Reason() != s.WantReason {
							t.Errorf("step %d: reason %q, want %q", i, out.Reason(), s.WantReason)
						}
					}
				})
			}
		})
	}
}

// TestSimultaneousPace is the upstream test "simultaneous requests are
// delayed sequentially": three concurrent calls at one instant at 10 QPS are
// spaced 100 ms apart.
func TestSimultaneousPace(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "simultaneous", QPS: 10})
			delays := make([]int64, 3)
			errs := make([]error, 3)
			parallel(3, func(i int) {
				out, err := p.Pace(bg, "key", 1)
				delays[i], errs[i] = out.DelayMs(), err
			})
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			slices.Sort(delays)
			if !slices.Equal(delays, []int64{0, 100, 200}) {
				t.Fatalf("delays %v, want [0 100 200]", delays)
			}
		})
	}
}
