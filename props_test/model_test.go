package props_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// TestModel drives the public engine with random sequences of calls and
// checks it, after every step, against a model of the SPEC that predicts
// the whole of Stats, every outcome and every rejection's detail, and
// against the invariants of SPEC section I (I1-I6, I8-I11) read from
// Stats alone; at the end of each sequence, against every event it emitted
// (I2, I3, F30, F31).
//
// The configuration is drawn: gate limits, a queue timeout, a token budget
// or none, and in the "classes" variant an admission class table (SPEC
// F16-F20). The steps: Acquire and Run (the callback held until the test
// lets it go, with or without a borrowed-slot deadline), observe-mode Run
// (bypassed at once, after a queue timeout or a failed postcheck, or
// admitted; its bypassed callback reporting usage, trying to abandon, and
// finishing), Release (with
// usage, without, invalid, twice), AbandonBorrowedConcurrency, cancelling a
// waiter, moving the clock past queue timeouts and deadlines, ApplyLimits
// (valid, stale, invalid), SetBudget, WouldAdmit, invalid calls, Drain with
// an ended context, Close, and, with classes, a probe of the floors. In
// half the runs deduplication is on: Runs leading a key of their own,
// followers joining them (queued or running), cancelled or timed out on
// their own, and sharing the leader's outcome however it ends (I9).
// The queue policy is drawn too: fair queuing across classes (with random
// weights) and waiting for capacity, each in some of the runs (X3, X4). In
// a third of the runs a cool-down is in play: Feedback steps report 429s
// with a Retry-After, and the model predicts, while it lasts, every call
// shed with the time left and every queued call turned away at its grant
// (ShedCooldown), or held in the queue until the engine's hold timer fires
// at its end (HoldCooldown) (X2). In a third of the runs rate limits apply
// (P6, P7), in half of those paced: a call over the rate waits for its turn
// outside the queue (its queue timeout, drawn near the turns, bounding it),
// may be cancelled while it waits, and, with cool-downs, waits them out
// before its turn; a cool-down that begins over booked turns gives them
// back (the oracle gives them back to its own pacers the same way) and the
// calls take new turns after it in the order they came (HoldCooldown), or
// are turned away (ShedCooldown). Paced runs leave out observe mode and
// deduplication; on Redis they have no cool-downs (the calls a cool-down's
// end sends on book their turns on workers, in no set order). In a quarter
// of the runs on Redis a fleet pool is in play (SPEC X1, see
// model_fleet_test.go): other replicas take and release holds in it, Redis
// goes away for this replica (and the failure policy decides), loses the
// pool's state or rewinds it, and the pool relearns; the model predicts
// every fleet admission and refusal, with its detail, and Stats.Fleet.
//
// Everything that blocks runs on its own goroutine and is tracked as a
// waiter; every step waits until the outcomes it causes have arrived, so
// the model always knows the exact state. Time is a mock clock, moved only
// by the test.
func TestModel(t *testing.T) {
	for _, classes := range []bool{false, true} {
		name := "plain"
		if classes {
			name = "classes"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each variant has its own bulkheads and clocks
			seen := map[string]int{}
			defer func() { t.Logf("outcomes seen: %v", seen) }()
			rdb := rateRedis(t)
			fr := newFleetRedis(t, rdb)
			rapid.Check(t, func(t *rapid.T) {
				m := newMachine(t, classes, seen, rdb, fr)
				actions := m.actions()
				t.Repeat(actions)
				if classes {
					// Twice rapid's default number of steps: class
					// postchecks and deadlines need a few steps to set up.
					t.Repeat(actions)
				}
				m.finish(t)
			})
		})
	}
}

// actions is the machine's steps for t.Repeat, weighted as the two
// machines this one merges weighted theirs (TestEngineModel without
// classes, TestClassesModel with). rapid picks among the sorted keys with a
// bias towards the first ones: the order below is roughly the order of
// importance.
func (m *machine) actions() map[string]func(*rapid.T) {
	weighted := []struct {
		name           string
		plain, classes int
		f              func(*rapid.T)
	}{
		{"Acquire", 3, 3, m.acquire},
		{"Run", 2, 3, m.run},
		{"Observe", 2, 2, m.observeRun},
		{"Bypassed", 2, 2, m.bypassStep},
		{"Release", 4, 3, m.release},
		{"Advance", 2, 2, m.advance},
		{"Abandon", 1, 2, m.abandon},
		{"ApplyLimits", 2, 2, m.applyLimits},
		{"FloorProbe", 0, 1, m.floorProbe},
		{"SetBudget", 1, 1, m.setBudget},
		{"Cancel", 2, 1, m.cancel},
		{"WouldAdmit", 1, 1, m.wouldAdmit},
		{"Invalid", 1, 1, m.invalid},
		{"DrainDoneCtx", 1, 1, m.drainDoneCtx},
		{"Close", 1, 1, m.closeLate},
		{"DedupLead", 2, 2, m.dedupLead},
		{"DedupFollow", 5, 5, m.dedupFollow},
		{"DedupCancel", 2, 2, m.dedupCancel},
		{"Feedback", 2, 2, m.feedback},
		{"Turn", 3, 3, m.turnStep},
		{"RetryClock", 1, 1, m.retryClock},
		{"FleetOthers", 3, 3, m.fleet.othersStep},
		{"FleetOutage", 2, 2, m.fleet.outageStep},
		{"FleetLose", 1, 1, m.fleet.loseStep},
		{"FleetRewind", 1, 1, m.fleet.rewindStep},
		{"FleetTime", 1, 1, m.fleet.timeStep},
	}
	actions := map[string]func(*rapid.T){"": m.check}
	for _, a := range weighted {
		n := a.plain
		if m.hasClasses {
			n = a.classes
		}
		if !m.hasDedup && strings.HasPrefix(a.name, "Dedup") || m.fleet == nil && strings.HasPrefix(a.name, "Fleet") {
			n = 0
		}
		switch a.name {
		case "Feedback":
			if !m.cooling {
				n = 0
			} else if m.paced() {
				n *= 2 // cool-downs over booked turns
			}
		case "ApplyLimits", "SetBudget":
			if m.cooling {
				n = 0 // the limits stay pinned (see machine.cooling)
			}
		case "Observe", "Bypassed":
			if m.paced() {
				n = 0 // observe mode is left out of paced runs
			}
		case "Turn":
			if !m.paced() {
				n = 0
			}
		case "RetryClock":
			if m.retry.budgets == nil {
				n = 0
			}
		}
		for range n {
			actions[fmt.Sprintf("%02d %s", len(actions), a.name)] = func(t *rapid.T) {
				m.seen["action "+a.name]++
				a.f(t)
			}
		}
	}
	return actions
}

