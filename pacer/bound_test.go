package pacer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// went is one call that went: when (µs, on the pacer's clock) and with
// what weight.
type went struct {
	at     int64
	weight float64
}

// checkBound is the brute-force sliding-window check of the bound a rate
// keeps: over every window [a, b] (whole microseconds, so b-a+1 µs of time)
// the weight admitted is at most burst + qps*(b-a+1 µs) plus one call's
// weight, the largest of the run. Every window that matters starts and ends
// at an admission, so the pairs of admissions are all the windows there are.
func checkBound(adm []went, qps, burst, maxWeight float64) error {
	slices.SortStableFunc(adm, func(x, y went) int {
		switch {
		case x.at < y.at:
			return -1
		case x.at > y.at:
			return 1
		}
		return 0
	})
	for i := range adm {
		sum := 0.0
		for j := i; j < len(adm); j++ {
			sum += adm[j].weight
			span := float64(adm[j].at-adm[i].at+1) / 1e6
			limit := burst + qps*span + maxWeight
			if sum > limit*(1+1e-9) {
				return fmt.Errorf("%v admitted in [%d, %d] µs (%d calls), more than burst %v + %v/s x %v s + %v = %v",
					sum, adm[i].at, adm[j].at, j-i+1, burst, qps, span, maxWeight, limit)
			}
		}
	}
	return nil
}

// checkSettledBound is checkBound for a key that is given weight back
// (Settle): events holds the calls that went and, with negative weights,
// the weight given back, at the time it was. Over every window [a, b] the
// weight admitted, less the weight given back within the window, is at
// most burst + qps*(b-a+1 µs) plus the largest call's weight.
func checkSettledBound(events []went, qps, burst, maxWeight float64) error {
	slices.SortStableFunc(events, func(x, y went) int { return int(min(max(x.at-y.at, -1), 1)) })
	// Every window that matters starts and ends at a call that went, and
	// holds every event at its ends' times.
	type instant struct {
		at        int64
		sum       float64 // everything at this time
		admission bool
	}
	var ts []instant
	for _, e := range events {
		if n := len(ts); n > 0 && ts[n-1].at == e.at {
			ts[n-1].sum += e.weight
			ts[n-1].admission = ts[n-1].admission || e.weight > 0
			continue
		}
		ts = append(ts, instant{e.at, e.weight, e.weight > 0})
	}
	for i := range ts {
		if !ts[i].admission {
			continue
		}
		sum := 0.0
		for j := i; j < len(ts); j++ {
			sum += ts[j].sum
			if !ts[j].admission {
				continue
			}
			span := float64(ts[j].at-ts[i].at+1) / 1e6
			limit := burst + qps*span + maxWeight
			if sum > limit*(1+1e-9) {
				return fmt.Errorf("%v admitted less given back in [%d, %d] µs, more than burst %v + %v/s x %v s + %v = %v",
					sum, ts[i].at, ts[j].at, burst, qps, span, maxWeight, limit)
			}
		}
	}
	return nil
}

// TestRateBound is the bound a rate keeps, on both stores: random arrival
// times (bursts at one instant, arrivals just before and after a slot comes
// due, long quiet spells), random weights, RateLimit and Pace mixed, alone
// and in a composite of two pacers, for bursts 0-16 and rates from one a
// minute to a million a second. Each admitted call counts at the time it
// goes (a paced call at the end of its delay). In a third of the runs,
// calls that went give part of their weight back (Settle) now and then,
// and the bound is on what went less what was given back.
func TestRateBound(t *testing.T) {
	_, client := startRedis(t)
	rapid.Check(t, func(rt *rapid.T) { rateBound(rt, t, client) })
}

