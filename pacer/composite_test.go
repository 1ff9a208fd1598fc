package pacer

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestCompositeUpstream replays the upstream PacerComposite tests with real
// pacers instead of mocks: members a, b, c whose second call waits 100, 300
// and 200 ms.
func TestCompositeUpstream(t *testing.T) {
	ms := time.Millisecond
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			a := mustNew(t, b.store, Options{Name: "a", QPS: 10})
			bb := mustNew(t, b.store, Options{Name: "b", QPS: 10.0 / 3})
			c := mustNew(t, b.store, Options{Name: "c", QPS: 5})
			comp, err := NewComposite(a, bb, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, rateLimit := range []bool{false, true} {
				key := map[bool]string{false: "pace", true: "rl"}[rateLimit]
				call := comp.Pace
				if rateLimit {
					call = comp.RateLimit
				}
				out, err := call(bg, key)
				if err != nil || out.Delay != 0 || out.Pacer != nil || out.Reason() != "no delay" {
					t.Fatalf("first call: %+v (%q), %v", out, out.Reason(), err)
				}
				out, err = call(bg, key)
				if err != nil || out.Delay != 300*ms || out.Pacer != bb {
					t.Fatalf("second call: %+v, %v; want b with 300ms", out, err)
				}
				if want := "pacer b\nwatermark=0.00/0 + weight=1, delayMs=300"; out.Reason() != want {
					t.Errorf("reason %q, want %q", out.Reason(), want)
				}
				for i, want := range []time.Duration{100 * ms, 300 * ms, 200 * ms} {
					if out.Members[i].Delay != want {
						t.Errorf("member %d delay %v, want %v", i, out.Members[i].Delay, want)
					}
				}
			}

			empty, err := NewComposite()
			if err != nil {
				t.Fatal(err)
			}
			out, err := empty.RateLimit(bg, "k")
			if err != nil || out.Delay != 0 || out.Reason() != "no pacers" {
				t.Fatalf("empty composite: %+v (%q), %v", out, out.Reason(), err)
			}
			if out, err = empty.PaceWait(bg, "k"); err != nil || out.Reason() != "no pacers" {
				t.Fatalf("empty composite PaceWait: %+v, %v", out, err)
			}
		})
	}
}

// TestCompositeRateLimitIsAtomic checks that a composite RateLimit that one
// member rejects records nothing in any member, and that one it admits is
// recorded in all.
func TestCompositeRateLimitIsAtomic(t *testing.T) {
	ms := time.Millisecond
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			rpm := mustNew(t, b.store, Options{Name: "rpm", QPS: 10, MaxBurst: 5})
			tpm := mustNew(t, b.store, Options{Name: "tpm", QPS: 1000})
			comp, err := NewComposite(rpm, tpm)
			if err != nil {
				t.Fatal(err)
			}
			// 500 tokens go (the free overflow of an idle pacer) and book
			// 500 ms of the token pacer.
			if out, err := comp.RateLimit(bg, "m", 1, 500); err != nil || out.Delay != 0 {
				t.Fatalf("first: %+v, %v", out, err)
			}
			// The request pacer has room, the token pacer says wait: rejected
			// with the token pacer's delay, and the request pacer keeps its
			// room.
			for i := 0; i < 3; i++ {
				b.clk.Add(100 * ms)
				out, err := comp.RateLimit(bg, "m", 1, 10)
				if err != nil || out.Pacer != tpm || out.Delay != time.Duration(400-100*i)*ms {
					t.Fatalf("rejected call %d: %+v, %v", i, out, err)
				}
				if out.Members[0].Delay != 0 {
					t.Fatalf("rpm would have waited: %+v", out.Members[0])
				}
			}
			// Had the rejections been recorded in rpm, its bucket would hold 3
			// more; it holds the first call's weight, drained.
			out, err := rpm.RateLimit(bg, "m", 1)
			if err != nil || out.Delay != 0 || out.Level != 0 {
				t.Fatalf("rpm after rejections: %+v, %v; want an empty bucket", out, err)
			}
			// Pace: a delay longer than a member's MaxDelay records nothing.
			short := mustNew(t, b.store, Options{Name: "short", QPS: 1000, MaxDelay: 100 * ms})
			comp2, err := NewComposite(rpm, short)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := comp2.Pace(bg, "n", 1, 500); err != nil {
				t.Fatal(err)
			}
			before, _ := rpm.RateLimit(bg, "n", 1)
			if _, err := comp2.Pace(bg, "n", 1, 10); !errors.Is(err, ErrTooLong) {
				t.Fatalf("Pace over MaxDelay: %v", err)
			}
			after, _ := rpm.RateLimit(bg, "n", 1)
			if after.Level != before.Level+1 { // +1: the RateLimit call itself
				t.Fatalf("a refused composite Pace was recorded in rpm: level %v then %v", before.Level, after.Level)
			}
		})
	}
}

// TestCompositePaceBooksAtTheGoTime checks that a paced call books each
// member's slot at the time it goes (the largest delay), not at the member's
// own earlier slot. Member a allows 2 calls a second, b one weight unit a
// second; b's light calls (weight 0.1) would let two calls through 100 ms
// apart, at 2 s and 2.1 s, had a kept the slots it booked at 1 s and 1.5 s
// while b held the calls back: two of a's calls in 100 ms.
func TestCompositePaceBooksAtTheGoTime(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			pa := mustNew(t, b.store, Options{Name: "a", QPS: 2})
			pb := mustNew(t, b.store, Options{Name: "b", QPS: 1})
			c, err := NewComposite(pa, pb)
			if err != nil {
				t.Fatal(err)
			}
			var got []time.Duration
			for _, wb := range []float64{1, 1, 0.1, 0.1} {
				out, err := c.Pace(bg, "k", 1, wb)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, out.Delay)
			}
			want := []time.Duration{0, time.Second, 2 * time.Second, 2500 * time.Millisecond}
			if !slices.Equal(got, want) {
				t.Fatalf("delays %v, want %v", got, want)
			}
		})
	}
}
