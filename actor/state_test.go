package actor

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// These tests drive the state machine directly, one message at a time,
// with a recorder for its effects: no actors, no goroutines, no clock.

// answered is one answer to an acquire request, as it was when given.
type answered struct {
	name string // the request's Request
	err  error
}

// recorder implements effects by writing them down.
type recorder struct {
	clock   time.Time
	events  []*admission.Event
	tells   []any
	armed   map[*AcquireRequest]uint64 // running queue timers, by the generation they fire for
	answers []answered
	drains  []admission.DrainResult
	expired []*Lease
	drifts  []string
	// The stages' effects: parked calls' waits (for their turns, or in the
	// cooling line), remote jobs started, fleet holds ended
	// and adjusted, overruns booked remotely, warnings.
	parks    map[*AcquireRequest]time.Duration
	remotes  []*remoteJob
	releases []*Lease
	adjusts  []string
	booked   [][]float64
	warnings []string
	holds    []time.Duration
}

func (r *recorder) now() time.Time                { return r.clock }
func (r *recorder) emit(ev *admission.Event)      { r.events = append(r.events, ev) }
func (r *recorder) tell(_ classes.Class, msg any) { r.tells = append(r.tells, msg) }
func (r *recorder) armTimer(q *AcquireRequest)    { r.armed[q] = q.gen }
func (r *recorder) stopTimer(q *AcquireRequest)   { delete(r.armed, q) }
func (r *recorder) armHold(d time.Duration)       { r.holds = append(r.holds, d) }
func (r *recorder) armPark(q *AcquireRequest, d time.Duration) {
	r.armed[q] = q.gen
	r.parks[q] = d
}
func (r *recorder) armCooldown(q *AcquireRequest, d time.Duration) {
	r.parks[q] = d
	r.armHold(d)
}
func (r *recorder) startRemote(j *remoteJob) { r.remotes = append(r.remotes, j) }
func (r *recorder) fleetRelease(l *Lease)    { r.releases = append(r.releases, l) }
func (r *recorder) fleetAdjust(l *Lease, held, seq int64, abandoned bool) {
	r.adjusts = append(r.adjusts, fmt.Sprint(held, " ", seq, " ", abandoned))
}
func (r *recorder) bookRemote(_ *rateStage, _ *rateSet, deltas []float64, _ *Lease) {
	r.booked = append(r.booked, deltas)
}
func (r *recorder) warn(msg string, _ ...any)   { r.warnings = append(r.warnings, msg) }
func (r *recorder) stopHold()                   {}
func (r *recorder) answerDrain(d *drainRequest) { r.drains = append(r.drains, d.result) }
func (r *recorder) expire(l *Lease)             { r.expired = append(r.expired, l) }
func (r *recorder) answer(q *AcquireRequest) {
	r.answers = append(r.answers, answered{q.Request.(string), q.Err})
}
func (r *recorder) drifted(q string, got int64, args ...any) {
	r.drifts = append(r.drifts, fmt.Sprint(append([]any{q, got}, args...)...))
}

// take returns the answers given since the last call, and forgets them.
func (r *recorder) take() []answered {
	a := r.answers
	r.answers = nil
	return a
}

// kindNames names the kinds of event, as the tests list them.
var kindNames = [admission.NumEventKinds]string{
	admission.EventAdmit: "Admit", admission.EventReject: "Reject", admission.EventRelease: "Release",
	admission.EventReconfigure: "Reconfigure", admission.EventUsage: "Usage", admission.EventAbandon: "Abandon",
	admission.EventBypass: "Bypass", admission.EventBypassUsage: "BypassUsage", admission.EventBypassRelease: "BypassRelease",
	admission.EventDedup: "Dedup",
}

// kinds lists the kinds of the events emitted since the last call, and
// forgets them.
func (r *recorder) kinds() []string {
	var out []string
	for _, ev := range r.events {
		out = append(out, kindNames[ev.Kind])
	}
	r.events = nil
	return out
}

// total sums counts.
func total(counts []int64) int64 {
	var n int64
	for _, c := range counts {
		n += c
	}
	return n
}

