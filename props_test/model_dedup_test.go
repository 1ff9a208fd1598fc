package props_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
)

// Deduplication in the state machine: Runs that lead a key, followers that
// join them (while they queue or run), followers cancelled or timed out on
// their own, and invariant I9: one execution per in-flight key, followers
// share the leader's outcome, a follower's end never touches its leader.
//
// Only the dedup steps' requests have a key (KeyFunc returns "" for every
// other request), so the other steps run as without deduplication.

// dedupKeys is the KeyFunc's table: each dedup step's request and its key.
type dedupKeys struct{ m sync.Map }

func (k *dedupKeys) keyFunc(r *bulkhead.Request) string {
	if v, ok := k.m.Load(r); ok {
		return v.(string)
	}
	return ""
}

// dedupGroup is one leader and the followers that joined it.
type dedupGroup struct {
	key, scope string
	class      string
	// prio, resOpt and attempt are the leader's priority, WithReservation
	// and attempt number, which its followers share (dedup partitions by
	// them, and by whether a call is a retry).
	prio      bulkhead.Priority
	resOpt    bulkhead.Option
	attempt   int
	leader    *waiter
	followers []*follower
	done      bool // the leader's Run returned and the followers were checked
}

// follower is one follower Run.
type follower struct {
	w       *waiter
	g       *dedupGroup
	expires time.Time // its own wait bound; zero: none
	ended   bool
}

// liveGroups is the groups whose leader's Run has not returned.
func (m *machine) liveGroups() []*dedupGroup {
	var out []*dedupGroup
	for _, g := range m.groups {
		if !g.done {
			out = append(out, g)
		}
	}
	return out
}

// dedupLead makes a Run with a key of its own, so it leads: it is admitted,
// queued or rejected as any Run.
func (m *machine) dedupLead(t *rapid.T) {
	c := m.drawCall(t, kindRun)
	m.nextKey++
	g := &dedupGroup{key: fmt.Sprintf("key-%d", m.nextKey), scope: rapid.SampledFrom([]string{"", "tenant"}).Draw(t, "scope"), class: c.class, prio: c.prio, resOpt: c.resOpt, attempt: c.attempt}
	if g.scope != "" {
		c.opts = append(c.opts, bulkhead.WithDedupScope(g.scope))
	}
	m.keys.m.Store(c.req, g.key)
	m.label = "DedupLead: "
	m.call(t, c, true)
	m.label = ""
	if !c.ctxDone { // a done context joins nothing: rejected at once
		g.leader = m.all[len(m.all)-1]
		m.groups = append(m.groups, g)
		m.seen["dedup lead"]++
	}
}

// dedupFollow makes a Run identical to a live leader's: it joins, holds
// nothing, and changes no counter but Stats().Dedup.Hits.
func (m *machine) dedupFollow(t *rapid.T) {
	if m.closed {
		// After Close nothing joins: the call is rejected Shutdown as any
		// Run is, which the other actions cover.
		t.Skip("closed: nothing joins")
	}
	live := m.liveGroups()
	if len(live) == 0 {
		m.dedupLead(t) // a leader for the next follow
		return
	}
	g := live[rapid.IntRange(0, len(live)-1).Draw(t, "group")]
	c := call{req: newRequest(), class: g.class}
	if m.hasClasses {
		c.opts = append(c.opts, bulkhead.WithClass(g.class))
	}
	if g.scope != "" {
		c.opts = append(c.opts, bulkhead.WithDedupScope(g.scope))
	}
	// The leader's priority and reservation override: only calls with
	// equal ones share.
	c.prio, c.resOpt = g.prio, g.resOpt
	if c.prio == bulkhead.High || rapid.Bool().Draw(t, "explicitNormal") {
		c.opts = append(c.opts, bulkhead.WithPriority(c.prio))
	}
	if c.resOpt != nil {
		c.opts = append(c.opts, c.resOpt)
	}
	if c.attempt = g.attempt; c.attempt > 0 {
		c.opts = append(c.opts, bulkhead.WithAttempt(c.attempt))
	}
	f := &follower{g: g}
	if k := rapid.IntRange(-1, 3).Draw(t, "followerTimeoutUnits"); k >= 0 {
		// Only an explicit timeout bounds a follower's wait; 0 is none.
		c.timeout = time.Duration(k) * unit
		c.opts = append(c.opts, bulkhead.WithQueueTimeout(c.timeout))
	}
	m.keys.m.Store(c.req, g.key)
	m.descr = fmt.Sprintf("DedupFollow %s of waiter %d timeout=%v", g.key, g.leader.id, c.timeout)
	m.tokensFrozen, m.capacityFrozen = true, true
	f.w = m.start(c, true)
	g.followers = append(g.followers, f)
	m.hits++
	err := spinUntil("the follower joining", func() (bool, error) {
		if o, ok := m.poll(f.w); ok {
			f.w.failAdmitted(o)
			return false, fmt.Errorf("the follower ended (err %v), want it following", o.err)
		}
		return m.b.Stats().Dedup.Hits == m.hits, nil
	})
	if err != nil {
		t.Fatalf("%s: %v", m.descr, err)
	}
	if c.timeout > 0 {
		f.expires = m.clk.Now().Add(c.timeout)
		m.timers++
	}
	m.dedupEvents = append(m.dedupEvents, bulkhead.DedupEvent{Request: c.req, Class: g.class, Scope: g.scope})
	m.seen[fmt.Sprintf("dedup follow leader-queued=%v", slices.Contains(m.queue, g.leader))]++
}

