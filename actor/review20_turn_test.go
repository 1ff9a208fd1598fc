package actor

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// endedCtx marks r's context as ended, as the facade sees it once the
// caller has gone: its Done channel is closed.
func endedCtx(r *AcquireRequest) {
	done := make(chan struct{})
	close(done)
	r.ctxDone = done
}

// A paced call whose turn a remote store is booking, and whose caller
// leaves meanwhile: the facade's cancel message arrives while the call is
// checking (the state leaves it to the verdict), and the store had booked
// the turn before the context ended. The verdict must answer the call; it
// parked it instead, and a parked call whose context has ended waits for a
// cancel message that was already spent: it was never answered, and Drain
// never completed.
func TestReviewRemoteTurnCancelWhileCheckingParked(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}})
	s.rates.remote = true
	a := newReq("a", 0)
	s.acquire(a)
	if len(rec.remotes) != 1 || !a.checking {
		t.Fatalf("jobs %d: want a's turn asked of the store", len(rec.remotes))
	}
	endedCtx(a)
	s.cancel(&cancelMsg{r: a, cause: context.Canceled}) // the caller left
	j := rec.remotes[0]
	j.delay = 300 * time.Millisecond // booked before the context ended
	s.verdict(j)
	rec.clock = rec.clock.Add(300 * time.Millisecond)
	if a.parked {
		s.unpark(&parkMsg{r: a, gen: a.gen, seq: a.parkSeq})
	}
	wantAnswers(t, rec, "a", aborted)
	if !s.idle() {
		t.Fatalf("not idle: parked %d, pending %d, checking %d", s.nparked, s.pending, s.checking)
	}
}

// The same with a turn free at once and no slot free: the verdict queued
// the call, whose cancel message was already spent; the pump passes over
// it forever (no queue timeout), so it was never answered.
func TestReviewRemoteTurnCancelWhileCheckingQueued(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 6000}}})
	s.rates.remote = true
	first := newReq("first", 0)
	s.acquire(first)
	s.verdict(rec.remotes[0])
	wantAnswers(t, rec, "first", admitted)
	a := newReq("a", 0)
	s.acquire(a)
	endedCtx(a)
	s.cancel(&cancelMsg{r: a, cause: context.Canceled})
	s.verdict(rec.remotes[1]) // delay 0: its turn is now
	release(s, first)
	wantAnswers(t, rec, "a", aborted)
	if !s.idle() {
		t.Fatalf("not idle: parked %d, pending %d, checking %d", s.nparked, s.pending, s.checking)
	}
}
