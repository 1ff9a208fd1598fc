package props_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// What the state machine (model_test.go) and the soaks share: the event
// log, Stats normalisation, the invariants that Stats alone shows, error
// checks and formatting.

// token is what an Acquire admits.
type token = bulkhead.Permit

// noReason is the zero Reason: admitted. (The root package does not
// re-export admission.NoReason.)
const noReason bulkhead.Reason = 0

// settle bounds every wait for an outcome a test expects. It is generous:
// a correct engine answers in microseconds.
const settle = testutil.Settle

// admitted is what a token and a run context both tell of their admission.
type admitted interface {
	ID() bulkhead.ID
	LimitRevision() int64
	Priority() bulkhead.Priority
	Class() string
	Reservation() *bulkhead.Reservation
	Resources() bulkhead.Resources
}

// admissionView is a copy of what an admission told of itself.
type admissionView struct {
	id        bulkhead.ID
	rev       int64
	prio      bulkhead.Priority
	class     string
	res       *bulkhead.Reservation
	resources bulkhead.Resources
}

func viewOf(a admitted) admissionView {
	return admissionView{a.ID(), a.LimitRevision(), a.Priority(), a.Class(), a.Reservation(), a.Resources()}
}

// discard releases a token that a failing check, or cleanup, leaves behind.
func discard(tok *token) {
	if tok != nil {
		_ = tok.Release(nil)
	}
}

// countingClock is a mock clock that counts the timers registered with
// AfterFunc: the engine's queue timeouts and the class actors' borrowed-slot
// deadlines. A timer runs for a duration, so one registered after the clock
// moved would fire late (see TestBorrowedDeadlineTimerRegisteredLate); the
// state machine waits, before every Add, until every timer it expects is
// registered.
type countingClock struct {
	*clock.Mock
	registered atomic.Int64
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Mock.AfterFunc(d, f)
	c.registered.Add(1)
	return t
}

// spinUntil yields until done reports true or an error, or settle passes.
func spinUntil(what string, done func() (bool, error)) error { return testutil.Poll(what, done) }

// spin yields n times, or until ctx ends: work of some length, without
// sleeping.
func spin(ctx context.Context, n int) {
	for range n {
		if ctx.Err() != nil {
			return
		}
		runtime.Gosched()
	}
}

// ---- Events ----

type eventKind int

const (
	evAdmit eventKind = iota
	evAbandon
	evRelease
)

type ordered struct {
	kind eventKind
	id   bulkhead.ID
	i    int // index in the list of its kind
}

// eventLog records what listeners saw, on the events goroutine.
type eventLog struct {
	mu        sync.Mutex
	order     []ordered // admits, abandons and releases
	admits    []bulkhead.AdmitEvent
	abandons  []bulkhead.AbandonEvent
	releases  []bulkhead.ReleaseEvent
	rejects   []bulkhead.RejectEvent
	reconfigs []bulkhead.ReconfigureEvent
	// bypassed calls' events, in order
	bypassOrder []any
	dedups      []bulkhead.DedupEvent
}

func (l *eventLog) recordBypass(e any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bypassOrder = append(l.bypassOrder, e)
}

func record[E any](l *eventLog, list *[]E, e E, kind eventKind, id bulkhead.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if kind >= 0 {
		l.order = append(l.order, ordered{kind, id, len(*list)})
	}
	*list = append(*list, e)
}

func (l *eventLog) hooks() bulkhead.Hooks {
	return bulkhead.Hooks{
		Admit:         func(e bulkhead.AdmitEvent) { record(l, &l.admits, e, evAdmit, e.ID) },
		Abandon:       func(e bulkhead.AbandonEvent) { record(l, &l.abandons, e, evAbandon, e.ID) },
		Release:       func(e bulkhead.ReleaseEvent) { record(l, &l.releases, e, evRelease, e.ID) },
		Reject:        func(e bulkhead.RejectEvent) { record(l, &l.rejects, e, -1, bulkhead.ID{}) },
		Reconfigure:   func(e bulkhead.ReconfigureEvent) { record(l, &l.reconfigs, e, -1, bulkhead.ID{}) },
		Bypass:        func(e bulkhead.BypassEvent) { l.recordBypass(e) },
		BypassUsage:   func(e bulkhead.BypassUsageEvent) { l.recordBypass(e) },
		BypassRelease: func(e bulkhead.BypassReleaseEvent) { l.recordBypass(e) },
		Dedup:         func(e bulkhead.DedupEvent) { record(l, &l.dedups, e, -1, bulkhead.ID{}) },
	}
}

