package props_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
)

// The state machine's steps.

type callKind int

const (
	kindAcquire callKind = iota
	kindRun
	kindWouldAdmit
)

func newRequest() *bulkhead.Request {
	return &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hello"}}}
}

// drawCall draws a call of kind: its request, class, priority, reservation
// and, for the calls that may queue, queue timeout, borrowed-slot deadline
// and whether its context has already ended.
func (m *machine) drawCall(t *rapid.T, kind callKind) call {
	c := call{req: newRequest()}
	c.req.MaxTokens = int64(rapid.IntRange(1, 40).Draw(t, "MaxTokens"))
	if m.hasClasses {
		if i := rapid.IntRange(0, len(m.names)).Draw(t, "class"); i < len(m.names) {
			c.class = m.names[i]
			c.opts = append(c.opts, bulkhead.WithClass(c.class))
		} else {
			c.class = m.limits.Classes.Default
		}
	}
	if rapid.Bool().Draw(t, "high") {
		c.prio = bulkhead.High
	}
	if c.prio == bulkhead.High || rapid.Bool().Draw(t, "explicitNormal") {
		c.opts = append(c.opts, bulkhead.WithPriority(c.prio))
	}
	switch {
	case rapid.IntRange(0, 4).Draw(t, "estimator") == 0:
		// No override: admission reserves what Estimate says (F10), nil
		// without a budget.
		est, err := m.b.Estimate(c.req)
		if err != nil || (est != nil) != m.hasBudget {
			t.Fatalf("Estimate: %+v, %v (budget %v)", est, err, m.hasBudget)
		}
		if est != nil {
			c.res = *est
		}
	case m.hasBudget:
		in := rapid.Int64Range(0, m.maxTok).Draw(t, "Input")
		out := rapid.Int64Range(0, m.maxTok).Draw(t, "MaxOutput")
		o := bulkhead.Reservation{Input: in, MaxOutput: out}
		if rapid.Bool().Draw(t, "withReserved") {
			o.Reserved = in + out
		}
		c.resOpt = bulkhead.WithReservation(o)
		c.opts = append(c.opts, c.resOpt)
		c.res = bulkhead.Reservation{Input: in, MaxOutput: out, Reserved: in + out}
	case rapid.Bool().Draw(t, "ignoredOverride"):
		// Without a budget an override is ignored (F10).
		c.resOpt = bulkhead.WithReservation(bulkhead.Reservation{Input: 3, MaxOutput: 4})
		c.opts = append(c.opts, c.resOpt)
	}
	m.drawAttempt(t, &c)
	if kind == kindWouldAdmit {
		return c
	}
	c.timeout = m.cfgTimeout
	if k := rapid.IntRange(-1, 3).Draw(t, "callTimeoutUnits"); k >= 0 {
		c.timeout = time.Duration(k) * unit
		c.opts = append(c.opts, bulkhead.WithQueueTimeout(c.timeout))
	}
	if m.paced() && rapid.Bool().Draw(t, "timeoutNearTurn") {
		// About when a turn comes (turns are 10 ms to 1 s apart).
		c.timeout = time.Duration(rapid.IntRange(1, 1500).Draw(t, "timeoutMs")) * time.Millisecond
		c.opts = append(c.opts, bulkhead.WithQueueTimeout(c.timeout))
	}
	if kind == kindRun && rapid.IntRange(0, 3).Draw(t, "deadlineKind") > 0 {
		c.deadline = time.Duration(rapid.IntRange(1, 40).Draw(t, "deadlineMs")) * time.Millisecond
		c.opts = append(c.opts, bulkhead.WithBorrowedDeadline(c.deadline))
	}
	c.ctxDone = rapid.IntRange(0, 11).Draw(t, "ctxDone") == 0
	return c
}

func (m *machine) acquire(t *rapid.T) { m.call(t, m.drawCall(t, kindAcquire), false) }

func (m *machine) run(t *rapid.T) { m.call(t, m.drawCall(t, kindRun), true) }

