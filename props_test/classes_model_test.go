package props_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

// TestClassesModel drives a bulkhead with a random admission class table
// (SPEC F16-F20) through random sequences of Acquire, Run (with and without
// a borrowed-slot deadline, its callback held until the test lets it go),
// Release, AbandonBorrowedConcurrency, clock advances past deadlines,
// ApplyLimits with new class tables (valid, stale and invalid), SetBudget,
// WouldAdmit, cancellation, Drain and Close. After every step it compares the
// whole of Stats (classes included) with a model that applies the F17
// formulas, and checks the invariants I1, I2, I3 and I5 per class; at the
// end, the events (one admit and one release per admission, one abandon per
// effective abandon, rejections with their constraints).
//
// Everything that blocks runs on its own goroutine; every step waits for the
// outcomes it causes, so the model always knows the exact state. Time is a
// mock clock, moved only by the test; no queue timeouts are set, so the only
// timers are borrowed-slot deadlines.
func TestClassesModel(t *testing.T) {
	seen := map[string]int{}
	defer func() { t.Logf("outcomes seen: %v", seen) }()
	rapid.Check(t, func(t *rapid.T) {
		m := newCM(t)
		m.seen = seen
		// rapid picks among the sorted keys with a bias towards the first
		// ones: the order below is roughly the order of importance.
		weighted := []struct {
			name string
			n    int
			f    func(*rapid.T)
		}{
			{"Acquire", 3, m.acquire},
			{"Run", 3, m.run},
			{"Release", 3, m.release},
			{"Advance", 2, m.advance},
			{"Abandon", 2, m.abandon},
			{"ApplyLimits", 2, m.applyLimits},
			{"FloorProbe", 1, m.floorProbe},
			{"SetBudget", 1, m.setBudget},
			{"Cancel", 1, m.cancel},
			{"WouldAdmit", 1, m.wouldAdmit},
			{"Invalid", 1, m.invalid},
			{"DrainDoneCtx", 1, m.drainDoneCtx},
			{"Close", 1, m.closeLate},
		}
		actions := map[string]func(*rapid.T){}
		for _, a := range weighted {
			for range a.n {
				actions[fmt.Sprintf("%02d %s", len(actions), a.name)] = func(t *rapid.T) {
					seen["action "+a.name]++
					a.f(t)
				}
			}
		}
		actions[""] = m.check
		// Twice rapid's default number of steps: queued calls, postchecks
		// and deadlines need a few steps to set up.
		t.Repeat(actions)
		t.Repeat(actions)
		m.finish(t)
	})
}

// cmClass is the model of one class: its usage and its counters (the
// counter fields of st; its gauges are computed in wantStats).
type cmClass struct {
	inFlight int   // slots, abandoned ones excluded
	tokens   int64 // held by unreleased admissions, abandoned ones included
	st       bulkhead.ClassStats
}

// cmWaiter is one Acquire or Run call, on its own goroutine.
type cmWaiter struct {
	id       int
	req      *bulkhead.Request
	run      *cmRun       // nil for Acquire
	ch       chan outcome // Acquire's result
	class    string
	prio     bulkhead.Priority
	res      bulkhead.Reservation // zero without a budget
	deadline time.Duration        // Run's borrowed-slot deadline, 0 for none
	enqueued time.Time
	cancel   context.CancelFunc
}

// cmHold is one admission the model knows of.
type cmHold struct {
	w          *cmWaiter
	tok        *bulkhead.Permit // Acquire only
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
}

func (h *cmHold) deadlineLive() bool {
	return !h.deadlineAt.IsZero() && !h.released && !h.abandoned
}

// cmExpect is an outcome the model predicts for a waiter.
type cmExpect struct {
	w      *cmWaiter
	reason bulkhead.Reason // noReason: admitted as h
	detail bulkhead.RejectDetail
	h      *cmHold
}

// cmOutcome is what a waiter ended with.
type cmOutcome struct {
	tok   *bulkhead.Permit
	start *cmStart
	err   error
}

// cmCall is a drawn call.
type cmCall struct {
	class    string // resolved: the default class when no WithClass
	opts     []bulkhead.Option
	prio     bulkhead.Priority
	res      bulkhead.Reservation
	deadline time.Duration
	ctxDone  bool
}

type cmMachine struct {
	b         *bulkhead.Bulkhead
	clk       *cmClock
	hasBudget bool
	names     []string // sorted
	maxTok    int64

	// The model.
	limits   bulkhead.Limits // Classes.Default always filled in
	cls      map[string]*cmClass
	closed   bool
	queue    []*cmWaiter
	holds    []*cmHold
	all      []*cmWaiter // every waiter, for cleanup
	inFlight int         // gate slots
	tokens   int64
	gate     bulkhead.GateStats // counters only
	calls    bulkhead.CallStats // counters only
	ledger   struct{ reserved, consumed, refunded int64 }
	timers   int64 // deadline timers the engine must have registered
	nextID   int

	// What the events must show.
	ev         *cmEvents
	admitOrder []bulkhead.ID
	admitWait  map[bulkhead.ID]time.Duration
	rejects    map[cmRejectKey]int
	releases   map[bulkhead.ID]bulkhead.ReleaseEvent
	abandons   map[bulkhead.ID]bulkhead.AbandonEvent
	reconfigs  []bulkhead.ReconfigureEvent

	// Per step.
	prev         bulkhead.Stats
	stepAdmits   []*cmHold
	stepApply    bool
	tokensFrozen bool
	descr        string
	label        string // prefixes descr
	steps        int
	finished     bool

	seen map[string]int
}

func newCM(t *rapid.T) *cmMachine {
	m := &cmMachine{
		clk:       &cmClock{Mock: clock.NewMock()},
		cls:       map[string]*cmClass{},
		admitWait: map[bulkhead.ID]time.Duration{},
		rejects:   map[cmRejectKey]int{},
		releases:  map[bulkhead.ID]bulkhead.ReleaseEvent{},
		abandons:  map[bulkhead.ID]bulkhead.AbandonEvent{},
		ev:        &cmEvents{},
	}
	m.gate.RejectedByReason = map[bulkhead.Reason]int64{}
	m.calls.RejectedByReason = map[bulkhead.Reason]int64{}
	m.calls.AbandonedByCause = map[bulkhead.AbandonCause]int64{}
	all := []string{"batch", "bg", "fg"}
	m.names = all[:rapid.IntRange(2, 3).Draw(t, "numClasses")]
	cfg := bulkhead.Config{
		Model:           "gpt-4o",
		MaxConcurrent:   rapid.IntRange(2, 4).Draw(t, "MaxConcurrent"),
		MaxQueue:        max(0, rapid.IntRange(-1, 3).Draw(t, "MaxQueue")),
		InitialRevision: int64(rapid.IntRange(0, 2).Draw(t, "InitialRevision")),
		Clock:           m.clk,
	}
	m.limits = bulkhead.Limits{Revision: cfg.InitialRevision, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue}
	m.hasBudget = rapid.IntRange(0, 3).Draw(t, "budgetKind") > 0
	budget := int64(-1)
	if m.hasBudget {
		budget = int64(rapid.IntRange(20, 120).Draw(t, "Budget"))
		reserve := int64(0)
		if rapid.Bool().Draw(t, "withReserve") {
			reserve = int64(rapid.IntRange(0, int(budget/3)).Draw(t, "HighPriorityReserve"))
		}
		cfg.TokenBudget = &bulkhead.TokenBudget{Budget: budget, HighPriorityReserve: reserve}
		m.limits.TokenBudget = &bulkhead.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
		m.maxTok = budget/int64(rapid.SampledFrom([]int{4, 8, 16}).Draw(t, "tokenScale")) + 2
	}
	cfg.Classes = &bulkhead.Classes{
		Default: m.names[rapid.IntRange(0, len(m.names)-1).Draw(t, "Default")],
		Limits:  m.drawTable(t, cfg.MaxConcurrent, budget),
	}
	c := cfg.Classes.Clone()
	m.limits.Classes = &c
	for _, name := range m.names {
		m.cls[name] = &cmClass{}
	}
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", cmFmtLimits(m.limits), err)
	}
	m.b = b
	b.Subscribe(m.ev.hooks())
	t.Cleanup(m.cleanup)
	m.prev = cmNormalize(b.Stats())
	return m
}

// drawTable draws a valid class table for maxConc slots and budget tokens
// (budget < 0: no token budget).
func (m *cmMachine) drawTable(t *rapid.T, maxConc int, budget int64) map[string]bulkhead.ClassLimits {
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
func (m *cmMachine) cleanup() {
	if m.finished {
		return
	}
	for _, w := range m.all {
		w.cancel()
	}
	m.b.Close()
	for _, h := range m.holds {
		if h.tok != nil {
			_ = h.tok.Release(nil)
		}
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
			if o.tok != nil {
				_ = o.tok.Release(nil)
			}
		default:
		}
	}
	_, _ = m.b.Drain(ctx)
}

// ---- The model's formulas (SPEC F7, F15, F17, F18) ----

func (m *cmMachine) lim(class string) bulkhead.ClassLimits { return m.limits.Classes.Limits[class] }

func (m *cmMachine) eff(p bulkhead.Priority) int64 {
	b := m.limits.TokenBudget
	if p == bulkhead.High {
		return b.Budget
	}
	return max(0, b.Budget-b.HighPriorityReserve)
}

