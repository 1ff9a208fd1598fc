package bulkhead_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// The fleet pool comes before the rates: "a fleet refusal spends no rate
// turn". With an in-process rate beside a fleet pool, the old facade
// decided the rate after the reserve; the engine decided it at the grant,
// before the reserve, so a call the fleet turned away had spent its rate
// turn and the next call, at the same instant, was turned away RateLimit
// though no call used that turn.
func TestReviewFleetRefusalSpendsNoInProcessRateTurn(t *testing.T) {
	_, client := fleetRedis(t)
	otherPool := newFleetPool(t, client, "turns", 1, -1, fleet.FailClosed)
	other := newBulkhead(t, fleetConfig(otherPool, 4))
	clk := clock.NewMock()
	cfg := fleetConfig(newFleetPool(t, client, "turns", 1, -1, fleet.FailClosed), 4)
	cfg.Clock = clk
	cfg.RateLimits = &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}
	b := newBulkhead(t, cfg)
	theirs := mustAcquire(t, other, req("theirs", 9)) // the fleet's one slot
	_, err := b.Acquire(context.Background(), req("refused", 9))
	wantFleetReject(t, err, bulkhead.ConcurrencyLimit, 1)
	_ = theirs.Release(nil)
	testutil.WaitFor(t, "the release to reach Redis", func() bool { return otherPool.Stats().LastView.Slots == 0 })
	p, err := b.Acquire(context.Background(), req("next", 9))
	if err != nil {
		t.Fatalf("the call after a fleet refusal, at the same instant: %v", err)
	}
	_ = p.Release(nil)
	// That one took the turn: the next, which the fleet lets through, is
	// turned away by the rate, and gives its fleet hold back.
	_, err = b.Acquire(context.Background(), req("third", 9))
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
	if st := b.Stats(); st.Gate.InFlight != 0 || st.Fleet.Checked != 3 || st.Fleet.Admitted != 2 {
		t.Fatalf("stats %+v, fleet %+v", st.Gate, st.Fleet)
	}
}
