package actor

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
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

// TestStateReleaseLedger: a release settles the hold against the usage
// given, or else the last reported, refunding what was not used; the
// ledger identity holds throughout; a second release changes nothing.
func TestStateReleaseLedger(t *testing.T) {
	s, rec := newTestState(t, budgetLimits(4, 0, 1000))
	a, b, c := newReq("a", 300), newReq("b", 200), newReq("c", 100)
	for _, r := range []*AcquireRequest{a, b, c} {
		s.acquire(r)
	}
	if _, err := s.applyUsage(c.Lease, admission.Usage{Input: 60, Output: 5}, nil); err != nil {
		t.Fatal(err)
	}
	rec.events = nil
	s.release(&releaseMsg{l: a.Lease, usage: admission.Usage{Input: 200, Output: 50}, hasUsage: true})
	s.release(&releaseMsg{l: b.Lease}) // no usage known
	s.release(&releaseMsg{l: c.Lease}) // the last report: 65, its whole hold (35 refunded early)
	s.release(&releaseMsg{l: a.Lease, usage: admission.Usage{Input: 1}, hasUsage: true})
	var refunds []int64
	for _, ev := range rec.events {
		refunds = append(refunds, ev.Refunded)
	}
	if !reflect.DeepEqual(refunds, []int64{50, 0, 0}) {
		t.Fatalf("refunds %v", refunds)
	}
	st := s.stats(external{})
	want := admission.Ledger{Reserved: 600, Consumed: 315, Refunded: 85}
	if st.Ledger != want || st.Tokens != 0 || st.Admissions.Released != 3 || st.LedgerDrift != 0 {
		t.Fatalf("ledger %+v, tokens %d, calls %+v", st.Ledger, st.Tokens, st.Admissions)
	}
	// reserved + overrun - early refunds == holds at release + in flight
	if want.Reserved+want.Overrun-35 != 300+200+65+st.Tokens {
		t.Fatal("ledger identity")
	}
	// A hold the books do not have is drift: counted and reported.
	d := newReq("d", 10)
	s.acquire(d)
	d.Lease.held = 25
	release(s, d)
	if st := s.stats(external{}); st.LedgerDrift != 1 || st.Tokens != 0 || len(rec.drifts) != 1 {
		t.Fatalf("drift %d, reported %q", st.LedgerDrift, rec.drifts)
	}
}

