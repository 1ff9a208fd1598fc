package actor

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/adaptive"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// These tests drive each stage beyond capacity through the state machine,
// one message at a time: feedback, acquisitions, timers firing, remote
// verdicts, releases.

const (
	cooldown  = admission.Cooldown
	rateLimit = admission.RateLimit
)

// modelReq is newReq for a call of model.
func modelReq(name, model string, reserved int64) *AcquireRequest {
	r := newReq(name, reserved)
	r.Model = model
	return r
}

// detailOf returns a rejection's detail.
func detailOf(t *testing.T, err error) *admission.RejectDetail {
	t.Helper()
	var rej *admission.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("%v is no rejection", err)
	}
	return rej.Detail
}

func TestStageCooldownShed(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4, MaxQueue: 4}, stageConfig{model: "m", shed: true})
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: 5 * time.Second})
	a := modelReq("a", "m", 0)
	s.acquire(a)
	other := modelReq("other", "n", 0)
	s.acquire(other)
	wantAnswers(t, rec, "a", cooldown, "other", admitted)
	if d := detailOf(t, a.Err).Cooldown; d == nil || d.RetryAfter != 5*time.Second || d.Model != "m" || d.Headroom {
		t.Fatalf("cool-down detail %+v", d)
	}
	// A feedback without a model is the bulkhead's own model's.
	rec.clock = rec.clock.Add(5 * time.Second)
	s.acquire(modelReq("b", "m", 0))
	s.feedback(&Feedback{Outcome: adaptive.RateLimited, RetryAfter: time.Second})
	s.acquire(modelReq("c", "m", 0))
	wantAnswers(t, rec, "b", admitted, "c", cooldown)
	if st := s.cool.stats(rec.clock); st.Started != 2 || st.Held != 0 || len(st.Active) != 1 {
		t.Fatalf("cool-down stats %+v", st)
	}
}

func TestStageCooldownHold(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4, MaxQueue: 1}, stageConfig{model: "m"})
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: 5 * time.Second})
	held := modelReq("held", "m", 0)
	s.acquire(held) // held in the queue, the hold timer armed
	if len(rec.take()) != 0 || s.pending != 1 || !reflect.DeepEqual(rec.holds, []time.Duration{5 * time.Second}) {
		t.Fatalf("pending %d, holds %v: want the call held 5s", s.pending, rec.holds)
	}
	// No room left in the queue to hold another: turned away.
	s.acquire(modelReq("full", "m", 0))
	wantAnswers(t, rec, "full", cooldown)
	rec.clock = rec.clock.Add(5 * time.Second)
	s.holdEnded()
	wantAnswers(t, rec, "held", admitted)
	if st := s.cool.stats(rec.clock); st.Held != 1 || st.Active != nil {
		t.Fatalf("cool-down stats %+v", st)
	}
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: 5 * time.Second})
	late := modelReq("late", "m", 0)
	late.QueueTimeout = time.Second
	s.acquire(late)
	// One whose queue timeout or deadline ends first: turned away at once.
	deadline := modelReq("deadline", "m", 0)
	deadline.Deadline = rec.clock.Add(2 * time.Second)
	s.acquire(deadline)
	wantAnswers(t, rec, "late", cooldown, "deadline", cooldown)
}

// A call already in the queue when a cool-down begins is turned away as
// its slot is granted, with the time left, when it may not wait it out.
func TestStageCooldownAtGrant(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 1}, stageConfig{model: "m", shed: true})
	first := modelReq("first", "m", 0)
	s.acquire(first)
	s.acquire(modelReq("waiter", "m", 0))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: 3 * time.Second})
	release(s, first)
	wantAnswers(t, rec, "first", admitted, "waiter", cooldown)
	if s.inFlight != 0 {
		t.Fatalf("in flight %d after the refusal at the grant, want 0", s.inFlight)
	}
}