// unit is the granularity of queue timeouts.
const unit = 10 * time.Millisecond

// classModel is the model of one class: its usage and its counters (the
// counter fields of st; its gauges are computed in wantStats). Without
// classes the machine keeps one, under "", that Stats does not show.
type classModel struct {
	inFlight int   // slots, abandoned ones excluded
	tokens   int64 // held by unreleased admissions, abandoned ones included
	st       bulkhead.ClassStats
}

// waiter is one Acquire or Run call, on its own goroutine.
type waiter struct {
	id       int
	req      *bulkhead.Request
	run      *callback    // nil for Acquire
	ch       chan outcome // Acquire's result
	class    string
	prio     bulkhead.Priority
	res      bulkhead.Reservation // zero without a budget
	deadline time.Duration        // Run's borrowed-slot deadline, 0 for none
	// last is what Run returned, stored before it is sent on run.done.
	last     atomic.Pointer[runDone]
	timeout  time.Duration // its queue timeout, 0 for none
	observe  bool          // an observe-mode Run
	shadow   reasonSet     // its shadow reasons
	enqueued time.Time
	expires  time.Time // when its queue timeout fires; zero: none
	attempt  int       // its attempt number: above 0, a retry
	cancel   context.CancelFunc
	held     bool // held for a cool-down at least once
	// Pace mode: where it waits outside the queue (since parkedAt; until
	// turnAt, for its turn), whether it holds a turn, whether it counted
	// as paced, and what is left of its queue timeout (the engine takes
	// each wait off it; 0 for none).
	park      parkKind
	parkedAt  time.Time
	turnAt    time.Time
	turned    bool
	pacedOnce bool
	left      time.Duration
}

type outcome struct {
	tok *token
	err error
}

// hold is one admission the model knows of.
type hold struct {
	w          *waiter
	tok        *token // Acquire only
	id         bulkhead.ID
	class      string
	prio       bulkhead.Priority
	res        bulkhead.Reservation
	rev        int64
	resources  bulkhead.Resources
	deadlineAt time.Time // when the borrowed-slot deadline fires; zero: none
	released   bool
	abandoned  bool
	expired    bool // Run returned a *BorrowedDeadlineError
	fleet      fleetHold
}

func (h *hold) deadlineLive() bool {
	return !h.deadlineAt.IsZero() && !h.released && !h.abandoned
}

// expect is an outcome the model predicts for a waiter.
type expect struct {
	w      *waiter
	reason bulkhead.Reason // noReason: admitted as h
	h      *hold
	reject *rejectWant
	bypass *bypassRun // bypassed (after reject, for a race)
}

// rejectWant is what the model predicts of a rejection: its reject event
// (whose detail is the error's), with two tolerances for timeouts, which
// fire on timer goroutines: their queue wait is only known to be positive,
// and when several fire in one clock move the detail's Pending may count
// the others still queued.
type rejectWant struct {
	// follower marks a dedup follower's own end: no detail, no timing.
	follower     bool
	ev           bulkhead.RejectEvent
	waitUnknown  bool
	pendingSlack int
}

// matches reports whether d is the predicted detail.
func (r *rejectWant) matches(d *bulkhead.RejectDetail) bool {
	if d == nil {
		return false
	}
	got := *d
	if got.Pending > r.ev.Detail.Pending && got.Pending <= r.ev.Detail.Pending+r.pendingSlack {
		got.Pending = r.ev.Detail.Pending
	}
	if f, w := got.Fleet, r.ev.Detail.Fleet; f != nil && w != nil && f.Fallback != nil && w.Fallback != nil && errors.Is(f.Fallback, fleet.ErrUnavailable) {
		// The client's error, wrapped: its text is the client's.
		c := *f
		c.Fallback = w.Fallback
		got.Fleet = &c
	}
	return reflect.DeepEqual(got, *r.ev.Detail)
}

// call is a drawn call.
type call struct {
	req   *bulkhead.Request
	class string // resolved: the default class when no WithClass
	opts  []bulkhead.Option
	prio  bulkhead.Priority
	res   bulkhead.Reservation
	// resOpt is the call's WithReservation, nil for none: dedup
	// partitions by it.
	resOpt   bulkhead.Option
	deadline time.Duration
	timeout  time.Duration
	ctxDone  bool
	observe  bool
	shadow   reasonSet
	attempt  int
}

