package pacer

import (
	"runtime"
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

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestLocalShrinks fills a store with many keys, lets them expire, and
// checks that calls on a few hot keys drop them and give back their memory:
// the shards' slices and maps are rebuilt at the size of the keys in use.
func TestLocalShrinks(t *testing.T) {
	const keys, hot = 100_000, 64
	c := newManualClock(startEpoch)
	l := NewLocal(LocalOptions{Clock: c})
	p := mustNew(t, l, Options{Name: "p", QPS: 10})
	base := heapInUse()
	for i := 0; i < keys; i++ {
		if _, err := p.RateLimit(bg, "key-"+strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	peak := heapInUse() - base
	c.Add(time.Hour)
	for i := 0; i < 4*keys; i++ {
		if _, err := p.Pace(bg, "hot-"+strconv.Itoa(i%hot), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.Len(); n > hot {
		t.Fatalf("Len %d after the idle keys expired, want at most %d", n, hot)
	}
	room := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		room += cap(s.ents)
		if s.old != nil {
			t.Errorf("shard %d is still migrating", i)
		}
		s.mu.Unlock()
	}
	if room > numShards*minShrink {
		t.Errorf("the shards have room for %d entries, for %d keys", room, l.Len())
	}
	if after := heapInUse() - base; after > peak/10 {
		t.Errorf("heap %d bytes at %d keys, %d bytes at %d keys: want a tenth or less", peak, keys, after, l.Len())
	}
	// The hot keys kept their state through the shrinks: each has its
	// 4*keys/hot calls booked, 100 ms apart.
	out, err := p.RateLimit(bg, "hot-0", 1)
	if want := time.Duration(4*keys/hot) * 100 * time.Millisecond; err != nil || out.Delay != want {
		t.Fatalf("hot key after the shrinks: %+v, %v; want a retry-after of %v", out, err, want)
	}
}

// TestLocalSweepKeepsState checks Sweep and the incremental upkeep against a
// model: after any mix of calls, sweeps, shrinks and time, every key that has
// not expired has the state its last recorded call left.
func TestLocalSweepKeepsState(t *testing.T) {
	c := newManualClock(startEpoch)
	l := NewLocal(LocalOptions{Clock: c})
	p := mustNew(t, l, Options{Name: "p", QPS: 1000})
	want := map[string]state{}
	for round := 0; round < 6; round++ {
		n := 5000 >> round
		for i := 0; i < n; i++ {
			key := "k" + strconv.Itoa((i*7919+round)%20000)
			res := step(want[key], wantOK(want, key), l.nowUs(), &params{weight: 1, qps: 1000, factor: 1, intervalUs: 1000, maxWaitUs: 0})
			if _, err := p.RateLimit(bg, key, 1); err != nil {
				t.Fatal(err)
			}
			if res.commit {
				want[key] = res.next
			}
		}
		if round%2 == 1 {
			l.Sweep()
		}
		c.Add(100 * time.Second)
		now := l.nowUs()
		for key, st := range want {
			got, ok := localState(l, "p", key)
			if now >= st.exp {
				continue // expired: dropped or not, it counts as absent
			}
			if !ok || got != st {
				t.Fatalf("round %d: %s is %+v (%v), want %+v", round, key, got, ok, st)
			}
		}
	}
	c.Add(time.Hour)
	l.Sweep()
	if n := l.Len(); n != 0 {
		t.Fatalf("Len %d after everything expired and Sweep", n)
	}
}

func wantOK(m map[string]state, k string) bool { _, ok := m[k]; return ok }

// BenchmarkLocalExpiry measures decisions on a store whose million keys
// have just expired: the sweep that drops them and the shrinks that give
// back their memory ride on the decisions, a few entries each, so the
// slowest decision stays in the microseconds (max-ns is the slowest one).
func BenchmarkLocalExpiry(b *testing.B) {
	const keys = 1_000_000
	c := newManualClock(startEpoch)
	l := NewLocal(LocalOptions{Clock: c})
	p := mustNew(b, l, Options{Name: "p", QPS: 10})
	for i := 0; i < keys; i++ {
		if _, err := p.RateLimit(bg, "key-"+strconv.Itoa(i), 1); err != nil {
			b.Fatal(err)
		}
	}
	c.Add(time.Hour)
	hot := make([]string, 1024)
	for i := range hot {
		hot[i] = "hot-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var worst time.Duration
	i := 0
	for b.Loop() {
		start := time.Now()
		if _, err := p.Pace(bg, hot[i%len(hot)], 1); err != nil {
			b.Fatal(err)
		}
		if d := time.Since(start); d > worst {
			worst = d
		}
		i++
	}
	b.ReportMetric(float64(worst.Nanoseconds()), "max-ns")
	b.ReportMetric(float64(l.Len()), "keys-left")
}