var allKinds = func() (k Kinds) {
	for i := range k {
		k[i] = true
	}
	return k
}()

// newTestState returns a state machine over limits, listened to for every
// kind of event, and the recorder of its effects.
func newTestState(t *testing.T, limits admission.Limits) (*state, *recorder) {
	t.Helper()
	return newStageState(t, limits, stageConfig{})
}

// newStageState is newTestState with stages beyond capacity.
func newStageState(t *testing.T, limits admission.Limits, sc stageConfig) (*state, *recorder) {
	t.Helper()
	rec := &recorder{clock: time.Unix(1_000, 0), armed: map[*AcquireRequest]uint64{}, parks: map[*AcquireRequest]time.Duration{}}
	s, err := newState(limits, QueuePolicy{}, sc, rec, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	s.listen(allKinds, 1)
	return s, rec
}

// newReq returns a request named name (its opaque Request) reserving
// reserved tokens.
func newReq(name string, reserved int64) *AcquireRequest {
	r := newAcquireRequest(nil, false)
	r.Request, r.Lease = name, &Lease{}
	r.Reservation = admission.Reservation{Input: reserved, Reserved: reserved}
	return r
}

func reasonOf(err error) admission.Reason {
	var rej *admission.RejectedError
	if errors.As(err, &rej) {
		return rej.Reason
	}
	return admission.NoReason
}

// wantAnswers checks the answers given since the last check: names in
// order, each with its reason (NoReason for an admission).
func wantAnswers(t *testing.T, rec *recorder, want ...any) {
	t.Helper()
	got := rec.take()
	var gotFlat []any
	for _, a := range got {
		gotFlat = append(gotFlat, a.name, reasonOf(a.err))
	}
	if !reflect.DeepEqual(gotFlat, want) {
		t.Fatalf("answers %v, want %v (errors %v)", gotFlat, want, got)
	}
}

func release(s *state, r *AcquireRequest) { s.release(&releaseMsg{l: r.Lease}) }

func budgetLimits(mc, mq int, budget int64) admission.Limits {
	return admission.Limits{MaxConcurrent: mc, MaxQueue: mq, TokenBudget: &admission.BudgetLimits{Budget: budget}}
}

const (
	admitted = admission.NoReason
	aborted  = admission.Aborted
	shutdown = admission.Shutdown
)

// TestStateDecisionOrder: closed, then an ended context, then capacity
// (budget limits never queue), then a free slot, then the gate's answer.
func TestStateDecisionOrder(t *testing.T) {
	tests := []struct {
		name     string
		limits   admission.Limits
		held     int  // admissions of 10 tokens taken first
		waiting  int  // then waiters queued
		closed   bool // then closed
		ended    bool // the call's context had ended when it was sent
		reserved int64
		want     admission.Reason
		queued   bool
		atGate   bool
	}{
		{name: "free slot", limits: budgetLimits(2, 1, 100), held: 1, reserved: 5, want: admitted},
		{name: "exact fit", limits: budgetLimits(2, 1, 100), held: 1, reserved: 90, want: admitted},
		{name: "closed wins over capacity", limits: budgetLimits(1, 1, 100), held: 1, closed: true, reserved: 1000, want: shutdown, atGate: true},
		{name: "ended context with a free slot", limits: budgetLimits(2, 1, 100), ended: true, want: aborted, atGate: true},
		{name: "budget before the gate", limits: budgetLimits(1, 5, 100), held: 1, reserved: 91, want: admission.BudgetLimit},
		{name: "budget never queues", limits: budgetLimits(2, 5, 100), held: 1, reserved: 91, want: admission.BudgetLimit},
		{name: "kill switch", limits: admission.Limits{MaxConcurrent: 0, MaxQueue: 5}, want: admission.ConcurrencyLimit, atGate: true},
		{name: "fail fast", limits: admission.Limits{MaxConcurrent: 1}, held: 1, want: admission.ConcurrencyLimit, atGate: true},
		{name: "queue full", limits: admission.Limits{MaxConcurrent: 1, MaxQueue: 2}, held: 1, waiting: 2, want: admission.QueueLimit, atGate: true},
		{name: "waits", limits: admission.Limits{MaxConcurrent: 1, MaxQueue: 2}, held: 1, waiting: 1, queued: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, rec := newTestState(t, tt.limits)
			for i := range tt.held {
				s.acquire(newReq(fmt.Sprint("held", i), 10))
			}
			for i := range tt.waiting {
				s.acquire(newReq(fmt.Sprint("waiter", i), 0))
			}
			if tt.closed {
				s.close()
			}
			rec.take()
			before := s.stats(external{})
			r := newReq("call", tt.reserved)
			if tt.ended {
				r.ended = errors.New("gave up")
			}
			s.acquire(r)
			st := s.stats(external{})
			if tt.queued {
				wantAnswers(t, rec)
				if st.Pending != before.Pending+1 || !r.queued {
					t.Fatalf("not queued: %+v", st.Gate)
				}
				return
			}
			wantAnswers(t, rec, "call", tt.want)
			if tt.want == admitted {
				return
			}
			if got := st.Gate.Rejections() - before.Gate.Rejections(); got != map[bool]int64{true: 1}[tt.atGate] {
				t.Fatalf("gate rejections +%d, at gate %v", got, tt.atGate)
			}
			if st.Admissions.Rejected[tt.want] != before.Admissions.Rejected[tt.want]+1 {
				t.Fatalf("rejections by reason %v", st.Admissions.Rejected)
			}
			if tt.ended && !errors.Is(r.Err, r.ended) {
				t.Fatalf("the rejection %v lost the context's cause", r.Err)
			}
			if st.Tokens != before.Tokens {
				t.Fatal("a rejection changed the tokens held")
			}
		})
	}
}