// sumFloors is the sum of the concurrency floors and of the token floors.
func (m *cmMachine) sumFloors() (int, int64) {
	var c int
	var tk int64
	for _, l := range m.limits.Classes.Limits {
		c += l.ProtectedConcurrent
		tk += l.ProtectedInFlightTokens
	}
	return c, tk
}

// protected is the sum over classes of min(class in flight, floor), and of
// min(class tokens, token floor).
func (m *cmMachine) protected() (int, int64) {
	var c int
	var tk int64
	for name, k := range m.cls {
		l := m.lim(name)
		c += min(k.inFlight, l.ProtectedConcurrent)
		tk += min(k.tokens, l.ProtectedInFlightTokens)
	}
	return c, tk
}

// borrowedTokens is the part of reserved the class's unused token floor does
// not cover.
func (m *cmMachine) borrowedTokens(class string, reserved int64) int64 {
	return max(0, reserved-max(0, m.lim(class).ProtectedInFlightTokens-m.cls[class].tokens))
}

// capacity runs the capacity checks in SPEC F17's order (the deciding
// call's own slot not counted) and returns the first failure.
func (m *cmMachine) capacity(class string, p bulkhead.Priority, reserved int64) (bulkhead.Reason, bulkhead.Constraint) {
	if m.hasBudget && m.tokens+reserved > m.eff(p) {
		return bulkhead.BudgetLimit, bulkhead.ConstraintGlobal
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
func (m *cmMachine) detail(class string, p bulkhead.Priority, reserved int64, cons bulkhead.Constraint) bulkhead.RejectDetail {
	d := bulkhead.RejectDetail{
		LimitRevision: m.limits.Revision,
		Constraint:    cons,
		InFlight:      m.inFlight,
		MaxConcurrent: m.limits.MaxConcurrent,
		Pending:       len(m.queue),
		MaxQueue:      m.limits.MaxQueue,
	}
	k, l := m.cls[class], m.lim(class)
	sf, stf := m.sumFloors()
	pc, pt := m.protected()
	capC, inUse := max(0, m.limits.MaxConcurrent-sf), max(0, m.inFlight-pc)
	sc := &bulkhead.SharedCapacityDetail{}
	sc.Concurrency.Capacity, sc.Concurrency.InUse, sc.Concurrency.Available = capC, inUse, max(0, capC-inUse)
	if k.inFlight >= l.ProtectedConcurrent {
		sc.Concurrency.RequestedBorrowed = 1
	}
	cd := &bulkhead.ClassDetail{
		ID:                           class,
		InFlight:                     k.inFlight,
		ProtectedConcurrent:          l.ProtectedConcurrent,
		ProtectedConcurrentInUse:     min(k.inFlight, l.ProtectedConcurrent),
		BorrowedConcurrent:           max(0, k.inFlight-l.ProtectedConcurrent),
		AvailableProtectedConcurrent: max(0, l.ProtectedConcurrent-k.inFlight),
	}
	if l.MaxConcurrent != nil {
		cd.MaxConcurrent = bulkhead.Ceiling(*l.MaxConcurrent)
		cd.AvailableConcurrent = bulkhead.Ceiling(max(0, *l.MaxConcurrent-k.inFlight))
	}
	if m.hasBudget {
		eff := m.eff(p)
		d.TokenBudget = &bulkhead.BudgetDetail{
			Budget:          m.limits.TokenBudget.Budget,
			InFlightTokens:  m.tokens,
			EffectiveBudget: eff,
			Available:       max(0, eff-m.tokens),
			Requested:       reserved,
		}
		tc, tu := max(0, eff-stf), max(0, m.tokens-pt)
		sc.TokenBudget = &admission.SharedBudgetDetail{Capacity: tc, InUse: tu, Available: max(0, tc-tu), RequestedBorrowed: m.borrowedTokens(class, reserved)}
		tf := l.ProtectedInFlightTokens
		cd.TokenBudget = &admission.ClassBudgetDetail{
			InFlightTokens:           k.tokens,
			ProtectedInFlightTokens:  tf,
			ProtectedTokensInUse:     min(k.tokens, tf),
			BorrowedInFlightTokens:   max(0, k.tokens-tf),
			AvailableProtectedTokens: max(0, tf-k.tokens),
			Requested:                reserved,
		}
		if l.MaxInFlightTokens != nil {
			cd.TokenBudget.MaxInFlightTokens = bulkhead.Ceiling(*l.MaxInFlightTokens)
			cd.TokenBudget.Available = bulkhead.Ceiling(max(0, *l.MaxInFlightTokens-k.tokens))
		}
	}
	d.SharedCapacity, d.Class = sc, cd
	return d
}

// cmDecision is what the engine does with a new call.
type cmDecision int

const (
	cmAdmit cmDecision = iota
	cmQueue
	cmReject
)

// decide is the decision order of F3/F4, F17 and section D: closed, done
// context, capacity (budget and classes), free slot, gate.
func (m *cmMachine) decide(c cmCall) (cmDecision, bulkhead.Reason, bulkhead.Constraint, bool) {
	switch {
	case m.closed:
		return cmReject, bulkhead.Shutdown, "", true
	case c.ctxDone:
		return cmReject, bulkhead.Aborted, "", true
	}
	if why, cons := m.capacity(c.class, c.prio, c.res.Reserved); why != noReason {
		return cmReject, why, cons, false
	}
	switch {
	case m.inFlight < m.limits.MaxConcurrent:
		return cmAdmit, noReason, "", false
	case m.limits.MaxConcurrent == 0 || m.limits.MaxQueue == 0:
		return cmReject, bulkhead.ConcurrencyLimit, bulkhead.ConstraintGlobal, true
	case len(m.queue) >= m.limits.MaxQueue:
		return cmReject, bulkhead.QueueLimit, bulkhead.ConstraintGlobal, true
	}
	return cmQueue, noReason, "", false
}

// reject counts a rejection of w: at the gate (atGate) or at the capacity
// checks, always per class.
func (m *cmMachine) reject(w *cmWaiter, why bulkhead.Reason, cons bulkhead.Constraint, atGate bool) {
	if atGate {
		m.gate.Rejected++
		m.gate.RejectedByReason[why]++
		if why == bulkhead.Aborted {
			m.gate.Aborted++
		}
	}
	m.calls.Rejected++
	m.calls.RejectedByReason[why]++
	k := m.cls[w.class]
	k.st.Rejected++
	if k.st.RejectedByReason == nil {
		k.st.RejectedByReason = map[bulkhead.Reason]int64{}
	}
	k.st.RejectedByReason[why]++
	m.rejects[cmRejectKey{why, cons, w.class, w.prio, m.limits.Revision}]++
	m.seen[fmt.Sprintf("reject %v/%v", why, cons)]++
}

// admit records the admission of w, whose slot is granted now, and returns
// the expected hold.
func (m *cmMachine) admit(w *cmWaiter) *cmHold {
	k, l := m.cls[w.class], m.lim(w.class)
	r := w.res.Reserved
	res := bulkhead.Resources{BorrowedConcurrency: k.inFlight >= l.ProtectedConcurrent, BorrowedTokens: m.borrowedTokens(w.class, r)}
	m.inFlight++
	m.calls.Admitted++
	k.inFlight++
	k.st.Admitted++
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
	h := &cmHold{w: w, class: w.class, prio: w.prio, res: w.res, rev: m.limits.Revision, resources: res}
	if w.run != nil && w.deadline > 0 && res.BorrowedConcurrency {
		h.deadlineAt = m.clk.Now().Add(w.deadline)
		m.timers++
	}
	m.stepAdmits = append(m.stepAdmits, h)
	kind := "acquire"
	if w.run != nil {
		kind = "run"
	}
	m.seen[fmt.Sprintf("admit %s borrowed=%v tokens=%v", kind, res.BorrowedConcurrency, res.BorrowedTokens > 0)]++
	return h
}

// pump is F3's pump: queued waiters, in arrival order, while slots are
// free, each postchecked with its slot held (F4 step 4).
func (m *cmMachine) pump() []cmExpect {
	var out []cmExpect
	for len(m.queue) > 0 && m.inFlight < m.limits.MaxConcurrent {
		w := m.queue[0]
		m.queue = m.queue[1:]
		m.gate.Admitted++
		if why, cons := m.capacity(w.class, w.prio, w.res.Reserved); why != noReason {
			m.gate.Released++
			m.seen["postcheck reject"]++
			d := m.detail(w.class, w.prio, w.res.Reserved, cons)
			m.reject(w, why, cons, false)
			out = append(out, cmExpect{w: w, reason: why, detail: d})
			continue
		}
		m.seen["queued then admitted"]++
		out = append(out, cmExpect{w: w, h: m.admit(w)})
	}
	return out
}

// abandonModel gives h's slot back (F19), for cause.
func (m *cmMachine) abandonModel(h *cmHold, cause bulkhead.AbandonCause) {
	h.abandoned = true
	k := m.cls[h.class]
	m.inFlight--
	m.gate.Released++
	k.inFlight--
	m.calls.Abandoned++
	m.calls.AbandonedByCause[cause]++
	k.st.Abandoned++
	if k.st.AbandonedByCause == nil {
		k.st.AbandonedByCause = map[bulkhead.AbandonCause]int64{}
	}
	k.st.AbandonedByCause[cause]++
	m.abandons[h.id] = bulkhead.AbandonEvent{
		Request: h.w.req, AdmissionID: h.id, LimitRevision: h.rev, Priority: h.prio, Class: h.class,
		Resources: h.resources, Cause: cause, HeldTokens: h.res.Reserved,
	}
	m.seen[fmt.Sprintf("abandon %v", cause)]++
}

// settle releases h with final usage u (F5, F11).
func (m *cmMachine) settle(h *cmHold, u *bulkhead.Usage) {
	h.released = true
	k := m.cls[h.class]
	if !h.abandoned {
		m.inFlight--
		m.gate.Released++
		k.inFlight--
	}
	m.calls.Released++
	k.st.Released++
	ev := bulkhead.ReleaseEvent{
		Request: h.w.req, AdmissionID: h.id, LimitRevision: h.rev, Priority: h.prio, Class: h.class,
		ReservedTokens: h.res.Reserved, Resources: h.resources, HeldTokens: h.res.Reserved,
	}
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
	}
	m.releases[h.id] = ev
}

// ---- Waiting for outcomes ----

// start launches c's call on its own goroutine.
func (m *cmMachine) start(c cmCall, run bool) *cmWaiter {
	m.nextID++
	w := &cmWaiter{
		id:       m.nextID,
		req:      &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hello"}}, MaxTokens: 10},
		class:    c.class,
		prio:     c.prio,
		res:      c.res,
		deadline: c.deadline,
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	if c.ctxDone {
		cancel()
	}
	m.all = append(m.all, w)
	if run {
		w.run = newCMRun()
		go func() {
			v, err := bulkhead.Run(ctx, m.b, w.req, w.run.fn, c.opts...)
			w.run.done <- cmDone{v, err}
		}()
	} else {
		w.ch = make(chan outcome, 1)
		go func() {
			tok, err := m.b.Acquire(ctx, w.req, c.opts...)
			w.ch <- outcome{tok, err}
		}()
	}
	return w
}

// receive waits for w's outcome.
func (m *cmMachine) receive(t *rapid.T, w *cmWaiter) cmOutcome {
	t.Helper()
	timeout := time.After(settle)
	if w.run == nil {
		select {
		case o := <-w.ch:
			return cmOutcome{tok: o.tok, err: o.err}
		case <-timeout:
		}
	} else {
		select {
		case s := <-w.run.started:
			return cmOutcome{start: &s}
		case d := <-w.run.done:
			if d.err == nil {
				t.Fatalf("waiter %d: Run returned %d without running its callback (%s)", w.id, d.v, m.descr)
			}
			return cmOutcome{err: d.err}
		case <-timeout:
		}
	}
	t.Fatalf("waiter %d: no outcome within %v (%s)", w.id, settle, m.descr)
	return cmOutcome{}
}

// poll returns w's outcome if it has one already.
func (m *cmMachine) poll(w *cmWaiter) (cmOutcome, bool) {
	if w.run == nil {
		select {
		case o := <-w.ch:
			return cmOutcome{tok: o.tok, err: o.err}, true
		default:
		}
		return cmOutcome{}, false
	}
	select {
	case s := <-w.run.started:
		return cmOutcome{start: &s}, true
	case d := <-w.run.done:
		return cmOutcome{err: d.err}, true
	default:
	}
	return cmOutcome{}, false
}

func (m *cmMachine) await(t *rapid.T, e cmExpect) {
	t.Helper()
	o := m.receive(t, e.w)
	if e.reason == noReason {
		if o.err != nil {
			t.Fatalf("waiter %d (class %s prio %v reserved %d): %v, want admission (%s)\ndetail %s", e.w.id, e.w.class,
				e.w.prio, e.w.res.Reserved, o.err, m.descr, cmFmtDetail(cmDetailOf(o.err)))
		}
		m.adopt(t, e.h, o)
		return
	}
	if o.err == nil {
		if e.w.run != nil {
			e.w.run.stop()
		} else {
			_ = o.tok.Release(nil)
		}
		t.Fatalf("waiter %d (class %s prio %v reserved %d) was admitted, want %v (%s)\nmodel detail %s", e.w.id, e.w.class,
			e.w.prio, e.w.res.Reserved, e.reason, m.descr, cmFmtDetail(&e.detail))
	}
	rej := wantReason(t, o.err, e.reason)
	if rej.Detail == nil || !reflect.DeepEqual(*rej.Detail, e.detail) {
		t.Fatalf("waiter %d (class %s prio %v reserved %d) rejected %v (%s) with detail\n got %s\nwant %s", e.w.id, e.w.class,
			e.w.prio, e.w.res.Reserved, e.reason, m.descr, cmFmtDetail(rej.Detail), cmFmtDetail(&e.detail))
	}
	if e.reason == bulkhead.Aborted && !errors.Is(o.err, context.Canceled) {
		t.Fatalf("waiter %d: aborted error %v does not match context.Canceled", e.w.id, o.err)
	}
}

func cmDetailOf(err error) *bulkhead.RejectDetail {
	var rej *bulkhead.RejectedError
	if errors.As(err, &rej) {
		return rej.Detail
	}
	return nil
}

// adopt checks an admission's token or run context against the model's
// hold and records it.
func (m *cmMachine) adopt(t *rapid.T, h *cmHold, o cmOutcome) {
	t.Helper()
	var (
		id        bulkhead.ID
		rev       int64
		prio      bulkhead.Priority
		class     string
		res       *bulkhead.Reservation
		resources bulkhead.Resources
	)
	if h.w.run == nil {
		h.tok = o.tok
		id, rev, prio, class, res, resources = o.tok.ID(), o.tok.LimitRevision(), o.tok.Priority(), o.tok.Class(), o.tok.Reservation(), o.tok.Resources()
	} else {
		s := o.start
		id, rev, prio, class, res, resources = s.id, s.rev, s.prio, s.class, s.res, s.resources
		if s.admission != bulkhead.Admitted || s.ctxErr != nil {
			t.Fatalf("waiter %d: callback started with admission %v, ctx error %v", h.w.id, s.admission, s.ctxErr)
		}
	}
	h.id = id
	if rev != h.rev || prio != h.prio || class != h.class || resources != h.resources {
		t.Fatalf("waiter %d admitted with revision %d priority %v class %q resources %+v; want %d %v %q %+v (F18, F25) (%s)",
			h.w.id, rev, prio, class, resources, h.rev, h.prio, h.class, h.resources, m.descr)
	}
	if m.hasBudget != (res != nil) || (res != nil && *res != h.res) {
		t.Fatalf("waiter %d: reservation %+v, want %+v (budget %v)", h.w.id, res, h.res, m.hasBudget)
	}
	if id == (bulkhead.ID{}) {
		t.Fatal("zero admission ID")
	}
	if _, dup := m.admitWait[id]; dup {
		t.Fatalf("admission ID %s minted twice", id)
	}
	m.holds = append(m.holds, h)
	m.admitOrder = append(m.admitOrder, id)
	wait := time.Duration(0)
	if !h.w.enqueued.IsZero() {
		wait = m.clk.Now().Sub(h.w.enqueued)
	}
	m.admitWait[id] = wait
}

// awaitAll waits for every predicted outcome, then checks that nothing else
// has ended.
func (m *cmMachine) awaitAll(t *rapid.T, es []cmExpect) {
	t.Helper()
	for _, e := range es {
		m.await(t, e)
	}
	m.noStray(t)
}

// noStray checks that no queued waiter has an outcome and that no running
// callback's Run has returned.
func (m *cmMachine) noStray(t *rapid.T) {
	t.Helper()
	for _, w := range m.queue {
		if o, ok := m.poll(w); ok {
			if o.tok != nil {
				_ = o.tok.Release(nil)
			}
			t.Fatalf("waiter %d ended (admitted %v, err %v) while the model has it queued (%s)", w.id, o.err == nil, o.err, m.descr)
		}
	}
	for _, h := range m.holds {
		if h.w.run == nil || h.released || h.expired {
			continue
		}
		select {
		case d := <-h.w.run.done:
			t.Fatalf("Run of %s (class %s, resources %+v, deadline %v) returned %d, %v while its callback runs (%s)",
				h.id, h.class, h.resources, h.w.deadline, d.v, d.err, m.descr)
		default:
		}
	}
}

// waitQueued waits until the engine's queue holds n waiters, failing if w
// ends instead.
func (m *cmMachine) waitQueued(t *rapid.T, w *cmWaiter, n int) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for m.b.Stats().Gate.Pending != n {
		if o, ok := m.poll(w); ok {
			t.Fatalf("waiter %d ended (admitted %v, err %v), want it queued (%s)", w.id, o.err == nil, o.err, m.descr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter %d never reached the queue (%s)", w.id, m.descr)
		}
		runtime.Gosched()
	}
}

// waitTimers waits until the class actors have registered every deadline
// timer the model expects, so that moving the clock fires exactly those.
func (m *cmMachine) waitTimers(t *rapid.T) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		n := m.clk.registered.Load()
		if n == m.timers {
			return
		}
		if n > m.timers || time.Now().After(deadline) {
			t.Fatalf("%d deadline timers registered, want %d (%s)", n, m.timers, m.descr)
		}
		runtime.Gosched()
	}
}

