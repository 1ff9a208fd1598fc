package props_test

import (
	"fmt"
	"reflect"
	"strings"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
)

// Observe mode in the state machine: Runs that may be bypassed instead of
// rejected, the steps of bypassed callbacks, and invariant I10: bypassed
// work never changes a capacity counter, and hard reasons are never
// bypassed.

// reasonSet is a set of shadow reasons.
type reasonSet uint16

func (s reasonSet) has(r bulkhead.Reason) bool { return s&(1<<r) != 0 }

func (s reasonSet) String() string {
	var names []string
	for _, r := range shadowable {
		if s.has(r) {
			names = append(names, r.String())
		}
	}
	return "[" + strings.Join(names, " ") + "]"
}

// shadowable is the reasons observe mode may bypass, and its default set.
var shadowable = []bulkhead.Reason{bulkhead.BudgetLimit, bulkhead.ConcurrencyLimit, bulkhead.QueueLimit, bulkhead.Timeout}

// bypassRun is one bypassed call the model knows of.
type bypassRun struct {
	w      *waiter
	id     bulkhead.ID
	why    bulkhead.Reason
	race   bool
	rev    int64
	detail *rejectWant // the refusal's detail, with a race's tolerances

	seq      int64
	last     bulkhead.Usage // cumulative, clamped
	lastRaw  bulkhead.Usage // as last reported: valid, unlike last may be
	reported bool
	released bool
	// The events it must have emitted.
	usages  []bulkhead.BypassUsageEvent
	release *bulkhead.BypassReleaseEvent
}

// admission is the identity b's events carry.
func (b *bypassRun) admission() bulkhead.Admission {
	return bulkhead.Admission{ID: b.id, Request: b.w.req, Attempt: b.w.attempt, Priority: b.w.prio, Class: b.w.class, LimitRevision: b.rev, Reserved: b.w.res.Reserved}
}

// observeRun makes an observe-mode Run: with the default shadow reasons,
// some of them, or none.
func (m *machine) observeRun(t *rapid.T) {
	c := m.drawCall(t, kindRun)
	c.observe = true
	c.opts = append(c.opts, bulkhead.WithMode(bulkhead.Observe))
	switch rapid.IntRange(0, 3).Draw(t, "shadowKind") {
	case 0, 1:
		for _, r := range shadowable {
			c.shadow |= 1 << r
		}
	case 2:
		var rs []bulkhead.Reason
		for _, r := range shadowable {
			if rapid.Bool().Draw(t, "shadow "+r.String()) {
				rs = append(rs, r)
				c.shadow |= 1 << r
			}
		}
		c.opts = append(c.opts, bulkhead.WithShadowReasons(rs...))
	default:
		c.opts = append(c.opts, bulkhead.WithShadowReasons())
	}
	m.call(t, c, true)
}

// bypass records that w is bypassed for why (race: after its rejection)
// and returns the call the model expects to run.
func (m *machine) bypass(w *waiter, why bulkhead.Reason, race bool, detail *rejectWant) *bypassRun {
	m.observe.Bypassed++
	if race {
		m.observe.RaceBypassed++
	}
	inc(&m.observe.BypassedByReason, why)
	m.observe.InFlight++
	m.seen[fmt.Sprintf("bypass %v race=%v", why, race)]++
	return &bypassRun{w: w, why: why, race: race, rev: m.limits.Revision, detail: detail}
}