// TestStatePumpIsFIFO: releases admit waiters in arrival order, one per
// freed slot, and a queued call's timing separates its wait from its work.
func TestStatePumpIsFIFO(t *testing.T) {
	s, rec := newTestState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 3})
	a := newReq("a", 0)
	s.acquire(a)
	ws := []*AcquireRequest{newReq("b", 0), newReq("c", 0), newReq("d", 0)}
	for _, w := range ws {
		w.Start = rec.clock
		rec.clock = rec.clock.Add(time.Millisecond) // a ms of work before it queues
		s.acquire(w)
	}
	wantAnswers(t, rec, "a", admitted)
	rec.kinds()
	prev := a
	for _, w := range ws {
		rec.clock = rec.clock.Add(time.Second)
		release(s, prev)
		wantAnswers(t, rec, w.Request, admitted)
		ev := rec.events[1]
		if !reflect.DeepEqual(rec.kinds(), []string{"Release", "Admit"}) || ev.Request != w.Request {
			t.Fatalf("events after releasing %v", prev.Request)
		}
		if ev.Timing.DecisionDuration != time.Millisecond || ev.Timing.QueueWait < time.Second {
			t.Fatalf("%v: timing %+v", w.Request, ev.Timing)
		}
		prev = w
	}
	release(s, prev)
	if st := s.stats(external{}); st.InFlight != 0 || st.Pending != 0 || st.Gate.Admitted != 4 || st.Gate.Released != 4 {
		t.Fatalf("gate %+v", st.Gate)
	}
}

// TestStateCancel: a cancelled waiter leaves the queue at once with the
// cause its sender read and is never admitted; a cancel after the answer
// changes nothing; a waiter whose context ended is passed over until its
// cancel arrives.
func TestStateCancel(t *testing.T) {
	s, rec := newTestState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 3})
	a, b, c, d := newReq("a", 0), newReq("b", 0), newReq("c", 0), newReq("d", 0)
	for _, r := range []*AcquireRequest{a, b, c, d} {
		s.acquire(r)
	}
	wantAnswers(t, rec, "a", admitted)
	cause := errors.New("gave up")
	s.cancel(&cancelMsg{r: b, cause: cause})
	wantAnswers(t, rec, "b", aborted)
	if !errors.Is(b.Err, cause) || s.pending != 2 {
		t.Fatalf("cancel: %v, pending %d", b.Err, s.pending)
	}
	s.cancel(&cancelMsg{r: b, cause: cause}) // twice
	s.cancel(&cancelMsg{r: a, cause: cause}) // admitted: its answer stands
	wantAnswers(t, rec)

	ended := make(chan struct{})
	close(ended)
	c.ctxDone = ended
	release(s, a)
	wantAnswers(t, rec, "d", admitted) // c is passed over
	if !c.queued || s.pending != 1 {
		t.Fatal("the ended waiter left the queue before its cancel")
	}
	s.cancel(&cancelMsg{r: c, cause: cause})
	wantAnswers(t, rec, "c", aborted)
	release(s, d)
	if st := s.stats(external{}); st.Gate.Rejected[admission.Aborted] != 2 || st.Pending != 0 || st.InFlight != 0 || st.Admissions.Admitted != 2 {
		t.Fatalf("gate %+v calls %+v", st.Gate, st.Admissions)
	}
}

