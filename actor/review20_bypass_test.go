package actor

import (
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// A provisional admission in observe mode that its fleet pool turns away
// for a reason the call shadows is bypassed: the call runs anyway and
// reaches the provider, which counts it against its rate limits. The old
// facade kept its spend from the provider's headroom then (it gave the
// headroom back only to a call it rejected); the rollback gave it back
// before it looked at the shadow reasons, so the next calls saw headroom
// the provider no longer had.
func TestReviewRollbackBypassKeepsHeadroomSpent(t *testing.T) {
	s, rec := newStageState(t, budgetLimits(4, 0, 1000), stageConfig{model: "m", shed: true})
	s.fleet = &fleetStage{}
	s.feedback(&Feedback{Model: "m", Headroom: &admission.Headroom{Tokens: 100, Requests: -1, TokensReset: time.Minute}})
	a := modelReq("a", "m", 30)
	a.Shadow = admission.ReasonSet(0).With(admission.ConcurrencyLimit)
	s.acquire(a)
	j := rec.remotes[0]
	j.why, j.ext = admission.ConcurrencyLimit, &admission.External{Constraint: admission.ConstraintFleet}
	s.verdict(j)
	wantAnswers(t, rec, "a", admitted)
	if a.Lease.Bypass == nil {
		t.Fatal("the call was not bypassed")
	}
	if got := s.cool.stats(rec.clock).Headroom["m"].Tokens; got != 70 {
		t.Fatalf("headroom %d after a bypassed call that runs against the provider, want 70", got)
	}
}
