package pacer

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLuaConstantsMatchGo(t *testing.T) {
	want := "local GRACE, HORIZON = 120000000, 100000000000000\n"
	if !strings.Contains(luaSource, want) {
		t.Fatalf("script constants differ from core.go; want line %q", want)
	}
	if strings.Contains(luaSource, "@") {
		t.Fatal("script has an unfilled placeholder")
	}
}

func TestIntervalAndDrain(t *testing.T) {
	for _, c := range []struct {
		w, qps float64
		want   int64
	}{
		{1, 10, 100_000},
		{1, 3, 333_334}, // rounded up: a key never books less than its rate
		{2, 3, 666_667},
		{1, 1000.0 / 60, 60_000}, // 59999.99999999999 µs in doubles
		{1, 7e5, 2},
		{0.0000001, 1, 1},
		{1e8, 1, 1e14},
	} {
		if got := interval(c.w, c.qps); got != c.want {
			t.Errorf("interval(%v, %v) = %d, want %d", c.w, c.qps, got, c.want)
		}
	}
	if !intervalOK(1e8, 1) || intervalOK(1e8+1, 1) || intervalOK(1, 0) || intervalOK(math.NaN(), 1) {
		t.Error("intervalOK does not bound weight/qps at the horizon")
	}
	for _, c := range []struct {
		burst, qps, factor float64
		want               int64
	}{
		{0, 10, 0.5, 0},
		{2, 10, 0.5, 400_000},
		{100, 1, 0.5, 200_000_000},
		{1, 3, 1, 333_334}, // ceil
		{1e300, 1e-300, 1, horizonUs},
		{1, 1e-300, 1e-300, horizonUs}, // qps*factor underflows to 0: +Inf
	} {
		if got := drainTime(c.burst, c.qps, c.factor); got != c.want {
			t.Errorf("drainTime(%v, %v, %v) = %d, want %d", c.burst, c.qps, c.factor, got, c.want)
		}
	}
}

// localPacer returns a pacer on a fresh Local store and the clock that
// drives it, set to startEpoch.
func localPacer(t *testing.T, opts Options) (*Pacer, *manualClock) {
	t.Helper()
	c := newManualClock(startEpoch)
	if opts.Name == "" {
		opts.Name = "p"
	}
	return mustNew(t, NewLocal(LocalOptions{Clock: c}), opts), c
}

type call struct {
	advance   time.Duration
	rateLimit bool
	weight    float64
	want      time.Duration
}

func run(t *testing.T, p *Pacer, c *manualClock, calls []call) {
	t.Helper()
	for i, k := range calls {
		c.Add(k.advance)
		var out Outcome
		var err error
		if k.rateLimit {
			out, err = p.RateLimit(bg, "k", k.weight)
		} else {
			out, err = p.Pace(bg, "k", k.weight)
		}
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if out.Delay != k.want {
			t.Fatalf("call %d (+%v, rateLimit %v, weight %v): delay %v, want %v", i, k.advance, k.rateLimit, k.weight, out.Delay, k.want)
		}
	}
}

// TestEarlyCallWaits checks that a call goes only when its slot has come,
// to the microsecond. Upstream let a call less than half a millisecond
// before its slot through without recording it (so every call in that half
// millisecond got in for free); the first fix let it through and recorded
// it, which at high rates still let hundreds of calls through at once.
func TestEarlyCallWaits(t *testing.T) {
	p, c := localPacer(t, Options{QPS: 3}) // interval 333334 µs (rounded up)
	us := time.Microsecond
	run(t, p, c, []call{
		{0, true, 1, 0},                   // t=0: goes, books the slot at 333334
		{333_000 * us, true, 1, 334 * us}, // 334 µs early: rejected, retry after 334 µs
		{0, true, 1, 334 * us},            // the rejection recorded nothing
		{334 * us, true, 1, 0},            // at the slot: goes, next slot 666668
		{0, true, 1, 333_334 * us},
		{333_333 * us, true, 1, 1 * us}, // a microsecond early
		{1 * us, false, 1, 0},
	})
	out, err := p.RateLimit(bg, "k", 1)
	if err != nil || out.Delay != 333_334*us || out.DelayMs() != 333 {
		t.Fatalf("RateLimit = %v (%d ms), %v; want 333334µs", out.Delay, out.DelayMs(), err)
	}
	if o := (Outcome{Delay: 1 * us}); o.DelayMs() != 1 {
		t.Fatalf("DelayMs of a 1µs delay = %d, want 1 (a positive delay is never 0 ms)", o.DelayMs())
	}
}