// The provider's headroom: each admission spends its reservation and a
// request; a call that does not fit is a cool-down until it would; a
// rolled-back admission gives its spend back.
func TestStageHeadroom(t *testing.T) {
	s, rec := newStageState(t, budgetLimits(4, 0, 1000), stageConfig{model: "m", shed: true})
	s.feedback(&Feedback{Model: "m", Headroom: &admission.Headroom{Tokens: 100, Requests: -1, TokensReset: time.Minute}})
	a := modelReq("a", "m", 80)
	s.acquire(a)
	b := modelReq("b", "m", 80)
	s.acquire(b)
	wantAnswers(t, rec, "a", admitted, "b", cooldown)
	if d := detailOf(t, b.Err).Cooldown; d == nil || !d.Headroom || d.RetryAfter != time.Minute {
		t.Fatalf("headroom detail %+v", d)
	}
	if st := s.cool.stats(rec.clock); st.Headroom["m"].Tokens != 20 || st.HeadroomReports != 1 {
		t.Fatalf("headroom stats %+v", st.Headroom)
	}
	// A release gives nothing back (the provider counted the call)...
	release(s, a)
	s.acquire(modelReq("c", "m", 30))
	wantAnswers(t, rec, "c", cooldown)
	// ...a rollback does.
	s.fleet = &fleetStage{}
	d := modelReq("d", "m", 20)
	s.acquire(d)
	if len(rec.remotes) != 1 || s.cool.stats(rec.clock).Headroom["m"].Tokens != 0 {
		t.Fatalf("remote jobs %d, headroom %+v: want d provisional, having spent the last 20", len(rec.remotes), s.cool.stats(rec.clock).Headroom)
	}
	j := rec.remotes[0]
	j.why, j.ext = admission.ConcurrencyLimit, &admission.External{Constraint: admission.ConstraintFleet}
	s.verdict(j)
	wantAnswers(t, rec, "d", admission.ConcurrencyLimit)
	if got := s.cool.stats(rec.clock).Headroom["m"].Tokens; got != 20 {
		t.Fatalf("headroom %d after the rollback, want 20 back", got)
	}
}

// The remote stages: an admission with a fleet pool is provisional until
// the worker's verdict, which confirms it, or rolls it back (ending the
// fleet hold, giving the slot to the next waiter), or carries a panic.
func TestStageRemoteVerdicts(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 2}, stageConfig{model: "m"})
	s.fleet = &fleetStage{}
	a := newReq("a", 0)
	s.acquire(a)
	w := newReq("w", 0)
	s.acquire(w)
	if len(rec.take()) != 0 || s.provisional != 1 || s.calls != 0 || s.idle() || len(rec.remotes) != 1 {
		t.Fatalf("provisional %d, calls %d, jobs %d: want a waiting for its verdict, unannounced", s.provisional, s.calls, len(rec.remotes))
	}
	if k := rec.kinds(); len(k) != 0 {
		t.Fatalf("events %v before the verdict, want none", k)
	}
	s.verdict(rec.remotes[0]) // NoReason: confirmed
	wantAnswers(t, rec, "a", admitted)
	if s.provisional != 0 || s.calls != 1 || !reflect.DeepEqual(rec.kinds(), []string{"Admit"}) {
		t.Fatalf("after the verdict: provisional %d, calls %d", s.provisional, s.calls)
	}
	release(s, a) // w is granted, provisionally
	if len(rec.releases) != 1 || rec.releases[0] != a.Lease || len(rec.remotes) != 2 {
		t.Fatalf("fleet releases %d, jobs %d", len(rec.releases), len(rec.remotes))
	}
	jw := rec.remotes[1]
	jw.why, jw.panic = admission.Aborted, "boom"
	jw.cause = errors.New("panic")
	x := newReq("x", 0)
	s.acquire(x) // queued behind w's provisional slot
	s.verdict(jw)
	if w.Panic != "boom" {
		t.Fatalf("the panic %v did not reach the caller", w.Panic)
	}
	if len(rec.releases) != 2 || rec.releases[1] != w.Lease {
		t.Fatal("the rolled-back admission's fleet hold was not ended")
	}
	wantAnswers(t, rec, "w", aborted)
	if len(rec.remotes) != 3 || s.provisional != 1 {
		t.Fatalf("jobs %d, provisional %d: want x granted its slot after the rollback", len(rec.remotes), s.provisional)
	}
	// Usage reports, abandonment and release reach the pool from the state.
	s.verdict(rec.remotes[2])
	wantAnswers(t, rec, "x", admitted)
	if _, err := s.applyUsage(x.Lease, admission.Usage{Input: 5}, nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rec.adjusts, []string{"0 1 false"}) {
		t.Fatalf("fleet adjustments %v", rec.adjusts)
	}
}