// ---- Actions ----

func (m *cmMachine) drawCall(t *rapid.T, run bool) cmCall {
	var c cmCall
	if i := rapid.IntRange(0, len(m.names)).Draw(t, "class"); i < len(m.names) {
		c.class = m.names[i]
		c.opts = append(c.opts, bulkhead.WithClass(c.class))
	} else {
		c.class = m.limits.Classes.Default
	}
	if rapid.Bool().Draw(t, "high") {
		c.prio = bulkhead.High
		c.opts = append(c.opts, bulkhead.WithPriority(bulkhead.High))
	}
	if m.hasBudget {
		in := rapid.Int64Range(0, m.maxTok).Draw(t, "Input")
		out := rapid.Int64Range(0, m.maxTok).Draw(t, "MaxOutput")
		o := bulkhead.Reservation{Input: in, MaxOutput: out}
		if rapid.Bool().Draw(t, "withReserved") {
			o.Reserved = in + out
		}
		c.opts = append(c.opts, bulkhead.WithReservation(o))
		c.res = bulkhead.Reservation{Input: in, MaxOutput: out, Reserved: in + out}
	} else if rapid.Bool().Draw(t, "ignoredOverride") {
		// Without a budget an override is ignored (F10).
		c.opts = append(c.opts, bulkhead.WithReservation(bulkhead.Reservation{Input: 3, MaxOutput: 4}))
	}
	if run && rapid.IntRange(0, 3).Draw(t, "deadlineKind") > 0 {
		c.deadline = time.Duration(rapid.IntRange(1, 40).Draw(t, "deadlineMs")) * time.Millisecond
		c.opts = append(c.opts, bulkhead.WithBorrowedDeadline(c.deadline))
	}
	c.ctxDone = rapid.IntRange(0, 14).Draw(t, "ctxDone") == 0
	return c
}

