package pacer

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"
)

// packState encodes four doubles as the script stores a state.
func packState(level, last, next, exp float64) string {
	b := make([]byte, 32)
	for i, f := range []float64{level, last, next, exp} {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(f))
	}
	return string(b)
}

// TestRedisUnreadableState plants values that no decision writes (other
// types, strings of another length, impossible numbers) under pacer keys,
// and checks that each counts as absent: the next calls succeed, decide as
// on a fresh key, and replace the value with a state that has a TTL.
func TestRedisUnreadableState(t *testing.T) {
	_, client := startRedis(t)
	clk := newManualClock(startEpoch)
	store := newRedisStore(t, client, RedisOptions{Clock: clk})
	p := mustNew(t, store, Options{Name: "rpm", QPS: 10})
	q := mustNew(t, store, Options{Name: "tpm", QPS: 1000})
	comp, err := NewComposite(p, q)
	if err != nil {
		t.Fatal(err)
	}
	now := float64(startEpoch.UnixMicro())
	plant := map[string]func(key string) error{
		"list": func(k string) error { return client.RPush(bg, k, "a", "b").Err() },
		"hash": func(k string) error {
			return client.HSet(bg, k, "level", "0", "lastDripUs", "1", "nextShotUs", "2").Err()
		},
		"set":      func(k string) error { return client.SAdd(bg, k, "x").Err() },
		"empty":    func(k string) error { return client.Set(bg, k, "", 0).Err() },
		"short":    func(k string) error { return client.Set(bg, k, "\x00\x01\x02", 0).Err() },
		"long":     func(k string) error { return client.Set(bg, k, strings.Repeat("\x00", 40), 0).Err() },
		"text":     func(k string) error { return client.Set(bg, k, strings.Repeat("garbage!", 4), 0).Err() },
		"nan":      func(k string) error { return client.Set(bg, k, packState(math.NaN(), now, now, now+1e12), 0).Err() },
		"inf":      func(k string) error { return client.Set(bg, k, packState(math.Inf(1), now, now, now+1e12), 0).Err() },
		"negative": func(k string) error { return client.Set(bg, k, packState(-5, now, now, now+1e12), 0).Err() },
		"fraction": func(k string) error { return client.Set(bg, k, packState(0, now+0.5, now+1, now+1e12), 0).Err() },
		"order":    func(k string) error { return client.Set(bg, k, packState(0, now, now-1, now+1e12), 0).Err() },
		"huge": func(k string) error {
			return client.Set(bg, k, packState(0, 1e300, 1e300, math.Inf(1)), 0).Err()
		},
		// Consistent, but its queue is a century ahead.
		"future": func(k string) error {
			return client.Set(bg, k, packState(0, now+3e15, now+3e15, now+3e15+graceUs), 0).Err()
		},
	}
	for name, f := range plant {
		t.Run(name, func(t *testing.T) {
			key := "k-" + name
			for _, rk := range []string{store.Key("rpm", key), store.Key("tpm", key)} {
				if err := f(rk); err != nil {
					t.Fatal(err)
				}
			}
			// A rejected call writes nothing but still decides.
			out, err := p.RateLimit(bg, key, 1)
			if err != nil || out.Delay != 0 || out.Level != 0 {
				t.Fatalf("first call: %+v, %v", out, err)
			}
			out, err = p.RateLimit(bg, key, 1)
			if err != nil || out.Delay != 100*time.Millisecond {
				t.Fatalf("second call: %+v, %v; want a 100 ms retry-after, as on a fresh key", out, err)
			}
			cout, err := comp.Pace(bg, key, 1, 1)
			if err != nil || cout.Delay != 100*time.Millisecond || cout.Pacer != p {
				t.Fatalf("composite: %+v, %v", cout, err)
			}
			for _, rk := range []string{store.Key("rpm", key), store.Key("tpm", key)} {
				if _, ok := redisState(t, client, rk); !ok {
					t.Fatalf("%s: no state", rk)
				}
				if ttl, err := client.PTTL(bg, rk).Result(); err != nil || ttl <= 0 {
					t.Fatalf("%s: PTTL %v, %v", rk, ttl, err)
				}
			}
		})
	}
}

// TestFormatReply checks that an unexpected script reply prints readably.
func TestFormatReply(t *testing.T) {
	got := formatReply([]any{int64(1), int64(-2), "\x00\xffa", []any{nil, "b"}, 1.5})
	if want := `[1 -2 "\x00\xffa" [nil "b"] 1.5]`; got != want {
		t.Fatalf("formatReply = %s, want %s", got, want)
	}
}
