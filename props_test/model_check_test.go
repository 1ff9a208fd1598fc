package props_test

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
)

// The state machine's checks: after every step, Stats against the model and
// the invariants; at the end, the events.

// wantStats is the model's Stats.
func (m *machine) wantStats() bulkhead.Stats {
	st := bulkhead.Stats{Limits: m.limits.Clone(), Gate: m.gate, Calls: m.calls}
	st.Gate.InFlight = m.inFlight
	st.Gate.Pending = len(m.queue)
	st.Gate.MaxConcurrent = m.limits.MaxConcurrent
	st.Gate.MaxQueue = m.limits.MaxQueue
	st.Gate.Closed = m.closed
	st.Calls.InFlight = m.calls.Admitted - m.calls.Released
	st.Cooldown.Started = m.coolStarted
	st.Cooldown.Held = m.coolHeld
	if m.coolingNow() {
		st.Cooldown.Active = map[string]time.Time{"gpt-4o": m.coolUntil}
	}
	st.Fleet = m.fleet.stats()
	st.Retries = m.retryStats("")
	st.Observe = m.observe
	st.Observe.BypassedByReason = maps.Clone(m.observe.BypassedByReason)
	if m.hasDedup {
		st.Dedup = &bulkhead.DedupStats{Active: m.activeKeys(), Hits: m.hits}
	}
	if m.rate != nil {
		rs := m.rateStats
		rs.Waiting = len(m.parked)
		st.Rate = &rs
	}
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
	if !m.hasClasses {
		return normalize(st)
	}
	sf, stf := m.sumFloors()
	pc, pt := m.protected()
	cs := &bulkhead.ClassesStats{Default: m.limits.Classes.Default, Classes: map[string]bulkhead.ClassStats{}}
	cs.Shared.MaxConcurrent = max(0, m.limits.MaxConcurrent-sf)
	cs.Shared.InFlight = max(0, m.inFlight-pc)
	cs.Shared.AvailableConcurrent = max(0, cs.Shared.MaxConcurrent-cs.Shared.InFlight)
	if m.hasBudget {
		tc, tu := max(0, m.limits.TokenBudget.Budget-stf), max(0, m.tokens-pt)
		cs.Shared.TokenBudget = &bulkhead.SharedBudget{Budget: tc, InFlightTokens: tu, Available: max(0, tc-tu)}
	}
	for _, name := range m.names {
		k := m.cls[name]
		c := k.st
		c.Limits = m.lim(name)
		c.InFlight = k.inFlight
		c.ProtectedConcurrentInUse = min(k.inFlight, c.Limits.ProtectedConcurrent)
		c.BorrowedConcurrent = max(0, k.inFlight-c.Limits.ProtectedConcurrent)
		c.InFlightTokens = k.tokens
		c.ProtectedTokensInUse = min(k.tokens, c.Limits.ProtectedInFlightTokens)
		c.BorrowedInFlightTokens = max(0, k.tokens-c.Limits.ProtectedInFlightTokens)
		c.Pending = m.waiting(name)
		c.Retries = m.retryStats(name)
		cs.Classes[name] = c
	}
	st.Classes = cs
	return normalize(st)
}

// limitPair is a value of Stats and its limit, if it has one. shared marks
// the values that a floor change can move without any admission.
type limitPair struct {
	name           string
	v, lim         int64
	hasLim, shared bool
}

// limitPairs lists every value of Stats that admissions must keep within a
// limit, with its limit, in an order fixed for the bulkhead's life.
func limitPairs(st bulkhead.Stats) []limitPair {
	pairs := []limitPair{
		{name: "in flight", v: int64(st.Gate.InFlight), lim: int64(st.Gate.MaxConcurrent), hasLim: true},
		{name: "pending", v: int64(st.Gate.Pending), lim: int64(st.Gate.MaxQueue), hasLim: true},
	}
	if tb := st.TokenBudget; tb != nil {
		pairs = append(pairs, limitPair{name: "tokens", v: tb.InFlightTokens, lim: tb.Budget, hasLim: true})
	}
	cs := st.Classes
	if cs == nil {
		return pairs
	}
	pairs = append(pairs, limitPair{name: "shared in flight", v: int64(cs.Shared.InFlight), lim: int64(cs.Shared.MaxConcurrent), hasLim: true, shared: true})
	if tb := cs.Shared.TokenBudget; tb != nil {
		pairs = append(pairs, limitPair{name: "shared tokens", v: tb.InFlightTokens, lim: tb.Budget, hasLim: true, shared: true})
	}
	for _, name := range slices.Sorted(maps.Keys(cs.Classes)) {
		c := cs.Classes[name]
		p := limitPair{name: name + " in flight", v: int64(c.InFlight)}
		if c.Limits.MaxConcurrent != nil {
			p.lim, p.hasLim = int64(*c.Limits.MaxConcurrent), true
		}
		pairs = append(pairs, p)
		p = limitPair{name: name + " tokens", v: c.InFlightTokens}
		if c.Limits.MaxInFlightTokens != nil {
			p.lim, p.hasLim = *c.Limits.MaxInFlightTokens, true
		}
		pairs = append(pairs, p)
	}
	return pairs
}