// admissionEvents is the events of one admission.
type admissionEvents struct {
	admit   *bulkhead.AdmitEvent
	abandon *bulkhead.AbandonEvent
	release *bulkhead.ReleaseEvent
}

// perAdmission groups the events by admission and checks that each one saw
// exactly one admit, at most one abandon and exactly one release, in that
// order (I2, F30). Call it with l.mu held, once every admission is released.
func (l *eventLog) perAdmission() (map[bulkhead.ID]*admissionEvents, error) {
	out := map[bulkhead.ID]*admissionEvents{}
	for _, o := range l.order {
		a := out[o.id]
		if a == nil {
			a = &admissionEvents{}
			out[o.id] = a
		}
		var dup bool
		switch o.kind {
		case evAdmit:
			dup = a.admit != nil
			a.admit = &l.admits[o.i]
		case evAbandon:
			dup = a.abandon != nil || a.admit == nil || a.release != nil
			a.abandon = &l.abandons[o.i]
		case evRelease:
			dup = a.release != nil || a.admit == nil
			a.release = &l.releases[o.i]
		}
		if dup {
			return nil, fmt.Errorf("I2/F30: events of %s repeated or out of order: %v at position %d", o.id, o.kind, o.i)
		}
	}
	for id, a := range out {
		if a.release == nil {
			return nil, fmt.Errorf("I2: %s has no release event", id)
		}
	}
	return out, nil
}

func (k eventKind) String() string { return [...]string{"admit", "abandon", "release"}[k] }

// ---- Stats ----

// normalize drops zero map entries and empty maps, so that two Stats
// compare by value. The class actors' deadline telemetry is dropped: it
// moves on the actors' own time, and checkDeadlines checks it. It edits
// st's class map: give it a Stats of its own, as Stats and wantStats
// return.
func normalize(st bulkhead.Stats) bulkhead.Stats {
	st.Gate.RejectedByReason = nonZero(st.Gate.RejectedByReason)
	st.Calls.RejectedByReason = nonZero(st.Calls.RejectedByReason)
	st.Calls.AbandonedByCause = nonZero(st.Calls.AbandonedByCause)
	st.Observe.BypassedByReason = nonZero(st.Observe.BypassedByReason)
	st.Events.Backlog = 0 // a gauge of the event goroutine's progress, not of admission
	st.Adaptive = nil     // the controller's counters; its limits are pinned (Stats.Limits shows them)
	if st.Classes != nil {
		c := *st.Classes
		for name, cs := range c.Classes {
			cs.RejectedByReason = nonZero(cs.RejectedByReason)
			cs.AbandonedByCause = nonZero(cs.AbandonedByCause)
			cs.Deadlines = bulkhead.DeadlineStats{}
			c.Classes[name] = cs
		}
		st.Classes = &c
	}
	return st
}

