package pacer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// TestBackendsAgree is SPEC invariant I12: the in-process store and the
// Redis store (with its script) give identical results on every sequence of
// calls: the same delays, the same bucket levels to the last bit, the same
// errors, and the same stored state. Both take decision time from clocks
// that the test moves in lockstep (forwards, by large and tiny steps, and
// now and then backwards).
func TestBackendsAgree(t *testing.T) {
	_, client := startRedis(t)
	rapid.Check(t, func(rt *rapid.T) {
		t0 := startEpoch.Add(time.Duration(rapid.Int64Range(0, 1e12).Draw(rt, "t0ns")))
		lc, rc := newManualClock(t0), newManualClock(t0)
		local := NewLocal(LocalOptions{Clock: lc})
		remote := newRedisStore(t, client, RedisOptions{Clock: rc})

		n := rapid.IntRange(1, 3).Draw(rt, "pacers")
		var lps, rps []*Pacer
		for i := 0; i < n; i++ {
			opts := Options{
				Name:        "p" + strconv.Itoa(i),
				QPS:         rapid.SampledFrom([]float64{0.5, 1, 3, 10, 1000.0 / 60, 250}).Draw(rt, "qps"),
				MaxBurst:    rapid.SampledFrom([]float64{0, 0, 0.5, 1, 2, 5, 100}).Draw(rt, "burst"),
				BurstFactor: rapid.SampledFrom([]float64{0, 0, 0.1, 0.5, 1, 0.999}).Draw(rt, "factor"),
				MaxDelay:    rapid.SampledFrom([]time.Duration{0, 0, 50 * time.Millisecond, 2 * time.Second}).Draw(rt, "maxDelay"),
			}
			if rapid.Bool().Draw(rt, "randomQPS") {
				opts.QPS = rapid.Float64Range(0.01, 5000).Draw(rt, "qpsValue")
			}
			lps = append(lps, mustNew(t, local, opts))
			rps = append(rps, mustNew(t, remote, opts))
		}
		lcomp, err := NewComposite(lps...)
		if err != nil {
			rt.Fatal(err)
		}
		rcomp, err := NewComposite(rps...)
		if err != nil {
			rt.Fatal(err)
		}
		keys := []string{"a", "b"}

		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for s := 0; s < steps; s++ {
			var d time.Duration
			switch rapid.IntRange(0, 5).Draw(rt, "advanceKind") {
			case 0:
				d = 0
			case 1:
				d = time.Duration(rapid.Int64Range(0, 2_000_000).Draw(rt, "advanceUs")) * time.Microsecond
			case 2:
				d = time.Duration(rapid.Int64Range(0, 20).Draw(rt, "advance100ms")) * 100 * time.Millisecond
			case 3:
				d = time.Duration(rapid.Int64Range(0, 1_000_000).Draw(rt, "advanceNs")) // sub-millisecond
			case 4:
				d = time.Duration(rapid.Int64Range(1, 600).Draw(rt, "advanceS")) * time.Second
			case 5:
				d = -time.Duration(rapid.Int64Range(1, 500_000).Draw(rt, "backUs")) * time.Microsecond
			}
			lc.Add(d)
			rc.Add(d)

			key := rapid.SampledFrom(keys).Draw(rt, "key")
			w := rapid.SampledFrom([]float64{1, 1, 2, 0.5, 7}).Draw(rt, "weight")
			if rapid.IntRange(0, 4).Draw(rt, "randomWeight") == 0 {
				w = rapid.Float64Range(0.001, 50).Draw(rt, "weightValue")
			}
			rateLimit := rapid.Bool().Draw(rt, "rateLimit")
			book := time.Duration(0) // Book's within, when > 0
			if !rateLimit && rapid.IntRange(0, 3).Draw(rt, "book") == 0 {
				book = time.Duration(rapid.Int64Range(1, 5_000_000).Draw(rt, "withinUs")) * time.Microsecond
			}
			// A settlement: Book's, or a give-back (a negative weight).
			settle := book > 0 && rapid.Bool().Draw(rt, "settle")
			if settle && rapid.Bool().Draw(rt, "giveBack") {
				w = -w
			}
			label := fmt.Sprintf("step %d (key %s, weight %v, rateLimit %v, book %v, settle %v)", s, key, w, rateLimit, book, settle)

			if n > 1 && rapid.IntRange(0, 3).Draw(rt, "composite") == 0 {
				var lo, ro CompositeOutcome
				var lerr, rerr error
				if rateLimit {
					lo, lerr = lcomp.RateLimit(bg, key, w, 1)
					ro, rerr = rcomp.RateLimit(bg, key, w, 1)
				} else if settle {
					lo, lerr = lcomp.Settle(bg, key, book, w, -1)
					ro, rerr = rcomp.Settle(bg, key, book, w, -1)
				} else if book > 0 {
					lo, lerr = lcomp.Book(bg, key, book, w, 1)
					ro, rerr = rcomp.Book(bg, key, book, w, 1)
				} else {
					lo, lerr = lcomp.Pace(bg, key, w)
					ro, rerr = rcomp.Pace(bg, key, w)
				}
				if lerr != nil && !errors.Is(lerr, ErrTooLong) {
					// Two weights for more than two members is invalid.
					if rerr == nil || lerr.Error() != rerr.Error() {
						rt.Fatalf("%s composite: errors differ: local %v, redis %v", label, lerr, rerr)
					}
					continue
				}
				sameErr(rt, label+" composite", lerr, rerr)
				if len(lo.Members) != len(ro.Members) {
					rt.Fatalf("%s composite: %d vs %d member outcomes", label, len(lo.Members), len(ro.Members))
				}
				for i := range lo.Members {
					sameOutcome(rt, fmt.Sprintf("%s composite member %d", label, i), lo.Members[i], ro.Members[i])
				}
				if (lo.Pacer == nil) != (ro.Pacer == nil) || (lo.Pacer != nil && lo.Pacer.Name() != ro.Pacer.Name()) {
					rt.Fatalf("%s composite: pacer %v vs %v", label, lo.Pacer, ro.Pacer)
				}
			} else {
				i := rapid.IntRange(0, n-1).Draw(rt, "pacer")
				var lo, ro Outcome
				var lerr, rerr error
				if rateLimit {
					lo, lerr = lps[i].RateLimit(bg, key, w)
					ro, rerr = rps[i].RateLimit(bg, key, w)
				} else if settle {
					lo, lerr = lps[i].Settle(bg, key, book, w)
					ro, rerr = rps[i].Settle(bg, key, book, w)
				} else if book > 0 {
					lo, lerr = lps[i].Book(bg, key, book, w)
					ro, rerr = rps[i].Book(bg, key, book, w)
				} else {
					lo, lerr = lps[i].Pace(bg, key, w)
					ro, rerr = rps[i].Pace(bg, key, w)
				}
				var ce *ConfigError
				if errors.As(lerr, &ce) && rerr != nil && lerr.Error() == rerr.Error() {
					continue // a weight too small for the pacer's rate, on both stores
				}
				sameErr(rt, label, lerr, rerr)
				sameOutcome(rt, label, lo, ro)
			}
		}

		// The stored state is the same, key by key.
		now := lc.Now().UnixMicro()
		for _, p := range lps {
			for _, key := range keys {
				lst, lok := localState(local, p.Name(), key)
				rst, rok := redisState(t, client, remote.Key(p.Name(), key))
				lok = lok && now < lst.exp
				rok = rok && now < rst.exp
				if lok != rok || (lok && lst != rst) {
					rt.Fatalf("state of %s/%s: local %+v (%v), redis %+v (%v)", p.Name(), key, lst, lok, rst, rok)
				}
			}
		}
	})
}