// TestStateTimeout: a queue timeout rejects its waiter and is stopped
// when the waiter leaves the queue otherwise; a timer message from an
// earlier use of the request (a stale generation) changes nothing.
func TestStateTimeout(t *testing.T) {
	s, rec := newTestState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 2})
	a, b := newReq("a", 0), newReq("b", 0)
	b.QueueTimeout = time.Second
	s.acquire(a)
	s.acquire(b)
	first, ok := rec.armed[b]
	if !ok {
		t.Fatal("no timer armed for the waiter")
	}
	release(s, a) // b admitted: its timer stops
	wantAnswers(t, rec, "a", admitted, "b", admitted)
	if _, ok := rec.armed[b]; ok {
		t.Fatal("the admitted waiter's timer still runs")
	}
	// The facade reuses b for a new call, which queues behind b's old
	// admission; the old timer's message arrives late.
	held := b.Lease
	b.reset()
	b.Request, b.Lease, b.QueueTimeout = "b again", &Lease{}, time.Second
	s.acquire(b)
	second := rec.armed[b]
	s.timeout(&timeoutMsg{r: b, gen: first})
	wantAnswers(t, rec)
	if !b.queued || second == first {
		t.Fatalf("a stale timer ended the new wait (generations %d, %d)", first, second)
	}
	s.timeout(&timeoutMsg{r: b, gen: second})
	wantAnswers(t, rec, "b again", admission.Timeout)
	s.timeout(&timeoutMsg{r: b, gen: second}) // delivered twice
	wantAnswers(t, rec)
	s.release(&releaseMsg{l: held})
	if st := s.stats(external{}); st.Gate.Rejected[admission.Timeout] != 1 || st.Pending != 0 || len(rec.armed) != 0 {
		t.Fatalf("gate %+v, timers %v", st.Gate, rec.armed)
	}
}