func rateBound(rt *rapid.T, t *testing.T, client *redis.Client) {
	clk := newManualClock(startEpoch.Add(time.Duration(rapid.Int64Range(0, 1e12).Draw(rt, "t0ns"))))
	var store Store = NewLocal(LocalOptions{Clock: clk})
	if rapid.Bool().Draw(rt, "redis") {
		store = newRedisStore(t, client, RedisOptions{Clock: clk})
	}
	type member struct {
		p         *Pacer
		maxWeight float64
		adm       []went
		paid      []went // the calls that went (or will) and have given nothing back
	}
	settles := rapid.IntRange(0, 2).Draw(rt, "settles") == 0
	newMember := func(name string) *member {
		qps := rapid.SampledFrom([]float64{1.0 / 60, 1, 10, 1000.0 / 60, 250, 1e4, 1e6}).Draw(rt, name+"qps")
		if rapid.Bool().Draw(rt, name+"randomQPS") {
			qps = math.Exp(rapid.Float64Range(math.Log(1.0/60), math.Log(1e6)).Draw(rt, name+"logQPS"))
		}
		burst := float64(rapid.IntRange(0, 16).Draw(rt, name+"burst"))
		if rapid.IntRange(0, 4).Draw(rt, name+"fractionalBurst") == 0 {
			burst = rapid.Float64Range(0, 16).Draw(rt, name+"burstValue")
		}
		opts := Options{
			Name:        name,
			QPS:         qps,
			MaxBurst:    burst,
			BurstFactor: rapid.SampledFrom([]float64{0, 0, 0.25, 0.5, 1}).Draw(rt, name+"factor"),
		}
		return &member{p: mustNew(t, store, opts)}
	}
	members := []*member{newMember("a")}
	composite := rapid.IntRange(0, 3).Draw(rt, "composite") == 0
	if composite {
		members = append(members, newMember("b"))
	}
	var comp *Composite
	if composite {
		var err error
		if comp, err = NewComposite(members[0].p, members[1].p); err != nil {
			rt.Fatal(err)
		}
	}
	// The typical gap between calls is a fraction of the slowest member's
	// interval, so that a run keeps the key saturated most of the time.
	slot := 1e6 / members[0].p.opts.QPS
	if composite {
		slot = math.Max(slot, 1e6/members[1].p.opts.QPS)
	}

	steps := rapid.IntRange(1, 120).Draw(rt, "steps")
	for s := 0; s < steps; s++ {
		var adv int64
		switch rapid.IntRange(0, 5).Draw(rt, "advanceKind") {
		case 0: // the same instant
		case 1, 2: // a fraction of a slot
			adv = int64(rapid.Float64Range(0, 1.2).Draw(rt, "slotFraction") * slot)
		case 3: // a microsecond or a few
			adv = rapid.Int64Range(1, 3).Draw(rt, "us")
		case 4: // a quiet spell of up to a few slots
			adv = int64(rapid.Float64Range(1, 5).Draw(rt, "slots") * slot)
		case 5: // a long quiet spell
			adv = rapid.Int64Range(1, 3600).Draw(rt, "seconds") * 1e6
		}
		clk.Add(time.Duration(adv) * time.Microsecond)
		now := clk.Now().UnixMicro()

		weights := make([]float64, len(members))
		for i := range weights {
			weights[i] = rapid.SampledFrom([]float64{1, 1, 1, 2, 3, 0.5, 10}).Draw(rt, "weight")
			if m := members[i]; intervalTooSmall(weights[i], m.p.opts.QPS) {
				weights[i] = 1
			}
		}
		if settles && rapid.IntRange(0, 3).Draw(rt, "giveBack") == 0 {
			// A call that went gives back part of its weight, as a call
			// that used less than it was counted for does (Settle), once
			// it has gone.
			deltas := make([]float64, len(members))
			for i, m := range members {
				if j := slices.IndexFunc(m.paid, func(c went) bool { return c.at <= now }); j >= 0 {
					deltas[i] = -m.paid[j].weight * rapid.SampledFrom([]float64{1, 0.5, 0.1}).Draw(rt, "unused")
					m.paid = slices.Delete(m.paid, j, j+1)
				}
			}
			within := time.Minute
			if composite && rapid.Bool().Draw(rt, "compositeSettle") {
				out, err := comp.Settle(bg, "k", within, deltas...)
				if err != nil {
					rt.Fatalf("step %d: settle %v: %v", s, deltas, err)
				}
				for i, m := range members {
					m.adm = append(m.adm, went{now, out.Members[i].Booked})
				}
			} else {
				for i, m := range members {
					out, err := m.p.Settle(bg, "k", within, deltas[i])
					if err != nil {
						rt.Fatalf("step %d: settle %v: %v", s, deltas[i], err)
					}
					if out.Booked < deltas[i] || out.Booked > 0 {
						rt.Fatalf("step %d: settle %v gave back %v", s, deltas[i], -out.Booked)
					}
					m.adm = append(m.adm, went{now, out.Booked})
				}
			}
			continue
		}
		rateLimit := rapid.IntRange(0, 2).Draw(rt, "mode") != 0
		var delay time.Duration
		var err error
		if composite {
			var out CompositeOutcome
			if rateLimit {
				out, err = comp.RateLimit(bg, "k", weights...)
			} else {
				out, err = comp.Pace(bg, "k", weights...)
			}
			delay = out.Delay
		} else {
			var out Outcome
			if rateLimit {
				out, err = members[0].p.RateLimit(bg, "k", weights[0])
			} else {
				out, err = members[0].p.Pace(bg, "k", weights[0])
			}
			delay = out.Delay
		}
		if errors.Is(err, ErrTooLong) {
			continue // booked nothing
		}
		if err != nil {
			rt.Fatalf("step %d: %v", s, err)
		}
		if rateLimit && delay > 0 {
			continue // rejected: recorded nothing
		}
		at := now + int64(delay/time.Microsecond)
		for i, m := range members {
			m.adm = append(m.adm, went{at, weights[i]})
			m.maxWeight = math.Max(m.maxWeight, weights[i])
			m.paid = append(m.paid, went{at, weights[i]})
		}
	}
	for _, m := range members {
		o := m.p.opts
		check := checkBound
		if settles {
			check = checkSettledBound
		}
		if err := check(m.adm, o.QPS, o.MaxBurst, m.maxWeight); err != nil {
			rt.Fatalf("pacer %s (qps %v, burst %v, factor %v): %v", o.Name, o.QPS, o.MaxBurst, o.BurstFactor, err)
		}
	}
}