func (m *cmMachine) acquire(t *rapid.T) { m.call(t, m.drawCall(t, false), false) }

func (m *cmMachine) run(t *rapid.T) { m.call(t, m.drawCall(t, true), true) }

// call makes c, as an Acquire or a Run, and returns its hold when the model
// says it is admitted at once.
func (m *cmMachine) call(t *rapid.T, c cmCall, run bool) *cmHold {
	kind := "Acquire"
	if run {
		kind = "Run"
	}
	w := m.start(c, run)
	m.descr = fmt.Sprintf("%s%s #%d class=%s prio=%v reserved=%d deadline=%v ctxDone=%v", m.label, kind, w.id, c.class, c.prio,
		c.res.Reserved, c.deadline, c.ctxDone)
	switch d, why, cons, atGate := m.decide(c); d {
	case cmAdmit:
		m.gate.Admitted++
		h := m.admit(w)
		m.awaitAll(t, []cmExpect{{w: w, h: h}})
		return h
	case cmReject:
		m.tokensFrozen = true
		det := m.detail(c.class, c.prio, c.res.Reserved, cons)
		m.reject(w, why, cons, atGate)
		m.awaitAll(t, []cmExpect{{w: w, reason: why, detail: det}})
	default:
		m.seen["queued"]++
		m.tokensFrozen = true
		w.enqueued = m.clk.Now()
		m.queue = append(m.queue, w)
		m.waitQueued(t, w, len(m.queue))
		m.noStray(t)
	}
	return nil
}

// floorProbe checks the floor guarantee of F17 directly: in steady state (no
// value above its limit, so no shrink still being absorbed), a call of a
// class below its concurrency floor, asking only for tokens its unused token
// floor covers, at high priority, is admitted and borrows nothing, whatever
// the other classes hold. The steady state is read from Stats, not from the
// model.
func (m *cmMachine) floorProbe(t *rapid.T) {
	if m.closed {
		t.Skip("closed")
	}
	st := m.b.Stats()
	cs := st.Classes
	var cands []string
	for _, name := range m.names {
		if c := cs.Classes[name]; c.InFlight < c.Limits.ProtectedConcurrent {
			cands = append(cands, name)
		}
	}
	if len(cands) == 0 {
		t.Skip("no class below its floor")
	}
	name := cands[rapid.IntRange(0, len(cands)-1).Draw(t, "probeClass")]
	c := cs.Classes[name]
	steady := cs.Shared.InFlight <= cs.Shared.MaxConcurrent
	if tb := st.TokenBudget; tb != nil {
		steady = steady && tb.InFlightTokens <= tb.Budget && cs.Shared.TokenBudget.InFlightTokens <= cs.Shared.TokenBudget.Budget &&
			(c.Limits.MaxInFlightTokens == nil || c.InFlightTokens <= *c.Limits.MaxInFlightTokens)
	}
	if !steady {
		m.seen["probe skipped: not steady"]++
		t.Skip("not in steady state")
	}
	call := cmCall{class: name, prio: bulkhead.High, opts: []bulkhead.Option{bulkhead.WithClass(name), bulkhead.WithPriority(bulkhead.High)}}
	if m.hasBudget {
		r := rapid.Int64Range(0, max(0, c.Limits.ProtectedInFlightTokens-c.InFlightTokens)).Draw(t, "probeTokens")
		call.res = bulkhead.Reservation{Input: r, Reserved: r}
		call.opts = append(call.opts, bulkhead.WithReservation(bulkhead.Reservation{Input: r}))
	}
	if d, why, cons, _ := m.decide(call); d != cmAdmit {
		t.Fatalf("FloorProbe: the model rejects (%v %v %v) a call of class %s below its floor in steady state\n%s",
			d, why, cons, name, cmFmtStats(st))
	}
	m.seen["floor probe"]++
	m.label = "FloorProbe: "
	h := m.call(t, call, false)
	m.label = ""
	if h.resources != (bulkhead.Resources{}) {
		t.Fatalf("FloorProbe: a call within its class's floors borrowed %+v", h.resources)
	}
}

func (m *cmMachine) drawUsage(t *rapid.T, h *cmHold) *bulkhead.Usage {
	if rapid.IntRange(0, 2).Draw(t, "withUsage") == 0 {
		return nil
	}
	return &bulkhead.Usage{
		Input:  rapid.Int64Range(0, h.res.Reserved+5).Draw(t, "usageInput"),
		Output: rapid.Int64Range(0, h.res.Reserved+5).Draw(t, "usageOutput"),
	}
}

func (m *cmMachine) release(t *rapid.T) {
	var live, dead []*cmHold
	for _, h := range m.holds {
		switch {
		case !h.released:
			live = append(live, h)
		case h.tok != nil:
			dead = append(dead, h)
		}
	}
	pool := live
	if len(dead) > 0 && (len(live) == 0 || rapid.IntRange(0, 4).Draw(t, "double") == 0) {
		pool = dead
	}
	if len(pool) == 0 {
		t.Skip("nothing to release")
	}
	h := pool[rapid.IntRange(0, len(pool)-1).Draw(t, "hold")]
	if h.tok == nil {
		fail := rapid.IntRange(0, 3).Draw(t, "fail") == 0
		m.finishRun(t, h, fail, m.drawUsage(t, h))
		return
	}
	usage := m.drawUsage(t, h)
	invalid := false
	if rapid.IntRange(0, 5).Draw(t, "invalidUsage") == 0 {
		invalid = true
		usage = &bulkhead.Usage{Input: -1, Output: 2}
	}
	m.descr = fmt.Sprintf("Release %s (class %s released=%v abandoned=%v) usage=%+v", h.id, h.class, h.released, h.abandoned, usage)
	err := h.tok.Release(usage)
	if h.released {
		// I2, F5: a later Release is a no-op that returns nil.
		m.gate.DoubleReleases++
		m.tokensFrozen = true
		if err != nil {
			t.Fatalf("%s: double release returned %v", m.descr, err)
		}
		return
	}
	if invalid != (err != nil) || (invalid && !errors.Is(err, bulkhead.ErrInvalid)) {
		t.Fatalf("%s: Release returned %v (invalid usage: %v)", m.descr, err, invalid)
	}
	if invalid {
		usage = nil // invalid usage still releases, without the usage
	}
	m.seen[fmt.Sprintf("release abandoned=%v", h.abandoned)]++
	m.settle(h, usage)
	m.awaitAll(t, m.pump())
}

// finishRun lets h's callback return: failing, or with usage set.
func (m *cmMachine) finishRun(t *rapid.T, h *cmHold, fail bool, usage *bulkhead.Usage) {
	m.descr = fmt.Sprintf("Finish Run %s (class %s resources %+v deadline %v abandoned=%v expired=%v) fail=%v usage=%+v",
		h.id, h.class, h.resources, h.w.deadline, h.abandoned, h.expired, fail, usage)
	rep := m.command(t, h, cmCmd{usage: usage, fail: fail})
	if rep.setErr != nil {
		t.Fatalf("%s: SetUsage: %v", m.descr, rep.setErr)
	}
	if h.expired {
		// F20: the callback's context is cancelled with the deadline error
		// as its cause.
		var de *bulkhead.BorrowedDeadlineError
		if !errors.As(rep.cause, &de) || de.AdmissionID != h.id || de.Deadline != h.w.deadline {
			t.Fatalf("%s: the callback's context cause is %v, want the deadline error", m.descr, rep.cause)
		}
	} else if rep.cause != nil {
		t.Fatalf("%s: the callback's context ended (%v) though its deadline did not expire", m.descr, rep.cause)
	}
	if fail {
		usage = nil // a failed callback settles without SetUsage's usage (F6)
	}
	m.seen[fmt.Sprintf("finish run expired=%v abandoned=%v", h.expired, h.abandoned)]++
	m.settle(h, usage)
	es := m.pump()
	if !h.expired {
		select {
		case d := <-h.w.run.done:
			if fail && (d.v != 0 || !errors.Is(d.err, errCMCallback)) || !fail && (d.v != 42 || d.err != nil) {
				t.Fatalf("%s: Run returned %d, %v", m.descr, d.v, d.err)
			}
		case <-time.After(settle):
			t.Fatalf("%s: Run did not return", m.descr)
		}
	} else {
		// Run returned at the deadline; the late callback's settlement still
		// releases the admission (its tokens) when it returns.
		deadline := time.Now().Add(settle)
		for m.b.Stats().Calls.Released != m.calls.Released {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the late callback's release never arrived", m.descr)
			}
			runtime.Gosched()
		}
		select {
		case d := <-h.w.run.done:
			t.Fatalf("%s: Run returned a second time: %d, %v", m.descr, d.v, d.err)
		default:
		}
	}
	m.awaitAll(t, es)
}

