package pacer

import (
	_ "embed"
	"encoding/json"
	"math"
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

// upstreamStep is a transcription of the upstream library's step function
// (its Lua script, on float seconds as it keeps them), the algorithm this
// package departs from on purpose (see step). It decides the public
// vectors as this package does (TestUpstreamTranscription), and the
// vectors of TestWhereUpstreamDiffers otherwise.
type upstreamStep struct {
	qps, burst       float64
	level, last, nxt float64 // the bucket, the last drip and the next shot, in seconds
	saved            bool
}

// push decides a call of weight at now (seconds) and returns its delay in
// milliseconds, rounded half up as upstream rounds it.
func (u *upstreamStep) push(now, weight float64, rateLimit bool) int64 {
	factor := 0.5
	if rateLimit {
		factor = 1
	}
	level, last, nxt := u.level, u.last, u.nxt
	if !u.saved {
		level, last, nxt = 0, now, 0
	}
	nxt = math.Max(nxt, now)
	if nxt <= now {
		level = math.Max(0, level-(now-last)*u.qps*factor) // the whole time since the last call
	}
	last = now
	level += weight
	shot := now
	if level-u.burst > 0 {
		shot = nxt
		nxt = shot + weight/u.qps
	}
	level = math.Min(u.burst, level)
	if !rateLimit || shot <= now { // a rejection records nothing
		u.level, u.last, u.nxt, u.saved = level, last, nxt, true
	}
	return int64(math.Floor((shot-now)*1000 + 0.5))
}

// TestUpstreamTranscription checks upstreamStep against the public
// vectors: it is upstream's algorithm as far as they tell.
func TestUpstreamTranscription(t *testing.T) {
	v := loadVectors(t)
	for _, c := range v.Cases {
		u := &upstreamStep{qps: c.QPS, burst: c.MaxBurst}
		ms := v.StartEpochMs
		for i, s := range c.Steps {
			ms += s.AdvanceMs
			if got := u.push(float64(ms)/1000, s.Weight, s.Method == "rateLimit"); got != s.WantDelayMs {
				t.Errorf("%s step %d: upstream transcription %d ms, want %d", c.Name, i, got, s.WantDelayMs)
			}
		}
	}
}

// TestWhereUpstreamDiffers replays the vectors on which this package
// decides otherwise than upstream's step function, on purpose (the public
// vectors never reach these cases), on both stores, and checks that the
// transcription of upstream's step gives upstream's delays: the differences
// docs/choices.md lists.
func TestWhereUpstreamDiffers(t *testing.T) {
	type vstep struct {
		advanceMs      int64
		rateLimit      bool
		upstream, ours int64 // delay in ms
	}
	for _, c := range []struct {
		name       string
		qps, burst float64
		steps      []vstep
	}{
		// A burst refills only once the queue has emptied: upstream
		// drains the bucket for the time the queue was busy too, and lets
		// two calls through 100 ms after the queue empties (7 calls in
		// 300 ms at 10 a second with a burst of 2; the bound is 6).
		{"refill after a busy queue", 10, 2, []vstep{
			{0, false, 0, 0}, {0, false, 0, 0}, {0, false, 0, 0},
			{0, false, 100, 100}, {0, false, 200, 200},
			{300, false, 0, 0}, {0, false, 0, 100},
		}},
		// A call goes only at its slot: upstream rounds a delay under
		// half a millisecond to 0 and lets the call through without
		// recording it, so every call of that half millisecond goes.
		// (At 3 a second the slot is 333.334 ms away here, 333.333 ms
		// upstream: a call books w/qps rounded up to the microsecond.)
		{"under half a millisecond early", 3, 0, []vstep{
			{0, true, 0, 0}, {333, true, 0, 1}, {0, true, 0, 1}, {0, true, 0, 1},
		}},
	} {
		u := &upstreamStep{qps: c.qps, burst: c.burst}
		for _, b := range backends(t, startEpoch) {
			t.Run(c.name+"/"+b.name, func(t *testing.T) {
				p := mustNew(t, b.store, Options{Name: t.Name(), QPS: c.qps, MaxBurst: c.burst})
				for i, s := range c.steps {
					b.clk.Add(time.Duration(s.advanceMs) * time.Millisecond)
					var out Outcome
					var err error
					if s.rateLimit {
						out, err = p.RateLimit(bg, "k", 1)
					} else {
						out, err = p.Pace(bg, "k", 1)
					}
					if err != nil {
						t.Fatal(err)
					}
					if out.DelayMs() != s.ours {
						t.Errorf("step %d: delay %d ms, want %d", i, out.DelayMs(), s.ours)
					}
				}
			})
		}
		ms := startEpoch.UnixMilli()
		differs := false
		for i, s := range c.steps {
			ms += s.advanceMs
			got := u.push(float64(ms)/1000, 1, s.rateLimit)
			if got != s.upstream {
				t.Errorf("%s step %d: upstream transcription %d ms, want %d", c.name, i, got, s.upstream)
			}
			differs = differs || s.upstream != s.ours
		}
		if !differs {
			t.Errorf("%s: upstream and this package agree on every step", c.name)
		}
	}
	// The saturated key of TestSaturatedKey, a call every 10 ms for 20 s
	// at 60 a minute: upstream admits 43 with a burst of 4 and 40 with a
	// burst of 1 (this package at most 25 and 22, the bound).
	for _, c := range []struct {
		burst float64
		want  int
	}{{4, 43}, {1, 40}} {
		u := &upstreamStep{qps: 1, burst: c.burst}
		admitted := 0
		for ms := int64(0); ms < 20_000; ms += 10 {
			if u.push(float64(startEpoch.UnixMilli()+ms)/1000, 1, true) == 0 {
				admitted++
			}
		}
		if admitted != c.want {
			t.Errorf("upstream admits %d calls of a saturated key in 20 s at 60 a minute with a burst of %v, want %d", admitted, c.burst, c.want)
		}
	}
}