// call makes c, as an Acquire or a Run, and returns its hold when the model
// says it is admitted at once.
func (m *machine) call(t *rapid.T, c call, run bool) *hold {
	kind := "Acquire"
	if run {
		kind = "Run"
	}
	w := m.start(c, run)
	if c.observe {
		kind = fmt.Sprintf("Run(observe %v)", c.shadow)
	}
	m.descr = fmt.Sprintf("%s%s #%d class=%q prio=%v reserved=%d timeout=%v deadline=%v ctxDone=%v attempt=%d", m.label, kind, w.id,
		c.class, c.prio, c.res.Reserved, c.timeout, c.deadline, c.ctxDone, c.attempt)
	if m.paced() {
		m.pacedCall(t, w, c)
		return nil
	}
	switch d, why, cons, atGate := m.decide(c); d {
	case admitNow:
		m.gate.Admitted++
		e := m.grant(w, true)
		if e.h == nil {
			// Held, then turned down by the fleet pool or the rate limit:
			// the slot goes back and no token counter moves (I4).
			m.tokensFrozen = true
		}
		m.awaitAll(t, []expect{e})
		return e.h
	case rejectNow:
		m.tokensFrozen = true
		if w.observe && w.shadow.has(why) {
			// Refused on arrival: bypassed at once, with no rejection.
			m.capacityFrozen = true
			d := m.detailFor(w.class, w.prio, w.res.Reserved, cons, why)
			b := m.bypass(w, why, false, &rejectWant{ev: bulkhead.RejectEvent{Detail: &d}})
			m.awaitAll(t, []expect{{w: w, reason: why, bypass: b}})
			return nil
		}
		m.awaitAll(t, []expect{m.reject(w, why, cons, atGate)})
	default:
		m.seen["queued"]++
		m.tokensFrozen = true
		m.stepEnqueued = true
		w.enqueued = m.clk.Now()
		if w.timeout > 0 {
			w.expires = w.enqueued.Add(w.timeout)
			m.timers++
		}
		m.enqueue(w)
		if d == queueHeld {
			m.holdCall(w)
			m.armHold()
			m.seen["held for the cool-down"]++
		}
		m.waitQueued(t, w, len(m.queue))
		if !(m.hold && m.coolingNow()) { // (a held queue's pump would arm the hold timer)
			m.noPump = d == queueCapacity
			es := m.pump()
			m.noPump = false
			if len(es) > 0 {
				t.Fatalf("%s: the model admits %v after the call queued: the queue was not settled", m.descr, es[0].w)
			}
		}
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
func (m *machine) floorProbe(t *rapid.T) {
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
	probe := call{req: newRequest(), class: name, prio: bulkhead.High, timeout: m.cfgTimeout,
		opts: []bulkhead.Option{bulkhead.WithClass(name), bulkhead.WithPriority(bulkhead.High)}}
	if m.hasBudget {
		r := rapid.Int64Range(0, max(0, c.Limits.ProtectedInFlightTokens-c.InFlightTokens)).Draw(t, "probeTokens")
		probe.res = bulkhead.Reservation{Input: r, Reserved: r}
		probe.opts = append(probe.opts, bulkhead.WithReservation(bulkhead.Reservation{Input: r}))
	}
	if m.rate != nil {
		t.Skip("the rate limits may turn the probe away")
	}
	if m.coolingNow() {
		t.Skip("the model is cooling down")
	}
	if m.fleet != nil && m.fleet.tight {
		t.Skip("the fleet pool may turn the probe away")
	}
	if m.wait && m.ahead(name, bulkhead.High, 0) {
		// First in, first out within the class: the probe would wait
		// behind its class's waiters for capacity.
		t.Skip("waiters of the class ahead")
	}
	if d, why, cons, _ := m.decide(probe); d != admitNow {
		t.Fatalf("FloorProbe: the model rejects (%v %v %v) a call of class %s below its floor in steady state\n%s",
			d, why, cons, name, fmtStats(st))
	}
	m.seen["floor probe"]++
	m.label = "FloorProbe: "
	h := m.call(t, probe, false)
	m.label = ""
	if h.resources != (bulkhead.Resources{}) {
		t.Fatalf("FloorProbe: a call within its class's floors borrowed %+v", h.resources)
	}
}

// drawUsage draws the final usage of h: with exact usage, within its
// reservation; else none, any, or (when invalidOK) invalid. A valid usage
// sometimes carries a breakdown, which the model counts nothing of.
func (m *machine) drawUsage(t *rapid.T, h *hold, invalidOK bool) (u *bulkhead.Usage, invalid bool) {
	if m.exactUsage {
		total := rapid.Int64Range(0, h.res.Reserved).Draw(t, "usageTotal")
		in := rapid.Int64Range(0, total).Draw(t, "usageInput")
		return withBreakdown(t, bulkhead.Usage{Input: in, Output: total - in}), false
	}
	switch rapid.IntRange(0, 4).Draw(t, "usageKind") {
	case 0:
		return nil, false
	case 1:
		if !invalidOK {
			return nil, false
		}
		switch rapid.IntRange(0, 2).Draw(t, "invalidUsage") {
		case 0:
			return &bulkhead.Usage{Input: 3, Output: -1}, true
		case 1:
			return &bulkhead.Usage{Input: 3, Output: 3, CachedInput: 2, CacheCreation: 2}, true
		}
		return &bulkhead.Usage{Input: -1, Output: 3}, true
	}
	return withBreakdown(t, bulkhead.Usage{
		Input:  rapid.Int64Range(0, h.res.Reserved+20).Draw(t, "usageInput"),
		Output: rapid.Int64Range(0, h.res.Reserved+20).Draw(t, "usageOutput"),
	}), false
}

// withBreakdown returns u, sometimes with a valid breakdown filled in.
func withBreakdown(t *rapid.T, u bulkhead.Usage) *bulkhead.Usage {
	if rapid.Bool().Draw(t, "breakdown") {
		u.CachedInput = rapid.Int64Range(0, u.Input).Draw(t, "cachedInput")
		u.CacheCreation = rapid.Int64Range(0, u.Input-u.CachedInput).Draw(t, "cacheCreation")
		u.Reasoning = rapid.Int64Range(0, u.Output).Draw(t, "reasoning")
	}
	return &u
}

// release releases a token (mostly a live one; one in five a double
// release) or lets a running callback finish.
func (m *machine) release(t *rapid.T) {
	var live, dead []*hold
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
		usage, _ := m.drawUsage(t, h, false)
		fail := !m.exactUsage && rapid.IntRange(0, 3).Draw(t, "fail") == 0
		m.finishRun(t, h, fail, usage)
		return
	}
	usage, invalid := m.drawUsage(t, h, true)
	m.descr = fmt.Sprintf("Release %s (class %q released=%v abandoned=%v) usage=%+v", h.id, h.class, h.released, h.abandoned, usage)
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
func (m *machine) finishRun(t *rapid.T, h *hold, fail bool, usage *bulkhead.Usage) {
	m.descr = fmt.Sprintf("Finish Run %s (class %q resources %+v deadline %v abandoned=%v expired=%v) fail=%v usage=%+v",
		h.id, h.class, h.resources, h.w.deadline, h.abandoned, h.expired, fail, usage)
	rep := m.command(t, h, command{usage: usage, fail: fail})
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
		m.awaitReturn(t, h.w, fail)
	} else {
		// Run returned at the deadline; the late callback's settlement still
		// releases the admission (its tokens) when it returns, and settles
		// its usage on the rates: on a remote store, on a goroutine of its
		// own that nobody waits for, so the check waits for it too.
		err := spinUntil("the late callback's release", func() (bool, error) {
			st := m.b.Stats()
			return st.Calls.Released == m.calls.Released && m.rate.settledIn(st.Rate, m.rateStats), nil
		})
		if err != nil {
			t.Fatalf("%s: %v", m.descr, err)
		}
		select {
		case d := <-h.w.run.done:
			t.Fatalf("%s: Run returned a second time: %d, %v", m.descr, d.v, d.err)
		default:
		}
	}
	m.awaitAll(t, es)
	if h.expired {
		m.awaitBookings(t)
	}
}

// abandon calls AbandonBorrowedConcurrency on a token (released or not,
// borrowed or not) or from a running callback: it is effective at most once,
// and only for a borrowed, unreleased admission (F19).
func (m *machine) abandon(t *rapid.T) {
	if m.fleet.tightWithWaiters() {
		t.Skip("the abandon's fleet adjustment would race the reserve of the call it lets in")
	}
	// Mostly an admission that can abandon; else any token or running
	// callback, where abandoning must do nothing.
	var pool, effective []*hold
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
	m.descr = fmt.Sprintf("Abandon %s (class %q resources %+v released=%v abandoned=%v run=%v)", h.id, h.class, h.resources,
		h.released, h.abandoned, h.tok == nil)
	var got bool
	if h.tok != nil {
		got = h.tok.AbandonBorrowedConcurrency()
	} else {
		got = m.command(t, h, command{abandon: true}).abandoned
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

// advance moves the clock past queue timeouts (F3) and borrowed-slot
// deadlines (F20). Timeouts that fire together only take waiters out of
// the queue, so any number may. A deadline's abandon admits waiters, whose
// own deadlines start from the clock's reading then, and several deadlines
// expiring at once abandon in an order the engine does not fix: so with
// waiters queued the clock stops short of the next deadline or exactly on
// it, one deadline at a time, and never fires a queue timeout with it (which
// of the two the engine sees first is a race). With nobody queued an
// abandon admits nobody, so the clock may jump past any number of deadlines.
func (m *machine) advance(t *rapid.T) {
	now := m.clk.Now()
	var next, last, qNext time.Time
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
	for _, w := range m.queue {
		if !w.expires.IsZero() && (qNext.IsZero() || w.expires.Before(qNext)) {
			qNext = w.expires
		}
	}
	if !next.IsZero() && !next.After(now) {
		t.Fatalf("a live deadline at %v is not after now %v", next, now)
	}
	queued := len(m.queue)
	ms := func(d time.Duration) int { return int(d / time.Millisecond) }
	var d time.Duration
	switch {
	case next.IsZero() && rapid.Bool().Draw(t, "halfUnits"):
		d = time.Duration(rapid.IntRange(1, 7).Draw(t, "advanceHalfUnits")) * unit / 2
	case next.IsZero():
		d = time.Duration(rapid.IntRange(1, 30).Draw(t, "advanceMs")) * time.Millisecond
	case queued == 0 && rapid.IntRange(0, 2).Draw(t, "expire") > 0:
		d = time.Duration(rapid.IntRange(ms(next.Sub(now)), ms(last.Sub(now))+10).Draw(t, "pastMs")) * time.Millisecond
	case queued == 0:
		d = time.Duration(rapid.IntRange(1, ms(last.Sub(now))+10).Draw(t, "advanceMs")) * time.Millisecond
	case next.Sub(now) >= 2*time.Millisecond && rapid.IntRange(0, 2).Draw(t, "expire") == 0:
		d = time.Duration(rapid.IntRange(1, ms(next.Sub(now))-1).Draw(t, "shortMs")) * time.Millisecond
	default:
		d = next.Sub(now)
	}
	if m.toPacedTimer {
		// To the next turn, or the end of the cool-down the cooling line
		// waits for.
		if w := m.nextTurn(); w != nil && (!m.holdPending || w.turnAt.Before(m.holdAt)) {
			d = max(d, w.turnAt.Sub(now))
		} else if m.holdPending {
			d = max(d, m.holdAt.Sub(now))
		}
	}
	if target := now.Add(d); queued > 0 && !next.IsZero() && !next.After(target) && !qNext.IsZero() && !qNext.After(target) {
		// Only the timeouts, then.
		d = qNext.Sub(now)
		if !qNext.Before(next) {
			d = next.Sub(now) - time.Millisecond
		}
		if d <= 0 {
			t.Skip("a queue timeout and a deadline at once")
		}
	}
	target := now.Add(d)
	holdFires := false
	if m.holdPending && !m.holdAt.After(target) {
		// The engine's hold timer fires: the clock stops there.
		target, d, holdFires = m.holdAt, m.holdAt.Sub(now), true
	}
	// A paced call's turn, one at a time: the clock stops there.
	var turn *waiter
	if w := m.nextTurn(); w != nil && !w.turnAt.After(target) {
		switch {
		case holdFires && m.holdAt.Equal(w.turnAt):
			t.Skip("a turn and the hold timer at once")
		case holdFires && m.holdAt.Before(w.turnAt):
			// The hold timer first; the turn in a later step.
		default:
			turn, target, d, holdFires = w, w.turnAt, w.turnAt.Sub(now), false
		}
	}
	var due []*hold
	for _, h := range m.holds {
		if h.deadlineLive() && !h.deadlineAt.After(target) {
			due = append(due, h)
		}
	}
	if len(due) > 1 && queued > 0 {
		t.Skip("simultaneous deadlines with waiters queued")
	}
	if (m.wait || m.fleet.tightWithWaiters()) && queued > 0 && len(due) > 0 {
		// A deadline's abandon and a timeout both pump, in an order the
		// test cannot know; in a tight fleet run, the abandon's fleet
		// adjustment would race the reserve of the call it lets in.
		d = min(d, next.Sub(now)-time.Millisecond)
		if d <= 0 {
			t.Skip("a deadline with waiters for capacity queued")
		}
		target, due = now.Add(d), nil
	}
	var timedOut []*waiter
	for _, w := range m.queue {
		if !w.expires.IsZero() && !w.expires.After(target) {
			timedOut = append(timedOut, w)
		}
	}
	if m.wait && len(timedOut) > 1 {
		// Each timeout pumps the queue, and a waiter that another's timeout
		// lets through is admitted before its own timeout fires: which of
		// them fire first is a race.
		t.Skip("simultaneous queue timeouts with waiting for capacity")
	}
	if m.wait && len(timedOut) == 1 {
		// The timeout's pump may admit a waiter for capacity: the clock
		// stops at the timeout, so that the admission's queue wait is known.
		target = timedOut[0].expires
		d = target.Sub(now)
	}
	// A follower's own wait bound ending at the same time as a leader's
	// queue timeout or deadline would race with the leader's outcome.
	expiring := m.expiringFollowers(target)
	if len(expiring) > 0 && len(due)+len(timedOut) > 0 {
		t.Skip("a follower's wait bound with a timeout or deadline")
	}
	if (holdFires || turn != nil) && len(due)+len(timedOut)+len(expiring) > 0 {
		t.Skip("the hold timer or a turn with another timer at once")
	}
	m.descr = fmt.Sprintf("Advance %v past %d deadline(s), %d queue timeout(s) and %d follower wait(s), %d queued, %d paced waiting (a turn: %v, the hold timer: %v)",
		d, len(due), len(timedOut), len(expiring), queued, len(m.parked), turn != nil, holdFires)
	m.waitTimers(t)
	if len(due) == 0 {
		m.tokensFrozen = true
	}
	m.clk.Add(d)
	m.queue = slices.DeleteFunc(m.queue, func(w *waiter) bool { return slices.Contains(timedOut, w) })
	var es []expect
	for _, w := range timedOut {
		e := m.reject(w, bulkhead.Timeout, m.global(), true)
		e.reject.pendingSlack = len(timedOut) - 1
		es = append(es, e)
	}
	for _, h := range due {
		h.expired = true
		m.abandonModel(h, bulkhead.AbandonDeadline)
	}
	if holdFires {
		m.holdPending = false
		m.seen["hold timer fired"]++
		es = append(es, m.wakeCooling()...)
	}
	if turn != nil {
		es = append(es, m.turnComes(turn)...)
	}
	if len(due) > 0 || holdFires || len(timedOut) > 0 { // a waiter that leaves has the queue looked at again
		es = append(es, m.pump()...)
	}
	if len(m.stepAdmits) > 0 {
		m.tokensFrozen = false // a turn, or the end of a cool-down, let a paced call in
	}
	if (m.wait || holdFires) && len(due) == 0 && len(es) > len(timedOut) {
		m.tokensFrozen = false // the timeout let a waiter for capacity through
	}
	m.seen[fmt.Sprintf("advance past %d deadlines, %d timeouts, %d queued", min(len(due), 2), min(len(timedOut), 2), min(queued, 1))]++
	for _, h := range due {
		var d runDone
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
	m.waitParked(t)
	for _, f := range expiring {
		m.followerEnds(t, f, bulkhead.Timeout)
		m.seen["dedup follower timeout"]++
	}
}

// drawLimits draws a valid limits snapshot at revision rev.
func (m *machine) drawLimits(t *rapid.T, rev int64) bulkhead.Limits {
	maxConc := 5
	if m.fleet.tightWithWaiters() {
		maxConc = min(maxConc, m.inFlight+1) // one call let in at a time (see model_fleet_test.go)
	}
	l := bulkhead.Limits{
		Revision:      rev,
		MaxConcurrent: rapid.IntRange(0, maxConc).Draw(t, "nextMaxConcurrent"), // 0: a kill switch (F24)
		MaxQueue:      rapid.IntRange(0, 5).Draw(t, "nextMaxQueue"),
	}
	if m.rate != nil {
		l.MaxQueue = 0 // see machine.rate
	}
	budget := int64(-1)
	if m.hasBudget {
		budget = int64(rapid.IntRange(0, 250).Draw(t, "nextBudget"))
		reserve := int64(rapid.IntRange(0, int(budget/2)).Draw(t, "nextReserve"))
		if rapid.IntRange(0, 5).Draw(t, "reserveOverBudget") == 0 {
			// A runtime change may leave the reserve above the budget (F15).
			reserve = budget + int64(rapid.IntRange(1, 50).Draw(t, "reserveExcess"))
		}
		l.TokenBudget = &bulkhead.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
	}
	if m.hasClasses {
		def := ""
		if rapid.Bool().Draw(t, "explicitDefault") {
			def = m.limits.Classes.Default
		}
		// At runtime the floors may exceed the limits: they then shrink.
		tableConc, tableBudget := l.MaxConcurrent, budget
		if rapid.IntRange(0, 2).Draw(t, "overcommitFloors") == 0 {
			tableConc += rapid.IntRange(1, 4).Draw(t, "extraFloors")
			if budget >= 0 {
				tableBudget += int64(rapid.IntRange(1, 150).Draw(t, "extraTokenFloors"))
			}
		}
		l.Classes = &bulkhead.Classes{Default: def, Limits: m.drawTable(t, tableConc, tableBudget)}
	}
	return l
}

// breakLimits makes l invalid in one of many ways (F16, F24) and says how.
// A stale snapshot is stale before it is invalid, except for a negative
// revision, so stale leaves that one out.
func (m *machine) breakLimits(t *rapid.T, l *bulkhead.Limits, stale bool) string {
	type brk struct {
		what string
		do   func()
	}
	breaks := []brk{
		{"negative MaxConcurrent", func() { l.MaxConcurrent = -1 }},
		{"negative MaxQueue", func() { l.MaxQueue = -1 }},
	}
	if !stale {
		breaks = append(breaks, brk{"negative revision", func() { l.Revision = -1 }})
	}
	if m.hasBudget {
		breaks = append(breaks,
			brk{"no budget", func() { l.TokenBudget = nil }},
			brk{"negative budget", func() { l.TokenBudget.Budget = -1 }},
			brk{"negative reserve", func() { l.TokenBudget.HighPriorityReserve = -1 }},
		)
	} else {
		breaks = append(breaks, brk{"a budget", func() { l.TokenBudget = &bulkhead.BudgetLimits{Budget: 50} }})
	}
	if !m.hasClasses {
		breaks = append(breaks, brk{"a class table", func() {
			l.Classes = &bulkhead.Classes{Default: "x", Limits: map[string]bulkhead.ClassLimits{"x": {}}}
		}})
		b := breaks[rapid.IntRange(0, len(breaks)-1).Draw(t, "breakKind")]
		b.do()
		return b.what
	}
	name := m.names[rapid.IntRange(0, len(m.names)-1).Draw(t, "breakClass")]
	cl := l.Classes.Limits[name]
	other := m.names[0]
	if other == m.limits.Classes.Default {
		other = m.names[1]
	}
	breaks = append(breaks,
		brk{"floor above its ceiling", func() {
			c := rapid.IntRange(0, 2).Draw(t, "c")
			cl.MaxConcurrent, cl.ProtectedConcurrent = bulkhead.Ceiling(c), c+1
		}},
		brk{"negative floor", func() { cl.ProtectedConcurrent = -1 }},
		brk{"negative ceiling", func() { cl.MaxConcurrent = bulkhead.Ceiling(-1) }},
		brk{"missing class", func() { delete(l.Classes.Limits, name) }},
		brk{"unknown class", func() { l.Classes.Limits["zzz"] = bulkhead.ClassLimits{} }},
		brk{"another default", func() { l.Classes.Default = other }},
		brk{"unknown default", func() { l.Classes.Default = "nope" }},
		brk{"no class table", func() { l.Classes = nil }},
		brk{"empty class table", func() { l.Classes.Limits = map[string]bulkhead.ClassLimits{} }},
	)
	if m.hasBudget {
		b := l.TokenBudget.Budget
		breaks = append(breaks,
			brk{"token floor above its ceiling", func() {
				c := rapid.Int64Range(0, b).Draw(t, "tc")
				cl.MaxInFlightTokens, cl.ProtectedInFlightTokens = bulkhead.Ceiling(c), c+1
			}},
			brk{"negative token ceiling", func() { cl.MaxInFlightTokens = bulkhead.Ceiling(int64(-1)) }},
		)
	} else {
		breaks = append(breaks,
			brk{"token floor without a budget", func() { cl.ProtectedInFlightTokens = 1 }},
			brk{"token ceiling without a budget", func() { cl.MaxInFlightTokens = bulkhead.Ceiling(int64(5)) }},
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

func (m *machine) applyLimits(t *rapid.T) {
	cur := m.limits.Revision
	m.stepApply = true
	switch kind := rapid.IntRange(0, 5).Draw(t, "applyKind"); kind {
	case 0, 1, 2: // valid and newer
		next := m.drawLimits(t, cur+int64(rapid.IntRange(1, 3).Draw(t, "revStep")))
		m.descr = "ApplyLimits " + fmtLimits(next)
		res, err := m.b.ApplyLimits(next)
		want := next.Clone()
		if want.Classes != nil {
			want.Classes.Default = m.limits.Classes.Default
		}
		if err != nil || !res.Applied || res.Reason != "" || !reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, want) {
			t.Fatalf("%s: = %+v, %v\nprevious %s\nwant current %s\ngot current %s", m.descr, res, err, fmtLimits(m.limits),
				fmtLimits(want), fmtLimits(res.Current))
		}
		m.seen["apply valid"]++
		m.installed(want)
		m.awaitAll(t, append(m.rejectUnfittable(), m.pump()...))
	case 3: // stale: not above the current revision, valid or not
		next := m.drawLimits(t, max(0, cur-int64(rapid.IntRange(0, 2).Draw(t, "staleBy"))))
		broken := ""
		if rapid.Bool().Draw(t, "staleAndInvalid") {
			broken = " and invalid: " + m.breakLimits(t, &next, true)
		}
		m.descr = "ApplyLimits stale" + broken + " " + fmtLimits(next)
		m.tokensFrozen = true
		res, err := m.b.ApplyLimits(next)
		if err != nil || res.Applied || res.Reason != bulkhead.StaleRevision ||
			!reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, m.limits) {
			t.Fatalf("%s: = %+v, %v; want stale_revision with current %s", m.descr, res, err, fmtLimits(m.limits))
		}
		m.seen["apply stale"]++
	default: // invalid, at a newer revision
		next := m.drawLimits(t, cur+1)
		what := m.breakLimits(t, &next, false)
		m.descr = "ApplyLimits invalid: " + what + " " + fmtLimits(next)
		m.tokensFrozen = true
		res, err := m.b.ApplyLimits(next)
		if !isConfigError(err) || res.Applied {
			t.Fatalf("%s: = %+v, %v; want a *ConfigError", m.descr, res, err)
		}
		m.seen["apply invalid"]++
	}
	if l := m.b.Limits(); !reflect.DeepEqual(l, m.limits) {
		t.Fatalf("%s: Limits() = %s, want %s", m.descr, fmtLimits(l), fmtLimits(m.limits))
	}
}

// installed updates the model for an applied snapshot (Default filled in).
func (m *machine) installed(next bulkhead.Limits) {
	m.reconfigs = append(m.reconfigs, bulkhead.ReconfigureEvent{Previous: m.limits.Clone(), Current: next.Clone()})
	m.limits = next.Clone()
}

func (m *machine) setBudget(t *rapid.T) {
	n := int64(rapid.IntRange(-1, 250).Draw(t, "SetBudget"))
	m.descr = fmt.Sprintf("SetBudget %d", n)
	m.stepApply = true
	res, err := m.b.SetBudget(n)
	if !m.hasBudget || n < 0 {
		// No budget, or a negative one. A budget below the token floors is
		// valid: the floors in effect shrink (F16).
		m.tokensFrozen = true
		if !errors.Is(err, bulkhead.ErrInvalid) || res.Applied {
			t.Fatalf("%s: = %+v, %v; want an invalid-input error", m.descr, res, err)
		}
		m.seen["set budget invalid"]++
		return
	}
	next := m.limits.Clone()
	next.Revision++
	next.TokenBudget.Budget = n
	if err != nil || !res.Applied || !reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, next) {
		t.Fatalf("%s: = %+v, %v; want %s", m.descr, res, err, fmtLimits(next))
	}
	m.seen["set budget"]++
	m.installed(next)
	m.awaitAll(t, append(m.rejectUnfittable(), m.pump()...))
}

// wouldAdmit checks the advisory decision and its detail; it changes
// nothing (F23).
func (m *machine) wouldAdmit(t *rapid.T) {
	c := m.drawCall(t, kindWouldAdmit)
	detail := rapid.Bool().Draw(t, "withDetail")
	if detail {
		c.opts = append(c.opts, bulkhead.WithDetail())
	}
	m.descr = fmt.Sprintf("WouldAdmit class=%q prio=%v reserved=%d attempt=%d", c.class, c.prio, c.res.Reserved, c.attempt)
	m.tokensFrozen = true
	d, err := m.b.WouldAdmit(c.req, c.opts...)
	if err != nil {
		t.Fatalf("%s: %v", m.descr, err)
	}
	// F23: closed, capacity, free slot, would queue, else the gate reason;
	// then a cool-down turns away a call the engine would take.
	dec, why, cons, _ := m.decideEngine(c)
	var over *bulkhead.RetryBudgetDetail
	if !m.closed && c.attempt > 0 {
		over = m.retryOver(c.class)
	}
	if over != nil {
		dec, why, cons = rejectNow, bulkhead.RetryBudget, m.retryConstraint(over)
	}
	if dec != rejectNow {
		why, cons = noReason, ""
		room := m.limits.MaxConcurrent > 0 && m.limits.MaxQueue > 0 && len(m.queue) < m.limits.MaxQueue
		if m.coolingNow() && (!m.hold || m.late(m.cfgTimeout) || !room) {
			why = bulkhead.Cooldown
		}
	}
	var rd *bulkhead.RateDetail
	if why == noReason && !m.paced() { // a paced call waits for its turn
		if rd = m.rate.peek(m, c.res); rd != nil {
			why = bulkhead.RateLimit
		}
	}
	if d.Admit != (why == noReason) || d.Reason != why {
		t.Fatalf("%s: = %+v, want reason %q", m.descr, d, why)
	}
	want := m.detailFor(c.class, c.prio, c.res.Reserved, cons, why)
	want.Rate, want.RetryBudget = rd, over
	if why == bulkhead.Cooldown {
		want.Cooldown = m.coolDetail()
	}
	if detail != (d.Detail != nil) || (detail && !reflect.DeepEqual(*d.Detail, want)) {
		t.Fatalf("%s: detail (asked: %v)\n got %s\nwant %s", m.descr, detail, fmtDetail(d.Detail), fmtDetail(&want))
	}
}

func (m *machine) cancel(t *rapid.T) {
	if len(m.queue)+len(m.parked) == 0 {
		t.Skip("nobody queued")
	}
	i := rapid.IntRange(0, len(m.queue)+len(m.parked)-1).Draw(t, "waiter")
	if i >= len(m.queue) {
		w := m.parked[i-len(m.queue)]
		m.descr = fmt.Sprintf("Cancel %v waiting (%v)", w, w.park)
		m.tokensFrozen = true
		e := m.cancelParked(w)
		w.cancel()
		m.awaitAll(t, []expect{e})
		m.waitParked(t)
		return
	}
	w := m.queue[i]
	m.descr = fmt.Sprintf("Cancel %v", w)
	m.tokensFrozen = true
	m.queue = slices.Delete(m.queue, i, i+1)
	e := m.reject(w, bulkhead.Aborted, "", true)
	es := append([]expect{e}, m.pump()...) // the queue is looked at again
	m.tokensFrozen = len(es) == 1
	w.cancel()
	m.awaitAll(t, es)
}

// invalid makes a call with invalid input: each is a *ConfigError, never a
// rejection, and changes nothing (SPEC conventions and section D, F5, F10,
// F16, F20, F23).
func (m *machine) invalid(t *rapid.T) {
	ok := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "x"}}}
	acquire := func(req *bulkhead.Request, opts ...bulkhead.Option) func() (*token, error) {
		return func() (*token, error) { return m.b.Acquire(context.Background(), req, opts...) }
	}
	run := func(opts ...bulkhead.Option) func() (*token, error) {
		return func() (*token, error) {
			_, err := bulkhead.Run(context.Background(), m.b, ok, func(context.Context, *bulkhead.RunContext) (int, error) {
				return 0, errors.New("ran")
			}, opts...)
			return nil, err
		}
	}
	wouldAdmit := func(opts ...bulkhead.Option) func() (*token, error) {
		return func() (*token, error) {
			_, err := m.b.WouldAdmit(ok, opts...)
			return nil, err
		}
	}
	cases := []struct {
		name string
		do   func() (*token, error)
	}{
		{"nil request", acquire(nil)},
		{"negative MaxTokens", acquire(&bulkhead.Request{MaxTokens: -1})},
		{"negative ExtraInputTokens", acquire(&bulkhead.Request{ExtraInputTokens: -1})},
		{"negative queue timeout", acquire(ok, bulkhead.WithQueueTimeout(-unit))},
		{"WithDetail on Acquire", acquire(ok, bulkhead.WithDetail())},
		{"unknown priority", acquire(ok, bulkhead.WithPriority(bulkhead.Priority(7)))},
		{"inconsistent reservation", acquire(ok, bulkhead.WithReservation(bulkhead.Reservation{Input: 1, MaxOutput: 1, Reserved: 3}))},
		{"negative reservation", acquire(ok, bulkhead.WithReservation(bulkhead.Reservation{MaxOutput: -1}))},
		{"Acquire with an unknown class", acquire(ok, bulkhead.WithClass("nope"))},
		{"Acquire with a borrowed deadline", acquire(ok, bulkhead.WithBorrowedDeadline(time.Second))},
		{"Run with an unknown class", run(bulkhead.WithClass("nope"))},
		{"Run with a zero deadline", run(bulkhead.WithBorrowedDeadline(0))},
		{"Run with a sub-millisecond deadline", run(bulkhead.WithBorrowedDeadline(time.Millisecond - 1))},
		{"Run with a deadline above the maximum", run(bulkhead.WithBorrowedDeadline(bulkhead.MaxBorrowedDeadline + time.Millisecond))},
		{"WithDetail on Run", run(bulkhead.WithDetail())},
		{"WouldAdmit with an unknown class", wouldAdmit(bulkhead.WithClass("nope"))},
		{"WouldAdmit with a queue timeout", wouldAdmit(bulkhead.WithQueueTimeout(unit))},
		{"Acquire in observe mode", acquire(ok, bulkhead.WithMode(bulkhead.Observe))},
		{"WouldAdmit in observe mode", wouldAdmit(bulkhead.WithMode(bulkhead.Observe))},
		{"Run with an unknown mode", run(bulkhead.WithMode(bulkhead.Mode(3)))},
		{"Run shadowing aborted", run(bulkhead.WithMode(bulkhead.Observe), bulkhead.WithShadowReasons(bulkhead.Timeout, bulkhead.Aborted))},
		{"Run shadowing shutdown", run(bulkhead.WithMode(bulkhead.Observe), bulkhead.WithShadowReasons(bulkhead.Shutdown))},
		{"Run with shadow reasons in enforce mode", run(bulkhead.WithShadowReasons(bulkhead.Timeout))},
	}
	c := cases[rapid.IntRange(0, len(cases)-1).Draw(t, "invalidCase")]
	m.descr = "Invalid: " + c.name
	m.tokensFrozen = true
	tok, err := c.do()
	discard(tok)
	if tok != nil || !isConfigError(err) {
		t.Fatalf("%s: admitted %v, %v; want a *ConfigError", m.descr, tok != nil, err)
	}
	m.seen["invalid "+c.name]++
}

// drainDoneCtx calls Drain with a context that has already ended: it
// reports what is outstanding, abandoned admissions and deduplicated keys
// in flight included, and cancels nothing (F33, I3).
func (m *machine) drainDoneCtx(t *rapid.T) {
	live := m.calls.Admitted - m.calls.Released
	bypassed := int(m.observe.InFlight)
	keys := int(m.activeKeys())
	idle := m.idle()
	if idle && m.closed {
		// A drained, closed bulkhead stops event delivery; that is the
		// final Drain's job (see TestDrainDoneCtxOnClosedIdleKeepsEvents).
		t.Skip("closed and idle")
	}
	m.descr = "Drain(done ctx)"
	m.tokensFrozen = true
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := m.b.Drain(ctx)
	want := bulkhead.DrainResult{Drained: idle}
	if !idle {
		want.InFlight, want.Pending, want.Bypassed, want.DedupActive = int(live), len(m.queue)+len(m.parked), bypassed, keys
	}
	if res != want || (idle && err != nil) || (!idle && !errors.Is(err, context.Canceled)) {
		t.Fatalf("%s: = %+v, %v; want %+v", m.descr, res, err, want)
	}
	m.noStray(t)
}

// idle reports whether the model has nothing outstanding: no admission
// unreleased, nobody queued or parked, no bypassed call running and no
// deduplicated key in flight.
func (m *machine) idle() bool {
	return m.calls.Admitted == m.calls.Released && len(m.queue)+len(m.parked) == 0 && m.observe.InFlight == 0 && m.activeKeys() == 0
}

// awaitBookings waits until no release's settlement on rates kept in Redis
// is still being made. A settlement that gives nothing back (its buckets
// had drained) moves no rate statistic, so Stats cannot tell it has
// landed; until it has, a later call's rate check may book first, and the
// give-back then takes back part of that call's weight, which the model,
// having settled first, does not. Drain, asked with a context that has
// already ended, counts such settlements in InFlight beside the
// admissions not yet released. On a closed bulkhead with nothing else
// outstanding that Drain would end event delivery (the final Drain's job),
// and nothing books a rate there any more: the settlement, whenever it
// lands, finds the buckets as the model did.
func (m *machine) awaitBookings(t *rapid.T) {
	if m.rate == nil || m.rate.cfg.Store == nil || (m.closed && m.idle()) {
		return
	}
	live := int(m.calls.Admitted - m.calls.Released)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	err := spinUntil("the rate settlements on Redis", func() (bool, error) {
		res, _ := m.b.Drain(done)
		return res.InFlight == live, nil
	})
	if err != nil {
		t.Fatalf("%s: %v", m.descr, err)
	}
}

// closeLate is the Close action: early in a run it asks WouldAdmit instead,
// so that most of a run happens open, and what follows a Close is still
// exercised in many runs.
func (m *machine) closeLate(t *rapid.T) {
	if m.steps < 45 || rapid.IntRange(0, 2).Draw(t, "closeNow") > 0 {
		m.wouldAdmit(t)
		return
	}
	m.seen["close"]++
	m.close(t)
}

// close closes the bulkhead: the queue is rejected shutdown (F33).
func (m *machine) close(t *rapid.T) {
	m.descr = "Close"
	m.tokensFrozen = true
	var es []expect
	if !m.closed {
		for _, w := range m.queueOrder() {
			m.queue = slices.DeleteFunc(m.queue, func(x *waiter) bool { return x == w })
			es = append(es, m.reject(w, bulkhead.Shutdown, "", true))
		}
		es = append(es, m.closeParked()...)
	}
	m.closed = true
	m.b.Close()
	m.awaitAll(t, es)
}

// cmpHighFirst orders High priority before Normal.
func cmpHighFirst(a, b bulkhead.Priority) int {
	switch {
	case a == b:
		return 0
	case a == bulkhead.High:
		return -1
	}
	return 1
}

// feedback reports a provider answer: a 429 with a Retry-After, which
// cools the model down until then (a longer cool-down running stands), or
// a success, which changes nothing the model sees (the limits are
// pinned).
func (m *machine) feedback(t *rapid.T) {
	f := bulkhead.Feedback{Outcome: bulkhead.OutcomeSuccess}
	if rapid.IntRange(0, 3).Draw(t, "feedback429") > 0 {
		f = bulkhead.Feedback{Outcome: bulkhead.OutcomeRateLimited, RetryAfter: time.Duration(rapid.IntRange(1, 8).Draw(t, "retryAfterHalfUnits")) * unit / 2}
	}
	m.descr = fmt.Sprintf("Feedback %v retry-after %v", f.Outcome, f.RetryAfter)
	m.tokensFrozen = true
	if err := m.b.Feedback(f); err != nil {
		t.Fatalf("%s: %v", m.descr, err)
	}
	if f.RetryAfter > 0 {
		m.coolStarted++
		if end := m.clk.Now().Add(f.RetryAfter); end.After(m.coolUntil) {
			m.coolUntil = end
		}
		m.seen["feedback 429"]++
		if m.paced() {
			m.awaitAll(t, m.coolTurns())
			m.waitParked(t)
		}
	}
}