func sameErr(rt *rapid.T, label string, lerr, rerr error) {
	if (lerr == nil) != (rerr == nil) || errors.Is(lerr, ErrTooLong) != errors.Is(rerr, ErrTooLong) {
		rt.Fatalf("%s: errors differ: local %v, redis %v", label, lerr, rerr)
	}
	if lerr != nil && !errors.Is(lerr, ErrTooLong) {
		rt.Fatalf("%s: unexpected error %v", label, lerr)
	}
}

func sameOutcome(rt *rapid.T, label string, l, r Outcome) {
	if l != r {
		rt.Fatalf("%s: outcomes differ:\nlocal %+v\nredis %+v", label, l, r)
	}
}

// localState returns the stored state of name/key in a Local store.
func localState(l *Local, name, key string) (state, bool) {
	k := localKey{name: name, key: key}
	s := &l.shards[l.shardOf(&k)]
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.find(k)
	if i < 0 {
		return state{}, false
	}
	return s.ents[i].st, true
}

// redisState returns the state stored in the Redis key.
func redisState(t testing.TB, client *redis.Client, key string) (state, bool) {
	t.Helper()
	v, err := client.Get(bg, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return state{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 32 {
		t.Fatalf("%s: %d bytes, want 32", key, len(v))
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[8*i:])) }
	return state{level: f(0), last: int64(f(1)), next: int64(f(2)), exp: int64(f(3))}, true
}
