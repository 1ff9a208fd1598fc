package pacer

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLuaConstantsMatchGo(t *testing.T) {
	want := "local GRACE, HORIZON, ROUND = 120000000, 100000000000000, 500\n"
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
		{1, 3, 333_333},
		{2, 3, 666_667},
		{1, 1000.0 / 60, 60_000},
		{0.0000001, 1, 0},
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

// TestSubMillisecondIsRecorded checks the fix of the upstream bug in which a
// rate-limited call arriving less than half a millisecond before its slot
// was admitted (delayMs 0) without being recorded, so every call in that
// half millisecond got in for free.
func TestSubMillisecondIsRecorded(t *testing.T) {
	p, c := localPacer(t, Options{QPS: 3}) // interval 333333 µs
	us := time.Microsecond
	run(t, p, c, []call{
		{0, true, 1, 0},            // t=0: goes, books the slot at 333333
		{333_000 * us, true, 1, 0}, // 333 µs early: goes now and is recorded (next slot 666666)
		{0, true, 1, 333_666 * us}, // upstream let this one in for free too
		{100 * us, true, 1, 333_566 * us},
		{333_100 * us, true, 1, 0}, // t=666200, 466 µs early: goes, next slot 999999
		{0, true, 1, 333_799 * us},
		{333_299 * us, true, 1, 500 * us}, // 500 µs rounds to 1 ms: a delay
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
		// At +300 ms the queue is empty: the bucket drains from t=0 at 5/s,
		// 1.5 units, so 0.5 are left; this call fills it to 1.5, the next
		// overflows from idle (free again), and the one after waits.
		{300 * ms, false, 1, 0},
		{0, false, 1, 0},
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
	// 49 calls queued at 1/s, a full bucket draining at 0.5/s (200 s): the
	// state lives for 200 s plus 120 s of slack.
	st, ok := localState(l, "p", "k")
	if !ok || st.exp != startEpoch.UnixMicro()+320_000_000 {
		t.Fatalf("state %+v, %v; want expiry at +320 s", st, ok)
	}
	if l.Len() != 1 {
		t.Fatalf("Len %d, want 1", l.Len())
	}
	c.Add(319 * time.Second)
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