// TestStateUsageReports: sequences rise by one per change, stale and
// duplicate reports change nothing and emit nothing, a rise is an overrun,
// a fall an early refund, progressive holds free what the stream used;
// invalid or overflowing reports are errors and change nothing; after
// release a report is only validated.
func TestStateUsageReports(t *testing.T) {
	s, rec := newTestState(t, budgetLimits(2, 0, 10_000))
	r := newReq("a", 0)
	r.Reservation = admission.Reservation{Input: 100, MaxOutput: 200, Reserved: 300}
	s.acquire(r)
	l := r.Lease
	rec.events = nil
	type step struct {
		u        admission.Usage
		p        *admission.Progressive
		seq      int64
		held     int64
		consumed int64
		field    string // the error's field, "" for none
	}
	steps := []step{
		{u: admission.Usage{Input: 60}, seq: 1, held: 260, consumed: 60},
		{u: admission.Usage{Input: 50}, seq: 1, held: 260, consumed: 60},               // stale: clamped
		{u: admission.Usage{Input: 60}, seq: 1, held: 260, consumed: 60},               // duplicate
		{u: admission.Usage{Input: 60, Output: 250}, seq: 2, held: 310, consumed: 310}, // overrun of 50
		{u: admission.Usage{Input: 60, Output: 250}, p: &admission.Progressive{SafetyMargin: 10}, seq: 3, held: 60, consumed: 310},
		{u: admission.Usage{Input: 60, Output: 260}, p: &admission.Progressive{RemainingOutput: 5}, seq: 4, held: 65, consumed: 320},
		{u: admission.Usage{}, p: &admission.Progressive{RemainingOutput: 201}, field: "Progressive.RemainingOutput"},
		{u: admission.Usage{Input: math.MaxInt64}, field: "Usage"}, // with output 260, cumulative
		{u: admission.Usage{}, p: &admission.Progressive{RemainingOutput: 1, SafetyMargin: math.MaxInt64}, field: "Progressive.SafetyMargin"},
		{u: admission.Usage{Output: math.MaxInt64 - 10}, p: &admission.Progressive{}, field: "Usage"}, // with input 60, cumulative
	}
	for i, st := range steps {
		ledger := s.stats(external{}).Ledger
		rep, err := s.applyUsage(l, st.u, st.p)
		if st.field != "" {
			var ce *admission.ConfigError
			if !errors.As(err, &ce) || ce.Field != st.field {
				t.Fatalf("step %d: %v, want an error for %s", i, err, st.field)
			}
			if after := s.stats(external{}).Ledger; after != ledger || l.sequence != 4 {
				t.Fatalf("step %d: a failed report changed the ledger: %+v", i, after)
			}
			continue
		}
		if err != nil || rep.Sequence != st.seq || rep.Held != st.held || rep.Usage.Total() != st.consumed {
			t.Fatalf("step %d: %+v, %v", i, rep, err)
		}
	}
	var seqs, deltas []int64
	for _, ev := range rec.events {
		seqs, deltas = append(seqs, ev.Sequence), append(deltas, ev.Held-ev.PreviousHeld)
	}
	if !reflect.DeepEqual(seqs, []int64{1, 2, 3, 4}) || !reflect.DeepEqual(deltas, []int64{-40, 50, -250, 5}) {
		t.Fatalf("usage events: sequences %v, deltas %v", seqs, deltas)
	}
	rec.events = nil
	release(s, r)
	if ev := rec.events[0]; ev.Kind != admission.EventRelease || ev.Sequence != 4 || ev.Held != 65 {
		t.Fatalf("release event %+v", ev)
	}
	rep, err := s.applyUsage(l, admission.Usage{Input: 70, Output: 260}, nil)
	if err != nil || rep.Held != 0 || rep.Sequence != 4 || rep.Usage.Total() != 330 || len(rec.events) != 1 {
		t.Fatalf("report after release = %+v, %v", rep, err)
	}
	st := s.stats(external{})
	if g := st.Ledger; st.Tokens != 0 || g.Overrun != 55 || g.Refunded != 290 || g.Reserved+g.Overrun-290 != 65 {
		t.Fatalf("ledger %+v, tokens %d", g, st.Tokens)
	}

	// A hold past int64, with a valid cumulative usage.
	r = newReq("big", 0)
	r.Reservation = admission.Reservation{MaxOutput: 200, Reserved: 200}
	s.acquire(r)
	if _, err := s.applyUsage(r.Lease, admission.Usage{Input: math.MaxInt64 - 100}, nil); !errors.Is(err, admission.ErrInvalid) ||
		!strings.Contains(err.Error(), "Usage.Input") {
		t.Fatalf("a hold past int64: %v", err)
	}

	// Without a budget nothing is held or reserved, so nothing is over.
	s, _ = newTestState(t, admission.Limits{MaxConcurrent: 1})
	r = newReq("b", 0)
	s.acquire(r)
	rep, err = s.applyUsage(r.Lease, admission.Usage{Input: 5, Output: 7}, nil)
	if err != nil || rep.Held != 0 || rep.Sequence != 1 || rep.Usage.Total() != 12 {
		t.Fatalf("report without a budget = %+v, %v", rep, err)
	}
}