// adoptBypass checks what a bypassed callback saw of itself and records it.
func (m *machine) adoptBypass(t *rapid.T, b *bypassRun, o ended) {
	t.Helper()
	w := b.w
	if o.start == nil {
		t.Fatalf("%v: %v, want it bypassed for %v (race %v) (%s)\nmodel detail %s", w, o.err, b.why, b.race, m.descr,
			fmtDetail(b.detail.ev.Detail))
	}
	s := o.start
	if s.bypass == nil || s.bypass.Reason != b.why || s.bypass.Race != b.race {
		t.Fatalf("%v: Bypass() = %+v, want reason %v race %v (%s)", w, s.bypass, b.why, b.race, m.descr)
	}
	if !b.detail.matches(s.bypass.Detail) {
		t.Fatalf("%v bypassed for %v (%s) with detail\n got %s\nwant %s", w, b.why, m.descr, fmtDetail(s.bypass.Detail),
			fmtDetail(b.detail.ev.Detail))
	}
	a := s.admissionView
	if a.rev != b.rev || a.prio != w.prio || a.class != w.class || a.resources != (bulkhead.Resources{}) ||
		m.hasBudget != (a.res != nil) || (a.res != nil && *a.res != w.res) || s.ctxErr != nil {
		t.Fatalf("%v bypassed with %+v (ctx %v), want revision %d, no resources, reservation %+v (%s)", w, a, s.ctxErr, b.rev, w.res, m.descr)
	}
	if !strings.HasPrefix(a.id.String(), "shadow-") {
		t.Fatalf("%v: bypass ID %s", w, a.id)
	}
	for _, other := range m.bypassed {
		if other.id == a.id {
			t.Fatalf("bypass ID %s minted twice", a.id)
		}
	}
	b.id = a.id
	m.bypassed = append(m.bypassed, b)
}

// bypassStep drives a bypassed callback: it reports usage (sometimes stale,
// sometimes progressive), tries to abandon a slot it does not hold, or
// finishes, failing or with usage set. None of it changes a capacity
// counter.
func (m *machine) bypassStep(t *rapid.T) {
	var live []*bypassRun
	for _, b := range m.bypassed {
		if !b.released {
			live = append(live, b)
		}
	}
	if len(live) == 0 {
		t.Skip("no bypassed call running")
	}
	b := live[rapid.IntRange(0, len(live)-1).Draw(t, "bypassed")]
	m.tokensFrozen, m.capacityFrozen = true, true
	switch rapid.IntRange(0, 3).Draw(t, "bypassAction") {
	case 0, 1:
		m.bypassReport(t, b)
	case 2:
		m.descr = fmt.Sprintf("Abandon bypassed %s", b.id)
		if m.command(t, &hold{w: b.w}, command{abandon: true}).abandoned {
			t.Fatalf("%s: abandoned a slot it does not hold", m.descr)
		}
	default:
		var u *bulkhead.Usage
		if rapid.Bool().Draw(t, "bypassFinalUsage") {
			u = withBreakdown(t, bulkhead.Usage{
				Input:  rapid.Int64Range(0, 30).Draw(t, "usageInput"),
				Output: rapid.Int64Range(0, 30).Draw(t, "usageOutput"),
			})
		}
		m.finishBypass(t, b, rapid.IntRange(0, 3).Draw(t, "fail") == 0, u)
	}
}