// check runs after every step.
func (m *machine) check(t *rapid.T) {
	m.steps++
	m.seen["steps"]++
	m.settleGroups(t)
	m.fleet.sync(t)
	raw := m.b.Stats()
	if err := checkDeadlines(raw); err != nil {
		t.Fatalf("after %s: %v", m.descr, err)
	}
	got := normalize(raw)
	prev := m.prev
	defer func() {
		m.prev = got
		m.stepAdmits = nil
		m.stepApply = false
		m.stepEnqueued = false
		m.tokensFrozen = false
		m.capacityFrozen = false
		m.fleet.endStep()
	}()

	// The model, all of Stats.
	want := m.wantStats()
	m.fleet.reconcile(t, got.Fleet, want.Fleet)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after %s:\nstats %s\nmodel %s", m.descr, fmtStats(got), fmtStats(want))
	}

	// I1, from Stats alone: new admissions never take a value above its
	// limit; a value above its limit (after a shrink) only falls.
	g := got.Gate
	prevPairs := limitPairs(prev)
	for i, p := range limitPairs(got) {
		q := prevPairs[i]
		if !p.hasLim {
			continue
		}
		if m.stepApply {
			// Limits moved; only admissions raise values (but a floor
			// change moves the shared pool's use by itself).
			if !p.shared && p.v > p.lim && p.v > q.v {
				t.Fatalf("I1: after %s, %s rose from %d to %d above its limit %d", m.descr, p.name, q.v, p.v, p.lim)
			}
			continue
		}
		if !q.hasLim {
			q.lim = p.lim // limits only change in apply steps
		}
		if p.v-p.lim > 0 && p.v-p.lim > q.v-q.lim {
			t.Fatalf("I1: after %s, %s is %d over its limit %d (was %d over %d)", m.descr, p.name, p.v, p.lim, q.v, q.lim)
		}
	}
	if got.Calls.Admitted > prev.Calls.Admitted && g.InFlight > g.MaxConcurrent {
		t.Fatalf("I1: %s admitted up to %d in flight over MaxConcurrent %d", m.descr, g.InFlight, g.MaxConcurrent)
	}
	if m.stepEnqueued && g.Pending > g.MaxQueue {
		t.Fatalf("I1: %s queued up to %d pending over MaxQueue %d", m.descr, g.Pending, g.MaxQueue)
	}
	// F3: no waiter waits while a slot is free; with waiting for capacity
	// (X4), none that fits: the first waiter of each waiting class does not;
	// while a cool-down holds the queue (HoldCooldown), any may.
	if g.Pending > 0 && g.InFlight < g.MaxConcurrent && !m.heldQueue() {
		if !m.wait {
			t.Fatalf("F3: %d waiting with %d of %d slots in use", g.Pending, g.InFlight, g.MaxConcurrent)
		}
		blocked := map[string]bool{}
		for i := m.nextWaiter(blocked); i >= 0; i = m.nextWaiter(blocked) {
			w := m.queue[i]
			why, cons := m.capacity(w.class, w.prio, w.res.Reserved)
			if why == noReason {
				t.Fatalf("X4: after %s, %v waits with %d of %d slots in use, and it fits", m.descr, w, g.InFlight, g.MaxConcurrent)
			}
			if globalBlock(cons) {
				break // it holds back the whole queue
			}
			blocked[w.class] = true
		}
	}
	if tb, ptb := got.TokenBudget, prev.TokenBudget; tb != nil {
		if n := len(m.stepAdmits); n > 0 {
			// Tokens rise only through admissions, each fitting the effective
			// budget of its priority; the last one bounds what is held now.
			last := m.stepAdmits[n-1]
			if eff := m.eff(last.prio); tb.InFlightTokens > eff {
				t.Fatalf("I1: %s left %d tokens held over the effective budget %d of a %v admission", m.descr, tb.InFlightTokens, eff, last.prio)
			}
		}
		// I4: rejections (and cancellations, timeouts, stale applies...)
		// change no token counter.
		if m.tokensFrozen && (tb.InFlightTokens != ptb.InFlightTokens || tb.TotalReserved != ptb.TotalReserved ||
			tb.TotalConsumed != ptb.TotalConsumed || tb.TotalRefunded != ptb.TotalRefunded || tb.TotalOverrun != ptb.TotalOverrun) {
			t.Fatalf("I4: %s changed the ledger from %+v to %+v", m.descr, *ptb, *tb)
		}
		// I6 (F11) without ReportUsage: no overrun, no early refund, so
		// TotalReserved == sum of holds at release + InFlightTokens.
		if tb.TotalOverrun != 0 || tb.TotalReserved != m.ledger.releasedReserved+tb.InFlightTokens {
			t.Fatalf("I6: ledger %+v, holds released %d", *tb, m.ledger.releasedReserved)
		}
		if tb.InFlightTokens < 0 || tb.Available != max(0, tb.Budget-tb.InFlightTokens) {
			t.Fatalf("budget gauges %+v", *tb)
		}
	}

	// I5, globally and per class, with abandoned-but-unreleased admissions:
	// they count in Calls.InFlight and hold their tokens, but hold no slot.
	var abandoned map[string]int64
	for _, h := range m.holds {
		if h.abandoned && !h.released {
			inc(&abandoned, h.class)
		}
	}
	if err := checkCounters(got, abandoned); err != nil {
		t.Fatalf("after %s: %v", m.descr, err)
	}
	if err := checkObserve(prev, got, m.capacityFrozen); err != nil {
		t.Fatalf("after %s: %v", m.descr, err)
	}
	// I8: revisions only rise.
	if got.Limits.Revision < prev.Limits.Revision {
		t.Fatalf("I8: revision fell from %d to %d", prev.Limits.Revision, got.Limits.Revision)
	}
	if got.Events.ListenerPanics != 0 {
		t.Fatalf("listener panics: %d", got.Events.ListenerPanics)
	}
}