// TestStateUsageBreakdown: each breakdown field is clamped never to fall,
// like the totals; parts left above their totals by the clamping trip no
// check; the breakdown reaches the usage and release events and changes no
// hold, refund or total.
func TestStateUsageBreakdown(t *testing.T) {
	s, rec := newTestState(t, budgetLimits(2, 0, 10_000))
	r := newReq("a", 0)
	r.Reservation = admission.Reservation{Input: 100, MaxOutput: 200, Reserved: 300}
	s.acquire(r)
	l := r.Lease
	rec.events = nil
	steps := []struct {
		u, want admission.Usage
		seq     int64
		held    int64
	}{
		{u: admission.Usage{Input: 60, CachedInput: 60}, want: admission.Usage{Input: 60, CachedInput: 60}, seq: 1, held: 260},
		// Each field clamped separately: the parts now exceed Input.
		{u: admission.Usage{Input: 60, CacheCreation: 60}, want: admission.Usage{Input: 60, CachedInput: 60, CacheCreation: 60}, seq: 2, held: 260},
		{u: admission.Usage{Input: 50, CachedInput: 10, CacheCreation: 5}, want: admission.Usage{Input: 60, CachedInput: 60, CacheCreation: 60}, seq: 2, held: 260}, // stale
		{u: admission.Usage{Input: 60, Output: 30, Reasoning: 30}, want: admission.Usage{Input: 60, Output: 30, CachedInput: 60, CacheCreation: 60, Reasoning: 30}, seq: 3, held: 260},
		{u: admission.Usage{Input: 60, Output: 40, Reasoning: 10}, want: admission.Usage{Input: 60, Output: 40, CachedInput: 60, CacheCreation: 60, Reasoning: 30}, seq: 4, held: 260},
		{u: admission.Usage{Input: 60, Output: 40, Reasoning: math.MaxInt64}, want: admission.Usage{Input: 60, Output: 40, CachedInput: 60, CacheCreation: 60, Reasoning: math.MaxInt64}, seq: 5, held: 260},
	}
	for i, st := range steps {
		rep, err := s.applyUsage(l, st.u, nil)
		if err != nil || rep.Sequence != st.seq || rep.Held != st.held || rep.Usage != st.want {
			t.Fatalf("step %d: %+v, %v", i, rep, err)
		}
		if l.last != st.want {
			t.Fatalf("step %d: last usage %+v, want %+v", i, l.last, st.want)
		}
	}
	var got []admission.Usage
	for _, ev := range rec.events {
		got = append(got, ev.Usage)
	}
	want := []admission.Usage{steps[0].want, steps[1].want, steps[3].want, steps[4].want, steps[5].want}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("usage events carry %+v, want %+v", got, want)
	}
	rec.events = nil
	release(s, r) // the last report is the final usage
	ev := rec.events[0]
	if !ev.HasUsage || ev.Usage != steps[5].want || ev.Held != 260 || ev.Refunded != 160 {
		t.Fatalf("release event %+v", ev)
	}

	// A final usage at release: the whole struct reaches the event, and only
	// Input + Output is consumed.
	r = newReq("b", 0)
	r.Reservation = admission.Reservation{Input: 100, MaxOutput: 200, Reserved: 300}
	s.acquire(r)
	rec.events = nil
	final := admission.Usage{Input: 90, Output: 10, CachedInput: 80, CacheCreation: 10, Reasoning: 10}
	s.release(&releaseMsg{l: r.Lease, usage: final, hasUsage: true})
	ev = rec.events[0]
	if !ev.HasUsage || ev.Usage != final || ev.Refunded != 200 {
		t.Fatalf("release event %+v", ev)
	}
	st := s.stats(external{})
	if g := st.Ledger; g.Consumed != 100+100 || g.Refunded != 40+160+200 || st.Tokens != 0 || g.Overrun != 0 {
		t.Fatalf("ledger %+v, tokens %d", g, st.Tokens)
	}
}

// borrowingState is a state with a budget of 1000 and one class "bg"
// without floors, so that every admission borrows.
func borrowingState(t *testing.T, maxConcurrent, maxQueue int) (*state, *recorder, classes.Class) {
	t.Helper()
	limits := budgetLimits(maxConcurrent, maxQueue, 1000)
	limits.Classes = &admission.Classes{Default: "bg", Limits: map[string]admission.ClassLimits{"bg": {}}}
	s, rec := newTestState(t, limits)
	bg, _ := s.tab.Lookup("bg")
	return s, rec, bg
}