// command sends cmd to h's running callback and waits for its reply.
func (m *cmMachine) command(t *rapid.T, h *cmHold, cmd cmCmd) cmReply {
	t.Helper()
	cmd.reply = make(chan cmReply, 1)
	select {
	case h.w.run.cmds <- cmd:
	case <-time.After(settle):
		t.Fatalf("%s: the callback does not take commands", m.descr)
	}
	select {
	case rep := <-cmd.reply:
		return rep
	case <-time.After(settle):
		t.Fatalf("%s: the callback did not reply", m.descr)
	}
	return cmReply{}
}

// abandon calls AbandonBorrowedConcurrency on a token (released or not,
// borrowed or not) or from a running callback: it is effective at most once,
// and only for a borrowed, unreleased admission (F19).
func (m *cmMachine) abandon(t *rapid.T) {
	// Mostly an admission that can abandon; else any token or running
	// callback, where abandoning must do nothing.
	var pool, effective []*cmHold
	for _, h := range m.holds {
		if h.tok != nil || !h.released {
			pool = append(pool, h)
		}
		if !h.released && !h.abandoned && h.resources.BorrowedConcurrency {
			effective = append(effective, h)
		}
	}
	if len(effective) > 0 && rapid.IntRange(0, 3).Draw(t, "effectiveAbandon") > 0 {
		pool = effective
	}
	if len(pool) == 0 {
		t.Skip("no admission")
	}
	h := pool[rapid.IntRange(0, len(pool)-1).Draw(t, "hold")]
	want := !h.released && !h.abandoned && h.resources.BorrowedConcurrency
	m.descr = fmt.Sprintf("Abandon %s (class %s resources %+v released=%v abandoned=%v run=%v)", h.id, h.class, h.resources,
		h.released, h.abandoned, h.tok == nil)
	var got bool
	if h.tok != nil {
		got = h.tok.AbandonBorrowedConcurrency()
	} else {
		got = m.command(t, h, cmCmd{abandon: true}).abandoned
	}
	if got != want {
		t.Fatalf("%s = %v, want %v (F19)", m.descr, got, want)
	}
	m.seen[fmt.Sprintf("abandon effective=%v", got)]++
	if !got {
		m.tokensFrozen = true
		return
	}
	m.abandonModel(h, bulkhead.AbandonManual)
	m.awaitAll(t, m.pump())
}

// advance moves the clock (F20). With waiters queued it stops short of
// the next borrowed-slot deadline or exactly on it, one deadline at a time:
// a deadline's abandon admits waiters, whose own deadlines start from the
// clock's reading then, and several deadlines expiring at once abandon in
// an order the engine does not fix. With nobody queued an abandon admits
// nobody, so the clock may jump past any number of deadlines.
func (m *cmMachine) advance(t *rapid.T) {
	now := m.clk.Now()
	var next, last time.Time
	for _, h := range m.holds {
		if !h.deadlineLive() {
			continue
		}
		if next.IsZero() || h.deadlineAt.Before(next) {
			next = h.deadlineAt
		}
		if h.deadlineAt.After(last) {
			last = h.deadlineAt
		}
	}
	queued := len(m.queue)
	ms := func(d time.Duration) int { return int(d / time.Millisecond) }
	var d time.Duration
	switch {
	case next.IsZero():
		d = time.Duration(rapid.IntRange(1, 30).Draw(t, "advanceMs")) * time.Millisecond
	case queued == 0 && rapid.IntRange(0, 2).Draw(t, "expire") > 0:
		d = time.Duration(rapid.IntRange(ms(next.Sub(now)), ms(last.Sub(now))+10).Draw(t, "pastMs")) * time.Millisecond
	case queued == 0:
		d = time.Duration(rapid.IntRange(1, ms(last.Sub(now))+10).Draw(t, "advanceMs")) * time.Millisecond
	case next.Sub(now) >= 2*time.Millisecond && rapid.IntRange(0, 2).Draw(t, "expire") == 0:
		d = time.Duration(rapid.IntRange(1, int(next.Sub(now)/time.Millisecond)-1).Draw(t, "shortMs")) * time.Millisecond
	default:
		d = next.Sub(now)
	}
	if !next.IsZero() && !next.After(now) {
		t.Fatalf("a live deadline at %v is not after now %v", next, now)
	}
	target := now.Add(d)
	var due []*cmHold
	for _, h := range m.holds {
		if h.deadlineLive() && !h.deadlineAt.After(target) {
			due = append(due, h)
		}
	}
	if len(due) > 1 && queued > 0 {
		t.Skip("simultaneous deadlines with waiters queued")
	}
	m.descr = fmt.Sprintf("Advance %v past %d deadline(s), %d queued", d, len(due), queued)
	m.waitTimers(t)
	if len(due) == 0 {
		m.tokensFrozen = true
	}
	m.clk.Add(d)
	for _, h := range due {
		h.expired = true
		m.abandonModel(h, bulkhead.AbandonDeadline)
	}
	es := m.pump()
	m.seen[fmt.Sprintf("advance past %d deadlines, %d queued", min(len(due), 2), min(queued, 1))]++
	for _, h := range due {
		var d cmDone
		select {
		case d = <-h.w.run.done:
		case <-time.After(settle):
			t.Fatalf("%s: Run of %s (deadline at %v) did not return", m.descr, h.id, h.deadlineAt)
		}
		var de *bulkhead.BorrowedDeadlineError
		if d.v != 0 || !errors.As(d.err, &de) || !errors.Is(d.err, bulkhead.ErrBorrowedDeadline) || errors.Is(d.err, bulkhead.ErrRejected) ||
			de.Deadline != h.w.deadline || de.AdmissionID != h.id || de.Resources != h.resources || de.Class != h.class {
			t.Fatalf("%s: Run of %s returned %d, %v; want its *BorrowedDeadlineError (F20, F22)", m.descr, h.id, d.v, d.err)
		}
	}
	m.awaitAll(t, es)
}

// drawLimits draws a valid limits snapshot at revision rev.
func (m *cmMachine) drawLimits(t *rapid.T, rev int64) bulkhead.Limits {
	l := bulkhead.Limits{
		Revision:      rev,
		MaxConcurrent: rapid.IntRange(1, 5).Draw(t, "nextMaxConcurrent"),
		MaxQueue:      rapid.IntRange(0, 3).Draw(t, "nextMaxQueue"),
	}
	if rapid.IntRange(0, 9).Draw(t, "killSwitch") == 0 {
		l.MaxConcurrent = 0 // F24: new calls rejected, waiters kept
	}
	budget := int64(-1)
	if m.hasBudget {
		budget = int64(rapid.IntRange(0, 150).Draw(t, "nextBudget"))
		reserve := int64(rapid.IntRange(0, int(budget/2)).Draw(t, "nextReserve"))
		if rapid.IntRange(0, 5).Draw(t, "reserveOverBudget") == 0 {
			reserve = budget + int64(rapid.IntRange(1, 20).Draw(t, "reserveExcess"))
		}
		l.TokenBudget = &bulkhead.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
	}
	def := ""
	if rapid.Bool().Draw(t, "explicitDefault") {
		def = m.limits.Classes.Default
	}
	l.Classes = &bulkhead.Classes{Default: def, Limits: m.drawTable(t, l.MaxConcurrent, budget)}
	return l
}

// breakLimits makes l invalid in one of many ways (F16, F24).
func (m *cmMachine) breakLimits(t *rapid.T, l *bulkhead.Limits) string {
	name := m.names[rapid.IntRange(0, len(m.names)-1).Draw(t, "breakClass")]
	cl := l.Classes.Limits[name]
	other := m.names[0]
	if other == m.limits.Classes.Default {
		other = m.names[1]
	}
	type brk struct {
		what string
		do   func()
	}
	breaks := []brk{
		{"floor above its ceiling", func() {
			c := rapid.IntRange(0, 2).Draw(t, "c")
			cl.MaxConcurrent, cl.ProtectedConcurrent = bulkhead.Ceiling(c), c+1
		}},
		{"floors above MaxConcurrent", func() { cl.MaxConcurrent, cl.ProtectedConcurrent = nil, l.MaxConcurrent+1 }},
		{"negative floor", func() { cl.ProtectedConcurrent = -1 }},
		{"negative ceiling", func() { cl.MaxConcurrent = bulkhead.Ceiling(-1) }},
		{"missing class", func() { delete(l.Classes.Limits, name) }},
		{"unknown class", func() { l.Classes.Limits["zzz"] = bulkhead.ClassLimits{} }},
		{"another default", func() { l.Classes.Default = other }},
		{"unknown default", func() { l.Classes.Default = "nope" }},
		{"no class table", func() { l.Classes = nil }},
		{"empty class table", func() { l.Classes.Limits = map[string]bulkhead.ClassLimits{} }},
		{"negative MaxConcurrent", func() { l.MaxConcurrent = -1 }},
	}
	if m.hasBudget {
		b := l.TokenBudget.Budget
		breaks = append(breaks,
			brk{"token floors above the budget", func() { cl.MaxInFlightTokens, cl.ProtectedInFlightTokens = nil, b+1 }},
			brk{"token floor above its ceiling", func() {
				c := rapid.Int64Range(0, b).Draw(t, "tc")
				cl.MaxInFlightTokens, cl.ProtectedInFlightTokens = bulkhead.Ceiling(c), c+1
			}},
			brk{"negative token ceiling", func() { cl.MaxInFlightTokens = bulkhead.Ceiling(int64(-1)) }},
			brk{"no budget", func() { l.TokenBudget = nil }},
		)
	} else {
		breaks = append(breaks,
			brk{"token floor without a budget", func() { cl.ProtectedInFlightTokens = 1 }},
			brk{"token ceiling without a budget", func() { cl.MaxInFlightTokens = bulkhead.Ceiling(int64(5)) }},
			brk{"a budget", func() { l.TokenBudget = &bulkhead.BudgetLimits{Budget: 50} }},
		)
	}
	b := breaks[rapid.IntRange(0, len(breaks)-1).Draw(t, "breakKind")]
	b.do()
	if l.Classes != nil {
		if _, ok := l.Classes.Limits[name]; ok {
			l.Classes.Limits[name] = cl
		}
	}
	return b.what + " (" + name + ")"
}

