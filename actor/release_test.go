package actor

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

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