// nonZero is in without its zero entries (in itself when it has none), nil
// when none is left.
func nonZero[K comparable](in map[K]int64) map[K]int64 {
	n := 0
	for _, v := range in {
		if v != 0 {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(in):
		return in
	}
	out := make(map[K]int64, n)
	for k, v := range in {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func sum[K comparable](m map[K]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// inc adds one to (*m)[k], making the map if needed.
func inc[K comparable](m *map[K]int64, k K) {
	if *m == nil {
		*m = map[K]int64{}
	}
	(*m)[k]++
}

// checkCounters checks I5 on any snapshot: admitted - released is in
// flight, globally and per class, where abandoned[class] admissions gave
// their slot back but are not yet released; rejections and abandons add up
// by reason and cause; the classes add up to the global counts.
func checkCounters(st bulkhead.Stats, abandoned map[string]int64) error {
	g, c := st.Gate, st.Calls
	if c.Admitted-c.Released != c.InFlight || g.Admitted-g.Released != int64(g.InFlight) || c.InFlight-int64(g.InFlight) != sum(abandoned) {
		return fmt.Errorf("I5: calls %d-%d=%d, gate %d-%d=%d, abandoned unreleased %v", c.Admitted, c.Released, c.InFlight,
			g.Admitted, g.Released, g.InFlight, abandoned)
	}
	if c.Rejected != sum(c.RejectedByReason) || g.Rejected != sum(g.RejectedByReason) || c.Abandoned != sum(c.AbandonedByCause) ||
		g.Aborted != g.RejectedByReason[bulkhead.Aborted] || g.TimedOut != g.RejectedByReason[bulkhead.Timeout] {
		return fmt.Errorf("I5: rejected %d by reason %v; gate %d by reason %v (aborted %d, timed out %d); abandoned %d by cause %v",
			c.Rejected, c.RejectedByReason, g.Rejected, g.RejectedByReason, g.Aborted, g.TimedOut, c.Abandoned, c.AbandonedByCause)
	}
	if st.Classes == nil {
		return nil
	}
	var sumIn int
	var sumTok, sumAdm, sumRel, sumRej, sumAband int64
	for name, cs := range st.Classes.Classes {
		if cs.Admitted-cs.Released-int64(cs.InFlight) != abandoned[name] || cs.Rejected != sum(cs.RejectedByReason) || cs.Abandoned != sum(cs.AbandonedByCause) {
			return fmt.Errorf("I5: class %s: admitted %d - released %d - in flight %d != %d abandoned unreleased; rejected %d by reason %v; abandoned %d by cause %v",
				name, cs.Admitted, cs.Released, cs.InFlight, abandoned[name], cs.Rejected, cs.RejectedByReason, cs.Abandoned, cs.AbandonedByCause)
		}
		sumIn += cs.InFlight
		sumTok += cs.InFlightTokens
		sumAdm += cs.Admitted
		sumRel += cs.Released
		sumRej += cs.Rejected
		sumAband += cs.Abandoned
	}
	var tokens int64
	if st.TokenBudget != nil {
		tokens = st.TokenBudget.InFlightTokens
	}
	if sumIn != g.InFlight || sumTok != tokens || sumAdm != c.Admitted || sumRel != c.Released || sumRej != c.Rejected || sumAband != c.Abandoned {
		return fmt.Errorf("I5: the classes sum to in flight %d tokens %d admitted %d released %d rejected %d abandoned %d; globally %d %d %d %d %d %d",
			sumIn, sumTok, sumAdm, sumRel, sumRej, sumAband, g.InFlight, tokens, c.Admitted, c.Released, c.Rejected, c.Abandoned)
	}
	return nil
}

// checkIdle checks I3 once all work has settled: nothing in flight or
// pending, no token held, globally and per class.
func checkIdle(st bulkhead.Stats) error {
	g, c := st.Gate, st.Calls
	idle := g.InFlight == 0 && g.Pending == 0 && c.InFlight == 0 && c.Admitted == c.Released && g.Admitted == g.Released &&
		st.Observe.InFlight == 0 && (st.Dedup == nil || st.Dedup.Active == 0)
	if tb := st.TokenBudget; tb != nil {
		idle = idle && tb.InFlightTokens == 0
	}
	if cs := st.Classes; cs != nil {
		idle = idle && cs.Shared.InFlight == 0 && (cs.Shared.TokenBudget == nil || cs.Shared.TokenBudget.InFlightTokens == 0)
		for _, c := range cs.Classes {
			idle = idle && c.InFlight == 0 && c.InFlightTokens == 0 && c.Admitted == c.Released
		}
	}
	if !idle {
		return fmt.Errorf("I3: not idle after drain: %s", fmtStats(st))
	}
	return nil
}

// checkDeadlines checks each class actor's deadline telemetry against the
// rest of the class's stats: every deadline started is running, expired or
// ended, and every abandonment by deadline follows an expiry.
func checkDeadlines(st bulkhead.Stats) error {
	if st.Classes == nil {
		return nil
	}
	for name, cs := range st.Classes.Classes {
		d := cs.Deadlines
		if d.Active < 0 || d.Started != d.Active+d.Expired+d.Ended {
			return fmt.Errorf("class %s: deadlines %+v do not add up", name, d)
		}
		if byDeadline := cs.AbandonedByCause[bulkhead.AbandonDeadline]; d.Expired < byDeadline {
			return fmt.Errorf("class %s: %d abandoned by deadline but %d deadlines expired", name, byDeadline, d.Expired)
		}
	}
	return nil
}

// ---- Errors ----

// wantReason checks that err is a rejection for reason why.
func wantReason(t testutil.Fataler, err error, why bulkhead.Reason) *bulkhead.RejectedError {
	t.Helper()
	return testutil.WantReason(t, err, why)
}

// sentinel is each reason's sentinel error.
var sentinel = testutil.Sentinel

// isConfigError reports whether err is invalid input: a *ConfigError, never
// a rejection.
func isConfigError(err error) bool {
	var ce *bulkhead.ConfigError
	return errors.As(err, &ce) && errors.Is(err, bulkhead.ErrInvalid) && !errors.Is(err, bulkhead.ErrRejected)
}

func detailOf(err error) *bulkhead.RejectDetail {
	var rej *bulkhead.RejectedError
	if errors.As(err, &rej) {
		return rej.Detail
	}
	return nil
}

func reasonName(r bulkhead.Reason) string {
	if r == noReason {
		return "admission"
	}
	return r.String()
}

// ---- Soaks ----

// soak runs workers goroutines on the real clock, each calling the step
// that newWorker gives it until duration has passed or the step fails, then
// closes b and drains it. A failing step fails t; a hang is fatal.
func soak(t *testing.T, b *bulkhead.Bulkhead, workers int, duration time.Duration, newWorker func(w int, rng *rand.Rand) func() error) {
	t.Helper()
	failures := make(chan string, workers)
	var wg sync.WaitGroup
	stop := time.Now().Add(duration)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			step := newWorker(w, rand.New(rand.NewPCG(uint64(w), 42)))
			for time.Now().Before(stop) {
				if err := step(); err != nil {
					failures <- fmt.Sprintf("worker %d: %v", w, err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(duration + 30*time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("the workers did not finish: the bulkhead hangs\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	// Every worker released what it took, so it drains.
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	if res, err := b.Drain(ctx); err != nil || !res.Drained {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// ---- Formatting ----

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func fmtClassLimits(l bulkhead.ClassLimits) string {
	return fmt.Sprintf("{floor %d max %s tokFloor %d maxTok %s}", l.ProtectedConcurrent, fmtPtr(l.MaxConcurrent),
		l.ProtectedInFlightTokens, fmtPtr(l.MaxInFlightTokens))
}

func fmtLimits(l bulkhead.Limits) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{rev %d conc %d queue %d", l.Revision, l.MaxConcurrent, l.MaxQueue)
	if l.TokenBudget != nil {
		fmt.Fprintf(&b, " budget %d reserve %d", l.TokenBudget.Budget, l.TokenBudget.HighPriorityReserve)
	}
	if c := l.Classes; c != nil {
		fmt.Fprintf(&b, " classes {default %q", c.Default)
		for _, name := range slices.Sorted(maps.Keys(c.Limits)) {
			fmt.Fprintf(&b, " %s:%s", name, fmtClassLimits(c.Limits[name]))
		}
		b.WriteString("}")
	}
	return b.String() + "}"
}

func fmtDetail(d *bulkhead.RejectDetail) string {
	if d == nil {
		return "<nil>"
	}
	return d.String()
}

func fmtStats(st bulkhead.Stats) string { return st.String() }
