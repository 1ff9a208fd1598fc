package actor

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

const retryBudget = admission.RetryBudget

// ---- The window arithmetic ----

// TestRetryLimitAllowsTheLargerOfFloorAndShare: the retries allowed are
// the larger of the floor and the ratio of the first attempts, rounded
// down, exactly (a ratio in millionths, no float rounding) and without
// overflow, however many first attempts.
func TestRetryLimitAllowsTheLargerOfFloorAndShare(t *testing.T) {
	tests := []struct {
		ppm, floor, firsts, want int64
	}{
		{100_000, 3, 0, 3},
		{100_000, 3, 29, 3},
		{100_000, 3, 39, 3},
		{100_000, 3, 40, 4},
		{100_000, 0, 9, 0},
		{100_000, 0, 10, 1},
		{290_000, 0, 100, 29}, // 0.29 * 100 is 28.999999999999996 in floating point
		{1_000_000, 0, 7, 7},
		{0, 2, 1 << 40, 2},
		{1, 0, 999_999, 0},
		{1, 0, 1_000_000, 1},
		{1_000_000, 0, math.MaxInt64, math.MaxInt64},
		{999_999, 0, math.MaxInt64, 9223362813482738952}, // floor((2^63-1) * 999999 / 10^6), past 64 bits on the way
		{1_000_000, 5, -1, 5},                            // a count never goes below zero; if it did, no share
	}
	for _, tt := range tests {
		l := retryLimit{ppm: tt.ppm, floor: tt.floor}
		if got := l.allowed(tt.firsts); got != tt.want {
			t.Errorf("allowed(ppm %d, floor %d, firsts %d) = %d, want %d", tt.ppm, tt.floor, tt.firsts, got, tt.want)
		}
	}
}

// TestRetryWindowSlidesInTenths: an admission counts from the bucket it
// falls in until the window has moved ten buckets on (between 9/10 of the
// window and the whole window), a jump past the whole window empties it,
// a clock set back counts in the latest bucket, and a count taken back
// after its bucket has left the window changes nothing.
func TestRetryWindowSlidesInTenths(t *testing.T) {
	origin := time.Unix(1000, 0)
	rs, err := newRetryStage(&admission.RetryConfig{Window: 10 * time.Second, Bulkhead: &admission.RetryLimit{PPM: 500_000}}, nil, origin)
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) time.Time { return origin.Add(d) }
	sums := func(d time.Duration) string {
		rs.advance(at(d))
		f, r := rs.bulk.sums()
		return fmt.Sprint(f, " ", r)
	}
	rs.count(classes.None, false, at(0))
	rs.count(classes.None, false, at(999*time.Millisecond))
	rs.count(classes.None, true, at(1500*time.Millisecond))
	if got := sums(9999 * time.Millisecond); got != "2 1" {
		t.Fatalf("at 9.999s: %s, want 2 1", got)
	}
	if got := sums(10 * time.Second); got != "0 1" {
		t.Fatalf("at 10s: %s, want 0 1 (the first second's bucket left the window)", got)
	}
	if got := sums(5 * time.Second); got != "0 1" {
		t.Fatalf("clock set back: %s, want 0 1", got)
	}
	k := rs.count(classes.None, true, at(5*time.Second)) // counts in the latest bucket, 10s
	if k != 10 {
		t.Fatalf("counted in bucket %d, want 10", k)
	}
	if got := sums(10500 * time.Millisecond); got != "0 2" {
		t.Fatalf("at 10.5s: %s, want 0 2", got)
	}
	rs.take(classes.None, true, k)
	if got := sums(10500 * time.Millisecond); got != "0 1" {
		t.Fatalf("taken back: %s, want 0 1", got)
	}
	if got := sums(11 * time.Second); got != "0 0" {
		t.Fatalf("at 11s: %s, want 0 0 (1.5s's bucket left the window)", got)
	}
	if got := sums(time.Hour); got != "0 0" {
		t.Fatalf("an hour on: %s, want 0 0", got)
	}
	rs.take(classes.None, true, 1) // long gone: nothing to take
	rs.take(classes.None, false, rs.cur)
	if f, r := rs.bulk.sums(); f != 0 || r != 0 {
		t.Fatalf("taking back below zero: %d %d", f, r)
	}
	// A far future clock (292 years on) saturates, and still counts.
	far := time.Unix(1<<62, 0)
	rs.count(classes.None, false, far)
	if f, _ := rs.bulk.sums(); f != 1 {
		t.Fatalf("far future: %d first attempts, want 1", f)
	}
}

