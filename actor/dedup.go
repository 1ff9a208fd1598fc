package actor

import (
	"context"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/dedup"
)

// Deduplication: the dedup actor keeps the in-flight calls and their
// followers (the Engine's methods below talk to it). Followers hold nothing
// and never reach the gate, so the state sees them only when one joins (for
// its event) and when one ends on its own (for its rejection).

// dedupJoined emits the event of a follower that joined its leader.
func (s *state) dedupJoined(m *dedup.Joined) {
	if s.listeners[admission.EventDedup] > 0 {
		s.fx.emit(newEvent(admission.Event{Kind: admission.EventDedup, Request: m.Call, Class: m.Class, Scope: m.Scope}))
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
	// It never reached the gate: its event carries no reservation, detail
	// or timing.
	s.rejected(r.Request, r.Priority, admission.Reservation{}, r.Class, why, nil, admission.Timing{})
	if r.Shadow.Has(why) && !r.ctxEnded() && !s.closed {
		s.bypass(r, why, true, nil)
		return
	}
	r.Err = &admission.RejectedError{Reason: why, Cause: r.FollowerCause}
	s.answer(r)
}

// Dedup reports whether deduplication is on.
func (e *Engine) Dedup() bool { return e.dedup != nil }

// NewJoin takes a dedup join from the pool.
func (e *Engine) NewJoin() *dedup.Join { return e.joins.Get().(*dedup.Join) }

// PutJoin returns a join to the pool once its last answer has been read
// (for a leader, once it has settled). A follower that left is not put
// back: its leave message may still be on its way (see Follow).
func (e *Engine) PutJoin(j *dedup.Join) {
	j.Reset()
	e.joins.Put(j)
}

// Join places a deduplicated call (see package dedup) and returns once its
// role is known.
func (e *Engine) Join(j *dedup.Join) {
	e.root.Send(e.dedup, j)
	j.AwaitRole()
}

// Follow waits for follower j's final answer: its leader's outcome, or its
// own end. When ctx ends first, j leaves (and may still get the outcome,
// when the leader settled in the meantime): each follower ends exactly one
// way. ctx's methods are called on this goroutine only. It reports
// whether j may go back to the pool once read: not when it left, nor when
// it had a wait bound (its timer's message may still be on its way).
func (e *Engine) Follow(ctx context.Context, j *dedup.Join) (reusable bool) {
	done := ctx.Done()
	select {
	case <-j.Answered():
		return j.Wait == 0
	case <-done:
	}
	select {
	case <-j.Answered(): // answered before the context ended
		return j.Wait == 0
	default:
	}
	e.root.Send(e.dedup, j.Leave(contextCause(ctx)))
	<-j.Answered()
	return false
}

// Settle ends leader j's entry: its followers get outcome. It does not
// wait: every later join is ordered behind it. A leader that no follower
// joined settles without a message; alone says so (nobody reads outcome).
func (e *Engine) Settle(j *dedup.Join, outcome any) (alone bool) {
	if settled, wake := j.SettleAlone(); settled {
		if wake {
			e.root.Send(e.dedup, dedupWake)
		}
		return true
	}
	e.root.Send(e.dedup, j.Settle(outcome))
	return false
}

var dedupWake = &dedup.WakeDrains{}

// dedupActive returns the number of deduplicated keys in flight.
func (e *Engine) dedupActive() int64 {
	q := dedup.NewStatsRequest()
	e.root.Send(e.dedup, q)
	q.Await()
	return q.Active
}

// drainDedup waits until the dedup table is empty, or until ctx ends. It
// returns the number of keys still in flight (0 once empty) and whether it
// had to wait.
func (e *Engine) drainDedup(ctx context.Context) (active int64, waited bool) {
	q := dedup.NewDrain()
	e.root.Send(e.dedup, q)
	select {
	case <-q.Done():
	case <-ctx.Done():
		e.root.Send(e.dedup, q.Cancel())
		<-q.Done()
	}
	return q.Active, q.Waited
}
