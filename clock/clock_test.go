package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestOrRealAndMock(t *testing.T) {
	m := NewMockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if OrReal(m) != Clock(m) {
		t.Fatal("OrReal replaced a given clock")
	}
	if OrReal(nil) == nil {
		t.Fatal("OrReal(nil) is nil")
	}
	fired := make(chan time.Time, 1)
	m.AfterFunc(time.Second, func() { fired <- m.Now() })
	m.Add(time.Second)
	if got := <-fired; !got.Equal(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)) {
		t.Fatalf("timer fired at %v", got)
	}
}

func TestMockTimers(t *testing.T) {
	m := NewMock()
	tm := m.NewTimer(time.Second)
	stopped := m.AfterFunc(time.Second, func() { t.Error("a stopped timer fired") })
	if !stopped.Stop() || stopped.C() != nil {
		t.Fatal("Stop of a pending AfterFunc timer")
	}
	m.Add(999 * time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("fired early")
	default:
	}
	m.Add(time.Millisecond)
	if got := <-tm.C(); !got.Equal(time.Unix(0, 0).Add(time.Second)) {
		t.Fatalf("fired at %v", got)
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer returned true")
	}
	ctx, cancel := m.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m.Set(m.Now().Add(time.Minute))
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("ctx.Err = %v", ctx.Err())
	}
}

func TestRealClock(t *testing.T) {
	c := New()
	tm := c.NewTimer(time.Hour)
	if tm.C() == nil || !tm.Stop() {
		t.Fatal("real timer")
	}
	done := make(chan struct{})
	c.AfterFunc(0, func() { close(done) })
	<-done
	if c.Now().IsZero() {
		t.Fatal("Now is zero")
	}
}
