package pacer

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// TestSettleGivesBackToTheBucket: weight given back lowers the bucket, so
// that more calls go once the queue has run out, on both stores; what is
// given back is at most what the bucket holds.
func TestSettleGivesBackToTheBucket(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "otpm", QPS: 1, MaxBurst: 4, BurstFactor: 1})
			goes := func(what string, want int) {
				t.Helper()
				n := 0
				for ; n < 10; n++ {
					out, err := p.RateLimit(bg, "k", 1)
					if err != nil {
						t.Fatal(err)
					}
					if out.Delay > 0 {
						break
					}
				}
				if n != want {
					t.Fatalf("%s: %d calls went at once, want %d", what, n, want)
				}
			}
			goes("from idle", 5) // the bucket's 4, and the call that overflows it
			out, err := p.Settle(bg, "k", time.Minute, -3)
			if err != nil || out.Booked != -3 || out.Delay != 0 {
				t.Fatalf("Settle(-3) = %+v, %v; want 3 given back", out, err)
			}
			goes("while the overflowing call's slot runs", 0)
			b.clk.Add(time.Second) // the queue runs out: the room given back is there
			goes("after the slot", 4)

			out, err = p.Settle(bg, "k", time.Minute, -100)
			if err != nil || out.Booked != -4 {
				t.Fatalf("Settle(-100) on a full bucket = %+v, %v; want the bucket's 4 given back", out, err)
			}
			out, err = p.Settle(bg, "k", time.Minute, -1)
			if err != nil || out.Booked != 0 {
				t.Fatalf("Settle(-1) on an empty bucket = %+v, %v; want nothing given back", out, err)
			}
			out, err = p.Settle(bg, "k", time.Minute, 0)
			if err != nil || out.Booked != 0 || out.Delay != 0 {
				t.Fatalf("Settle(0) = %+v, %v", out, err)
			}

			// Without a burst there is no bucket to give back to.
			strict := mustNew(t, b.store, Options{Name: "strict", QPS: 1, BurstFactor: 1})
			if out, err := strict.RateLimit(bg, "k", 1); err != nil || out.Delay != 0 {
				t.Fatalf("strict: %+v, %v", out, err)
			}
			if out, err := strict.Settle(bg, "k", time.Minute, -1); err != nil || out.Booked != 0 {
				t.Fatalf("strict Settle(-1) = %+v, %v; want nothing given back", out, err)
			}
			if out, err := strict.RateLimit(bg, "k", 1); err != nil || out.Delay != time.Second {
				t.Fatalf("strict after Settle: %+v, %v; want the next slot, 1s away", out, err)
			}
		})
	}
}

// TestSettleBooksOverruns: a positive delta books as Book does, capped at
// within from now; in a composite each member settles its own delta, in
// one step.
func TestSettleBooksOverruns(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			in := mustNew(t, b.store, Options{Name: "in", QPS: 10, MaxBurst: 10, BurstFactor: 1})
			outp := mustNew(t, b.store, Options{Name: "out", QPS: 10, MaxBurst: 10, BurstFactor: 1})
			comp, err := NewComposite(in, outp)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := comp.RateLimit(bg, "k", 10, 10); err != nil {
				t.Fatal(err)
			}
			// Input used 25 beyond its count: the bucket is full, so 25 is
			// booked in the queue, but only 1 s (10) of it fits; output
			// gives 4 back.
			res, err := comp.Settle(bg, "k", time.Second, 25, -4)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Members[0].Booked; got != 10 {
				t.Errorf("input booked %v, want 10 (1 s of it)", got)
			}
			if got := res.Members[1].Booked; got != -4 {
				t.Errorf("output booked %v, want -4", got)
			}
			if out, err := in.RateLimit(bg, "k", 1); err != nil || out.Delay != time.Second {
				t.Errorf("input after the overrun: %+v, %v; want 1s to wait", out, err)
			}
			if out, err := outp.RateLimit(bg, "k", 4); err != nil || out.Delay != 0 {
				t.Errorf("output after the give-back: %+v, %v; want room for 4", out, err)
			}
		})
	}
}

// TestSettlePacedCallsKeepTheirTurns: weight given back while paced calls
// wait in the queue does not let a later call go ahead of them.
func TestSettlePacedCallsKeepTheirTurns(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "p", QPS: 1, MaxBurst: 2})
			// Two calls fill the bucket, the third overflows it and goes,
			// the next two queue: 1 s and 2 s.
			var last time.Duration
			for range 5 {
				out, err := p.Pace(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				last = out.Delay
			}
			if last != 2*time.Second {
				t.Fatalf("the fifth call waits %v, want 2s", last)
			}
			if out, err := p.Settle(bg, "k", time.Minute, -2); err != nil || out.Booked != -2 {
				t.Fatalf("Settle(-2) = %+v, %v", out, err)
			}
			out, err := p.Pace(bg, "k", 1)
			if err != nil || out.Delay != 3*time.Second {
				t.Fatalf("a call after the give-back: %+v, %v; want it after the queued calls (3s)", out, err)
			}
		})
	}
}

// TestSettleValidation: a delta that is not a number, or one that gives
// back more than the horizon, and a within that is not positive, are
// invalid and change nothing; Book still refuses negative weights.
func TestSettleValidation(t *testing.T) {
	p := mustNew(t, NewLocal(LocalOptions{}), Options{Name: "p", QPS: 1, MaxBurst: 2})
	comp, err := NewComposite(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"NaN", func() error { _, err := p.Settle(bg, "k", time.Second, math.NaN()); return err }()},
		{"-Inf", func() error { _, err := p.Settle(bg, "k", time.Second, math.Inf(-1)); return err }()},
		{"+Inf", func() error { _, err := p.Settle(bg, "k", time.Second, math.Inf(1)); return err }()},
		{"beyond the horizon", func() error { _, err := p.Settle(bg, "k", time.Second, -1e300); return err }()},
		{"within 0", func() error { _, err := p.Settle(bg, "k", 0, -1); return err }()},
		{"composite NaN", func() error { _, err := comp.Settle(bg, "k", time.Second, math.NaN()); return err }()},
		{"Book negative", func() error { _, err := p.Book(bg, "k", time.Second, -1); return err }()},
		{"composite Book negative", func() error { _, err := comp.Book(bg, "k", time.Second, -1); return err }()},
	} {
		var ce *ConfigError
		if !errors.As(c.err, &ce) || !errors.Is(c.err, admission.ErrInvalid) {
			t.Errorf("%s: %v; want a *ConfigError matching ErrInvalid", c.name, c.err)
		}
	}
	if l := p.store.(*Local); l.Len() != 0 {
		t.Fatalf("invalid settlements stored %d keys", l.Len())
	}
}