// ---- The budget in the state machine ----

// newRetryState is a state machine with retry budgets cfg and queue
// policy qp, its windows counted from the recorder's clock.
func newRetryState(t *testing.T, limits admission.Limits, qp QueuePolicy, cfg *admission.RetryConfig) (*state, *recorder) {
	t.Helper()
	rec := &recorder{clock: time.Unix(1_000, 0), armed: map[*AcquireRequest]uint64{}, parks: map[*AcquireRequest]time.Duration{}}
	s, err := newState(limits, qp, stageConfig{model: "m", retry: cfg, origin: rec.clock}, rec, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	s.listen(allKinds, 1)
	return s, rec
}

// retryReq is newReq for a retry.
func retryReq(name string) *AcquireRequest {
	r := newReq(name, 0)
	r.Retry = true
	return r
}

func bulkBudget(window time.Duration, ppmRatio int64, floor int) *admission.RetryConfig {
	return &admission.RetryConfig{Window: window, Bulkhead: &admission.RetryLimit{Ratio: float64(ppmRatio) / ppm, PPM: ppmRatio, MinRetries: floor}}
}

// TestRetryOverBudgetIsRefusedAtOnce: retries are admitted while they are
// below the larger of the floor and the ratio of the first attempts
// admitted over the window; the next is refused RetryBudget at once, slots
// free or not, with the numbers that decided, and holds nothing; first
// attempts are never refused for it.
func TestRetryOverBudgetIsRefusedAtOnce(t *testing.T) {
	s, rec := newRetryState(t, budgetLimits(100, 0, 1000), QueuePolicy{}, bulkBudget(10*time.Second, 500_000, 1))
	for i := range 4 {
		s.acquire(newReq(fmt.Sprint("first", i), 10))
	}
	a, b := retryReq("retry-a"), retryReq("retry-b")
	s.acquire(a)
	s.acquire(b)
	c := retryReq("retry-c")
	c.Reservation = admission.Reservation{Input: 10, Reserved: 10}
	s.acquire(c)
	wantAnswers(t, rec, "first0", admitted, "first1", admitted, "first2", admitted, "first3", admitted,
		"retry-a", admitted, "retry-b", admitted, "retry-c", retryBudget)
	d := detailOf(t, c.Err)
	want := &admission.RetryBudgetDetail{RetryBudgetStats: admission.RetryBudgetStats{Ratio: 0.5, MinRetries: 1, Window: 10 * time.Second,
		FirstAttempts: 4, Retries: 2, Allowed: 2}}
	if !reflect.DeepEqual(d.RetryBudget, want) || d.InFlight != 6 || d.TokenBudget == nil || d.TokenBudget.Reserved != 10 {
		t.Fatalf("detail %+v, retry budget %+v; want %+v", d, d.RetryBudget, want)
	}
	st := s.stats(external{})
	if st.Admissions.Rejected[retryBudget] != 1 || st.Gate.Rejections() != 0 || st.Tokens != 40 || st.InFlight != 6 {
		t.Fatalf("stats %+v", st)
	}
	if st.Retries.Admitted != 2 || !reflect.DeepEqual(st.Retries.Budget, &admission.RetryBudgetStats{
		Ratio: 0.5, MinRetries: 1, Window: 10 * time.Second, FirstAttempts: 4, Retries: 2, Allowed: 2}) {
		t.Fatalf("retry stats %+v, budget %+v", st.Retries, st.Retries.Budget)
	}
	s.acquire(newReq("first4", 0))
	wantAnswers(t, rec, "first4", admitted)
	s.acquire(retryReq("retry-d")) // 5 first attempts: still 2 allowed
	s.acquire(newReq("first5", 0))
	s.acquire(retryReq("retry-e")) // 6: 3 allowed
	wantAnswers(t, rec, "retry-d", retryBudget, "first5", admitted, "retry-e", admitted)
}

// TestRetryBudgetFollowsTheWindow: the first attempts a budget counts leave
// it with the window, and so do the retries; the floor lets retries
// through when nothing else is counted.
func TestRetryBudgetFollowsTheWindow(t *testing.T) {
	s, rec := newRetryState(t, admission.Limits{MaxConcurrent: 100}, QueuePolicy{}, bulkBudget(10*time.Second, 100_000, 1))
	for i := range 20 {
		s.acquire(newReq(fmt.Sprint("f", i), 0))
	}
	rec.take()
	s.acquire(retryReq("r1"))
	s.acquire(retryReq("r2"))
	s.acquire(retryReq("r3"))
	wantAnswers(t, rec, "r1", admitted, "r2", admitted, "r3", retryBudget)
	rec.clock = rec.clock.Add(9999 * time.Millisecond)
	s.acquire(retryReq("r4"))
	wantAnswers(t, rec, "r4", retryBudget)
	rec.clock = rec.clock.Add(time.Millisecond) // the window has moved past them all
	s.acquire(retryReq("r5"))
	s.acquire(retryReq("r6"))
	wantAnswers(t, rec, "r5", admitted, "r6", retryBudget)
}

// TestClassRetryBudgetCountsItsClass: a class's budget counts its own
// first attempts and retries only; the bulkhead's counts every class; a
// retry must have room in both, and the detail names the budget that
// refused it (the class's, or "" for the bulkhead's) with its constraint.
func TestClassRetryBudgetCountsItsClass(t *testing.T) {
	limits := admission.Limits{MaxConcurrent: 100, Classes: &admission.Classes{Default: "a",
		Limits: map[string]admission.ClassLimits{"a": {}, "b": {}}}}
	cfg := &admission.RetryConfig{Window: 10 * time.Second,
		Bulkhead: &admission.RetryLimit{Ratio: 0.5, PPM: 500_000},
		PerClass: map[string]admission.RetryLimit{"a": {Ratio: 0.25, PPM: 250_000}}}
	s, rec := newRetryState(t, limits, QueuePolicy{}, cfg)
	a, _ := s.tab.Lookup("a")
	b, _ := s.tab.Lookup("b")
	call := func(name string, c classes.Class, retry bool) *AcquireRequest {
		r := newReq(name, 0)
		r.Class, r.Retry = c, retry
		s.acquire(r)
		return r
	}
	for i := range 4 {
		call(fmt.Sprint("b", i), b, false)
	}
	ra := call("a-retry", a, true) // the bulkhead has room (2), a has none (0 of 0)
	rb := call("b-retry", b, true)
	call("a0", a, false)
	call("a1", a, false)
	call("a2", a, false)
	call("a3", a, false) // a: 1 allowed; bulkhead: 8 first attempts, 4 allowed
	ra2 := call("a-retry2", a, true)
	rec.take()
	if reasonOf(ra.Err) != retryBudget || reasonOf(rb.Err) != admitted || reasonOf(ra2.Err) != admitted {
		t.Fatalf("answers %v %v %v", ra.Err, rb.Err, ra2.Err)
	}
	if d := detailOf(t, ra.Err); d.RetryBudget.Class != "a" || d.Constraint != admission.ConstraintClass || d.RetryBudget.Allowed != 0 {
		t.Fatalf("detail %+v %+v", d, d.RetryBudget)
	}
	call("b-retry2", b, true)
	call("b-retry3", b, true)
	last := call("b-retry4", b, true) // the bulkhead's 4 are taken
	rec.take()
	if d := detailOf(t, last.Err); reasonOf(last.Err) != retryBudget || d.RetryBudget.Class != "" || d.Constraint != admission.ConstraintGlobal ||
		d.RetryBudget.FirstAttempts != 8 || d.RetryBudget.Retries != 4 {
		t.Fatalf("%v: detail %+v", last.Err, d.RetryBudget)
	}
	st := s.stats(external{})
	ca, cb := st.Classes.Classes[a-1].Retries, st.Classes.Classes[b-1].Retries
	if st.Retries.Admitted != 4 || ca.Admitted != 1 || cb.Admitted != 3 || cb.Budget != nil ||
		ca.Budget == nil || ca.Budget.FirstAttempts != 4 || ca.Budget.Retries != 1 || ca.Budget.Allowed != 1 {
		t.Fatalf("retry stats %+v, a %+v %+v, b %+v", st.Retries, ca, ca.Budget, cb)
	}
}

// TestQueuedRetryIsCheckedAgainAtItsGrant: retries that found room in the
// budget as they arrived, then waited, are checked again as each is
// granted its slot: the room the first takes is not there for the second,
// which is refused then (its slot goes to the next waiter).
func TestQueuedRetryIsCheckedAgainAtItsGrant(t *testing.T) {
	s, rec := newRetryState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 5}, QueuePolicy{RetryAging: -1}, bulkBudget(10*time.Second, 0, 1))
	f := newReq("first", 0)
	s.acquire(f)
	r1, r2, w := retryReq("r1"), retryReq("r2"), newReq("w", 0)
	s.acquire(r1)
	s.acquire(r2)
	s.acquire(w)
	wantAnswers(t, rec, "first", admitted)
	release(s, f)
	wantAnswers(t, rec, "r1", admitted)
	release(s, r1)
	wantAnswers(t, rec, "r2", retryBudget, "w", admitted)
	if st := s.stats(external{}); st.Gate.Admitted != 4 || st.Gate.Released != 3 || st.InFlight != 1 {
		t.Fatalf("gate %+v, in flight %d: r2's slot was granted and given back", st.Gate, st.InFlight)
	}
}

