package actor

import (
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/dedup"
)

// Deduplication: followers hold nothing and never reach the gate, so the
// state sees them only when one joins (for its event) and when one ends on
// its own (for its rejection).

// dedupJoined emits the event of a follower that joined its leader.
func (s *state) dedupJoined(m *dedup.Joined) {
	if s.listeners[KindDedup] > 0 {
		s.fx.emit(&admission.DedupEvent{Request: m.Call, Class: m.Class, Scope: m.Scope})
	}
}

// rejectFollower ends a dedup follower whose wait ended on its own or whose
// leader's value it cannot share (r.Follower says which): a rejection of
// the call, counted and emitted without a detail (it never reached the
// gate, so the gate counts nothing). A follower that timed out in observe
// mode, with Timeout shadowed and its context alive, is then bypassed, as
// a queued call refused after its wait is, unless the engine is closed: a
// closed bulkhead is never bypassed.
func (s *state) rejectFollower(r *AcquireRequest) {
	why := r.Follower
	s.callStats.Rejected++
	s.callsByWhy[why]++
	s.tab.Reject(r.Class, why)
	if s.listeners[KindReject] > 0 {
		s.fx.emit(&admission.RejectEvent{
			Request:       r.Request,
			Reason:        why,
			LimitRevision: s.limits.Revision,
			Priority:      r.Priority,
			Class:         s.tab.Name(r.Class),
		})
	}
	if r.Shadow.Has(why) && !r.ctxEnded() && !s.closed {
		s.bypass(r, why, true, nil)
		return
	}
	r.Err = &admission.RejectedError{Reason: why, Cause: r.FollowerCause}
	s.answer(r)
}