// TestStateAbandon: a borrowed slot is given back once, admitting the next
// waiter, while the hold and the admission stay until release; its
// deadline expires with it, or is ended; a slot on the class's floor
// cannot be abandoned.
func TestStateAbandon(t *testing.T) {
	s, rec, bg := borrowingState(t, 1, 1)
	borrowed, waiter := newReq("borrowed", 20), newReq("waiter", 10)
	borrowed.Class, waiter.Class = bg, bg
	borrowed.BorrowedDeadline, waiter.BorrowedDeadline = time.Minute, time.Minute
	s.acquire(borrowed)
	s.acquire(waiter)
	wantAnswers(t, rec, "borrowed", admitted)
	if start, ok := rec.tells[0].(*classes.StartDeadline[*Lease]); !ok || start.At != rec.clock.Add(time.Minute) || !borrowed.Lease.Resources.BorrowedConcurrency {
		t.Fatalf("deadline not started: %+v", rec.tells)
	}
	rec.events = nil
	if !s.abandon(borrowed.Lease, admission.AbandonDeadline) || s.abandon(borrowed.Lease, admission.AbandonManual) {
		t.Fatal("abandon is not effective exactly once")
	}
	wantAnswers(t, rec, "waiter", admitted)
	if k := rec.kinds(); !reflect.DeepEqual(k, []string{"Abandon", "Admit"}) || len(rec.expired) != 1 || rec.expired[0] != borrowed.Lease {
		t.Fatalf("events %v, expired %v", k, rec.expired)
	}
	st := s.stats(external{})
	if st.InFlight != 1 || s.calls != 2 || st.Tokens != 30 || st.Admissions.Abandoned[admission.AbandonDeadline] != 1 {
		t.Fatalf("after abandon: gate %+v calls %+v", st.Gate, st.Admissions)
	}
	release(s, borrowed) // its slot is already back, its deadline over
	st = s.stats(external{})
	if st.InFlight != 1 || s.calls != 1 || st.Tokens != 10 || len(rec.tells) != 2 {
		t.Fatalf("after release: gate %+v calls %+v tells %d", st.Gate, st.Admissions, len(rec.tells))
	}
	if s.abandon(borrowed.Lease, admission.AbandonManual) {
		t.Fatal("a released admission was abandoned")
	}
	if !s.abandon(waiter.Lease, admission.AbandonManual) {
		t.Fatal("manual abandon refused")
	}
	if _, ok := rec.tells[2].(*classes.EndDeadline[*Lease]); !ok || len(rec.expired) != 1 {
		t.Fatalf("a manual abandon did not end the deadline: %+v", rec.tells)
	}
	release(s, waiter)

	limits := budgetLimits(1, 1, 1000)
	limits.Classes = &admission.Classes{Default: "fg", Limits: map[string]admission.ClassLimits{"fg": {ProtectedConcurrent: 1}}}
	s, _ = newTestState(t, limits)
	floor := newReq("floor", 0)
	floor.Class, _ = s.tab.Lookup("fg")
	s.acquire(floor)
	if s.abandon(floor.Lease, admission.AbandonManual) {
		t.Fatal("a slot on the floor was abandoned")
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

// TestStateStopDeadline: a deadline ended before the release (what a dedup
// leader does once fn returns, to fix its followers' outcome) tells the
// class actor and never expires after that: a late expiry abandons
// nothing, while a manual abandon still works. A deadline that expired
// first stays expired.
func TestStateStopDeadline(t *testing.T) {
	s, rec, bg := borrowingState(t, 2, 0)
	ended, expired := newReq("ended", 1), newReq("expired", 1)
	for _, r := range []*AcquireRequest{ended, expired} {
		r.Class, r.BorrowedDeadline = bg, time.Minute
		s.acquire(r)
	}
	wantAnswers(t, rec, "ended", admitted, "expired", admitted)
	rec.tells = nil

	s.stopDeadline(ended.Lease)
	if len(rec.tells) != 1 {
		t.Fatalf("tells %+v, want the deadline ended", rec.tells)
	}
	if _, ok := rec.tells[0].(*classes.EndDeadline[*Lease]); !ok {
		t.Fatalf("tells %+v, want the deadline ended", rec.tells)
	}
	if s.abandon(ended.Lease, admission.AbandonDeadline) {
		t.Fatal("an ended deadline expired")
	}
	s.stopDeadline(ended.Lease) // once is enough
	if len(rec.tells) != 1 || len(rec.expired) != 0 {
		t.Fatalf("tells %+v, expired %v", rec.tells, rec.expired)
	}

	if !s.abandon(expired.Lease, admission.AbandonDeadline) {
		t.Fatal("deadline abandon refused")
	}
	s.stopDeadline(expired.Lease) // too late: changes nothing
	if len(rec.expired) != 1 || rec.expired[0] != expired.Lease || expired.Lease.deadlineOff {
		t.Fatalf("expired %v", rec.expired)
	}
	if !s.abandon(ended.Lease, admission.AbandonManual) {
		t.Fatal("manual abandon after the deadline ended refused")
	}
	st := s.stats(external{})
	if st.Admissions.Abandoned != [admission.NumCauses]int64{admission.AbandonDeadline: 1, admission.AbandonManual: 1} {
		t.Fatalf("abandoned %+v", st.Admissions.Abandoned)
	}
	release(s, ended)
	release(s, expired)
}