// finish ends the run: Close rejects the queue, every admission is settled
// (late callbacks included), a real Drain drains, then nothing is held
// anywhere and the events are checked (I2, I3, I11, F30, F31).
func (m *machine) finish(t *rapid.T) {
	m.close(t)
	m.check(t)
	for _, b := range m.bypassed {
		if !b.released {
			m.finishBypass(t, b, false, withBreakdown(t, bulkhead.Usage{Input: 1, Output: 2}))
			m.check(t)
		}
	}
	for _, h := range m.holds {
		if h.released {
			continue
		}
		var u *bulkhead.Usage
		if m.exactUsage || rapid.Bool().Draw(t, "finalUsage") {
			u = &bulkhead.Usage{Input: h.res.Input, Output: h.res.MaxOutput}
		}
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
	if err := checkIdle(st); err != nil {
		t.Fatal(err)
	}
	// F11: with exact usage and no overrun, reserved == consumed + refunded.
	if tb := st.TokenBudget; tb != nil && m.exactUsage && tb.TotalReserved != tb.TotalConsumed+tb.TotalRefunded {
		t.Fatalf("F11: exact usage but reserved %d != consumed %d + refunded %d", tb.TotalReserved, tb.TotalConsumed, tb.TotalRefunded)
	}
	m.checkEvents(t, st)
	m.checkBypassEvents(t, st)
	m.checkDedupEvents(t, st)
}

func (m *machine) checkEvents(t *rapid.T, st bulkhead.Stats) {
	m.ev.mu.Lock()
	defer m.ev.mu.Unlock()
	ev := m.ev
	byID := map[bulkhead.ID]*hold{}
	for _, h := range m.holds {
		byID[h.id] = h
	}

	// Per admission: admit, at most one abandon, release, in that order
	// (I2, F30).
	if _, err := ev.perAdmission(); err != nil {
		t.Fatal(err)
	}

	// Admit events: exactly one per admission, in the model's order (I2,
	// I11: FIFO among waiters never cancelled), with the admission's own
	// request, class, resources, revision (I8) and reservation, and its
	// queue wait (F31).
	if len(ev.admits) != len(m.admitOrder) || int64(len(ev.admits)) != st.Calls.Admitted {
		t.Fatalf("I2: %d admit events, %d admissions, stats %d", len(ev.admits), len(m.admitOrder), st.Calls.Admitted)
	}
	for i, e := range ev.admits {
		// With a fleet pool an admission is announced when its remote stage
		// confirms it, and the workers of calls granted in one step answer
		// in any order: there the model checks which calls were admitted
		// (each waiter's own outcome, in FIFO order) but not the order of
		// their events.
		if h := byID[e.ID]; m.fleet != nil && h == nil || m.fleet == nil && e.ID != m.admitOrder[i] {
			t.Fatalf("I11: admit event %d is %s, want %s (order %v)", i, e.ID, m.admitOrder[i], m.admitOrder)
		}
		h := byID[e.ID]
		if e.Request != h.w.req || e.LimitRevision != h.rev || e.Priority != h.prio || e.Class != h.class ||
			e.Reserved != h.res.Reserved || e.Resources != h.resources {
			t.Fatalf("admit event %+v, want class %q revision %d priority %v reserved %d resources %+v", e, h.class, h.rev, h.prio,
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
	for _, e := range ev.releases {
		if want, ok := m.releases[e.ID]; !ok || !reflect.DeepEqual(e, want) {
			t.Fatalf("release event\n got %+v\nwant %+v", e, want)
		}
	}

	// Abandon events: exactly one per effective abandon, with its cause
	// (I2, F19, F20).
	if len(ev.abandons) != len(m.abandons) || int64(len(ev.abandons)) != st.Calls.Abandoned {
		t.Fatalf("I2: %d abandon events, want %d (stats %d)", len(ev.abandons), len(m.abandons), st.Calls.Abandoned)
	}
	for _, e := range ev.abandons {
		if want, ok := m.abandons[e.ID]; !ok || !reflect.DeepEqual(e, want) {
			t.Fatalf("abandon event\n got %+v\nwant %+v", e, want)
		}
	}

	// Reject events: one per rejected call, as the model predicted it:
	// reason, revision, priority, class, detail (constraint included, F21)
	// and timing (F31).
	if len(ev.rejects) != len(m.rejects) || int64(len(ev.rejects)) != st.Calls.Rejected {
		t.Fatalf("%d reject events, want %d (stats %d)", len(ev.rejects), len(m.rejects), st.Calls.Rejected)
	}
	seen := map[*bulkhead.Request]bool{}
	for _, e := range ev.rejects {
		want, ok := m.rejects[e.Request]
		if !ok || seen[e.Request] {
			t.Fatalf("unexpected or repeated reject event %+v", e)
		}
		seen[e.Request] = true
		if want.follower {
			// A follower's own end: no detail, no timing (I9).
			if e.Detail != nil || e.Admission != want.ev.Admission || e.Reason != want.ev.Reason || e.Timing != (bulkhead.Timing{}) {
				t.Fatalf("follower reject event\n got %+v\nwant %+v", e, want.ev)
			}
			continue
		}
		if e.Detail == nil || e.Detail.LimitRevision != e.LimitRevision || (m.hasClasses && (e.Detail.Class == nil || e.Detail.Class.Name != e.Class)) {
			t.Fatalf("reject event %+v with detail %s", e, fmtDetail(e.Detail))
		}
		w := want.ev
		timing := e.DecisionDuration == 0 && e.QueueWait == w.QueueWait
		if want.waitUnknown {
			timing = e.DecisionDuration == 0 && e.QueueWait > 0
		}
		if e.Reason != w.Reason || e.LimitRevision != w.LimitRevision || e.Priority != w.Priority || e.Class != w.Class ||
			!want.matches(e.Detail) || !timing {
			t.Fatalf("reject event (F21, F31)\n got %+v detail %s\nwant %+v detail %s (wait unknown %v)", e, fmtDetail(e.Detail),
				w, fmtDetail(w.Detail), want.waitUnknown)
		}
	}

	// Reconfigure events: one per applied snapshot, in order, revisions
	// rising (I8).
	if len(ev.reconfigs) != len(m.reconfigs) {
		t.Fatalf("%d reconfigure events, want %d", len(ev.reconfigs), len(m.reconfigs))
	}
	for i, e := range ev.reconfigs {
		if !reflect.DeepEqual(e, m.reconfigs[i]) || e.Current.Revision <= e.Previous.Revision {
			t.Fatalf("reconfigure event %d: %s -> %s, want %s -> %s", i, fmtLimits(e.Previous), fmtLimits(e.Current),
				fmtLimits(m.reconfigs[i].Previous), fmtLimits(m.reconfigs[i].Current))
		}
	}
}