// TestHighRateNoHeadStart checks that at a high rate the calls of one
// instant are spaced like any others: at 1e6/s, the second call of an
// instant waits a microsecond.
func TestHighRateNoHeadStart(t *testing.T) {
	p, c := localPacer(t, Options{QPS: 1e6})
	us := time.Microsecond
	run(t, p, c, []call{
		{0, true, 1, 0},
		{0, true, 1, 1 * us},
		{0, false, 1, 1 * us},
		{0, false, 1, 2 * us},
		{0, true, 1, 3 * us},
	})
}

// TestBurst checks that MaxBurst+1 calls go from idle, that the bucket drains
// at QPS*factor only while nothing is queued, and that the drain resumes
// from the last call.
func TestBurst(t *testing.T) {
	ms := time.Millisecond
	p, c := localPacer(t, Options{QPS: 10, MaxBurst: 2})
	run(t, p, c, []call{
		{0, false, 1, 0}, {0, false, 1, 0}, {0, false, 1, 0}, // bucket 0 -> 2, then the free overflow
		{0, false, 1, 100 * ms},
		{0, false, 1, 200 * ms},
		// At +300 ms the queue has just emptied: the bucket, full, starts
		// to drain only now (upstream drained it for the whole 300 ms, 1.5
		// units, and let two calls through here: 7 calls in 300 ms at 10/s
		// with a burst of 2). This call takes the free slot, the next waits.
		{300 * ms, false, 1, 0},
		{0, false, 1, 100 * ms},
		// 500 ms later (the queue emptied at +500 ms, 300 ms ago) the bucket
		// has drained 1.5 units at 5/s, to 0.5: one call fits, the next
		// overflows (free), and the one after waits.
		{500 * ms, false, 1, 0},
		{0, false, 1, 0},
		{0, false, 1, 100 * ms},
	})
	out, err := p.Pace(bg, "k", 1)
	if err != nil || out.Level != 2 {
		t.Fatalf("level %v, %v; want a full bucket", out.Level, err)
	}
}

// TestHeavyCallFromIdle checks upstream's behaviour for a weight above the
// bucket: from idle it goes at once (even under RateLimit) and books
// weight/QPS for everyone after it.
func TestHeavyCallFromIdle(t *testing.T) {
	ms := time.Millisecond
	p, c := localPacer(t, Options{QPS: 10, MaxBurst: 1})
	run(t, p, c, []call{
		{0, true, 5, 0},
		{0, true, 1, 500 * ms},
		{0, false, 1, 500 * ms},
		{0, false, 1, 600 * ms},
	})
}

// TestClockStepsBack checks that time never runs backwards for a key: a
// clock that steps back neither refills the bucket nor moves the queue.
func TestClockStepsBack(t *testing.T) {
	ms := time.Millisecond
	p, c := localPacer(t, Options{QPS: 10, MaxBurst: 2})
	run(t, p, c, []call{
		{0, false, 1, 0}, {0, false, 1, 0}, {0, false, 1, 0},
		{-time.Second, false, 1, 100 * ms}, // decided as at the last call
		{0, false, 1, 200 * ms},
	})
	out, _ := p.RateLimit(bg, "k", 1)
	if out.Level != 2 {
		t.Fatalf("level %v after a backward step, want 2 (no negative drain)", out.Level)
	}
}