// bypassReport reports cumulative usage from b's callback and checks the
// report: it holds nothing, and only a change takes the next sequence.
func (m *machine) bypassReport(t *rapid.T, b *bypassRun) {
	u := b.lastRaw // clamps to last: a stale report
	if !b.reported || rapid.IntRange(0, 3).Draw(t, "staleReport") > 0 {
		u = *withBreakdown(t, bulkhead.Usage{
			Input:  rapid.Int64Range(0, 30).Draw(t, "reportInput"),
			Output: rapid.Int64Range(0, 30).Draw(t, "reportOutput"),
		})
	}
	var prog *bulkhead.Progressive
	if rapid.IntRange(0, 3).Draw(t, "progressive") == 0 {
		prog = &bulkhead.Progressive{RemainingOutput: rapid.Int64Range(0, b.w.res.MaxOutput).Draw(t, "remaining"),
			SafetyMargin: rapid.Int64Range(0, 5).Draw(t, "margin")}
	}
	m.descr = fmt.Sprintf("ReportUsage bypassed %s %+v progressive %+v", b.id, u, prog)
	rep := m.command(t, &hold{w: b.w}, command{report: &u, prog: prog})
	if rep.repErr != nil {
		t.Fatalf("%s: %v", m.descr, rep.repErr)
	}
	// Cumulative: each field only rises.
	c := bulkhead.Usage{
		Input: max(u.Input, b.last.Input), Output: max(u.Output, b.last.Output), CachedInput: max(u.CachedInput, b.last.CachedInput),
		CacheCreation: max(u.CacheCreation, b.last.CacheCreation), Reasoning: max(u.Reasoning, b.last.Reasoning),
	}
	stale := b.reported && c == b.last
	b.lastRaw = u
	if !stale {
		b.seq++
		b.last, b.reported = c, true
	}
	res := b.w.res
	want := bulkhead.UsageReport{AdmissionID: b.id, LimitRevision: b.rev, Class: b.w.class, Sequence: b.seq, Reserved: res.Reserved,
		Consumed: c.Input + c.Output}
	if m.hasBudget {
		outputCap, remaining := res.MaxOutput, max(0, res.MaxOutput-c.Output)
		want.OutputCap, want.OutputRemaining = &outputCap, &remaining
		want.OverReservation = max(0, c.Input+c.Output-res.Reserved)
	}
	if !reflect.DeepEqual(rep.rep, want) {
		t.Fatalf("%s: report\n got %v\nwant %v", m.descr, rep.rep, want)
	}
	m.seen[fmt.Sprintf("bypass report stale=%v", stale)]++
	if stale {
		return
	}
	ev := bulkhead.BypassUsageEvent{Admission: b.admission(), Reason: b.why, Sequence: b.seq, Usage: c,
		OutputCap: want.OutputCap, OutputRemaining: want.OutputRemaining, OverReservation: want.OverReservation}
	if prog != nil {
		p := *prog
		ev.Progressive = &p
	}
	b.usages = append(b.usages, ev)
}

// finishBypass lets b's callback return, failing or with usage set: its
// final usage is that usage, else its last report (F6).
func (m *machine) finishBypass(t *rapid.T, b *bypassRun, fail bool, usage *bulkhead.Usage) {
	m.descr = fmt.Sprintf("Finish bypassed %s fail=%v usage=%+v", b.id, fail, usage)
	rep := m.command(t, &hold{w: b.w}, command{usage: usage, fail: fail})
	if rep.setErr != nil || rep.cause != nil {
		t.Fatalf("%s: SetUsage %v, context cause %v", m.descr, rep.setErr, rep.cause)
	}
	final := usage
	if fail || final == nil {
		final = nil
		if b.reported {
			u := b.last
			final = &u
		}
	}
	b.released = true
	m.observe.InFlight--
	if final != nil {
		m.observe.UsageReported++
		m.observe.InputTokens += final.Input
		m.observe.OutputTokens += final.Output
	}
	b.release = &bulkhead.BypassReleaseEvent{Admission: b.admission(), Reason: b.why, UsageSequence: b.seq, Usage: final}
	m.awaitReturn(t, b.w, fail)
	m.seen[fmt.Sprintf("finish bypassed fail=%v usage=%v", fail, final != nil)]++
}

// capacityOf is st without what bypassed work and dedup followers may
// change: the observe and dedup statistics (and the event backlog, which
// moves on its own).
func capacityOf(st bulkhead.Stats) bulkhead.Stats {
	st.Observe = bulkhead.ObserveStats{}
	st.Dedup = nil // followers hold nothing either
	st.Events.Backlog = 0
	return st
}