// TestSaturatedKey is the saturated case as a table: a key asked for a call
// every 10 ms for 20 s admits at most burst + rate x 20 s + 1 calls, and (with
// the rate as the only limit) no fewer than rate x 20 s. Upstream's step
// function admits 43 at 60/min with burst 4, and 40 with burst 1
// (TestWhereUpstreamDiffers).
func TestSaturatedKey(t *testing.T) {
	for _, c := range []struct {
		name        string
		qps, burst  float64
		rateLimit   bool
		wantAtLeast int
		wantAtMost  int
	}{
		{"60/min burst 0", 1, 0, true, 20, 21},
		{"60/min burst 1", 1, 1, true, 21, 22},
		{"60/min burst 4", 1, 4, true, 24, 25},
		{"60/min burst 16", 1, 16, true, 36, 37},
		{"10/s burst 4", 10, 4, true, 204, 205},
		{"60/min burst 4 paced", 1, 4, false, 20, 25},
		{"10/s burst 16 paced", 10, 16, false, 200, 217},
	} {
		for _, b := range backends(t, startEpoch) {
			t.Run(c.name+"/"+b.name, func(t *testing.T) {
				p := mustNew(t, b.store, Options{Name: t.Name(), QPS: c.qps, MaxBurst: c.burst})
				start := b.clk.Now()
				end := start.Add(20 * time.Second)
				admitted := 0
				for b.clk.Now().Before(end) {
					var out Outcome
					var err error
					if c.rateLimit {
						out, err = p.RateLimit(bg, "k", 1)
					} else {
						out, err = p.Pace(bg, "k", 1)
					}
					if err != nil && !errors.Is(err, ErrTooLong) {
						t.Fatal(err)
					}
					goes := c.rateLimit && out.Delay == 0 || !c.rateLimit && b.clk.Now().Add(out.Delay).Before(end)
					if err == nil && goes {
						admitted++
					}
					if c.rateLimit {
						b.clk.Add(10 * time.Millisecond)
					} else {
						// A paced caller waits its delay, then asks again.
						b.clk.Add(max(out.Delay, 10*time.Millisecond))
					}
				}
				if admitted < c.wantAtLeast || admitted > c.wantAtMost {
					t.Fatalf("%d calls went in 20 s, want %d to %d", admitted, c.wantAtLeast, c.wantAtMost)
				}
			})
		}
	}
}