// TestStateApplyLimits: a stale revision or an invalid snapshot changes
// nothing and emits nothing; raising the limit admits waiters at once;
// the kill switch keeps waiters and rejects new calls.
func TestStateApplyLimits(t *testing.T) {
	s, rec := newTestState(t, budgetLimits(1, 3, 100))
	a, b, c := newReq("a", 10), newReq("b", 10), newReq("c", 10)
	for _, r := range []*AcquireRequest{a, b, c} {
		s.acquire(r)
	}
	wantAnswers(t, rec, "a", admitted)
	rec.events = nil
	next := func(rev int64, mc int, budget *admission.BudgetLimits) *applyRequest {
		return &applyRequest{next: admission.Limits{Revision: rev, MaxConcurrent: mc, MaxQueue: 3, TokenBudget: budget}}
	}
	budget := &admission.BudgetLimits{Budget: 100}
	before := s.limits.Clone()
	res, err := s.applyLimits(next(0, 5, budget))
	if err != nil || res.Applied || res.Reason != admission.StaleRevision {
		t.Fatalf("stale: %+v, %v", res, err)
	}
	for _, bad := range []*applyRequest{next(1, -1, budget), next(1, 5, nil), {setBudget: true, budget: 5, next: admission.Limits{Revision: 9}}} {
		if bad.setBudget {
			bad.next = admission.Limits{}
			s.hasBudget = false // as a bulkhead without a budget
			_, err = s.applyLimits(bad)
			s.hasBudget = true
		} else {
			_, err = s.applyLimits(bad)
		}
		if !errors.Is(err, admission.ErrInvalid) {
			t.Fatalf("invalid %+v: %v", bad.next, err)
		}
	}
	if !reflect.DeepEqual(s.limits, before) || len(rec.events) != 0 || len(rec.answers) != 0 {
		t.Fatalf("a refused snapshot changed something: %+v, %v", s.limits, rec.events)
	}
	res, err = s.applyLimits(next(1, 3, budget))
	if err != nil || !res.Applied || res.Current.MaxConcurrent != 3 {
		t.Fatalf("raise: %+v, %v", res, err)
	}
	wantAnswers(t, rec, "b", admitted, "c", admitted)
	if k := rec.kinds(); !reflect.DeepEqual(k, []string{"Reconfigure", "Admit", "Admit"}) {
		t.Fatalf("events %v", k)
	}
	d := newReq("d", 0)
	s.acquire(d)                                                 // 3 of 3 slots taken: waits
	if _, err := s.applyLimits(next(2, 0, budget)); err != nil { // kill switch
		t.Fatal(err)
	}
	release(s, a)
	release(s, b)
	s.acquire(newReq("e", 0))
	wantAnswers(t, rec, "e", admission.ConcurrencyLimit) // d keeps waiting
	if res, err := s.applyLimits(&applyRequest{setBudget: true, budget: 50}); err != nil || res.Current.Revision != 3 || res.Current.MaxConcurrent != 0 {
		t.Fatalf("SetBudget: %+v, %v", res, err)
	}
	if _, err := s.applyLimits(next(4, 2, budget)); err != nil {
		t.Fatal(err)
	}
	wantAnswers(t, rec, "d", admitted)
	if s.limits.Revision != 4 || s.limits.TokenBudget.Budget != 100 {
		t.Fatalf("limits %+v", s.limits)
	}
}

// TestStateCloseAndDrain: Close rejects every waiter in order and every
// later call; in-flight work releases normally; a Drain is answered once
// the engine is idle, or at once when withdrawn, and says whether it was
// closed.
func TestStateCloseAndDrain(t *testing.T) {
	s, rec := newTestState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 2})
	a, b, c := newReq("a", 0), newReq("b", 0), newReq("c", 0)
	for _, r := range []*AcquireRequest{a, b, c} {
		s.acquire(r)
	}
	wantAnswers(t, rec, "a", admitted)
	early := &drainRequest{}
	s.drain(early)
	s.cancelDrain(early)
	s.cancelDrain(early) // withdrawn twice
	if !reflect.DeepEqual(rec.drains, []admission.DrainResult{{InFlight: 1, Pending: 2}}) || early.closed {
		t.Fatalf("withdrawn drain: %+v", rec.drains)
	}
	waiting := &drainRequest{}
	s.drain(waiting)
	s.close()
	s.close()
	wantAnswers(t, rec, "b", shutdown, "c", shutdown)
	s.acquire(newReq("late", 0))
	wantAnswers(t, rec, "late", shutdown)
	if len(rec.drains) != 1 {
		t.Fatal("a drain was answered with work in flight")
	}
	release(s, a)
	if !reflect.DeepEqual(rec.drains[1:], []admission.DrainResult{{Drained: true}}) || !waiting.closed {
		t.Fatalf("drains %+v", rec.drains)
	}
	s.drain(&drainRequest{}) // idle: answered at once
	if len(rec.drains) != 3 || !rec.drains[2].Drained {
		t.Fatalf("drains %+v", rec.drains)
	}
}

// TestStateExternalStats: the counters kept outside the state machine come
// from what the actor passes in.
func TestStateExternalStats(t *testing.T) {
	limits := admission.Limits{MaxConcurrent: 1, Classes: &admission.Classes{Default: "a", Limits: map[string]admission.ClassLimits{"a": {}}}}
	s, _ := newTestState(t, limits)
	ext := external{doubleReleases: 3, listenerPanics: 2, deadlines: []admission.DeadlineStats{{Started: 5, Expired: 1}}}
	st := s.stats(ext)
	if st.DoubleReleases != 3 || st.ListenerPanics != 2 || st.Classes.Classes[0].Name != "a" || st.Classes.Classes[0].Deadlines != ext.deadlines[0] {
		t.Fatalf("stats %+v", st)
	}
}

