package pacer

import (
	"math"
	"slices"
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

// TestTableRewind: turns given back from an instant on are booked again
// from there, never before the table's time nor before weight Book
// recorded in the queue.
func TestTableRewind(t *testing.T) {
	table := NewTable()
	table.SetTime(startEpoch)
	p := mustNew(t, table, Options{Name: "p", QPS: 10})
	pace := func() time.Duration {
		t.Helper()
		out, err := p.Pace(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		return out.Delay
	}
	for range 5 {
		pace() // turns at 0, 100, ..., 400 ms
	}
	table.Rewind("p", "k", startEpoch.Add(200*time.Millisecond))
	if d := pace(); d != 200*time.Millisecond {
		t.Fatalf("after a rewind to 200ms: a turn in %v", d)
	}
	table.Rewind("p", "k", startEpoch.Add(time.Hour)) // later than the queue's end: nothing
	table.Rewind("q", "k", startEpoch)                // no such pacer: nothing
	if d := pace(); d != 300*time.Millisecond {
		t.Fatalf("after rewinds that give nothing back: a turn in %v", d)
	}
	table.SetTime(startEpoch.Add(50 * time.Millisecond))
	table.Rewind("p", "k", startEpoch) // never before the table's time
	if d := pace(); d != 0 {
		t.Fatalf("after a rewind to the past: a turn in %v", d)
	}
	// Weight spent beyond a reservation stays booked.
	if _, err := p.Book(bg, "k", time.Minute, 3); err != nil { // 150ms to 450ms
		t.Fatal(err)
	}
	pace() // 450ms
	table.Rewind("p", "k", startEpoch.Add(100*time.Millisecond))
	if d := pace(); d != 400*time.Millisecond {
		t.Fatalf("after a rewind across weight booked: a turn in %v, want 400ms (450ms from the start)", d)
	}
}

// TestTableRewindKeepsBound: an owner that gives back every turn from an
// instant on (Rewind) and books those calls again later, in their order,
// keeps the bound a rate keeps over the calls that go, as in
// TestRateBound, alone and in a composite.
func TestTableRewindKeepsBound(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		table := NewTable()
		now := startEpoch
		table.SetTime(now)
		n := rapid.IntRange(1, 2).Draw(rt, "pacers")
		var ps []*Pacer
		for i := range n {
			ps = append(ps, mustNew(t, table, Options{
				Name:     "p" + strconv.Itoa(i),
				QPS:      rapid.SampledFrom([]float64{1, 10, 1000.0 / 60}).Draw(rt, "qps"),
				MaxBurst: rapid.SampledFrom([]float64{0, 1, 2.5, 4}).Draw(rt, "burst"),
			}))
		}
		comp, err := NewComposite(ps...)
		if err != nil {
			rt.Fatal(err)
		}
		type call struct {
			at time.Time
			w  []float64
		}
		var waiting []call // turns booked, in the order they were booked
		adm := make([][]went, n)
		maxW := make([]float64, n)
		goes := func(c call) {
			for i, w := range c.w {
				adm[i] = append(adm[i], went{c.at.UnixMicro(), w})
				maxW[i] = math.Max(maxW[i], w)
			}
		}
		book := func(w []float64) {
			out, err := comp.Pace(bg, "k", w...)
			if err != nil {
				rt.Fatal(err)
			}
			waiting = append(waiting, call{now.Add(out.Delay), w})
		}
		for s := rapid.IntRange(1, 100).Draw(rt, "steps"); s > 0; s-- {
			now = now.Add(time.Duration(rapid.Int64Range(0, 300_000).Draw(rt, "advanceUs")) * time.Microsecond)
			table.SetTime(now)
			kept := waiting[:0]
			for _, c := range waiting {
				if c.at.After(now) {
					kept = append(kept, c)
				} else {
					goes(c)
				}
			}
			waiting = kept
			if len(waiting) > 0 && rapid.IntRange(0, 5).Draw(rt, "rewind") == 0 {
				// Every turn from the i-th on is given back, and booked
				// again now or later, in order.
				i := rapid.IntRange(0, len(waiting)-1).Draw(rt, "from")
				back := slices.Clone(waiting[i:])
				waiting = waiting[:i]
				for _, p := range ps {
					table.Rewind(p.Name(), "k", back[0].at)
				}
				now = now.Add(time.Duration(rapid.Int64Range(0, 2_000_000).Draw(rt, "pauseUs")) * time.Microsecond)
				table.SetTime(now)
				for _, c := range waiting {
					if !c.at.After(now) {
						goes(c)
					}
				}
				waiting = slices.DeleteFunc(waiting, func(c call) bool { return !c.at.After(now) })
				for _, c := range back {
					book(c.w)
				}
				continue
			}
			w := make([]float64, n)
			for i := range w {
				w[i] = rapid.SampledFrom([]float64{1, 1, 2, 0.5}).Draw(rt, "weight")
			}
			book(w)
		}
		for _, c := range waiting {
			goes(c)
		}
		for i, p := range ps {
			o := p.Options()
			if err := checkBound(adm[i], o.QPS, o.MaxBurst, maxW[i]); err != nil {
				rt.Fatalf("pacer %s (qps %v, burst %v): %v", o.Name, o.QPS, o.MaxBurst, err)
			}
		}
	})
}
