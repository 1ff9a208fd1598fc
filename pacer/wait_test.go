package pacer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// armWait makes every wait report its duration on the returned channel once
// its timer is armed, so a test can move the mock clock knowing that the
// waiter will see it.
func armWait(t *testing.T) <-chan time.Duration {
	ch := make(chan time.Duration, 16)
	testHookWait = func(d time.Duration) { ch <- d }
	t.Cleanup(func() { testHookWait = nil })
	return ch
}

type waitResult struct {
	out Outcome
	err error
}

func goPaceWait(ctx context.Context, p *Pacer) <-chan waitResult {
	done := make(chan waitResult, 1)
	go func() {
		out, err := p.PaceWait(ctx, "k", 1)
		done <- waitResult{out, err}
	}()
	return done
}

func notDone[T any](t *testing.T, ch <-chan T) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("returned early: %+v", r)
	default:
	}
}

func TestPaceWait(t *testing.T) {
	ms := time.Millisecond
	m := clock.NewMockAt(startEpoch)
	p := mustNew(t, NewLocal(LocalOptions{Clock: m}), Options{Name: "p", QPS: 10})
	waits := armWait(t)

	if out, err := p.PaceWait(bg, "k", 1); err != nil || out.Delay != 0 {
		t.Fatalf("first call: %+v, %v", out, err)
	}
	if len(waits) != 0 {
		t.Fatal("a call without delay waited")
	}

	done := goPaceWait(bg, p)
	if d := <-waits; d != 100*ms {
		t.Fatalf("waits %v, want 100ms", d)
	}
	m.Add(99 * ms)
	notDone(t, done)
	m.Add(ms)
	if r := <-done; r.err != nil || r.out.Delay != 100*ms {
		t.Fatalf("PaceWait: %+v, %v", r.out, r.err)
	}

	// Cancelled while waiting: the cause is returned, and the slot stays booked.
	ctx, cancel := context.WithCancelCause(bg)
	done = goPaceWait(ctx, p)
	if d := <-waits; d != 100*ms {
		t.Fatalf("waits %v, want 100ms", d)
	}
	cancel(errBecause)
	if r := <-done; !errors.Is(r.err, errBecause) || r.out.Delay != 100*ms {
		t.Fatalf("cancelled PaceWait: %+v, %v", r.out, r.err)
	}
	if out, _ := p.RateLimit(bg, "k", 1); out.Delay != 200*ms {
		t.Fatalf("after a cancelled wait the next slot is in %v, want 200ms", out.Delay)
	}
}

// TestPaceWaitDeadline checks that PaceWait books nothing and returns at once
// when the context's deadline comes before the call could go.
func TestPaceWaitDeadline(t *testing.T) {
	ms := time.Millisecond
	m := clock.NewMockAt(startEpoch)
	p := mustNew(t, NewLocal(LocalOptions{Clock: m}), Options{Name: "p", QPS: 10})
	waits := armWait(t)
	if _, err := p.Pace(bg, "k", 1); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := m.WithTimeout(bg, 50*ms)
	defer cancel()
	out, err := p.PaceWait(ctx, "k", 1)
	if !errors.Is(err, ErrTooLong) || !errors.Is(err, context.DeadlineExceeded) || out.Delay != 100*ms {
		t.Fatalf("PaceWait = %+v, %v; want a 100ms delay, ErrTooLong and DeadlineExceeded", out, err)
	}
	if len(waits) != 0 {
		t.Fatal("PaceWait waited for a call it could not make")
	}
	if out, _ := p.RateLimit(bg, "k", 1); out.Delay != 100*ms {
		t.Fatalf("the refused call booked a slot: next in %v", out.Delay)
	}

	// A deadline that leaves time enough: the call waits and goes.
	ctx2, cancel2 := m.WithTimeout(bg, 100*ms)
	defer cancel2()
	done := goPaceWait(ctx2, p)
	<-waits
	m.Add(100 * ms)
	r := <-done
	if r.err != nil && !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatal(r.err)
	}
	// (At exactly the deadline either may win; the slot was booked.)
	if r.out.Delay != 100*ms {
		t.Fatalf("delay %v", r.out.Delay)
	}

	// A deadline already past.
	ctx3, cancel3 := m.WithDeadline(bg, m.Now().Add(-ms))
	defer cancel3()
	if _, err := p.PaceWait(ctx3, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("past deadline: %v", err)
	}
}

func TestCompositePaceWait(t *testing.T) {
	ms := time.Millisecond
	m := clock.NewMockAt(startEpoch)
	l := NewLocal(LocalOptions{Clock: m})
	rpm := mustNew(t, l, Options{Name: "rpm", QPS: 10})
	tpm := mustNew(t, l, Options{Name: "tpm", QPS: 100})
	c, err := NewComposite(rpm, tpm)
	if err != nil {
		t.Fatal(err)
	}
	waits := armWait(t)
	if _, err := c.PaceWait(bg, "k", 1, 50); err != nil {
		t.Fatal(err)
	}
	type res struct {
		out CompositeOutcome
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := c.PaceWait(bg, "k", 1, 50)
		done <- res{out, err}
	}()
	if d := <-waits; d != 500*ms {
		t.Fatalf("waits %v, want 500ms (50 tokens at 100/s)", d)
	}
	m.Add(500 * ms)
	r := <-done
	if r.err != nil || r.out.Pacer != tpm || r.out.Members[0].Delay != 100*ms {
		t.Fatalf("composite PaceWait: %+v, %v", r.out, r.err)
	}

	ctx, cancel := m.WithTimeout(bg, 10*ms)
	defer cancel()
	_, err = c.PaceWait(ctx, "k", 1, 50)
	if !errors.Is(err, ErrTooLong) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("composite PaceWait past the deadline: %v", err)
	}
}

// TestPaceWaitRedisServerTime paces on the Redis server's clock and waits on
// the wall clock.
func TestPaceWaitRedisServerTime(t *testing.T) {
	_, client := startRedis(t)
	p := mustNew(t, newRedisStore(t, client, RedisOptions{}), Options{Name: "p", QPS: 20})
	if out, err := p.PaceWait(bg, "k", 1); err != nil || out.Delay != 0 {
		t.Fatalf("first call: %+v, %v", out, err)
	}
	start := time.Now()
	out, err := p.PaceWait(bg, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if out.Delay <= 0 || out.Delay > 50*time.Millisecond {
		t.Fatalf("second call delayed %v, want (0, 50ms]", out.Delay)
	}
	if el := time.Since(start); el < out.Delay {
		t.Fatalf("PaceWait returned after %v, before its delay of %v", el, out.Delay)
	}
}