// TestRolledBackRetryGivesItsRoomBack: a provisional admission (a remote
// stage decides it) is counted in the budget at once, so that a second
// retry cannot take the same room meanwhile; rolled back, it gives the
// room back.
func TestRolledBackRetryGivesItsRoomBack(t *testing.T) {
	s, rec := newRetryState(t, admission.Limits{MaxConcurrent: 4}, QueuePolicy{}, bulkBudget(10*time.Second, 0, 1))
	s.fleet = &fleetStage{}
	r1 := retryReq("r1")
	s.acquire(r1)
	r2 := retryReq("r2")
	s.acquire(r2)
	wantAnswers(t, rec, "r2", retryBudget)
	j := rec.remotes[0]
	j.why, j.ext = admission.FleetUnavailable, &admission.External{Fleet: &admission.FleetDetail{}}
	s.verdict(j)
	wantAnswers(t, rec, "r1", admission.FleetUnavailable)
	r3 := retryReq("r3")
	s.acquire(r3)
	s.verdict(rec.remotes[1])
	wantAnswers(t, rec, "r3", admitted)
	if st := s.stats(external{}); st.Retries.Admitted != 1 || st.Retries.Budget.Retries != 1 {
		t.Fatalf("retry stats %+v %+v", st.Retries, st.Retries.Budget)
	}
}