// liveFollowers is the followers still waiting.
func (m *machine) liveFollowers() []*follower {
	var out []*follower
	for _, g := range m.liveGroups() {
		for _, f := range g.followers {
			if !f.ended {
				out = append(out, f)
			}
		}
	}
	return out
}

// dedupCancel cancels a follower's context: it alone is rejected Aborted,
// without detail; its leader and the other followers go on.
func (m *machine) dedupCancel(t *rapid.T) {
	fs := m.liveFollowers()
	if len(fs) == 0 {
		t.Skip("no follower waiting")
	}
	f := fs[rapid.IntRange(0, len(fs)-1).Draw(t, "follower")]
	m.descr = fmt.Sprintf("DedupCancel follower %d of %s", f.w.id, f.g.key)
	m.tokensFrozen = true
	f.w.cancel()
	m.followerEnds(t, f, bulkhead.Aborted)
	m.seen["dedup cancel"]++
}

// followerEnds waits for f's own rejection for why and counts it: a
// rejection of the call, never at the gate, with a reject event without
// detail.
func (m *machine) followerEnds(t *rapid.T, f *follower, why bulkhead.Reason) {
	t.Helper()
	f.ended = true
	m.calls.Rejected++
	inc(&m.calls.RejectedByReason, why)
	k := m.cls[f.w.class]
	k.st.Rejected++
	inc(&k.st.RejectedByReason, why)
	m.rejects[f.w.req] = &rejectWant{follower: true, ev: bulkhead.RejectEvent{
		Admission: bulkhead.Admission{Request: f.w.req, Attempt: f.w.attempt, LimitRevision: m.limits.Revision, Priority: f.w.prio, Class: f.w.class},
		Reason:    why,
	}}
	d := m.runReturn(t, f.w)
	rej := wantReason(t, d.err, why)
	if rej.Detail != nil || (why == bulkhead.Aborted && !errors.Is(d.err, context.Canceled)) {
		t.Fatalf("%s: follower ended with %v (detail %s)", m.descr, d.err, fmtDetail(rej.Detail))
	}
}

// runReturn waits for the Run of w to return.
func (m *machine) runReturn(t *rapid.T, w *waiter) runDone {
	t.Helper()
	select {
	case d := <-w.run.done:
		return d
	case <-time.After(settle):
		t.Fatalf("%s: the Run of waiter %d did not return", m.descr, w.id)
	}
	return runDone{}
}

// expiringFollowers is the live followers whose own wait ends by target.
func (m *machine) expiringFollowers(target time.Time) []*follower {
	var out []*follower
	for _, f := range m.liveFollowers() {
		if !f.expires.IsZero() && !f.expires.After(target) {
			out = append(out, f)
		}
	}
	return out
}

