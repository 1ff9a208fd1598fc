package pacer

import (
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestTableAgreesWithLocal checks that a Table, told the time, decides as
// a Local store on the same clock: the same outcomes for every call, alone
// and in composites, in every mode.
func TestTableAgreesWithLocal(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		clk := newManualClock(startEpoch)
		local := NewLocal(LocalOptions{Clock: clk})
		table := NewTable()
		n := rapid.IntRange(1, 3).Draw(rt, "pacers")
		var lps, tps []*Pacer
		for i := 0; i < n; i++ {
			opts := Options{
				Name:     "p" + strconv.Itoa(i),
				QPS:      rapid.SampledFrom([]float64{0.5, 1, 10, 1000.0 / 60, 1e4}).Draw(rt, "qps"),
				MaxBurst: rapid.SampledFrom([]float64{0, 1, 2.5, 10}).Draw(rt, "burst"),
			}
			lps = append(lps, mustNew(t, local, opts))
			tps = append(tps, mustNew(t, table, opts))
		}
		lc, _ := NewComposite(lps...)
		tc, _ := NewComposite(tps...)
		for s := rapid.IntRange(1, 80).Draw(rt, "steps"); s > 0; s-- {
			clk.Add(time.Duration(rapid.Int64Range(-1000, 2_000_000).Draw(rt, "advanceUs")) * time.Microsecond)
			table.SetTime(clk.Now())
			key := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "key")
			w := rapid.SampledFrom([]float64{0, 1, 3, 0.5}).Draw(rt, "weight")
			i := rapid.IntRange(0, n-1).Draw(rt, "pacer")
			var lo, to CompositeOutcome
			var lerr, terr error
			switch rapid.IntRange(0, 4).Draw(rt, "mode") {
			case 0:
				lo.Outcome, lerr = lps[i].RateLimit(bg, key, w)
				to.Outcome, terr = tps[i].RateLimit(bg, key, w)
			case 1:
				lo.Outcome, lerr = lps[i].Pace(bg, key, w)
				to.Outcome, terr = tps[i].Pace(bg, key, w)
			case 2:
				lo, lerr = lc.RateLimit(bg, key, w)
				to, terr = tc.RateLimit(bg, key, w)
			case 3:
				lo, lerr = lc.PaceWithin(bg, key, 300*time.Millisecond, w)
				to, terr = tc.PaceWithin(bg, key, 300*time.Millisecond, w)
			case 4:
				lo, lerr = lc.Book(bg, key, time.Second, w)
				to, terr = tc.Book(bg, key, time.Second, w)
			}
			if (lerr == nil) != (terr == nil) || lo.Outcome != to.Outcome || len(lo.Members) != len(to.Members) {
				rt.Fatalf("local %+v (%v), table %+v (%v)", lo, lerr, to, terr)
			}
			for j := range lo.Members {
				if lo.Members[j] != to.Members[j] {
					rt.Fatalf("member %d: local %+v, table %+v", j, lo.Members[j], to.Members[j])
				}
			}
		}
	})
}

func TestTableDropsExpiredState(t *testing.T) {
	table := NewTable()
	table.SetTime(startEpoch)
	p := mustNew(t, table, Options{Name: "p", QPS: 10})
	for i := 0; i < 100; i++ {
		if _, err := p.RateLimit(bg, strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if table.Len() != 100 {
		t.Fatalf("Len %d, want 100", table.Len())
	}
	table.SetTime(startEpoch.Add(time.Hour))
	for i := 0; i < 60; i++ { // each decision sweeps two entries
		_, _ = p.RateLimit(bg, "other", 1)
	}
	if table.Len() != 1 {
		t.Fatalf("Len %d after the state expired, want 1", table.Len())
	}
}