type machine struct {
	b          *bulkhead.Bulkhead
	fleet      *fleetModel // the fleet pool, nil for none
	clk        *countingClock
	hasBudget  bool
	hasClasses bool
	names      []string // sorted; nil without classes
	exactUsage bool     // every settlement reports usage <= its reservation
	cfgTimeout time.Duration
	maxTok     int64 // bound of drawn reservations

	// The model.
	limits   bulkhead.Limits // Classes.Default always filled in
	cls      map[string]*classModel
	closed   bool
	queue    []*waiter // in arrival order
	holds    []*hold   // every admission, released or not
	all      []*waiter // every waiter, for cleanup
	inFlight int       // gate slots
	tokens   int64
	gate     bulkhead.GateStats // counters only; gauges come from the model
	calls    bulkhead.CallStats // counters only
	ledger   struct {
		reserved, consumed, refunded int64
		releasedReserved             int64 // sum of holds at release
	}
	timers int64 // AfterFunc timers the engine must have registered
	nextID int

	// Observe mode: every bypassed call, and the statistics.
	bypassed []*bypassRun
	observe  bulkhead.ObserveStats

	// Deduplication, when hasDedup: the keys of the dedup steps' requests,
	// every leader with its followers, and the followers that joined.
	hasDedup    bool
	keys        dedupKeys
	groups      []*dedupGroup
	nextKey     int
	hits        int64
	dedupEvents []bulkhead.DedupEvent

	// The queue policy: fair queuing (with classes) serves the backlogged
	// class with the lowest virtual token counter (vtc; last is the counter
	// of the class served last); wait lets calls wait for capacity.
	fair, wait bool
	weights    map[string]int
	vtc        map[string]int64 // in millionths of a token
	last       int64

	// Cool-downs, when cooling: the bulkhead sheds the calls of a model
	// cooling down after a 429 (Feedback with a RetryAfter), with limits
	// pinned (Adaptive bounds equal to the starting limits, and no
	// ApplyLimits steps) so the controller never moves them; coolUntil is
	// when the cool-down ends and coolStarted counts the feedbacks.
	cooling     bool
	coolUntil   time.Time
	coolStarted int64
	// hold is HoldCooldown: a call that may wait is held in the queue; the
	// engine's hold timer is then due at holdAt (holdPending).
	hold        bool
	holdPending bool
	holdAt      time.Time
	coolHeld    int64 // calls held, each once

	// Rate limits, when rate is set: an oracle pacer on the same clock,
	// deciding what the bulkhead's rate limits must (SPEC P6). The queue is
	// kept at 0 with rates, so each check is made by the one call a step
	// makes, in a known order.
	rate      *rateOracle
	rateStats bulkhead.RateStats
	// parked is, in pace mode, the calls waiting outside the queue: for
	// their turns, or for a cool-down to end (in the order they came).
	parked []*waiter
	// toPacedTimer makes the step Advance to the next paced timer (Turn).
	toPacedTimer bool

	// retry is the retries: attempt numbers, the queue's aging and the
	// retry budgets (see model_retry_test.go). noPump marks a model pump
	// that checks the queue is settled where the engine serves no queue:
	// the engine's hold timer is not armed then (see armAging).
	retry  retryModel
	noPump bool

	// What the events must show.
	ev         *eventLog
	admitOrder []bulkhead.ID
	admitWait  map[bulkhead.ID]time.Duration
	rejects    map[*bulkhead.Request]*rejectWant
	releases   map[bulkhead.ID]bulkhead.ReleaseEvent
	abandons   map[bulkhead.ID]bulkhead.AbandonEvent
	reconfigs  []bulkhead.ReconfigureEvent

	// Per step.
	prev         bulkhead.Stats
	stepAdmits   []*hold // admissions of this step, in order
	stepApply    bool    // the limits may have changed
	stepEnqueued bool
	tokensFrozen bool // the step may not change any token counter (I4)
	// capacityFrozen says the step only bypassed or ran bypassed work: it
	// may change no counter but Observe's (I10).
	capacityFrozen bool
	descr          string // what the step did, for failures
	label          string // prefixes descr
	steps          int
	finished       bool

	// seen counts what the runs exercised, to show the test reaches the
	// interesting cases.
	seen map[string]int
}

func newMachine(t *rapid.T, classes bool, seen map[string]int, rdb *redis.Client, fr *fleetRedis) *machine {
	m := &machine{
		clk:        &countingClock{Mock: clock.NewMock()},
		hasClasses: classes,
		cls:        map[string]*classModel{},
		admitWait:  map[bulkhead.ID]time.Duration{},
		rejects:    map[*bulkhead.Request]*rejectWant{},
		releases:   map[bulkhead.ID]bulkhead.ReleaseEvent{},
		abandons:   map[bulkhead.ID]bulkhead.AbandonEvent{},
		ev:         &eventLog{},
		seen:       seen,
	}
	cfg := bulkhead.Config{
		Model:           "gpt-4o",
		MaxConcurrent:   rapid.IntRange(1, 4).Draw(t, "MaxConcurrent"),
		MaxQueue:        rapid.IntRange(0, 4).Draw(t, "MaxQueue"),
		QueueTimeout:    time.Duration(rapid.IntRange(0, 3).Draw(t, "QueueTimeoutUnits")) * unit,
		InitialRevision: int64(rapid.IntRange(0, 3).Draw(t, "InitialRevision")),
		Clock:           m.clk,
	}
	m.cfgTimeout = cfg.QueueTimeout
	m.limits = bulkhead.Limits{Revision: cfg.InitialRevision, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue}
	m.hasBudget = rapid.IntRange(0, 3).Draw(t, "budgetKind") > 0 // 3 in 4 runs have a budget
	budget := int64(-1)
	if m.hasBudget {
		budget = 0 // 1 in 8 runs: only zero-token calls fit (F7)
		if rapid.IntRange(0, 7).Draw(t, "zeroBudget") > 0 {
			budget = int64(rapid.IntRange(20, 200).Draw(t, "Budget"))
		}
		reserve := int64(0)
		switch rapid.IntRange(0, 2).Draw(t, "reserveKind") {
		case 1:
			reserve = int64(rapid.IntRange(0, int(budget/3)).Draw(t, "HighPriorityReserve"))
		case 2:
			reserve = int64(rapid.IntRange(0, int(budget)).Draw(t, "HighPriorityReserve"))
		}
		cfg.TokenBudget = &bulkhead.TokenBudget{Budget: budget, HighPriorityReserve: reserve}
		m.limits.TokenBudget = &bulkhead.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
		m.maxTok = budget/int64(rapid.SampledFrom([]int{4, 6, 8, 16}).Draw(t, "tokenScale")) + 3
	}
	if classes {
		m.names = []string{"batch", "bg", "fg"}[:rapid.IntRange(2, 3).Draw(t, "numClasses")]
		cfg.Classes = &bulkhead.Classes{
			Default: m.names[rapid.IntRange(0, len(m.names)-1).Draw(t, "Default")],
			Limits:  m.drawTable(t, cfg.MaxConcurrent, budget),
		}
		c := cfg.Classes.Clone()
		m.limits.Classes = &c
	}
	for _, name := range m.classNames() {
		m.cls[name] = &classModel{}
	}
	m.drawQueuePolicy(t, &cfg)
	// Cool-downs in a third of the runs, and in half the paced ones kept in
	// process; none in the paced runs on Redis, where the calls a
	// cool-down's end sends on book their turns on workers, in no set
	// order.
	if m.cooling = rapid.IntRange(0, 2).Draw(t, "cooldowns") == 0; m.cooling {
		m.hold = rapid.Bool().Draw(t, "holdCooldown")
	}
	if rapid.IntRange(0, 2).Draw(t, "rateLimits") == 0 {
		cfg.MaxQueue, m.limits.MaxQueue = 0, 0
		m.rate = newRateOracle(t, m.clk, m.hasBudget && budget > 0, rdb)
		cfg.RateLimits = m.rate.cfg
		switch {
		case m.paced() && m.rate.cfg.Store != nil:
			m.cooling = false
		case m.paced() && !m.cooling:
			if m.cooling = rapid.IntRange(0, 2).Draw(t, "pacedCooldowns") > 0; m.cooling {
				m.hold = rapid.Bool().Draw(t, "holdCooldown")
			}
		}
	}
	if m.cooling {
		mode := bulkhead.ShedCooldown
		if m.hold {
			mode = bulkhead.HoldCooldown
		}
		cfg.Adaptive = &bulkhead.Adaptive{Cooldown: mode, MinConcurrent: cfg.MaxConcurrent, MaxConcurrent: cfg.MaxConcurrent}
		m.seen[fmt.Sprintf("cool-down %v", mode)]++
	}
	if fr != nil && rapid.IntRange(0, 3).Draw(t, "fleet") == 0 {
		m.fleet = newFleetModel(t, m, &cfg, fr)
	}
	if m.rate != nil { // as the bulkhead has them: a tight fleet run does not pace
		m.seen[fmt.Sprintf("rates pace=%v redis=%v", m.rate.cfg.Pace, m.rate.cfg.Store != nil)]++
	}
	m.drawRetries(t, &cfg)
	m.exactUsage = rapid.Bool().Draw(t, "exactUsage")
	if m.hasDedup = !m.paced() && rapid.Bool().Draw(t, "dedup"); m.hasDedup {
		cfg.Dedup = &bulkhead.DedupConfig{KeyFunc: m.keys.keyFunc}
	}
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", fmtLimits(m.limits), err)
	}
	m.b = b
	b.Subscribe(m.ev.hooks())
	// On failure, end every waiter and the bulkhead so no goroutine leaks
	// past the failing check (goleak would otherwise hide the real error).
	t.Cleanup(m.cleanup)
	m.prev = normalize(b.Stats())
	return m
}

