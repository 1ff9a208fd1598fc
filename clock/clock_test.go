package clock

import (
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