// In-process rates, decided at the grant: a call over the rate is turned
// away with the exact retry-after, records nothing, and gives its slot
// back.
func TestStageRateDecided(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", PerModel: Rate{RequestsPerMinute: 60}}})
	s.acquire(newReq("a", 0))
	b := newReq("b", 0)
	s.acquire(b)
	wantAnswers(t, rec, "a", admitted, "b", rateLimit)
	if d := detailOf(t, b.Err).Rate; d == nil || d.RetryAfter != time.Second || d.Limit != "requests" || d.Key != "m" {
		t.Fatalf("rate detail %+v", d)
	}
	if s.inFlight != 1 {
		t.Fatalf("in flight %d, want 1: the refused call gave its slot back", s.inFlight)
	}
	rec.clock = rec.clock.Add(time.Second)
	s.acquire(newReq("c", 0))
	wantAnswers(t, rec, "c", admitted)
}

// Paced rates: a call over the rate waits on its own timer for its turn,
// then takes its slot; one whose turn comes after its queue timeout is
// turned away at once; cancel and Close end a wait.
func TestStageRatePaced(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}})
	s.acquire(newReq("a", 0))
	b := newReq("b", 0)
	s.acquire(b)
	wantAnswers(t, rec, "a", admitted)
	if rec.parks[b] != time.Second || s.nparked != 1 {
		t.Fatalf("parks %v: want b parked for its turn, 1s", rec.parks)
	}
	late := newReq("late", 0)
	late.QueueTimeout = 1500 * time.Millisecond // its turn is 2s away
	s.acquire(late)
	wantAnswers(t, rec, "late", rateLimit)
	rec.clock = rec.clock.Add(time.Second)
	s.unpark(&parkMsg{r: b, gen: b.gen, seq: b.parkSeq})
	wantAnswers(t, rec, "b", admitted)
	if b.RateWait != time.Second || s.rates.paced.Load() != 1 {
		t.Fatalf("rate wait %v, paced %d", b.RateWait, s.rates.paced.Load())
	}
	// A parked call whose context ends is withdrawn; Close ends the rest.
	c := newReq("c", 0)
	s.acquire(c)
	d := newReq("d", 0)
	s.acquire(d)
	s.cancel(&cancelMsg{r: c, cause: errors.New("gone")})
	s.close()
	wantAnswers(t, rec, "c", aborted, "d", shutdown)
	if s.nparked != 0 || len(rec.armed) != 0 {
		t.Fatalf("parked %d, timers %d after cancel and close", s.nparked, len(rec.armed))
	}
	// A timer message that arrives after the answer changes nothing.
	s.unpark(&parkMsg{r: d, gen: d.gen - 1, seq: d.parkSeq})
	wantAnswers(t, rec)
}

// Paced calls held back by one cool-down wait in the cooling line until
// the engine's hold timer says it is over; then they take their turns in
// the order they came, one turn apart.
func TestStageCooldownParkedInOrder(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}})
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: 10 * time.Second})
	var calls []*AcquireRequest
	for _, name := range []string{"a", "b", "c"} {
		r := modelReq(name, "m", 0)
		r.QueueTimeout = 30 * time.Second
		s.acquire(r)
		if !r.parked || rec.parks[r] != 10*time.Second || len(rec.armed) != 0 {
			t.Fatalf("%s: parked %v for %v, timers %d; want the 10s cool-down on the hold timer", name, r.parked, rec.parks[r], len(rec.armed))
		}
		calls = append(calls, r)
	}
	b, c := calls[1], calls[2]
	rec.clock = rec.clock.Add(5 * time.Second)
	s.holdEnded() // too early: they wait on
	wantAnswers(t, rec)
	rec.clock = rec.clock.Add(5 * time.Second)
	s.holdEnded()
	wantAnswers(t, rec, "a", admitted)
	if !b.parked || !c.parked || rec.parks[b] != time.Second || rec.parks[c] != 2*time.Second {
		t.Fatalf("turns: b %v, c %v; want 1s and 2s", rec.parks[b], rec.parks[c])
	}
	rec.clock = rec.clock.Add(time.Second)
	s.unpark(&parkMsg{r: b, gen: b.gen, seq: b.parkSeq})
	wantAnswers(t, rec, "b", admitted)
	rec.clock = rec.clock.Add(time.Second)
	s.unpark(&parkMsg{r: c, gen: c.gen, seq: c.parkSeq})
	wantAnswers(t, rec, "c", admitted)
	if st := s.cool.stats(rec.clock); st.Held != 3 {
		t.Fatalf("held %d, want 3", st.Held)
	}
}