// TestPacedRetryIsCheckedAgainAtItsTurn: a retry that waited for its paced
// turn is checked against its budget again when the turn comes.
func TestPacedRetryIsCheckedAgainAtItsTurn(t *testing.T) {
	rec := &recorder{clock: time.Unix(1_000, 0), armed: map[*AcquireRequest]uint64{}, parks: map[*AcquireRequest]time.Duration{}}
	s, err := newState(admission.Limits{MaxConcurrent: 4}, QueuePolicy{}, stageConfig{model: "m", origin: rec.clock,
		retry: bulkBudget(10*time.Second, 0, 1),
		rates: &Rates{Name: "bh", Model: "m", Pace: true, PerModel: Rate{RequestsPerMinute: 60}}}, rec, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	s.acquire(newReq("a", 0))
	p := retryReq("paced")
	s.acquire(p) // waits a second for its turn
	r := retryReq("r")
	r.Model = "other" // no rate: admitted at once, taking the one retry
	s.acquire(r)
	wantAnswers(t, rec, "a", admitted, "r", admitted)
	rec.clock = rec.clock.Add(time.Second)
	s.unpark(&parkMsg{r: p, gen: p.gen, seq: p.parkSeq})
	wantAnswers(t, rec, "paced", retryBudget)
}

// TestWouldAdmitAnswersRetryBudget: the advisory answer for a retry names
// the budget that would refuse it, with its detail when asked; for a first
// attempt, nothing changes.
func TestWouldAdmitAnswersRetryBudget(t *testing.T) {
	s, _ := newRetryState(t, admission.Limits{MaxConcurrent: 1}, QueuePolicy{}, bulkBudget(10*time.Second, 0, 0))
	q := &wouldAdmitRequest{retry: true, detail: true}
	s.wouldAdmitRequest(q)
	if q.why != retryBudget || q.snapshot == nil || q.snapshot.RetryBudget == nil || q.snapshot.RetryBudget.Allowed != 0 {
		t.Fatalf("why %v, detail %+v", q.why, q.snapshot)
	}
	q = &wouldAdmitRequest{}
	s.wouldAdmitRequest(q)
	if q.why != admitted {
		t.Fatalf("a first attempt: %v", q.why)
	}
}

// ---- The queue's order ----

// queueOrder sends held, which must be admitted, then early, which must
// queue; moves the clock on by wait; sends late, which must queue too; and
// then admits them all one slot at a time, returning their names in the
// order they were admitted.
func queueOrder(t *testing.T, s *state, rec *recorder, held *AcquireRequest, early []*AcquireRequest, wait time.Duration, late ...*AcquireRequest) []string {
	t.Helper()
	byName := map[string]*AcquireRequest{}
	s.acquire(held)
	for _, r := range early {
		byName[r.Request.(string)] = r
		s.acquire(r)
	}
	rec.clock = rec.clock.Add(wait)
	for _, r := range late {
		byName[r.Request.(string)] = r
		s.acquire(r)
	}
	if got := rec.take(); len(got) != 1 || got[0].err != nil {
		t.Fatalf("answers %v: want the held call admitted, the others queued", got)
	}
	var order []string
	for cur := held; ; {
		release(s, cur)
		got := rec.take()
		if len(got) == 0 {
			return order
		}
		if len(got) != 1 || got[0].err != nil {
			t.Fatalf("answers %v after a release", got)
		}
		order = append(order, got[0].name)
		cur = byName[got[0].name]
	}
}

// TestFirstAttemptsGoAheadOfRetries: in the plain queue, a first attempt
// goes ahead of the retries waiting before it until they have waited the
// aging; then they go in arrival order with the first attempts.
func TestFirstAttemptsGoAheadOfRetries(t *testing.T) {
	s, rec := newRetryState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 10}, QueuePolicy{RetryAging: 5 * time.Second}, nil)
	got := queueOrder(t, s, rec, newReq("held", 0), []*AcquireRequest{retryReq("r1"), newReq("f1", 0), retryReq("r2"), newReq("f2", 0)}, 0)
	if !reflect.DeepEqual(got, []string{"f1", "f2", "r1", "r2"}) {
		t.Fatalf("order %v, want the first attempts first", got)
	}
	// old1 and old2 wait 5s before the others come: they have aged.
	got = queueOrder(t, s, rec, newReq("held2", 0), []*AcquireRequest{retryReq("old1"), retryReq("old2")}, 5*time.Second,
		newReq("g1", 0), retryReq("young"), newReq("g2", 0))
	if !reflect.DeepEqual(got, []string{"old1", "old2", "g1", "g2", "young"}) {
		t.Fatalf("order %v, want the aged retries in arrival order, the young one last", got)
	}
	// One that has waited 4.999s has not.
	got = queueOrder(t, s, rec, newReq("held3", 0), []*AcquireRequest{retryReq("almost")}, 4999*time.Millisecond, newReq("h1", 0))
	if !reflect.DeepEqual(got, []string{"h1", "almost"}) {
		t.Fatalf("order %v", got)
	}
}

