package pacer

import (
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestLocalConcurrent runs many goroutines on shared and distinct keys, on
// single pacers and composites, under the race detector, and checks that the
// calls at one instant on one key got distinct, evenly spaced slots.
func TestLocalConcurrent(t *testing.T) {
	c := newManualClock(startEpoch)
	l := NewLocal(LocalOptions{Clock: c})
	p := mustNew(t, l, Options{Name: "p", QPS: 100})
	q := mustNew(t, l, Options{Name: "q", QPS: 1000, MaxBurst: 3})
	comp, err := NewComposite(p, q)
	if err != nil {
		t.Fatal(err)
	}
	const workers, calls = 8, 50
	delays := make([][]time.Duration, workers)
	parallel(workers, func(w int) {
		for i := 0; i < calls; i++ {
			out, err := p.Pace(bg, "shared", 1)
			if err != nil {
				t.Error(err)
				return
			}
			delays[w] = append(delays[w], out.Delay)
			own := "own-" + strconv.Itoa(w)
			if _, err := comp.RateLimit(bg, own, 1, 2); err != nil {
				t.Error(err)
			}
			if _, err := comp.Pace(bg, "shared", 1); err != nil {
				t.Error(err)
			}
		}
	})
	all := slices.Concat(delays...)
	slices.Sort(all)
	// p's slots on "shared" are taken by the Pace calls and the composite
	// Pace calls alike, 10 ms apart; the Pace calls hold some of them.
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] || all[i]%(10*time.Millisecond) != 0 {
			t.Fatalf("slots %v and %v: want distinct multiples of 10ms", all[i-1], all[i])
		}
	}
	if got, want := all[len(all)-1], time.Duration(2*workers*calls-1)*10*time.Millisecond; got > want {
		t.Fatalf("last slot %v, beyond the %v that %d calls need", got, want, 2*workers*calls)
	}
}

// TestLocalDropsIdleState checks that a store with many keys drops the state
// of keys gone idle on its own, without Sweep.
func TestLocalDropsIdleState(t *testing.T) {
	c := newManualClock(startEpoch)
	l := NewLocal(LocalOptions{Clock: c})
	p := mustNew(t, l, Options{Name: "p", QPS: 10})
	for i := 0; i < 10_000; i++ {
		if _, err := p.RateLimit(bg, "k"+strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if l.Len() != 10_000 {
		t.Fatalf("Len %d, want 10000", l.Len())
	}
	c.Add(time.Hour)
	// Calls on a few hot keys are enough to sweep every shard in time.
	for i := 0; i < 40_000; i++ {
		if _, err := p.Pace(bg, "hot"+strconv.Itoa(i%100), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.Len(); n > 100 {
		t.Fatalf("Len %d after the idle keys expired, want at most the 100 hot keys", n)
	}
}

// TestLocalMonotonic checks that the Local store's time is the clock's
// time, to the microsecond, as for the Redis store's client clock.
func TestLocalMonotonic(t *testing.T) {
	c := newManualClock(startEpoch.Add(123456789))
	l := NewLocal(LocalOptions{Clock: c})
	for _, d := range []time.Duration{0, 1, 999, 1000, 1001, 17*time.Second + 1, -5 * time.Second} {
		c.Add(d)
		if got, want := l.nowUs(), c.Now().UnixMicro(); got != want {
			t.Fatalf("nowUs %d, clock %d", got, want)
		}
	}
}