// drawQueuePolicy draws the queue policy: waiting for capacity in a third
// of the runs, fair queuing (with random weights) in half the runs with
// classes.
func (m *machine) drawQueuePolicy(t *rapid.T, cfg *bulkhead.Config) {
	m.wait = rapid.IntRange(0, 2).Draw(t, "waitForCapacity") == 0
	m.vtc = map[string]int64{}
	if m.hasClasses && rapid.Bool().Draw(t, "fair") {
		m.fair = true
		m.weights = map[string]int{}
		for _, name := range m.names {
			if w := rapid.IntRange(0, 3).Draw(t, "weight"); w > 0 {
				m.weights[name] = w
			}
		}
	}
	cfg.Queue = bulkhead.QueuePolicy{Fair: m.fair, Weights: m.weights, WaitForCapacity: m.wait}
	m.seen[fmt.Sprintf("policy fair=%v wait=%v", m.fair, m.wait)]++
}

// weight is class's weight in the fair queue.
func (m *machine) weight(class string) int64 {
	if w := m.weights[class]; w > 0 {
		return int64(w)
	}
	return 1
}

// waiting counts class's waiters.
func (m *machine) waiting(class string) int {
	n := 0
	for _, w := range m.queue {
		if w.class == class {
			n++
		}
	}
	return n
}

// ahead reports whether a new call of class and priority p, with attempt
// number attempt, waits behind waiters of its class: any, or with fair
// queuing, for a High priority call, the class's High priority waiters;
// but a first attempt goes ahead of the retries of its line that have not
// waited the aging.
func (m *machine) ahead(class string, p bulkhead.Priority, attempt int) bool {
	for _, w := range m.queue {
		switch {
		case w.class != class, m.fair && p == bulkhead.High && w.prio != bulkhead.High:
		case attempt == 0 && m.apart(w) && !(m.fair && p != bulkhead.High && w.prio == bulkhead.High):
		default:
			return true
		}
	}
	return false
}

// enqueue puts w at the end of the queue; with fair queuing a class that
// starts to wait is first lifted to the counter of the class served last.
func (m *machine) enqueue(w *waiter) {
	if m.fair && m.waiting(w.class) == 0 {
		m.vtc[w.class] = max(m.vtc[w.class], m.last)
	}
	m.queue = append(m.queue, w)
}

// globalBlock reports whether a waiter for capacity short of cons holds
// back the whole queue (a global limit) rather than its class alone.
func globalBlock(cons bulkhead.Constraint) bool {
	return cons == "" || cons == bulkhead.ConstraintGlobal
}

// queueOrder is the order in which the engine goes through the whole
// queue (Close, new limits): arrival order, or with fair queuing class by
// class, High priority first, each in arrival order.
func (m *machine) queueOrder() []*waiter {
	order := slices.Clone(m.queue)
	if m.fair {
		slices.SortStableFunc(order, func(a, b *waiter) int {
			if c := strings.Compare(a.class, b.class); c != 0 {
				return c
			}
			return cmpHighFirst(a.prio, b.prio)
		})
	}
	return order
}

// rejectUnfittable is the engine's sweep after new limits with waiting for
// capacity: every waiter that can never fit them is rejected.
func (m *machine) rejectUnfittable() []expect {
	if !m.wait {
		return nil
	}
	var out []expect
	for _, w := range m.queueOrder() {
		why, cons := m.capacity(w.class, w.prio, w.res.Reserved)
		if why == noReason || !m.neverFits(w.class, w.prio, w.res.Reserved) {
			continue
		}
		m.queue = slices.DeleteFunc(m.queue, func(x *waiter) bool { return x == w })
		m.seen["never fits after new limits"]++
		out = append(out, m.reject(w, why, cons, false))
	}
	return out
}

// nextWaiter is the index in the queue of the waiter the pump serves next,
// -1 for none: the first one of a class not blocked, or with fair queuing
// the first (High priority first) of the waiting class, not blocked, with
// the lowest counter (ties to the class first by name); either way, first
// attempts ahead of the retries that have not waited the aging.
func (m *machine) nextWaiter(blocked map[string]bool) int {
	if !m.fair {
		for _, w := range m.lineOrder(m.queue) {
			if !blocked[w.class] {
				return slices.Index(m.queue, w)
			}
		}
		return -1
	}
	best := ""
	for _, name := range m.names {
		if m.waiting(name) > 0 && !blocked[name] && (best == "" || m.vtc[name] < m.vtc[best]) {
			best = name
		}
	}
	if best == "" {
		return -1
	}
	var high, normal []*waiter
	for _, w := range m.queue {
		switch {
		case w.class != best:
		case w.prio == bulkhead.High:
			high = append(high, w)
		default:
			normal = append(normal, w)
		}
	}
	if len(high) == 0 {
		high = normal
	}
	return slices.Index(m.queue, m.lineOrder(high)[0])
}

