package actor

import (
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The fleet pool comes before the rates ("capacity, slot, fleet, rate: a
// fleet refusal spends no rate turn"), and the old facade kept that order
// for an in-process rate too (with a fleet pool it decided the rate after
// the reserve). The state machine decided an in-process rate at the grant,
// before the fleet stage: a call the fleet turned away had spent its turn,
// and the next call was refused RateLimit for a turn nobody used.
func TestReviewFleetRefusalSpendsNoLocalRateTurn(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", PerModel: Rate{RequestsPerMinute: 60}}})
	s.fleet = &fleetStage{}
	a := newReq("a", 0)
	s.acquire(a)
	if len(rec.remotes) != 1 {
		t.Fatalf("answers %v, jobs %d: want a's fleet reserve under way", rec.take(), len(rec.remotes))
	}
	j := rec.remotes[0]
	j.why, j.ext = admission.ConcurrencyLimit, &admission.External{Constraint: admission.ConstraintFleet}
	s.verdict(j)
	wantAnswers(t, rec, "a", admission.ConcurrencyLimit)
	b := newReq("b", 0)
	s.acquire(b) // same instant: the turn a did not use is free
	wantAnswers(t, rec)
	if len(rec.remotes) != 2 {
		t.Fatalf("jobs %d, answer %v: want b at the fleet stage, not turned away by the rate", len(rec.remotes), b.Err)
	}
	// The fleet admits b: the rate is decided then, and a third call at
	// the same instant finds b's turn taken.
	s.verdict(rec.remotes[1])
	wantAnswers(t, rec, "b", admitted)
	s.acquire(newReq("c", 0))
	s.verdict(rec.remotes[2])
	wantAnswers(t, rec, "c", rateLimit)
	if s.inFlight != 1 || s.provisional != 0 || len(rec.releases) != 2 {
		t.Fatalf("in flight %d, provisional %d, fleet releases %d: want c's slot and fleet hold given back", s.inFlight, s.provisional, len(rec.releases))
	}
}