// pacedState is a state pacing model m at 600 calls a minute (a turn every
// 100 ms, no burst), with cool-downs held or shed, and n calls of m made
// at the start, the first admitted and the others waiting for turns 100 ms
// apart.
func pacedState(t *testing.T, shed bool, n int, rate Rate) (*state, *recorder, []*AcquireRequest) {
	t.Helper()
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 64}, stageConfig{model: "m", shed: shed,
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: rate}})
	var calls []*AcquireRequest
	for i := range n {
		r := modelReq(fmt.Sprint(i), "m", 10)
		s.acquire(r)
		calls = append(calls, r)
	}
	wantAnswers(t, rec, "0", admitted)
	return s, rec, calls
}

// ms is n milliseconds.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// A cool-down that starts over booked turns: every call of the model
// waiting for its turn gives it back and waits in the cooling line; when
// the cool-down ends they take new turns in the order they came, 100 ms
// apart from its end, the turns given back returned to the rate (without
// them, the first new turn would come after the last one given back, at
// 2 s).
func TestStageCooldownGivesTurnsBack(t *testing.T) {
	s, rec, calls := pacedState(t, false, 20, Rate{RequestsPerMinute: 600})
	rec.clock = rec.clock.Add(ms(50))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: time.Second})
	if len(rec.armed) != 0 || s.nparked != 19 || s.cooling.head != calls[1] || s.cooling.tail != calls[19] {
		t.Fatalf("timers %d, parked %d: want the 19 waiting calls in the cooling line, in order", len(rec.armed), s.nparked)
	}
	rec.clock = rec.clock.Add(time.Second)
	s.holdEnded()
	wantAnswers(t, rec, "1", admitted)
	for i, r := range calls[2:] {
		if d := rec.parks[r]; d != ms(100*(i+1)) {
			t.Fatalf("call %d: new turn in %v, want %v", i+2, d, ms(100*(i+1)))
		}
	}
	if st := s.stats(external{}); st.Rate.Paced != 19 || st.Rate.PacedTime != 19*ms(50) || st.Cooldown.Held != 19 {
		t.Fatalf("paced %d in %v, held %d: want 19 calls that waited 50ms each, 19 held", st.Rate.Paced, st.Rate.PacedTime, st.Cooldown.Held)
	}
}

// ShedCooldown: the calls whose turns fall inside the cool-down are turned
// away at once with the time left; those whose turns fall after it keep
// them (and the turns given back stay booked before them).
func TestStageCooldownShedsTurnsInside(t *testing.T) {
	s, rec, calls := pacedState(t, true, 10, Rate{RequestsPerMinute: 600})
	rec.clock = rec.clock.Add(ms(50))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: ms(500)})
	wantAnswers(t, rec, "1", cooldown, "2", cooldown, "3", cooldown, "4", cooldown, "5", cooldown)
	if d := detailOf(t, calls[3].Err).Cooldown; d == nil || d.RetryAfter != ms(500) || !d.Until.Equal(rec.clock.Add(ms(500))) {
		t.Fatalf("cool-down detail %+v, want the 500ms left", d)
	}
	if s.nparked != 4 || !calls[6].parked || calls[6].parkFor != parkTurn || !calls[6].parkUntil.Equal(rec.clock.Add(ms(550))) {
		t.Fatalf("parked %d: want calls 6-9 waiting for their turns, 6 at 600ms", s.nparked)
	}
	rec.clock = rec.clock.Add(ms(500))
	late := modelReq("late", "m", 10)
	s.acquire(late)
	if rec.parks[late] != ms(450) {
		t.Fatalf("a new call waits %v, want 450ms: behind the turns kept, to 1s", rec.parks[late])
	}
}

// With shed turns at the end of the rate's queue, they go back to it: a
// call made as the cool-down ends goes at once (the turns shed would have
// kept it waiting until 2s).
func TestStageCooldownShedGivesTailBack(t *testing.T) {
	s, rec, _ := pacedState(t, true, 20, Rate{RequestsPerMinute: 600})
	rec.clock = rec.clock.Add(ms(50))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: ms(1900)})
	if got := len(rec.take()); got != 19 || s.nparked != 0 {
		t.Fatalf("%d answers, %d parked: want the 19 waiting calls shed, all their turns before 1.95s", got, s.nparked)
	}
	rec.clock = rec.clock.Add(ms(1900))
	now := modelReq("now", "m", 10)
	s.acquire(now)
	wantAnswers(t, rec, "now", admitted)
}