// TestStateIDs: admission IDs are distinct version 4 UUIDs.
func TestStateIDs(t *testing.T) {
	s, _ := newTestState(t, admission.Limits{MaxConcurrent: 100})
	seen := map[admission.ID]bool{}
	for i := range 100 {
		r := newReq(fmt.Sprint(i), 0)
		s.acquire(r)
		id := r.Lease.ID
		if seen[id] || id[6]>>4 != 4 || id[8]>>6 != 2 {
			t.Fatalf("ID %v repeated or not version 4", id)
		}
		seen[id] = true
	}
}

// TestObserveBypass: a request whose refusal its shadow set holds is
// answered as a bypass (at once without a reject event, after a queue
// timeout with one), holds nothing, and keeps Drain waiting until its
// release; a reason outside the set is still rejected.
func TestObserveBypass(t *testing.T) {
	s, rec := newTestState(t, budgetLimits(1, 1, 10))
	shadow := admission.ReasonSet(0).With(admission.BudgetLimit).With(admission.Timeout).With(admission.QueueLimit)
	held := newReq("held", 5)
	s.acquire(held)
	over := newReq("over", 6)
	over.Shadow = shadow
	s.acquire(over)
	wantAnswers(t, rec, "held", admission.NoReason, "over", admission.NoReason)
	if b := over.Lease.Bypass; b == nil || b.Reason != admission.BudgetLimit || b.Race || b.Detail == nil || !over.Lease.ID.Bypass() {
		t.Fatalf("bypass %+v, ID %s", b, over.Lease.ID)
	}
	queued := newReq("queued", 1)
	queued.Shadow, queued.QueueTimeout = shadow, time.Second
	s.acquire(queued)
	full := newReq("full", 1)
	full.Shadow = admission.ReasonSet(0).With(admission.BudgetLimit) // not QueueLimit
	s.acquire(full)
	wantAnswers(t, rec, "full", admission.QueueLimit)
	s.timeout(&timeoutMsg{r: queued, gen: rec.armed[queued]})
	wantAnswers(t, rec, "queued", admission.NoReason)
	if b := queued.Lease.Bypass; b == nil || b.Reason != admission.Timeout || !b.Race {
		t.Fatalf("race bypass %+v", b)
	}
	if got, want := rec.kinds(), []string{"Admit", "Bypass", "Reject", "Reject", "Bypass"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	st := s.stats(external{})
	if st.InFlight != 1 || st.Tokens != 5 || total(st.Observe.Bypassed[:]) != 2 || st.Observe.RaceBypassed != 1 ||
		st.Observe.InFlight != 2 || st.Admissions.Rejections() != 2 {
		t.Fatalf("stats %+v", st)
	}
	release(s, held)
	s.drain(&drainRequest{})
	if len(rec.drains) != 0 {
		t.Fatalf("drained with bypassed calls running: %v", rec.drains)
	}
	s.release(&releaseMsg{l: over.Lease, usage: admission.Usage{Input: 2, Output: 3}, hasUsage: true})
	release(s, queued)
	if want := []admission.DrainResult{{Drained: true}}; !reflect.DeepEqual(rec.drains, want) {
		t.Fatalf("drains %v, want %v", rec.drains, want)
	}
	if o := s.stats(external{}).Observe; o.InFlight != 0 || o.UsageReported != 1 || o.Input != 2 || o.Output != 3 {
		t.Fatalf("observe %+v", o)
	}
	if got, want := rec.kinds(), []string{"Release", "BypassRelease", "BypassRelease"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

// TestCancelArrivingBeforeItsRequestAborts: AcquireAsync's cancel message can
// reach the engine before its request (the context ended as the request was
// sent): the engine ignored it, then queued the request, which the pump
// passes over as one whose cancel message is on its way. It was never
// answered.
func TestCancelArrivingBeforeItsRequestAborts(t *testing.T) {
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
