package actor

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/dedup"
)

// TestStateFollowers: a follower that ends on its own is a rejection of
// the call (counted, emitted without a detail, never at the gate), even on
// a closed engine; in observe mode a timed-out follower is bypassed, an
// aborted or unshareable one never is. A join emits its event.
func TestStateFollowers(t *testing.T) {
	s, rec := newTestState(t, budgetLimits(1, 1, 10))
	s.dedupJoined(&dedup.Joined{Call: "f", Class: "", Scope: "tenant"})
	if got := rec.events; len(got) != 1 || !reflect.DeepEqual(got[0], &admission.Event{Kind: admission.EventDedup, Request: "f", Scope: "tenant"}) {
		t.Fatalf("events %v", got)
	}
	rec.events = nil

	cause := errors.New("gone")
	ab := newReq("aborted", 3)
	ab.Follower, ab.FollowerCause = admission.Aborted, cause
	ab.Shadow = admission.ReasonSet(0).With(admission.Timeout)
	s.acquire(ab)
	to := newReq("timeout", 3)
	to.Follower = admission.Timeout
	s.acquire(to)
	un := newReq("unshareable", 3)
	un.Follower = admission.UnshareableResult
	un.Shadow = admission.ReasonSet(0).With(admission.Timeout).With(admission.BudgetLimit)
	s.acquire(un)
	wantAnswers(t, rec, "aborted", admission.Aborted, "timeout", admission.Timeout, "unshareable", admission.UnshareableResult)
	if !errors.Is(ab.Err, cause) || ab.Err.(*admission.RejectedError).Detail != nil {
		t.Fatalf("aborted follower: %v", ab.Err)
	}
	for _, e := range rec.events {
		if e.Kind != admission.EventReject || e.Detail != nil || e.Timing != (admission.Timing{}) || e.Reservation != (admission.Reservation{}) {
			t.Fatalf("reject event %+v", e)
		}
	}
	rec.events = nil

	obs := newReq("observed", 3)
	obs.Follower, obs.Shadow = admission.Timeout, admission.ReasonSet(0).With(admission.Timeout)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs.ctxDone = ctx.Done()
	s.acquire(obs)
	wantAnswers(t, rec, "observed", admission.NoReason)
	if b := obs.Lease.Bypass; b == nil || b.Reason != admission.Timeout || !b.Race || b.Detail != nil {
		t.Fatalf("bypass %+v", b)
	}
	if got, want := rec.kinds(), []string{"Reject", "Bypass"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}

	s.close()
	late := newReq("late", 1)
	late.Follower = admission.Timeout
	s.acquire(late)
	wantAnswers(t, rec, "late", admission.Timeout)

	st := s.stats(external{})
	want := [admission.NumReasons]int64{admission.Aborted: 1, admission.Timeout: 3, admission.UnshareableResult: 1}
	if st.Admissions.Rejected != want || st.Gate.Rejections() != 0 ||
		st.Observe.RaceBypassed != 1 || st.Ledger.Reserved != 0 {
		t.Fatalf("stats %+v %+v %+v", st.Admissions, st.Gate, st.Observe)
	}
}