// A call that may not wait the cool-down out is turned away Cooldown as it
// starts, as a new call would be; one that may wait it out but not until
// its new turn is turned away RateLimit then, with the exact retry-after,
// and books nothing: the call behind it takes that turn.
func TestStageCooldownOutlastsTurns(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 64}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 600}}})
	var calls []*AcquireRequest
	for i := range 6 {
		r := modelReq(fmt.Sprint(i), "m", 10)
		switch i {
		case 2:
			r.Deadline = rec.clock.Add(ms(900)) // before the cool-down ends
		case 4:
			r.QueueTimeout = ms(1200) // 150ms left as it ends
		}
		s.acquire(r)
		calls = append(calls, r)
	}
	wantAnswers(t, rec, "0", admitted)
	rec.clock = rec.clock.Add(ms(50))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: time.Second})
	wantAnswers(t, rec, "2", cooldown)
	if d := detailOf(t, calls[2].Err).Cooldown; d == nil || d.RetryAfter != time.Second {
		t.Fatalf("cool-down detail %+v", d)
	}
	rec.clock = rec.clock.Add(time.Second)
	s.holdEnded() // 1 goes, 3 at +100ms, 4 would be at +200ms
	wantAnswers(t, rec, "1", admitted, "4", rateLimit)
	if d := detailOf(t, calls[4].Err).Rate; d == nil || d.RetryAfter != ms(200) {
		t.Fatalf("rate detail %+v, want the 200ms until its turn", d)
	}
	if rec.parks[calls[3]] != ms(100) || rec.parks[calls[5]] != ms(200) {
		t.Fatalf("new turns %v and %v, want 100 and 200ms", rec.parks[calls[3]], rec.parks[calls[5]])
	}
}

// A class's rate is shared by the calls of every model: when another
// model's call keeps a turn on it after the turns a cool-down gives back,
// those stay booked (a call made then waits behind them all), so that no
// new turn falls on the one kept.
func TestStageCooldownKeptTurnOnSharedRate(t *testing.T) {
	limits := admission.Limits{MaxConcurrent: 64, Classes: &admission.Classes{Default: "c", Limits: map[string]admission.ClassLimits{"c": {}}}}
	s, rec := newStageState(t, limits, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerClass: map[string]Rate{"c": {RequestsPerMinute: 600}}}})
	c, _ := s.tab.Lookup("c")
	call := func(name, model string) *AcquireRequest {
		r := modelReq(name, model, 10)
		r.Class = c
		s.acquire(r)
		return r
	}
	call("a", "m")
	b, other, d := call("b", "m"), call("other", "n"), call("d", "m")
	wantAnswers(t, rec, "a", admitted)
	rec.clock = rec.clock.Add(ms(50))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: time.Second})
	if b.parkFor != parkCooldown || d.parkFor != parkCooldown || other.parkFor != parkTurn || rec.parks[other] != ms(200) {
		t.Fatalf("b %v, d %v, other %v (%v): want m's calls cooling and other keeping its turn", b.parkFor, d.parkFor, other.parkFor, rec.parks[other])
	}
	e := call("e", "n")
	if rec.parks[e] != ms(350) {
		t.Fatalf("a new call of n waits %v, want 350ms: behind the turns kept booked", rec.parks[e])
	}
}

// A paced call whose turn came while it waited for a slot, held back in
// the queue by a cool-down, goes to the cooling line and takes a new turn
// after it, instead of going at its end with all the others held.
func TestStageCooldownQueuedTurnTakesNewTurn(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 2}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}})
	a := modelReq("a", "m", 0)
	s.acquire(a)
	b := modelReq("b", "m", 0)
	s.acquire(b)
	rec.clock = rec.clock.Add(time.Second)
	s.unpark(&parkMsg{r: b, gen: b.gen, seq: b.parkSeq}) // its turn: no slot, it queues
	if !b.queued {
		t.Fatal("b did not queue for a slot after its turn")
	}
	rec.clock = rec.clock.Add(ms(500))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: 2 * time.Second})
	release(s, a)
	wantAnswers(t, rec, "a", admitted)
	if !b.parked || b.parkFor != parkCooldown || rec.parks[b] != 2*time.Second || s.pending != 0 {
		t.Fatalf("b parked %v (%v) for %v, pending %d: want it in the cooling line for 2s", b.parked, b.parkFor, rec.parks[b], s.pending)
	}
	rec.clock = rec.clock.Add(2 * time.Second)
	s.holdEnded()
	wantAnswers(t, rec, "b", admitted)
}