// checkObserve checks I10 from Stats alone: only shadowable reasons are
// ever bypassed, the counts add up and never fall, and a step that only
// bypassed or ran bypassed work (frozen) changed no other counter.
func checkObserve(prev, got bulkhead.Stats, frozen bool) error {
	o, p := got.Observe, prev.Observe
	for why := range o.BypassedByReason {
		shadowed := false
		for _, r := range shadowable {
			shadowed = shadowed || r == why
		}
		if !shadowed {
			return fmt.Errorf("I10: bypassed for the hard reason %v: %+v", why, o)
		}
	}
	if o.Bypassed != sum(o.BypassedByReason) || o.RaceBypassed > o.Bypassed || o.InFlight < 0 || o.InFlight > o.Bypassed ||
		o.Bypassed < p.Bypassed || o.RaceBypassed < p.RaceBypassed || o.UsageReported < p.UsageReported ||
		o.InputTokens < p.InputTokens || o.OutputTokens < p.OutputTokens {
		return fmt.Errorf("I10: observe stats %+v after %+v", o, p)
	}
	if frozen && !reflect.DeepEqual(capacityOf(got), capacityOf(prev)) {
		return fmt.Errorf("I10: bypassed work changed capacity counters:\nbefore %s\nafter  %s", fmtStats(capacityOf(prev)), fmtStats(capacityOf(got)))
	}
	return nil
}

// checkBypassEvents checks each bypassed call's events against the model:
// one bypass event, its usage events in sequence, one bypass release, in
// that order (F30), and that their IDs are never an admission's.
func (m *machine) checkBypassEvents(t *rapid.T, st bulkhead.Stats) {
	m.ev.mu.Lock()
	defer m.ev.mu.Unlock()
	type seen struct {
		bypass  *bulkhead.BypassEvent
		usages  []bulkhead.BypassUsageEvent
		release *bulkhead.BypassReleaseEvent
	}
	byID := map[bulkhead.ID]*seen{}
	get := func(id bulkhead.ID) *seen {
		s := byID[id]
		if s == nil {
			s = &seen{}
			byID[id] = s
		}
		return s
	}
	for _, e := range m.ev.bypassOrder {
		switch e := e.(type) {
		case bulkhead.BypassEvent:
			s := get(e.ID)
			if s.bypass != nil {
				t.Fatalf("F30: two bypass events for %s", e.ID)
			}
			s.bypass = &e
		case bulkhead.BypassUsageEvent:
			s := get(e.ID)
			if s.bypass == nil || s.release != nil {
				t.Fatalf("F30: bypass usage event of %s outside its bypass and release", e.ID)
			}
			s.usages = append(s.usages, e)
		case bulkhead.BypassReleaseEvent:
			s := get(e.ID)
			if s.bypass == nil || s.release != nil {
				t.Fatalf("F30: bypass release event of %s without its bypass, or twice", e.ID)
			}
			s.release = &e
		}
	}
	if len(byID) != len(m.bypassed) || int64(len(byID)) != st.Observe.Bypassed {
		t.Fatalf("%d bypassed calls in the events, model %d, stats %d", len(byID), len(m.bypassed), st.Observe.Bypassed)
	}
	admitted := map[bulkhead.ID]bool{}
	for _, h := range m.holds {
		admitted[h.id] = true
	}
	for _, b := range m.bypassed {
		s := byID[b.id]
		if s == nil || s.bypass == nil || s.release == nil || admitted[b.id] {
			t.Fatalf("bypassed %s: events %+v (an admission's ID: %v)", b.id, s, admitted[b.id])
		}
		e := *s.bypass
		if e.Admission != b.admission() || e.Reason != b.why || e.Race != b.race || !b.detail.matches(e.Detail) {
			t.Fatalf("bypass event\n got %v\nwant %v %v race %v detail %s", e, b.admission(), b.why, b.race, fmtDetail(b.detail.ev.Detail))
		}
		if !reflect.DeepEqual(s.usages, b.usages) && (len(s.usages) > 0 || len(b.usages) > 0) {
			t.Fatalf("bypass usage events of %s\n got %v\nwant %v", b.id, s.usages, b.usages)
		}
		if !reflect.DeepEqual(*s.release, *b.release) {
			t.Fatalf("bypass release event\n got %v\nwant %v", *s.release, *b.release)
		}
	}
}