// settleGroups checks the groups whose leader's Run has returned (I9):
// every follower still waiting returns the leader's outcome, no follower's
// fn ever ran, and no follower of a live leader has returned.
func (m *machine) settleGroups(t *rapid.T) {
	for _, g := range m.groups {
		if g.done {
			continue
		}
		for _, f := range g.followers {
			select {
			case s := <-f.w.run.started:
				t.Fatalf("I9: follower %d of %s ran its fn (%+v)", f.w.id, g.key, s)
			default:
			}
		}
		ld := g.leader.last.Load()
		if ld == nil {
			for _, f := range g.followers {
				if f.ended {
					continue
				}
				if o, ok := m.poll(f.w); ok {
					t.Fatalf("I9: follower %d of %s returned (%v) while its leader is in flight (%s)", f.w.id, g.key, o.err, m.descr)
				}
			}
			continue
		}
		g.done = true
		for _, f := range g.followers {
			if f.ended {
				continue
			}
			f.ended = true
			d := m.runReturn(t, f.w)
			if !sameOutcome(*ld, d) {
				t.Fatalf("I9: follower %d of %s returned %d, %v; its leader %d, %v", f.w.id, g.key, d.v, d.err, ld.v, ld.err)
			}
			// A copy of the leader's own Aborted or Timeout says it is the
			// leader's, and never matches the leader's context error.
			var lr *bulkhead.RejectedError
			own := errors.As(ld.err, &lr) && (lr.Reason == bulkhead.Aborted || lr.Reason == bulkhead.Timeout)
			if errors.Is(d.err, bulkhead.ErrLeaderRejected) != own || (own && errors.Is(d.err, context.Canceled)) {
				t.Fatalf("follower %d of %s returned %v for its leader's %v", f.w.id, g.key, d.err, ld.err)
			}
			m.seen[fmt.Sprintf("dedup shared %s", outcomeKind(*ld))]++
		}
	}
}

// sameOutcome reports whether a follower's return d is its leader's l: the
// value, or the same error (a rejection of the same reason and detail, the
// same deadline error).
func sameOutcome(l, d runDone) bool {
	if l.err == nil || d.err == nil {
		return l.err == nil && d.err == nil && l.v == d.v
	}
	var lr, dr *bulkhead.RejectedError
	if errors.As(l.err, &lr) {
		return errors.As(d.err, &dr) && dr.Reason == lr.Reason && reflect.DeepEqual(dr.Detail, lr.Detail)
	}
	var ld, dd *bulkhead.BorrowedDeadlineError
	if errors.As(l.err, &ld) {
		return errors.As(d.err, &dd) && dd.AdmissionID == ld.AdmissionID
	}
	return errors.Is(d.err, errCallback) && errors.Is(l.err, errCallback)
}

func outcomeKind(d runDone) string {
	var rej *bulkhead.RejectedError
	switch {
	case d.err == nil:
		return "value"
	case errors.As(d.err, &rej):
		return "rejection " + rej.Reason.String()
	case errors.Is(d.err, bulkhead.ErrBorrowedDeadline):
		return "deadline"
	}
	return "error"
}

// activeKeys is the model's Stats().Dedup.Active.
func (m *machine) activeKeys() int64 {
	var n int64
	for _, g := range m.groups {
		if g.leader.last.Load() == nil {
			n++
		}
	}
	return n
}

// checkDedupEvents checks one Dedup event per follower, in join order.
func (m *machine) checkDedupEvents(t *rapid.T, st bulkhead.Stats) {
	if st.Dedup == nil {
		return
	}
	m.ev.mu.Lock()
	defer m.ev.mu.Unlock()
	if int64(len(m.ev.dedups)) != st.Dedup.Hits || !reflect.DeepEqual(m.ev.dedups, m.dedupEvents) && len(m.dedupEvents) > 0 {
		t.Fatalf("dedup events\n got %v\nwant %v (hits %d)", m.ev.dedups, m.dedupEvents, st.Dedup.Hits)
	}
}