func (m *cmMachine) applyLimits(t *rapid.T) {
	cur := m.limits.Revision
	switch kind := rapid.IntRange(0, 5).Draw(t, "applyKind"); kind {
	case 0, 1, 2: // valid and newer
		next := m.drawLimits(t, cur+int64(rapid.IntRange(1, 2).Draw(t, "revStep")))
		m.descr = "ApplyLimits " + cmFmtLimits(next)
		res, err := m.b.ApplyLimits(next)
		want := next.Clone()
		want.Classes.Default = m.limits.Classes.Default
		if err != nil || !res.Applied || res.Reason != "" || !reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, want) {
			t.Fatalf("%s: = %+v, %v\nprevious %s\nwant current %s\ngot current %s", m.descr, res, err, cmFmtLimits(m.limits),
				cmFmtLimits(want), cmFmtLimits(res.Current))
		}
		m.seen["apply valid"]++
		m.installed(want)
		m.awaitAll(t, m.pump())
	case 3: // stale: not above the current revision, valid or not
		next := m.drawLimits(t, max(0, cur-int64(rapid.IntRange(0, 1).Draw(t, "staleBy"))))
		broken := ""
		if rapid.Bool().Draw(t, "staleAndInvalid") {
			broken = " and invalid: " + m.breakLimits(t, &next)
		}
		m.descr = "ApplyLimits stale" + broken + " " + cmFmtLimits(next)
		m.tokensFrozen = true
		res, err := m.b.ApplyLimits(next)
		if err != nil || res.Applied || res.Reason != bulkhead.StaleRevision ||
			!reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, m.limits) {
			t.Fatalf("%s: = %+v, %v; want stale_revision with current %s", m.descr, res, err, cmFmtLimits(m.limits))
		}
		m.seen["apply stale"]++
	default: // invalid, at a newer revision
		next := m.drawLimits(t, cur+1)
		what := m.breakLimits(t, &next)
		m.descr = "ApplyLimits invalid: " + what + " " + cmFmtLimits(next)
		m.tokensFrozen = true
		res, err := m.b.ApplyLimits(next)
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || res.Applied {
			t.Fatalf("%s: = %+v, %v; want a *ConfigError", m.descr, res, err)
		}
		m.seen["apply invalid"]++
	}
	m.stepApply = true
	if l := m.b.Limits(); !reflect.DeepEqual(l, m.limits) {
		t.Fatalf("%s: Limits() = %s, want %s", m.descr, cmFmtLimits(l), cmFmtLimits(m.limits))
	}
}

// installed updates the model for an applied snapshot (Default filled in).
func (m *cmMachine) installed(next bulkhead.Limits) {
	m.reconfigs = append(m.reconfigs, bulkhead.ReconfigureEvent{Previous: m.limits.Clone(), Current: next.Clone()})
	m.limits = next.Clone()
}

func (m *cmMachine) setBudget(t *rapid.T) {
	n := int64(rapid.IntRange(-1, 150).Draw(t, "SetBudget"))
	m.descr = fmt.Sprintf("SetBudget %d", n)
	m.stepApply = true
	res, err := m.b.SetBudget(n)
	_, stf := m.sumFloors()
	if !m.hasBudget || n < 0 || n < stf {
		// No budget, a negative one, or one below the token floors (F16).
		m.tokensFrozen = true
		if !errors.Is(err, bulkhead.ErrInvalid) || res.Applied {
			t.Fatalf("%s (token floors %d): = %+v, %v; want an invalid-input error", m.descr, stf, res, err)
		}
		m.seen["set budget invalid"]++
		return
	}
	next := m.limits.Clone()
	next.Revision++
	next.TokenBudget.Budget = n
	if err != nil || !res.Applied || !reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, next) {
		t.Fatalf("%s: = %+v, %v; want %s", m.descr, res, err, cmFmtLimits(next))
	}
	m.seen["set budget"]++
	m.installed(next)
	m.awaitAll(t, m.pump())
}

// wouldAdmit checks the advisory decision and its detail; it changes
// nothing (F23).
func (m *cmMachine) wouldAdmit(t *rapid.T) {
	c := m.drawCall(t, false)
	c.ctxDone = false
	detail := rapid.Bool().Draw(t, "withDetail")
	if detail {
		c.opts = append(c.opts, bulkhead.WithDetail())
	}
	m.descr = fmt.Sprintf("WouldAdmit class=%s prio=%v reserved=%d", c.class, c.prio, c.res.Reserved)
	m.tokensFrozen = true
	d, err := m.b.WouldAdmit(&bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hello"}}}, c.opts...)
	if err != nil {
		t.Fatalf("%s: %v", m.descr, err)
	}
	dec, why, cons, _ := m.decide(c)
	if dec != cmReject {
		why, cons = noReason, ""
	}
	if d.Admit != (why == noReason) || d.Reason != why {
		t.Fatalf("%s: = %+v, want reason %q", m.descr, d, why)
	}
	if want := m.detail(c.class, c.prio, c.res.Reserved, cons); detail != (d.Detail != nil) || (detail && !reflect.DeepEqual(*d.Detail, want)) {
		t.Fatalf("%s: detail\n got %s\nwant %s", m.descr, cmFmtDetail(d.Detail), cmFmtDetail(&want))
	}
}

func (m *cmMachine) cancel(t *rapid.T) {
	if len(m.queue) == 0 {
		t.Skip("nobody queued")
	}
	i := rapid.IntRange(0, len(m.queue)-1).Draw(t, "waiter")
	w := m.queue[i]
	m.descr = fmt.Sprintf("Cancel waiter %d", w.id)
	m.tokensFrozen = true
	m.queue = slices.Delete(m.queue, i, i+1)
	det := m.detail(w.class, w.prio, w.res.Reserved, "")
	m.reject(w, bulkhead.Aborted, "", true)
	w.cancel()
	m.awaitAll(t, []cmExpect{{w: w, reason: bulkhead.Aborted, detail: det}})
}

// invalid makes calls with invalid class or deadline options: each is a
// *ConfigError, never a rejection, and changes nothing (F16, F20).
func (m *cmMachine) invalid(t *rapid.T) {
	ok := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "x"}}}
	fn := func(context.Context, *bulkhead.RunContext) (int, error) { return 0, errors.New("ran") }
	cases := []struct {
		name string
		do   func() error
	}{
		{"Acquire with an unknown class", func() error {
			tok, err := m.b.Acquire(context.Background(), ok, bulkhead.WithClass("nope"))
			if tok != nil {
				_ = tok.Release(nil)
			}
			return err
		}},
		{"Acquire with a borrowed deadline", func() error {
			tok, err := m.b.Acquire(context.Background(), ok, bulkhead.WithBorrowedDeadline(time.Second))
			if tok != nil {
				_ = tok.Release(nil)
			}
			return err
		}},
		{"Run with an unknown class", func() error {
			_, err := bulkhead.Run(context.Background(), m.b, ok, fn, bulkhead.WithClass("nope"))
			return err
		}},
		{"Run with a zero deadline", func() error {
			_, err := bulkhead.Run(context.Background(), m.b, ok, fn, bulkhead.WithBorrowedDeadline(0))
			return err
		}},
		{"Run with a sub-millisecond deadline", func() error {
			_, err := bulkhead.Run(context.Background(), m.b, ok, fn, bulkhead.WithBorrowedDeadline(time.Millisecond-1))
			return err
		}},
		{"Run with a deadline above the maximum", func() error {
			_, err := bulkhead.Run(context.Background(), m.b, ok, fn, bulkhead.WithBorrowedDeadline(bulkhead.MaxBorrowedDeadline+time.Millisecond))
			return err
		}},
		{"WouldAdmit with an unknown class", func() error {
			_, err := m.b.WouldAdmit(ok, bulkhead.WithClass("nope"))
			return err
		}},
	}
	c := cases[rapid.IntRange(0, len(cases)-1).Draw(t, "invalidCase")]
	m.descr = "Invalid: " + c.name
	m.tokensFrozen = true
	err := c.do()
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || errors.Is(err, bulkhead.ErrRejected) {
		t.Fatalf("%s: %v; want a *ConfigError", m.descr, err)
	}
}

