package props_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// gatedClock is a mock clock whose first AfterFunc call pauses, on entry,
// until the test lets it go: it stands for the scheduler preempting the
// goroutine that registers a timer between its reading of the clock and the
// registration.
type gatedClock struct {
	*clock.Mock
	once    sync.Once
	entered chan struct{}
	proceed chan struct{}
}

func (c *gatedClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.once.Do(func() {
		close(c.entered)
		<-c.proceed
	})
	return c.Mock.AfterFunc(d, f)
}

// TestBorrowedDeadlineTimerRegisteredLate: a borrowed-slot deadline is an
// instant fixed at admission (SPEC F20), and every timer is deterministic
// under a mock clock (SPEC conventions).
//
// The class's child actor arms the deadline's timer while the admission is
// being decided (it runs on the synchronized dispatcher), so a test that
// moves the clock after Run's callback started always finds it armed. This
// test forces the one window left: the clock moving past the deadline while
// the timer is being armed. A timer runs for a duration, so it would be
// registered relative to the moved clock and fire late; the class actor
// must notice and expire the lease at once.
func TestBorrowedDeadlineTimerRegisteredLate(t *testing.T) {
	clk := &gatedClock{Mock: clock.NewMock(), entered: make(chan struct{}), proceed: make(chan struct{})}
	cfg := bulkhead.Interactive("gpt-4o", 2)
	cfg.Clock = clk
	cfg.Classes = &bulkhead.Classes{Default: "bg", Limits: map[string]bulkhead.ClassLimits{"bg": {}}}
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	out := make(chan error, 1)
	go func() {
		_, err := bulkhead.Run(context.Background(), b, &bulkhead.Request{Messages: []bulkhead.Message{{Content: "x"}}},
			func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
				close(started)
				<-finish
				return 1, nil
			}, bulkhead.WithBorrowedDeadline(20*time.Millisecond))
		out <- err
	}()
	<-clk.entered // the class actor read Now() = 0 and is arming the timer
	clk.Mock.Add(20 * time.Millisecond)
	close(clk.proceed)
	<-started

	var de *bulkhead.BorrowedDeadlineError
	select {
	case err := <-out:
		if !errors.As(err, &de) {
			t.Errorf("Run returned %v, want its *BorrowedDeadlineError", err)
		}
	case <-time.After(10 * time.Second):
		st := b.Stats()
		t.Errorf("the clock is past the borrowed-slot deadline but Run has not returned: "+
			"the timer was armed relative to the moved clock (abandoned by deadline: %d, gate in flight %d)",
			st.Calls.AbandonedByCause[bulkhead.AbandonDeadline], st.Gate.InFlight)
		clk.Add(20 * time.Millisecond) // t=40ms: the late timer fires
		<-out
	}
	close(finish)
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := b.Drain(ctx); err != nil || !res.Drained {
		t.Fatalf("Drain: %+v, %v", res, err)
	}
}