// TestRetriesKeepArrivalOrderWithNegativeAging: with a negative aging,
// retries wait in arrival order with everyone.
func TestRetriesKeepArrivalOrderWithNegativeAging(t *testing.T) {
	s, rec := newRetryState(t, admission.Limits{MaxConcurrent: 1, MaxQueue: 10}, QueuePolicy{RetryAging: -1}, nil)
	got := queueOrder(t, s, rec, newReq("held", 0), []*AcquireRequest{retryReq("r1"), newReq("f1", 0), retryReq("r2"), newReq("f2", 0)}, 0)
	if !reflect.DeepEqual(got, []string{"r1", "f1", "r2", "f2"}) {
		t.Fatalf("order %v, want arrival order", got)
	}
}

// TestFairQueuePutsFirstAttemptsFirstWithinClassAndPriority: with fair
// queuing, the classes take their turns as before, High priority first
// within a class, and within a class and priority first attempts go ahead
// of retries.
func TestFairQueuePutsFirstAttemptsFirstWithinClassAndPriority(t *testing.T) {
	limits := admission.Limits{MaxConcurrent: 1, MaxQueue: 20, Classes: &admission.Classes{Default: "a",
		Limits: map[string]admission.ClassLimits{"a": {}, "b": {}}}}
	s, rec := newRetryState(t, limits, QueuePolicy{Fair: true, RetryAging: time.Minute}, nil)
	a, _ := s.tab.Lookup("a")
	b, _ := s.tab.Lookup("b")
	mk := func(name string, c classes.Class, high, retry bool) *AcquireRequest {
		r := newReq(name, 0)
		r.Class, r.Retry = c, retry
		if high {
			r.Priority = admission.High
		}
		return r
	}
	got := queueOrder(t, s, rec, mk("held", a, false, false), []*AcquireRequest{
		mk("a-retry", a, false, true), mk("a-high-retry", a, true, true), mk("a-first", a, false, false), mk("a-high-first", a, true, false),
		mk("b-retry", b, false, true), mk("b-first", b, false, false)}, 0)
	// a and b take turns (a first: they tie, and a's handle is lower);
	// within a, High priority first, first attempts ahead of retries.
	want := []string{"a-high-first", "b-first", "a-high-retry", "b-retry", "a-first", "a-retry"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestNewFirstAttemptPassesRetriesWaitingForCapacity: a new first attempt
// that fits goes ahead of its class's retries that wait for capacity, as
// it would in the queue.
func TestNewFirstAttemptPassesRetriesWaitingForCapacity(t *testing.T) {
	s, rec := newRetryState(t, budgetLimits(4, 4, 100), QueuePolicy{WaitForCapacity: true, RetryAging: time.Minute}, nil)
	s.acquire(newReq("big", 90))
	r := retryReq("retry")
	r.Reservation = admission.Reservation{Input: 20, Reserved: 20}
	s.acquire(r) // waits for 20 tokens
	s.acquire(newReq("small", 5))
	wantAnswers(t, rec, "big", admitted, "small", admitted)
	if !r.queued {
		t.Fatal("the retry left the queue")
	}
	s.cancel(&cancelMsg{r: r, cause: errors.New("gone")})
	wantAnswers(t, rec, "retry", aborted)
}

// TestAgedRetryIsServedWhenItAges: with waiting for capacity, a retry
// that fits waits behind a first attempt that does not (the queue holds
// back behind a call short of the token budget) only until it has waited
// its aging: the engine's hold timer serves the queue again then, and the
// retry, now ahead, is admitted while the first attempt still waits. So
// in the plain queue and, within a class and priority, in the fair queue.
func TestAgedRetryIsServedWhenItAges(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "fair"}[fair], func(t *testing.T) {
			limits := budgetLimits(4, 4, 100)
			if fair {
				limits.Classes = &admission.Classes{Default: "a", Limits: map[string]admission.ClassLimits{"a": {}, "b": {}}}
			}
			s, rec := newRetryState(t, limits, QueuePolicy{Fair: fair, WaitForCapacity: true, RetryAging: 3 * time.Second}, nil)
			a, _ := s.tab.Lookup("a")
			mk := func(name string, reserved int64, retry bool) *AcquireRequest {
				r := newReq(name, reserved)
				r.Retry = retry
				if fair {
					r.Class = a
				}
				return r
			}
			s.acquire(mk("held1", 30, false))
			held2 := mk("held2", 30, false)
			s.acquire(held2)
			s.acquire(mk("retry", 50, true)) // waits for 50 tokens
			rec.clock = rec.clock.Add(time.Second)
			f := mk("first", 75, false)
			s.acquire(f) // waits for 75 tokens, ahead of the retry
			wantAnswers(t, rec, "held1", admitted, "held2", admitted)
			rec.holds = nil
			release(s, held2) // 50 fit, 75 do not: the first attempt holds the queue back
			wantAnswers(t, rec)
			if !reflect.DeepEqual(rec.holds, []time.Duration{2 * time.Second}) {
				t.Fatalf("hold timer %v, want 2s: when the retry will have waited 3s", rec.holds)
			}
			rec.clock = rec.clock.Add(2 * time.Second)
			s.holdEnded()
			wantAnswers(t, rec, "retry", admitted)
			if !f.queued {
				t.Fatal("the first attempt left the queue")
			}
		})
	}
}

