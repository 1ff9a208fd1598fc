package pacer

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestZeroWeight checks that a call of weight 0 (a zero-token call in a
// tokens-per-minute pacer) is never delayed and books nothing, on both
// stores, alone and in a composite, even on a key whose queue is full.
func TestZeroWeight(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "rpm", QPS: 10})
			// The same state under a larger bucket: a level above p's
			// MaxBurst of 0.
			wide := mustNew(t, b.store, Options{Name: "rpm", QPS: 10, MaxBurst: 5})
			tpm := mustNew(t, b.store, Options{Name: "tpm", QPS: 100})
			comp, err := NewComposite(p, tpm)
			if err != nil {
				t.Fatal(err)
			}
			zero := func(what string, out Outcome, err error) {
				t.Helper()
				if err != nil || out.Delay != 0 || out.Fallback != nil {
					t.Fatalf("%s: %+v, %v; want no delay", what, out, err)
				}
			}

			// A fresh key: nothing is stored.
			out, err := p.Pace(bg, "fresh", 0)
			zero("Pace fresh", out, err)
			if got := out.Reason(); got != "watermark=0.00/0 + weight=0, delayMs=0" {
				t.Errorf("reason %q", got)
			}
			out, err = p.RateLimit(bg, "fresh", 0)
			zero("RateLimit fresh", out, err)
			out, err = p.PaceWait(bg, "fresh", 0)
			zero("PaceWait fresh", out, err)
			cout, err := comp.Pace(bg, "fresh", 0, 0)
			zero("composite fresh", cout.Outcome, err)
			if cout.Pacer != nil || len(cout.Members) != 2 || cout.Reason() != "no delay" {
				t.Fatalf("composite fresh: %+v", cout)
			}
			if l, ok := b.store.(*Local); ok && l.Len() != 0 {
				t.Fatalf("local store holds %d keys", l.Len())
			}
			if r, ok := b.store.(*Redis); ok {
				c := r.client.(*redis.Client)
				if n := c.Exists(bg, r.Key("rpm", "fresh"), r.Key("tpm", "fresh")).Val(); n != 0 {
					t.Fatalf("redis holds %d keys", n)
				}
			}

			// A busy key: five calls fill wide's bucket, the sixth books the
			// next 100 ms.
			for i := 0; i < 6; i++ {
				if _, err := wide.Pace(bg, "busy", 1); err != nil {
					t.Fatal(err)
				}
			}
			out, err = p.Pace(bg, "busy", 0)
			zero("Pace busy", out, err)
			out, err = p.RateLimit(bg, "busy", 0)
			zero("RateLimit busy", out, err)
			out, err = p.PaceWait(bg, "busy", 0)
			zero("PaceWait busy", out, err)
			// Weight 0 for rpm, 1 for tpm: only tpm is asked and books.
			cout, err = comp.Pace(bg, "busy", 0, 1)
			zero("composite busy", cout.Outcome, err)
			if cout.Members[0].Delay != 0 || cout.Members[0].Weight != 0 || cout.Members[1].Weight != 1 {
				t.Fatalf("composite busy: %+v", cout)
			}
			// Nothing was booked in rpm: its next call still gets the slot
			// the sixth call booked, 100 ms ahead; tpm's next call gets the
			// slot after the composite's.
			out, err = p.Pace(bg, "busy", 1)
			if err != nil || out.Delay != 100*time.Millisecond {
				t.Fatalf("after zero-weight calls: %+v, %v; want 100 ms", out, err)
			}
			out, err = tpm.Pace(bg, "busy", 1)
			if err != nil || out.Delay != 10*time.Millisecond {
				t.Fatalf("tpm: %+v, %v; want 10 ms", out, err)
			}
		})
	}
}

// TestMaxQPS checks that the highest rate still paces, a microsecond per
// weight-1 call, on both stores, and that a higher rate is refused by name.
func TestMaxQPS(t *testing.T) {
	if _, err := New(NewLocal(LocalOptions{}), Options{Name: "p", QPS: MaxQPS * 1.5}); err == nil ||
		!strings.Contains(err.Error(), "Options.QPS") || !strings.Contains(err.Error(), "at most 1e+06") {
		t.Fatalf("QPS above MaxQPS: %v", err)
	}
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "fast", QPS: MaxQPS})
			// Simultaneous calls are spaced 1 µs apart: the 1000th waits
			// 999 µs. (Delays below 500 µs are reported as none.)
			var last Outcome
			for i := 0; i < 1000; i++ {
				out, err := p.Pace(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				last = out
			}
			if last.Delay != 999*time.Microsecond {
				t.Fatalf("1000th call: %+v, want a delay of 999 µs", last)
			}
		})
	}
}

// TestReasonRounding checks that the level in a reason is rounded half up,
// whatever strconv does with exact ties.
func TestReasonRounding(t *testing.T) {
	for _, c := range []struct {
		level float64
		want  string
	}{
		{0, "0.00"}, {1, "1.00"}, {0.125, "0.13"}, {0.375, "0.38"}, {0.625, "0.63"}, {0.875, "0.88"},
		{2.125, "2.13"}, {0.25, "0.25"}, {0.5, "0.50"},
		{1.005, "1.00"}, {2.675, "2.67"}, // just below the half in binary
		{0.115, "0.12"}, {0.994999, "0.99"}, {0.995, "0.99"}, {0.9951, "1.00"},
		{4.4999990463257, "4.50"}, {1e20, "100000000000000000000.00"},
	} {
		o := Outcome{Level: c.level, MaxBurst: 2, Weight: 1}
		want := "watermark=" + c.want + "/2 + weight=1, delayMs=0"
		if got := o.Reason(); got != want {
			t.Errorf("level %v: %q, want %q", c.level, got, want)
		}
	}
}

// TestClockStepBackRetryAfter checks that after the clock steps back behind
// a key's last call, a RateLimit rejection's retry-after is the time until
// the call can go on the stepped-back clock, on both stores: a retry sooner
// is rejected again, and a retry at the retry-after goes.
func TestClockStepBackRetryAfter(t *testing.T) {
	ms := time.Millisecond
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "rl", QPS: 10})
			if out, err := p.RateLimit(bg, "k", 1); err != nil || out.Delay != 0 {
				t.Fatalf("first call: %+v, %v", out, err)
			}
			b.clk.Add(-10 * time.Second)
			out, err := p.RateLimit(bg, "k", 1)
			if err != nil || out.Delay != 10*time.Second+100*ms {
				t.Fatalf("after the step back: %+v, %v; want a retry-after of 10.1 s", out, err)
			}
			b.clk.Add(100 * ms)
			out, err = p.RateLimit(bg, "k", 1)
			if err != nil || out.Delay != 10*time.Second {
				t.Fatalf("100 ms later: %+v, %v; want 10 s", out, err)
			}
			b.clk.Add(out.Delay)
			out, err = p.RateLimit(bg, "k", 1)
			if err != nil || out.Delay != 0 {
				t.Fatalf("at the retry-after: %+v, %v; want admitted", out, err)
			}
			// Pace still counts from the key's last call: time stands still
			// for the key, so the pacer neither refills nor over-admits.
			b.clk.Add(-5 * time.Second)
			out, err = p.Pace(bg, "k", 1)
			if err != nil || out.Delay != 100*ms {
				t.Fatalf("Pace after a step back: %+v, %v; want 100 ms", out, err)
			}
		})
	}
}