// A turn booked after weight spent beyond a reservation (an overrun,
// booked at release) is not given back below that weight: it stays
// charged.
func TestStageCooldownKeepsOverrunBooked(t *testing.T) {
	s, rec, calls := pacedState(t, false, 5, Rate{TokensPerMinute: 6000}) // 10 tokens: 100ms
	rec.clock = rec.clock.Add(ms(20))
	s.release(&releaseMsg{l: calls[0].Lease, usage: admission.Usage{Input: 110}, hasUsage: true}) // 100 over: 1s at the end of the queue
	rec.clock = rec.clock.Add(ms(30))
	s.feedback(&Feedback{Model: "m", Outcome: adaptive.RateLimited, RetryAfter: time.Second})
	rec.clock = rec.clock.Add(time.Second)
	s.holdEnded()
	if d := rec.parks[calls[1]]; d != ms(450) {
		t.Fatalf("first new turn in %v, want 450ms: after the overrun, which ends at 1.5s", d)
	}
}

// A paced call on a remote store: a worker books the turn, and the verdict
// parks the call or sends it on.
func TestStageRemoteTurn(t *testing.T) {
	s, rec := newStageState(t, admission.Limits{MaxConcurrent: 4}, stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}})
	s.rates.remote = true // as if the store were Redis
	a := newReq("a", 0)
	s.acquire(a)
	if len(rec.remotes) != 1 || rec.remotes[0].kind != remoteTurn || s.checking != 1 || s.idle() {
		t.Fatalf("jobs %d, checking %d: want a's turn asked of the store", len(rec.remotes), s.checking)
	}
	j := rec.remotes[0]
	j.delay = 300 * time.Millisecond
	s.verdict(j)
	if rec.parks[a] != 300*time.Millisecond || s.checking != 0 {
		t.Fatalf("parks %v: want a parked for the turn the store gave", rec.parks)
	}
	rec.clock = rec.clock.Add(300 * time.Millisecond)
	s.unpark(&parkMsg{r: a, gen: a.gen, seq: a.parkSeq})
	wantAnswers(t, rec, "a", admitted)
	b := newReq("b", 0)
	s.acquire(b)
	jb := rec.remotes[1]
	jb.why, jb.ext = admission.RateUnavailable, &admission.External{Rate: &admission.RateDetail{}}
	s.verdict(jb)
	wantAnswers(t, rec, "b", admission.RateUnavailable)
}

// The adaptive limit learns from feedback messages: a 429 lowers the
// limit at the next revision, the budget moving in proportion.
func TestStageAdaptive(t *testing.T) {
	params := adaptive.Params{Rule: adaptive.AIMD, Min: 1, Max: 8, Backoff: 0.5, Step: 1, Tolerance: 1.5, Smoothing: 0.2, Window: time.Second}
	s, rec := newStageState(t, budgetLimits(8, 0, 8000), stageConfig{model: "m",
		adaptive: &Adaptive{Params: params, HasBudget: true, MinBudget: 1000, MaxBudget: 8000}})
	a := newReq("a", 10)
	s.acquire(a)
	wantAnswers(t, rec, "a", admitted)
	if a.Lease.inFlight != 1 || a.Lease.epoch != 1 {
		t.Fatalf("noted at the grant: in flight %d, epoch %d", a.Lease.inFlight, a.Lease.epoch)
	}
	rec.kinds()
	rec.clock = rec.clock.Add(time.Second)
	s.feedback(&Feedback{Outcome: adaptive.RateLimited, Lease: a.Lease})
	if s.limits.MaxConcurrent != 4 || s.limits.Revision != 1 || s.limits.TokenBudget.Budget != 4000 {
		t.Fatalf("limits %+v after a 429, want 4 at revision 1 with a 4000 budget", s.limits)
	}
	if k := rec.kinds(); !reflect.DeepEqual(k, []string{"Reconfigure"}) {
		t.Fatalf("events %v", k)
	}
	if st := s.adaptiveStats(); st.Decreases != 1 || st.Samples != 1 || !st.LastChange.Equal(rec.clock) {
		t.Fatalf("adaptive stats %+v", st)
	}
	// A kill switch is left alone.
	s.applyLimits(&applyRequest{next: admission.Limits{Revision: 5, TokenBudget: &admission.BudgetLimits{Budget: 4000}}})
	rec.clock = rec.clock.Add(time.Second)
	s.feedback(&Feedback{Outcome: adaptive.RateLimited})
	if s.limits.MaxConcurrent != 0 || s.limits.Revision != 5 {
		t.Fatalf("limits %+v: the kill switch moved", s.limits)
	}
}