// TestRetryRefusedAtItsGrantInTheFairQueueFreesItsSlot: in the fair queue,
// a waiting retry whose budget was spent while it waited is refused as it
// is granted its slot, and the slot goes on to the next waiter: nothing
// is left held.
func TestRetryRefusedAtItsGrantInTheFairQueueFreesItsSlot(t *testing.T) {
	limits := admission.Limits{MaxConcurrent: 1, MaxQueue: 5, Classes: &admission.Classes{Default: "a",
		Limits: map[string]admission.ClassLimits{"a": {}, "b": {}}}}
	s, rec := newRetryState(t, limits, QueuePolicy{Fair: true, RetryAging: -1}, bulkBudget(10*time.Second, 0, 1))
	a, _ := s.tab.Lookup("a")
	b, _ := s.tab.Lookup("b")
	mk := func(name string, c classes.Class, retry bool) *AcquireRequest {
		r := newReq(name, 0)
		r.Class, r.Retry = c, retry
		return r
	}
	held := mk("held", a, false)
	s.acquire(held)
	ra, rb, w := mk("a-retry", a, true), mk("b-retry", b, true), mk("b-first", b, false)
	s.acquire(ra)
	s.acquire(rb)
	s.acquire(w)
	wantAnswers(t, rec, "held", admitted)
	release(s, held) // the classes tie, a goes first: a-retry takes the one retry
	wantAnswers(t, rec, "a-retry", admitted)
	release(s, ra) // b's turn: b-retry finds the budget spent, and b-first gets the slot
	wantAnswers(t, rec, "b-retry", retryBudget, "b-first", admitted)
	st := s.stats(external{})
	if st.InFlight != 1 || st.Pending != 0 || st.Retries.Admitted != 1 || st.Admissions.Rejected[retryBudget] != 1 {
		t.Fatalf("in flight %d, pending %d, retries %+v, rejected %v", st.InFlight, st.Pending, st.Retries, st.Admissions.Rejected)
	}
}
