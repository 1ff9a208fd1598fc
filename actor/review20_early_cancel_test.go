package actor

import (
	"context"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// AcquireAsync's cancel message can reach the engine before its request
// (the context ended as the request was sent): the engine ignored it,
// then queued the request, which the pump passes over as one whose cancel
// message is on its way. It was never answered.
func TestReviewCancelBeforeRequest(t *testing.T) {
	s, rec := newTestState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 4})
	first := newReq("first", 0)
	s.acquire(first)
	wantAnswers(t, rec, "first", admitted)
	a := newReq("a", 0)
	endedCtx(a)
	s.cancel(&cancelMsg{r: a, cause: context.Canceled})
	s.acquire(a)
	release(s, first)
	wantAnswers(t, rec, "a", aborted)
	if !s.idle() {
		t.Fatalf("not idle: pending %d", s.pending)
	}
}