// classNames is the keys of m.cls: the classes, or "" without any.
func (m *machine) classNames() []string {
	if !m.hasClasses {
		return []string{""}
	}
	return m.names
}

// drawTable draws a valid class table for maxConc slots and budget tokens
// (budget < 0: no token budget).
func (m *machine) drawTable(t *rapid.T, maxConc int, budget int64) map[string]bulkhead.ClassLimits {
	// Without floors calls can queue (with floors only after a shrink).
	noFloors := rapid.Bool().Draw(t, "noFloors")
	noTokFloors := rapid.IntRange(0, 2).Draw(t, "noTokenFloors") == 0
	remC, remT := maxConc, budget
	out := map[string]bulkhead.ClassLimits{}
	for _, name := range m.names {
		var l bulkhead.ClassLimits
		if !noFloors && remC > 0 {
			l.ProtectedConcurrent = rapid.IntRange(0, min(2, remC)).Draw(t, "floor")
			remC -= l.ProtectedConcurrent
		}
		if rapid.Bool().Draw(t, "hasCeiling") {
			l.MaxConcurrent = bulkhead.Ceiling(rapid.IntRange(l.ProtectedConcurrent, l.ProtectedConcurrent+3).Draw(t, "ceiling"))
		}
		if budget >= 0 {
			if !noTokFloors && remT > 0 {
				l.ProtectedInFlightTokens = rapid.Int64Range(0, min(remT, budget/2)).Draw(t, "tokenFloor")
				remT -= l.ProtectedInFlightTokens
			}
			if rapid.Bool().Draw(t, "hasTokenCeiling") {
				l.MaxInFlightTokens = bulkhead.Ceiling(rapid.Int64Range(l.ProtectedInFlightTokens, l.ProtectedInFlightTokens+budget).Draw(t, "tokenCeiling"))
			}
		}
		out[name] = l
	}
	return out
}