// drainDoneCtx calls Drain with a context that has already ended: it
// reports what is outstanding, abandoned admissions included, and cancels
// nothing (F33).
func (m *cmMachine) drainDoneCtx(t *rapid.T) {
	live := m.calls.Admitted - m.calls.Released
	idle := live == 0 && len(m.queue) == 0
	if idle && m.closed {
		t.Skip("closed and idle") // the final Drain's job
	}
	m.descr = "Drain(done ctx)"
	m.tokensFrozen = true
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := m.b.Drain(ctx)
	want := bulkhead.DrainResult{Drained: idle}
	if !idle {
		want.InFlight, want.Pending = int(live), len(m.queue)
	}
	if res != want || (idle && err != nil) || (!idle && !errors.Is(err, context.Canceled)) {
		t.Fatalf("%s: = %+v, %v; want %+v", m.descr, res, err, want)
	}
	m.noStray(t)
}

// closeLate is the Close action: early in a run it asks WouldAdmit instead.
func (m *cmMachine) closeLate(t *rapid.T) {
	if m.steps < 45 || rapid.IntRange(0, 2).Draw(t, "closeNow") > 0 {
		m.wouldAdmit(t)
		return
	}
	m.close(t)
}

func (m *cmMachine) close(t *rapid.T) {
	m.descr = "Close"
	m.tokensFrozen = true
	var es []cmExpect
	if !m.closed {
		for len(m.queue) > 0 {
			w := m.queue[0]
			m.queue = m.queue[1:]
			es = append(es, cmExpect{w: w, reason: bulkhead.Shutdown, detail: m.detail(w.class, w.prio, w.res.Reserved, "")})
			m.reject(w, bulkhead.Shutdown, "", true)
		}
	}
	m.closed = true
	m.b.Close()
	m.awaitAll(t, es)
}

// ---- Invariants ----

// wantStats is the model's Stats.
func (m *cmMachine) wantStats() bulkhead.Stats {
	st := bulkhead.Stats{Limits: m.limits.Clone(), Gate: m.gate, Calls: m.calls}
	st.Gate.InFlight = m.inFlight
	st.Gate.Pending = len(m.queue)
	st.Gate.MaxConcurrent = m.limits.MaxConcurrent
	st.Gate.MaxQueue = m.limits.MaxQueue
	st.Gate.Closed = m.closed
	st.Calls.InFlight = m.calls.Admitted - m.calls.Released
	if m.hasBudget {
		b := m.limits.TokenBudget
		st.TokenBudget = &bulkhead.BudgetStats{
			Budget:              b.Budget,
			HighPriorityReserve: b.HighPriorityReserve,
			InFlightTokens:      m.tokens,
			Available:           max(0, b.Budget-m.tokens),
			TotalReserved:       m.ledger.reserved,
			TotalConsumed:       m.ledger.consumed,
			TotalRefunded:       m.ledger.refunded,
		}
	}
	sf, stf := m.sumFloors()
	pc, pt := m.protected()
	cs := &bulkhead.ClassesStats{Default: m.limits.Classes.Default, Classes: map[string]bulkhead.ClassStats{}}
	cs.Shared.MaxConcurrent = max(0, m.limits.MaxConcurrent-sf)
	cs.Shared.InFlight = max(0, m.inFlight-pc)
	cs.Shared.AvailableConcurrent = max(0, cs.Shared.MaxConcurrent-cs.Shared.InFlight)
	if m.hasBudget {
		tc, tu := max(0, m.limits.TokenBudget.Budget-stf), max(0, m.tokens-pt)
		cs.Shared.TokenBudget = &admission.SharedBudgetStats{Budget: tc, InFlightTokens: tu, Available: max(0, tc-tu)}
	}
	for name, k := range m.cls {
		c := k.st
		c.Limits = m.lim(name)
		c.InFlight = k.inFlight
		c.ProtectedConcurrentInUse = min(k.inFlight, c.Limits.ProtectedConcurrent)
		c.BorrowedConcurrent = max(0, k.inFlight-c.Limits.ProtectedConcurrent)
		c.InFlightTokens = k.tokens
		c.ProtectedTokensInUse = min(k.tokens, c.Limits.ProtectedInFlightTokens)
		c.BorrowedInFlightTokens = max(0, k.tokens-c.Limits.ProtectedInFlightTokens)
		cs.Classes[name] = c
	}
	st.Classes = cs
	return cmNormalize(st)
}

// cmPair is a value of Stats and its limit, if it has one.
type cmPair struct {
	v, lim int64
	hasLim bool
}

// limitPairs lists every value of Stats that admissions must keep within a
// limit, with its limit. shared marks the pairs that a floor change can move
// without any admission.
func limitPairs(st bulkhead.Stats) (pairs map[string]cmPair, shared map[string]bool) {
	pairs, shared = map[string]cmPair{}, map[string]bool{}
	pairs["in flight"] = cmPair{int64(st.Gate.InFlight), int64(st.Gate.MaxConcurrent), true}
	cs := st.Classes
	pairs["shared in flight"] = cmPair{int64(cs.Shared.InFlight), int64(cs.Shared.MaxConcurrent), true}
	shared["shared in flight"] = true
	if tb := st.TokenBudget; tb != nil {
		pairs["tokens"] = cmPair{tb.InFlightTokens, tb.Budget, true}
		pairs["shared tokens"] = cmPair{cs.Shared.TokenBudget.InFlightTokens, cs.Shared.TokenBudget.Budget, true}
		shared["shared tokens"] = true
	}
	for name, c := range cs.Classes {
		p := cmPair{v: int64(c.InFlight)}
		if c.Limits.MaxConcurrent != nil {
			p.lim, p.hasLim = int64(*c.Limits.MaxConcurrent), true
		}
		pairs[name+" in flight"] = p
		p = cmPair{v: c.InFlightTokens}
		if c.Limits.MaxInFlightTokens != nil {
			p.lim, p.hasLim = *c.Limits.MaxInFlightTokens, true
		}
		pairs[name+" tokens"] = p
	}
	return pairs, shared
}

// check runs after every step.
func (m *cmMachine) check(t *rapid.T) {
	m.steps++
	m.seen["steps"]++
	raw := m.b.Stats()
	if err := cmCheckDeadlines(raw); err != nil {
		t.Fatalf("after %s: %v", m.descr, err)
	}
	got := cmNormalize(raw)
	prev := m.prev
	defer func() {
		m.prev = got
		m.stepAdmits = nil
		m.stepApply = false
		m.tokensFrozen = false
	}()

	// The model, all of Stats.
	if want := m.wantStats(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after %s:\nstats %s\nmodel %s", m.descr, cmFmtStats(got), cmFmtStats(want))
	}

	// I1, from Stats alone: new admissions never take a value above its
	// limit; a value above its limit (after a shrink) only falls.
	pairs, shared := limitPairs(got)
	prevPairs, _ := limitPairs(prev)
	for name, p := range pairs {
		q := prevPairs[name]
		if !p.hasLim {
			continue
		}
		if m.stepApply {
			// Limits moved; only admissions raise values (but a floor
			// change moves the shared pool's use by itself).
			if !shared[name] && p.v > p.lim && p.v > q.v {
				t.Fatalf("I1: after %s, %s rose from %d to %d above its limit %d", m.descr, name, q.v, p.v, p.lim)
			}
			continue
		}
		if !q.hasLim {
			q.lim = p.lim // limits only change in apply steps
		}
		if p.v-p.lim > 0 && p.v-p.lim > q.v-q.lim {
			t.Fatalf("I1: after %s, %s is %d over its limit %d (was %d over %d)", m.descr, name, p.v, p.lim, q.v, q.lim)
		}
	}
	if n := len(m.stepAdmits); n > 0 && got.TokenBudget != nil {
		last := m.stepAdmits[n-1]
		if eff := m.eff(last.prio); got.TokenBudget.InFlightTokens > eff {
			t.Fatalf("I1: %s left %d tokens held over the effective budget %d of a %v admission", m.descr, got.TokenBudget.InFlightTokens, eff, last.prio)
		}
	}
	// I4: rejections and no-ops change no token counter.
	if tb, ptb := got.TokenBudget, prev.TokenBudget; m.tokensFrozen && tb != nil && (tb.InFlightTokens != ptb.InFlightTokens ||
		tb.TotalReserved != ptb.TotalReserved || tb.TotalConsumed != ptb.TotalConsumed || tb.TotalRefunded != ptb.TotalRefunded) {
		t.Fatalf("I4: %s changed the ledger from %+v to %+v", m.descr, *ptb, *tb)
	}

	// I5, globally and per class, with abandoned-but-unreleased admissions:
	// they count in Calls.InFlight and hold their tokens, but hold no slot.
	abandonedLive := map[string]int64{}
	var abandonedAll int64
	for _, h := range m.holds {
		if h.abandoned && !h.released {
			abandonedLive[h.class]++
			abandonedAll++
		}
	}
	g, c := got.Gate, got.Calls
	if c.Admitted-c.Released != c.InFlight || g.Admitted-g.Released != int64(g.InFlight) || c.InFlight-int64(g.InFlight) != abandonedAll {
		t.Fatalf("I5: calls %d-%d=%d, gate %d-%d=%d, abandoned unreleased %d", c.Admitted, c.Released, c.InFlight,
			g.Admitted, g.Released, g.InFlight, abandonedAll)
	}
	var abandonedSum int64
	for _, n := range c.AbandonedByCause {
		abandonedSum += n
	}
	if c.Rejected != sum(c.RejectedByReason) || g.Rejected != sum(g.RejectedByReason) || c.Abandoned != abandonedSum {
		t.Fatalf("I5: rejected %d by reason %v; gate %d by reason %v; abandoned %d by cause %v", c.Rejected, c.RejectedByReason,
			g.Rejected, g.RejectedByReason, c.Abandoned, c.AbandonedByCause)
	}
	var sumIn int
	var sumTok, sumAdm, sumRel, sumRej, sumAband int64
	for name, cs := range got.Classes.Classes {
		var byCause int64
		for _, n := range cs.AbandonedByCause {
			byCause += n
		}
		if cs.Admitted-cs.Released-int64(cs.InFlight) != abandonedLive[name] || cs.Rejected != sum(cs.RejectedByReason) || cs.Abandoned != byCause {
			t.Fatalf("I5: class %s: admitted %d - released %d - in flight %d != %d abandoned unreleased; rejected %d by reason %v; abandoned %d by cause %v",
				name, cs.Admitted, cs.Released, cs.InFlight, abandonedLive[name], cs.Rejected, cs.RejectedByReason, cs.Abandoned, cs.AbandonedByCause)
		}
		sumIn += cs.InFlight
		sumTok += cs.InFlightTokens
		sumAdm += cs.Admitted
		sumRel += cs.Released
		sumRej += cs.Rejected
		sumAband += cs.Abandoned
	}
	var tokens int64
	if got.TokenBudget != nil {
		tokens = got.TokenBudget.InFlightTokens
	}
	if sumIn != g.InFlight || sumTok != tokens || sumAdm != c.Admitted || sumRel != c.Released || sumRej != c.Rejected || sumAband != c.Abandoned {
		t.Fatalf("I5: the classes sum to in flight %d tokens %d admitted %d released %d rejected %d abandoned %d; globally %d %d %d %d %d %d",
			sumIn, sumTok, sumAdm, sumRel, sumRej, sumAband, g.InFlight, tokens, c.Admitted, c.Released, c.Rejected, c.Abandoned)
	}
	// I8: revisions only rise.
	if got.Limits.Revision < prev.Limits.Revision {
		t.Fatalf("I8: revision fell from %d to %d", prev.Limits.Revision, got.Limits.Revision)
	}
}