// TestMaxDelay checks that Pace records nothing when the delay exceeds
// Options.MaxDelay.
func TestMaxDelay(t *testing.T) {
	ms := time.Millisecond
	p, c := localPacer(t, Options{QPS: 10, MaxDelay: 150 * ms})
	run(t, p, c, []call{{0, false, 1, 0}, {0, false, 1, 100 * ms}})
	out, err := p.Pace(bg, "k", 1)
	if !errors.Is(err, ErrTooLong) || out.Delay != 200*ms {
		t.Fatalf("Pace = %v, %v; want a 200ms delay and ErrTooLong", out.Delay, err)
	}
	// The refused call booked nothing, and RateLimit is not bounded by
	// MaxDelay.
	run(t, p, c, []call{{0, true, 1, 200 * ms}})
}

// TestExpiry checks that a state past its expiry counts as absent (and is
// equivalent to the drained state it stands for), and that the store drops
// it from memory.
func TestExpiry(t *testing.T) {
	c := newManualClock(startEpoch)
	l := NewLocal(LocalOptions{Clock: c})
	p := mustNew(t, l, Options{Name: "p", QPS: 1, MaxBurst: 100})
	for i := 0; i < 150; i++ {
		if _, err := p.Pace(bg, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	// 50 s of calls queued at 1/s, then a full bucket draining at 0.5/s
	// (200 s): the state lives for 250 s plus 120 s of slack.
	st, ok := localState(l, "p", "k")
	if !ok || st.exp != startEpoch.UnixMicro()+370_000_000 {
		t.Fatalf("state %+v, %v; want expiry at +370 s", st, ok)
	}
	if l.Len() != 1 {
		t.Fatalf("Len %d, want 1", l.Len())
	}
	c.Add(369 * time.Second)
	l.Sweep()
	if l.Len() != 1 {
		t.Fatal("live state dropped")
	}
	c.Add(time.Second)
	l.Sweep()
	if l.Len() != 0 {
		t.Fatal("expired state kept")
	}
	out, err := p.Pace(bg, "k", 1)
	if err != nil || out.Delay != 0 || out.Level != 0 {
		t.Fatalf("after expiry: %+v, %v; want a fresh state", out, err)
	}
}

// TestBook checks that Book records spent weight without waiting, and never
// books a slot further than within from now: a huge figure moves the key's
// schedule at most that far ahead, and what does not fit is reported.
func TestBook(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			// 60k tokens a minute (1000/s), burst 0.
			p := mustNew(t, b.store, Options{Name: "tokens", QPS: 1000})
			out, err := p.Book(bg, "k", time.Minute, 1e9)
			if err != nil {
				t.Fatal(err)
			}
			// From idle the whole figure would book 11.6 days; it books a
			// minute's worth.
			if out.Delay != 0 || out.Booked != 60_000 || out.Weight != 1e9 {
				t.Fatalf("Book(1e9) = %+v; want no delay and 60000 booked", out)
			}
			if out, _ := p.RateLimit(bg, "k", 1); out.Delay != time.Minute {
				t.Fatalf("retry after %v, want 1m (one window)", out.Delay)
			}
			// The schedule is a window ahead already: another huge figure
			// books nothing more, and a later one books what the passing time
			// made room for.
			if out, err := p.Book(bg, "k", time.Minute, 5e10); err != nil || out.Booked != 0 || out.Delay != time.Minute {
				t.Fatalf("second Book = %+v, %v; want nothing booked", out, err)
			}
			b.clk.Add(10 * time.Second)
			if out, err := p.Book(bg, "k", time.Minute, 5e10); err != nil || out.Booked != 10_000 {
				t.Fatalf("Book after 10s = %+v, %v; want 10000 booked", out, err)
			}
			if out, _ := p.RateLimit(bg, "k", 1); out.Delay != time.Minute {
				t.Fatalf("retry after %v, want 1m", out.Delay)
			}
			// A figure that fits is booked whole, and a bad within is invalid.
			q := mustNew(t, b.store, Options{Name: "small", QPS: 1000, MaxBurst: 500})
			if out, err := q.Book(bg, "k", time.Minute, 700); err != nil || out.Booked != 700 {
				t.Fatalf("Book(700) = %+v, %v; want all booked", out, err)
			}
			var ce *ConfigError
			if _, err := q.Book(bg, "k", 0, 1); !errors.As(err, &ce) || ce.Field != "within" {
				t.Fatalf("Book within 0: %v, want a ConfigError naming within", err)
			}
		})
	}
}