// cleanup ends whatever a failed run left behind; finish does the same,
// with checks, on success.
func (m *machine) cleanup() {
	if m.finished {
		return
	}
	for _, w := range m.all {
		w.cancel()
	}
	m.b.Close()
	for _, h := range m.holds {
		discard(h.tok)
	}
	for _, w := range m.all {
		if w.run != nil {
			w.run.stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	_, _ = m.b.Drain(ctx)
	for _, w := range m.all {
		if w.ch == nil {
			continue
		}
		select {
		case o := <-w.ch:
			discard(o.tok)
		default:
		}
	}
	_, _ = m.b.Drain(ctx)
}

// ---- The model's formulas (SPEC F3, F4, F7, F15, F17, F18, F21) ----

// lim is the limits in effect for class: its configured ceilings, and its
// floors shrunk in proportion while a runtime limit is below their sum
// (floor x limit / sum of floors, rounded down; token floors follow the
// whole budget).
func (m *machine) lim(class string) bulkhead.ClassLimits {
	if m.limits.Classes == nil {
		return bulkhead.ClassLimits{}
	}
	l := m.limits.Classes.Limits[class]
	var sc int
	var st int64
	for _, c := range m.limits.Classes.Limits {
		sc += c.ProtectedConcurrent
		st += c.ProtectedInFlightTokens
	}
	if limit := m.limits.MaxConcurrent; sc > limit {
		l.ProtectedConcurrent = l.ProtectedConcurrent * limit / sc
	}
	if m.hasBudget {
		if limit := m.limits.TokenBudget.Budget; st > limit {
			l.ProtectedInFlightTokens = l.ProtectedInFlightTokens * limit / st
		}
	}
	return l
}

func (m *machine) eff(p bulkhead.Priority) int64 {
	b := m.limits.TokenBudget
	if p == bulkhead.High {
		return b.Budget
	}
	return max(0, b.Budget-b.HighPriorityReserve)
}

// global is the constraint of a global limit: named only with classes.
func (m *machine) global() bulkhead.Constraint {
	if m.hasClasses {
		return bulkhead.ConstraintGlobal
	}
	return ""
}

// sumFloors is the sum of the concurrency floors and of the token floors.
func (m *machine) sumFloors() (int, int64) {
	var c int
	var tk int64
	for _, name := range m.names {
		l := m.lim(name)
		c += l.ProtectedConcurrent
		tk += l.ProtectedInFlightTokens
	}
	return c, tk
}

// protected is the sum over classes of min(class in flight, floor), and of
// min(class tokens, token floor).
func (m *machine) protected() (int, int64) {
	var c int
	var tk int64
	for _, name := range m.names {
		k, l := m.cls[name], m.lim(name)
		c += min(k.inFlight, l.ProtectedConcurrent)
		tk += min(k.tokens, l.ProtectedInFlightTokens)
	}
	return c, tk
}

// borrowedTokens is the part of reserved the class's unused token floor does
// not cover.
func (m *machine) borrowedTokens(class string, reserved int64) int64 {
	return max(0, reserved-max(0, m.lim(class).ProtectedInFlightTokens-m.cls[class].tokens))
}

// capacity runs the capacity checks in SPEC F17's order (the deciding
// call's own slot not counted) and returns the first failure.
func (m *machine) capacity(class string, p bulkhead.Priority, reserved int64) (bulkhead.Reason, bulkhead.Constraint) {
	if m.hasBudget && m.tokens+reserved > m.eff(p) {
		return bulkhead.BudgetLimit, m.global()
	}
	if !m.hasClasses {
		return noReason, ""
	}
	k, l := m.cls[class], m.lim(class)
	if m.hasBudget && l.MaxInFlightTokens != nil && k.tokens+reserved > *l.MaxInFlightTokens {
		return bulkhead.BudgetLimit, bulkhead.ConstraintClass
	}
	if l.MaxConcurrent != nil && k.inFlight >= *l.MaxConcurrent {
		return bulkhead.ConcurrencyLimit, bulkhead.ConstraintClass
	}
	sf, stf := m.sumFloors()
	pc, pt := m.protected()
	if sf > 0 && k.inFlight >= l.ProtectedConcurrent && max(0, m.inFlight-pc)+1 > max(0, m.limits.MaxConcurrent-sf) {
		return bulkhead.ConcurrencyLimit, bulkhead.ConstraintClassProtection
	}
	if m.hasBudget && stf > 0 {
		if b := m.borrowedTokens(class, reserved); b > 0 && max(0, m.tokens-pt)+b > max(0, m.eff(p)-stf) {
			return bulkhead.BudgetLimit, bulkhead.ConstraintClassProtection
		}
	}
	return noReason, ""
}

// detail is the RejectDetail the engine should report now (SPEC F21).
func (m *machine) detail(class string, p bulkhead.Priority, reserved int64, cons bulkhead.Constraint) bulkhead.RejectDetail {
	d := bulkhead.RejectDetail{
		LimitRevision: m.limits.Revision,
		Constraint:    cons,
		InFlight:      m.inFlight,
		MaxConcurrent: m.limits.MaxConcurrent,
		Pending:       len(m.queue),
		MaxQueue:      m.limits.MaxQueue,
	}
	if m.hasBudget {
		eff := m.eff(p)
		d.TokenBudget = &bulkhead.BudgetDetail{
			Budget:          m.limits.TokenBudget.Budget,
			InFlightTokens:  m.tokens,
			EffectiveBudget: eff,
			Available:       max(0, eff-m.tokens),
			Reserved:        reserved,
		}
	}
	if !m.hasClasses {
		return d
	}
	k, l := m.cls[class], m.lim(class)
	sf, stf := m.sumFloors()
	pc, pt := m.protected()
	capC, inUse := max(0, m.limits.MaxConcurrent-sf), max(0, m.inFlight-pc)
	sc := &bulkhead.SharedPool{MaxConcurrent: capC, InFlight: inUse, AvailableConcurrent: max(0, capC-inUse)}
	d.WouldBorrow.BorrowedConcurrency = k.inFlight >= l.ProtectedConcurrent
	cd := &bulkhead.ClassDetail{Name: class}
	cd.Limits = bulkhead.ClassLimits{ProtectedConcurrent: l.ProtectedConcurrent}
	cd.InFlight = k.inFlight
	cd.ProtectedConcurrentInUse = min(k.inFlight, l.ProtectedConcurrent)
	cd.BorrowedConcurrent = max(0, k.inFlight-l.ProtectedConcurrent)
	if l.MaxConcurrent != nil {
		cd.Limits.MaxConcurrent = bulkhead.Ceiling(*l.MaxConcurrent)
	}
	if m.hasBudget {
		tc, tu := max(0, m.eff(p)-stf), max(0, m.tokens-pt)
		sc.TokenBudget = &bulkhead.SharedBudget{Budget: tc, InFlightTokens: tu, Available: max(0, tc-tu)}
		d.WouldBorrow.BorrowedTokens = m.borrowedTokens(class, reserved)
		tf := l.ProtectedInFlightTokens
		cd.Limits.ProtectedInFlightTokens = tf
		cd.InFlightTokens = k.tokens
		cd.ProtectedTokensInUse = min(k.tokens, tf)
		cd.BorrowedInFlightTokens = max(0, k.tokens-tf)
		if l.MaxInFlightTokens != nil {
			cd.Limits.MaxInFlightTokens = bulkhead.Ceiling(*l.MaxInFlightTokens)
		}
	}
	d.Shared, d.Class = sc, cd
	return d
}

// detailFor is the detail of a decision for why: a budget or concurrency
// rejection tells whether the call can never fit these limits (its
// reservation above its whole effective budget or its class's token
// ceiling, or a class concurrency ceiling of 0).
func (m *machine) detailFor(class string, p bulkhead.Priority, reserved int64, cons bulkhead.Constraint, why bulkhead.Reason) bulkhead.RejectDetail {
	d := m.detail(class, p, reserved, cons)
	if why == bulkhead.BudgetLimit || why == bulkhead.ConcurrencyLimit {
		d.NeverFits = m.neverFits(class, p, reserved)
	}
	return d
}

// neverFits reports whether a call cannot be admitted under the current
// limits however long it waits.
func (m *machine) neverFits(class string, p bulkhead.Priority, reserved int64) bool {
	if m.hasBudget && reserved > m.eff(p) {
		return true
	}
	if !m.hasClasses {
		return false
	}
	l := m.lim(class)
	if (l.MaxConcurrent != nil && *l.MaxConcurrent == 0) || (m.hasBudget && l.MaxInFlightTokens != nil && reserved > *l.MaxInFlightTokens) {
		return true
	}
	// Through the shared pool: no floor and no shared slot, or more to
	// borrow (beyond the class's token floor) than the pool holds.
	sf, stf := m.sumFloors()
	if m.limits.MaxConcurrent > 0 && max(0, m.limits.MaxConcurrent-sf) == 0 && l.ProtectedConcurrent == 0 {
		return true
	}
	return m.hasBudget && reserved-l.ProtectedInFlightTokens > max(0, m.eff(p)-stf)
}

// decision is what the engine does with a new call.
type decision int

const (
	admitNow decision = iota
	queueUp
	rejectNow
	// queueHeld: held in the queue for the cool-down (HoldCooldown).
	queueHeld
	// queueCapacity: queued to wait for capacity; the engine queues it
	// without serving the queue.
	queueCapacity
)

// decide is the decision order of F3/F4, F17 and section D: closed, done
// context, capacity (budget and classes), free slot, gate. atGate tells a
// gate rejection from a capacity one.
func (m *machine) decide(c call) (d decision, why bulkhead.Reason, cons bulkhead.Constraint, atGate bool) {
	switch {
	case m.closed:
		return rejectNow, bulkhead.Shutdown, "", true
	case c.ctxDone:
		return rejectNow, bulkhead.Aborted, "", true
	case c.attempt > 0 && m.retryOver(c.class) != nil:
		return rejectNow, bulkhead.RetryBudget, "", false
	case m.coolingNow() && (!m.hold || m.late(c.timeout)):
		return rejectNow, bulkhead.Cooldown, "", false
	case m.coolingNow():
		// HoldCooldown: after the capacity checks, held in the queue when
		// it has room, else turned away.
		if why, _ := m.capacity(c.class, c.prio, c.res.Reserved); why != noReason {
			return m.decideEngine(c)
		}
		if m.limits.MaxConcurrent > 0 && m.limits.MaxQueue > 0 && len(m.queue) < m.limits.MaxQueue {
			return queueHeld, noReason, "", false
		}
		return rejectNow, bulkhead.Cooldown, "", false
	}
	return m.decideEngine(c)
}

// queueLeft is what is left of waiter w's queue timeout, 0 for no bound.
func (m *machine) queueLeft(w *waiter) time.Duration {
	if w.timeout <= 0 {
		return 0
	}
	return max(time.Nanosecond, w.timeout-m.clk.Now().Sub(w.enqueued))
}

// late reports whether the cool-down outlasts a call's queue timeout: it
// may not wait for it.
func (m *machine) late(timeout time.Duration) bool {
	return timeout > 0 && m.coolUntil.Sub(m.clk.Now()) >= timeout
}

// heldQueue reports whether a cool-down holds the queue back now: the
// engine's hold timer is due, or the next waiter would be held.
func (m *machine) heldQueue() bool {
	return m.hold && (m.holdPending || m.coolingNow())
}

// holdCall counts w held for the cool-down, once.
func (m *machine) holdCall(w *waiter) {
	if !w.held {
		w.held = true
		m.coolHeld++
	}
}

// armHold is the engine arming its hold timer for the end of the cool-down,
// unless it is due by then already: a new AfterFunc timer.
func (m *machine) armHold() { m.armHoldAt(m.coolUntil) }

// armHoldAt is the engine arming its hold timer for at, unless it is due
// by then already: a new AfterFunc timer.
func (m *machine) armHoldAt(at time.Time) {
	if !m.holdPending || at.Before(m.holdAt) {
		m.timers++
		m.holdAt, m.holdPending = at, true
	}
}

// coolingNow reports whether the model is cooling down.
func (m *machine) coolingNow() bool { return m.clk.Now().Before(m.coolUntil) }

// coolDetail is the detail of a Cooldown rejection now.
func (m *machine) coolDetail() *bulkhead.CooldownDetail {
	return &bulkhead.CooldownDetail{Model: "gpt-4o", Until: m.coolUntil, RetryAfter: m.coolUntil.Sub(m.clk.Now())}
}

// decideEngine is decide past the facade's checks: the engine's capacity
// and gate.
func (m *machine) decideEngine(c call) (d decision, why bulkhead.Reason, cons bulkhead.Constraint, atGate bool) {
	if m.closed {
		return rejectNow, bulkhead.Shutdown, "", true
	}
	gateFull := m.limits.MaxConcurrent == 0 || m.limits.MaxQueue == 0 || len(m.queue) >= m.limits.MaxQueue
	if why, cons := m.capacity(c.class, c.prio, c.res.Reserved); why != noReason {
		if m.wait && !gateFull && !m.neverFits(c.class, c.prio, c.res.Reserved) {
			return queueCapacity, noReason, "", false // waits for capacity
		}
		return rejectNow, why, cons, false
	}
	switch {
	case m.inFlight < m.limits.MaxConcurrent && !m.ahead(c.class, c.prio, c.attempt):
		return admitNow, noReason, "", false
	case m.limits.MaxConcurrent == 0 || m.limits.MaxQueue == 0:
		return rejectNow, bulkhead.ConcurrencyLimit, m.global(), true
	case len(m.queue) >= m.limits.MaxQueue:
		return rejectNow, bulkhead.QueueLimit, m.global(), true
	}
	return queueUp, noReason, "", false
}

// reject counts a rejection of w, already out of the queue: at the gate
// (atGate) or at the capacity checks, always per class. It returns the
// outcome to expect, with the detail of the state now.
func (m *machine) reject(w *waiter, why bulkhead.Reason, cons bulkhead.Constraint, atGate bool) expect {
	d := m.detailFor(w.class, w.prio, w.res.Reserved, cons, why)
	if why == bulkhead.Cooldown {
		d.Cooldown = m.coolDetail()
	}
	if why == bulkhead.RetryBudget {
		d.RetryBudget = m.retryOver(w.class)
		d.Constraint = m.retryConstraint(d.RetryBudget)
	}
	if atGate {
		m.gate.Rejected++
		inc(&m.gate.RejectedByReason, why)
		switch why {
		case bulkhead.Aborted:
			m.gate.Aborted++
		case bulkhead.Timeout:
			m.gate.TimedOut++
		}
	}
	m.calls.Rejected++
	inc(&m.calls.RejectedByReason, why)
	k := m.cls[w.class]
	k.st.Rejected++
	inc(&k.st.RejectedByReason, why)
	var reserved int64
	if d.TokenBudget != nil {
		reserved = d.TokenBudget.Reserved
	}
	r := &rejectWant{ev: bulkhead.RejectEvent{
		Admission: bulkhead.Admission{Request: w.req, Attempt: w.attempt, LimitRevision: m.limits.Revision, Priority: w.prio, Class: w.class, Reserved: reserved},
		Reason:    why, Detail: &d,
	}}
	if !w.enqueued.IsZero() {
		r.ev.QueueWait = m.clk.Now().Sub(w.enqueued)
	}
	r.waitUnknown = why == bulkhead.Timeout
	m.rejects[w.req] = r
	m.seen[fmt.Sprintf("reject %v/%v queued=%v", why, cons, !w.enqueued.IsZero())]++
	e := expect{w: w, reason: why, reject: r}
	if w.observe && !w.enqueued.IsZero() && w.shadow.has(why) {
		// Refused after it queued: rejected, then bypassed (a race).
		e.bypass = m.bypass(w, why, true, r)
	}
	return e
}

// admit records the admission of w, whose slot is granted now, and returns
// the expected hold.
func (m *machine) admit(w *waiter) *hold {
	k, l := m.cls[w.class], m.lim(w.class)
	r := w.res.Reserved
	var res bulkhead.Resources
	if m.hasClasses {
		res = bulkhead.Resources{BorrowedConcurrency: k.inFlight >= l.ProtectedConcurrent, BorrowedTokens: m.borrowedTokens(w.class, r)}
	}
	m.inFlight++
	m.calls.Admitted++
	k.inFlight++
	k.st.Admitted++
	m.countAdmission(w)
	if m.fair {
		m.vtc[w.class] += max(r, 1) * 1_000_000 / m.weight(w.class)
		m.last = m.vtc[w.class]
	}
	if m.hasBudget {
		m.tokens += r
		m.ledger.reserved += r
		k.tokens += r
		k.st.TotalReserved += r
	}
	if res.BorrowedConcurrency {
		k.st.TotalBorrowedAdmissions++
	}
	k.st.TotalBorrowedTokensReserved += res.BorrowedTokens
	h := &hold{w: w, class: w.class, prio: w.prio, res: w.res, rev: m.limits.Revision, resources: res}
	if w.run != nil && w.deadline > 0 && res.BorrowedConcurrency {
		h.deadlineAt = m.clk.Now().Add(w.deadline)
		m.timers++
	}
	m.stepAdmits = append(m.stepAdmits, h)
	kind := "acquire"
	if w.run != nil {
		kind = "run"
	}
	m.seen[fmt.Sprintf("admit %s borrowed=%v tokens=%v queued=%v", kind, res.BorrowedConcurrency, res.BorrowedTokens > 0, !w.enqueued.IsZero())]++
	return h
}

// grant is what follows the slot of w, granted now (and counted in the
// gate): the fleet pool's hold, then, when rates says so, the rate limits
// (in the engine, on the fleet's verdict). It returns w's admission, or
// the rejection that gives the slot back: a fleet refusal that observe
// mode shadows is bypassed after it (a race bypass, as after a queue).
func (m *machine) grant(w *waiter, rates bool) expect {
	var v fleetVerdict
	if m.fleet != nil {
		if v = m.fleet.reserve(w); v.why != noReason {
			m.gate.Released++
			e := m.reject(w, v.why, v.cons, false)
			d := e.reject.ev.Detail
			d.Fleet, d.NeverFits = v.detail, v.neverFits
			if w.observe && w.shadow.has(v.why) && e.bypass == nil {
				e.bypass = m.bypass(w, v.why, true, e.reject)
			}
			return e
		}
	}
	if rates {
		if rd := m.rate.check(m, w.res); rd != nil {
			// The slot goes back, and the fleet hold with it.
			m.gate.Released++
			e := m.reject(w, bulkhead.RateLimit, "", false)
			e.reject.ev.Detail.Rate = rd
			if m.fleet != nil {
				m.seen["fleet admitted, then the rates refused"]++
			}
			return e
		}
	}
	h := m.admit(w)
	if m.fleet != nil {
		m.fleet.admitted(h, v)
	}
	return expect{w: w, h: h}
}

// pump is F3's pump: queued waiters, in arrival order (or the fair
// queue's), while slots are free, each postchecked with its slot held (F4
// step 4). A waiter for capacity that does not fit stays and blocks its
// class for the rest of the pump, unless it can never fit: then it is
// rejected.
func (m *machine) pump() []expect {
	var out []expect
	defer func() {
		if !m.noPump {
			m.armAging()
		}
	}()
	blocked := map[string]bool{}
	free, reserves := m.limits.MaxConcurrent-m.inFlight, 0
	defer func() {
		if m.fleet != nil && m.fleet.tight && free > 1 && reserves > 1 {
			m.fleet.violation = fmt.Sprintf("%d fleet reserves at once, with %d slots free", reserves, free)
		}
	}()
	for m.inFlight < m.limits.MaxConcurrent {
		i := m.nextWaiter(blocked)
		if i < 0 {
			break
		}
		w := m.queue[i]
		m.noteOrder(i)
		if m.hold && m.coolingNow() && !m.late(m.queueLeft(w)) {
			m.holdCall(w)
			m.armHold()
			m.seen["waiter held for the cool-down"]++
			blocked[w.class] = true // held, and so is its class behind it
			continue
		}
		if m.wait {
			if why, cons := m.capacity(w.class, w.prio, w.res.Reserved); why != noReason {
				if !m.neverFits(w.class, w.prio, w.res.Reserved) {
					if globalBlock(cons) {
						break // holds back the whole queue
					}
					blocked[w.class] = true
					continue
				}
				m.queue = slices.Delete(m.queue, i, i+1)
				m.seen["never fits after waiting"]++
				out = append(out, m.reject(w, why, cons, false))
				continue
			}
		}
		m.queue = slices.Delete(m.queue, i, i+1)
		m.gate.Admitted++
		if why, cons := m.capacity(w.class, w.prio, w.res.Reserved); why != noReason {
			m.gate.Released++
			out = append(out, m.reject(w, why, cons, false))
			continue
		}
		if w.attempt > 0 && m.retryOver(w.class) != nil {
			// Checked again as it is granted its slot: the room it found
			// as it arrived may have been taken.
			m.gate.Released++
			out = append(out, m.reject(w, bulkhead.RetryBudget, "", false))
			continue
		}
		if m.coolingNow() {
			// Checked again as it is granted its slot: turned away, with
			// the time left, instead of being sent into another 429.
			m.gate.Released++
			m.seen["queued call cooled down at its grant"]++
			out = append(out, m.reject(w, bulkhead.Cooldown, "", false))
			continue
		}
		reserves++
		out = append(out, m.grant(w, false))
	}
	return out
}

// abandonModel gives h's slot back (F19), for cause.
func (m *machine) abandonModel(h *hold, cause bulkhead.AbandonCause) {
	h.abandoned = true
	k := m.cls[h.class]
	m.inFlight--
	m.gate.Released++
	k.inFlight--
	m.calls.Abandoned++
	inc(&m.calls.AbandonedByCause, cause)
	k.st.Abandoned++
	inc(&k.st.AbandonedByCause, cause)
	m.abandons[h.id] = bulkhead.AbandonEvent{Admission: h.admission(), Cause: cause, Held: h.res.Reserved}
	if m.fleet != nil {
		m.fleet.abandoned(h)
	}
	m.seen[fmt.Sprintf("abandon %v", cause)]++
}

// admission is the identity h's events carry.
func (h *hold) admission() bulkhead.Admission {
	return bulkhead.Admission{
		ID: h.id, Request: h.w.req, Attempt: h.w.attempt, Priority: h.prio, Class: h.class,
		LimitRevision: h.rev, Reserved: h.res.Reserved, Resources: h.resources,
	}
}

// settle releases h with final usage u (F5, F11).
func (m *machine) settle(h *hold, u *bulkhead.Usage) {
	h.released = true
	k := m.cls[h.class]
	if !h.abandoned {
		m.inFlight--
		m.gate.Released++
		k.inFlight--
	}
	m.calls.Released++
	k.st.Released++
	ev := bulkhead.ReleaseEvent{Admission: h.admission(), Held: h.res.Reserved}
	if u != nil {
		c := *u
		ev.Usage = &c
	}
	if m.hasBudget {
		held := h.res.Reserved
		if u != nil {
			total := u.Input + u.Output
			m.ledger.consumed += total
			k.st.TotalConsumed += total
			if total < held {
				ev.Refunded = held - total
				m.ledger.refunded += held - total
				k.st.TotalRefunded += held - total
			}
		}
		m.tokens -= held
		k.tokens -= held
		m.ledger.releasedReserved += held
	}
	m.releases[h.id] = ev
	if m.fleet != nil {
		m.fleet.released(h)
	}
	if u != nil {
		m.rate.settle(m, h.res, *u)
	}
}