// finish ends the run: Close rejects the queue, every admission is settled
// (late callbacks included), a real Drain drains, then nothing is held
// anywhere and the events are checked (I2, I3, F30).
func (m *cmMachine) finish(t *rapid.T) {
	m.close(t)
	m.check(t)
	for _, h := range m.holds {
		if h.released {
			continue
		}
		u := &bulkhead.Usage{Input: h.res.Input, Output: h.res.MaxOutput}
		if h.tok != nil {
			m.descr = "final Release " + h.id.String()
			if err := h.tok.Release(u); err != nil {
				t.Fatalf("%s: %v", m.descr, err)
			}
			m.settle(h, u)
			m.awaitAll(t, m.pump())
		} else {
			m.finishRun(t, h, false, u)
		}
		m.check(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	res, err := m.b.Drain(ctx)
	if err != nil || res != (bulkhead.DrainResult{Drained: true}) {
		t.Fatalf("I3: final Drain = %+v, %v", res, err)
	}
	m.finished = true

	st := m.b.Stats()
	if st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.InFlight != 0 || st.Calls.Admitted != st.Calls.Released ||
		st.Classes.Shared.InFlight != 0 {
		t.Fatalf("I3: not idle after drain: %s", cmFmtStats(st))
	}
	if tb := st.TokenBudget; tb != nil && (tb.InFlightTokens != 0 || st.Classes.Shared.TokenBudget.InFlightTokens != 0) {
		t.Fatalf("I3: tokens held after drain: %s", cmFmtStats(st))
	}
	for name, c := range st.Classes.Classes {
		if c.InFlight != 0 || c.InFlightTokens != 0 || c.Admitted != c.Released {
			t.Fatalf("I3: class %s not idle after drain: %+v", name, c)
		}
	}
	m.checkEvents(t, st)
}

func (m *cmMachine) checkEvents(t *rapid.T, st bulkhead.Stats) {
	m.ev.mu.Lock()
	defer m.ev.mu.Unlock()
	ev := m.ev
	byID := map[bulkhead.ID]*cmHold{}
	for _, h := range m.holds {
		byID[h.id] = h
	}

	// Admit events: exactly one per admission, in the model's order (I2,
	// I11), with the admission's class, resources and revision.
	if len(ev.admits) != len(m.admitOrder) || int64(len(ev.admits)) != st.Calls.Admitted {
		t.Fatalf("I2: %d admit events, %d admissions, stats %d", len(ev.admits), len(m.admitOrder), st.Calls.Admitted)
	}
	for i, e := range ev.admits {
		if e.AdmissionID != m.admitOrder[i] {
			t.Fatalf("I11: admit event %d is %s, want %s", i, e.AdmissionID, m.admitOrder[i])
		}
		h := byID[e.AdmissionID]
		if e.Request != h.w.req || e.LimitRevision != h.rev || e.Priority != h.prio || e.Class != h.class ||
			e.Reserved != h.res.Reserved || e.Resources != h.resources {
			t.Fatalf("admit event %+v, want class %s revision %d priority %v reserved %d resources %+v", e, h.class, h.rev, h.prio,
				h.res.Reserved, h.resources)
		}
		if e.DecisionDuration != 0 || e.QueueWait != m.admitWait[h.id] {
			t.Fatalf("F31: admit event timing %+v, want queue wait %v (mock clock)", e.Timing, m.admitWait[h.id])
		}
	}

	// Release events: exactly one per admission, as the model settled it.
	if len(ev.releases) != len(m.releases) || int64(len(ev.releases)) != st.Calls.Released {
		t.Fatalf("I2: %d release events, want %d (stats %d)", len(ev.releases), len(m.releases), st.Calls.Released)
	}
	seen := map[bulkhead.ID]bool{}
	for _, e := range ev.releases {
		want, ok := m.releases[e.AdmissionID]
		if !ok || seen[e.AdmissionID] {
			t.Fatalf("I2: unexpected or repeated release event %+v", e)
		}
		seen[e.AdmissionID] = true
		if !reflect.DeepEqual(e, want) {
			t.Fatalf("release event\n got %+v\nwant %+v", e, want)
		}
	}

	// Abandon events: exactly one per effective abandon, with its cause
	// (I2, F19, F20).
	if len(ev.abandons) != len(m.abandons) || int64(len(ev.abandons)) != st.Calls.Abandoned {
		t.Fatalf("I2: %d abandon events, want %d (stats %d)", len(ev.abandons), len(m.abandons), st.Calls.Abandoned)
	}
	clear(seen)
	for _, e := range ev.abandons {
		want, ok := m.abandons[e.AdmissionID]
		if !ok || seen[e.AdmissionID] {
			t.Fatalf("I2: unexpected or repeated abandon event %+v", e)
		}
		seen[e.AdmissionID] = true
		if !reflect.DeepEqual(e, want) {
			t.Fatalf("abandon event\n got %+v\nwant %+v", e, want)
		}
	}

	// Per admission, in causal order: admit, [abandon], release (F30).
	pos := map[bulkhead.ID][3]int{}
	for i, o := range ev.order {
		p := pos[o.id]
		p[o.kind] = i + 1
		pos[o.id] = p
	}
	for id, p := range pos {
		if p[cmEvAdmit] == 0 || p[cmEvRelease] <= p[cmEvAdmit] || (p[cmEvAbandon] != 0 && (p[cmEvAbandon] < p[cmEvAdmit] || p[cmEvAbandon] > p[cmEvRelease])) {
			t.Fatalf("F30: events of %s out of order: admit %d abandon %d release %d", id, p[cmEvAdmit], p[cmEvAbandon], p[cmEvRelease])
		}
	}

	// Reject events: the model's multiset, constraint included (F21).
	got := map[cmRejectKey]int{}
	for _, e := range ev.rejects {
		if e.Detail == nil || e.Detail.LimitRevision != e.LimitRevision || e.Detail.Class == nil || e.Detail.Class.Name != e.Class {
			t.Fatalf("reject event %+v detail %s", e, cmFmtDetail(e.Detail))
		}
		got[cmRejectKey{e.Reason, e.Detail.Constraint, e.Class, e.Priority, e.LimitRevision}]++
	}
	if !maps.Equal(got, m.rejects) || int64(len(ev.rejects)) != st.Calls.Rejected {
		t.Fatalf("reject events %v, want %v (stats %d)", got, m.rejects, st.Calls.Rejected)
	}

	// Reconfigure events: one per applied snapshot, in order.
	if len(ev.reconfigs) != len(m.reconfigs) {
		t.Fatalf("%d reconfigure events, want %d", len(ev.reconfigs), len(m.reconfigs))
	}
	for i, e := range ev.reconfigs {
		if !reflect.DeepEqual(e, m.reconfigs[i]) {
			t.Fatalf("reconfigure event %d: %s -> %s, want %s -> %s", i, cmFmtLimits(e.Previous), cmFmtLimits(e.Current),
				cmFmtLimits(m.reconfigs[i].Previous), cmFmtLimits(m.reconfigs[i].Current))
		}
	}
}
