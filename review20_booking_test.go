package bulkhead_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// An overrun on rates kept in Redis is booked at release on a goroutine
// of the engine's (the release waits for it), but the engine counted the
// admission settled as soon as it handled the release: a Drain (or
// Shutdown) that ran meanwhile reported drained while that goroutine still
// talked to Redis, though after Close and a Drain that drained, the
// bulkhead's goroutines have ended.
func TestReviewDrainWaitsForOverrunBooking(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 60_000, TokenBurst: bulkhead.NoBurst}}))
	p := mustAcquire(t, b, req("a", 99)) // 100 tokens
	booking, resume := make(chan struct{}), make(chan struct{})
	hold := func() { close(booking); <-resume }
	once.Store(&hold)
	released := make(chan error, 1)
	go func() { released <- p.Release(&bulkhead.Usage{Input: 5000}) }()
	<-booking // the overrun's booking has its reply, on the engine's goroutine
	b.Close()
	res := drainNow(b)
	select {
	case <-released:
		t.Fatal("the release returned before its overrun was booked")
	default:
	}
	close(resume)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if res.Drained || res.InFlight != 1 {
		t.Fatalf("Drain after Close: %+v while the release's overrun booking still ran on a goroutine of the engine's; want not drained, 1 in flight", res)
	}
	if res := drainNow(b); !res.Drained {
		t.Fatalf("Drain once the booking is done: %+v", res)
	}
}

// A Redis hook that panics while an overrun is booked at release: the
// booking runs on a goroutine of the engine's, which recovered nothing, so
// the panic ended the process. (Before, the booking ran on the releasing
// caller's goroutine, where the panic reached the caller; every other
// Redis call of a remote stage recovers it into its verdict.) The test
// runs the release in a child process and fails when that process dies.
func TestReviewOverrunBookingHookPanic(t *testing.T) {
	if os.Getenv("BULKHEAD_REVIEW20_CHILD") == "1" {
		overrunBookingHookPanic(t)
		return
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReviewOverrunBookingHookPanic$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "BULKHEAD_REVIEW20_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a panicking Redis hook during an overrun booking ended the process (%v):\n%s", err, out)
	}
}

func overrunBookingHookPanic(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 60_000, TokenBurst: bulkhead.NoBurst}}))
	p := mustAcquire(t, b, req("a", 99))
	boom := func() { panic("redis hook") }
	once.Store(&boom)
	func() {
		defer func() { _ = recover() }() // reaching the caller is fine too
		_ = p.Release(&bulkhead.Usage{Input: 5000})
	}()
	if st := b.Stats().Rate; st.OverrunErrors != 1 {
		t.Fatalf("rate stats %+v: want the failed booking counted", st)
	}
}