// An overrun is booked at release on the in-process tokens rate, at most
// one window ahead; on a remote store it is handed to a worker.
func TestStageOverrun(t *testing.T) {
	s, rec := newStageState(t, budgetLimits(4, 0, 1<<40), stageConfig{model: "m",
		rates: &Rates{Name: "bh", Model: "m", PerModel: Rate{TokensPerMinute: 6000}}})
	a := newReq("a", 100)
	s.acquire(a)
	s.release(&releaseMsg{l: a.Lease, usage: admission.Usage{Input: 1e9}, hasUsage: true})
	b := newReq("b", 100)
	s.acquire(b)
	wantAnswers(t, rec, "a", admitted, "b", rateLimit)
	if d := detailOf(t, b.Err).Rate; d.RetryAfter != time.Minute {
		t.Fatalf("retry after %v, want one window (1m)", d.RetryAfter)
	}
	if len(rec.warnings) != 1 || s.rates.overrunDropped.Load() == 0 {
		t.Fatalf("warnings %v, dropped %d", rec.warnings, s.rates.overrunDropped.Load())
	}
	s.rates.remote = true
	rec.clock = rec.clock.Add(time.Hour)
	c := newReq("c", 100)
	s.acquire(c)
	s.release(&releaseMsg{l: c.Lease, usage: admission.Usage{Input: 300}, hasUsage: true})
	if !reflect.DeepEqual(rec.booked, [][]float64{{200}}) {
		t.Fatalf("remote bookings %v, want the 200 over", rec.booked)
	}
}

// TestRollbackBypassKeepsHeadroomSpent checks a provisional admission in
// observe mode that its fleet pool turns away for a reason the call shadows:
// it is bypassed, the call runs anyway and reaches the provider, which counts
// it against its rate limits, so its spend from the provider's headroom
// stays spent. The old facade kept it (it gave the headroom back only to a
// call it rejected); the rollback gave it back before it looked at the
// shadow reasons, so the next calls saw headroom the provider no longer
// had.
func TestRollbackBypassKeepsHeadroomSpent(t *testing.T) {
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

// TestFleetRefusalSpendsNoLocalRateTurn checks that the fleet pool comes
// before the rates ("capacity, slot, fleet, rate: a fleet refusal spends no
// rate turn"), as the old facade kept it for an in-process rate too (with a
// fleet pool it decided the rate after the reserve). The state machine
// decided an in-process rate at the grant, before the fleet stage: a call the
// fleet turned away had spent its turn, and the next call was refused
// RateLimit for a turn nobody used.
func TestFleetRefusalSpendsNoLocalRateTurn(t *testing.T) {
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

// endedCtx marks r's context as ended, as the facade sees it once the
// caller has gone: its Done channel is closed.
func endedCtx(r *AcquireRequest) {
	done := make(chan struct{})
	close(done)
	r.ctxDone = done
}

// TestPacedCallLeavingWhileItsRemoteTurnIsBookedIsAnswered checks a paced
// call whose turn a remote store is booking, and whose caller leaves
// meanwhile: the facade's cancel message arrives while the call is checking
// (the state leaves it to the verdict), and the store had booked the turn
// before the context ended. The verdict must answer the call; it parked it
// instead, and a parked call whose context has ended waits for a cancel
// message that was already spent: it was never answered, and Drain never
// completed.
func TestPacedCallLeavingWhileItsRemoteTurnIsBookedIsAnswered(t *testing.T) {
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

// TestPacedCallLeavingWhileItsRemoteTurnIsBookedIsNotQueued: the same with a
// turn free at once and no slot free: the verdict queued the call, whose
// cancel message was already spent; the pump passes over it forever (no
// queue timeout), so it was never answered.
func TestPacedCallLeavingWhileItsRemoteTurnIsBookedIsNotQueued(t *testing.T) {
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
