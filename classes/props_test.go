package classes

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The property test drives a Table through random admissions, releases,
// abandonments, hold changes and runtime replacements, with a minimal
// admission actor around it (global budget, class checks, a gate without a
// queue, the postcheck), and compares it after every step with a model
// that recomputes every SPEC F17 formula from the list of live admissions.
// Runtime replacements may set limits below the sum of the floors; the
// model then shrinks the floors itself (SPEC F16) and uses the floors in
// effect in every formula.

// lease is one live admission in the model.
type lease struct {
	class     int // index into the model's classes
	reserved  int64
	held      int64
	res       admission.Resources
	abandoned bool
}

// classModel is the model's view of one class: its limits and counters.
type classModel struct {
	name   string
	limits admission.ClassLimits

	admitted, released, abandoned, rejected int64
	reserved, consumed, refunded, overrun   int64
	earlyRefunds, heldAtRelease             int64
	borrowedAdmissions, borrowedTokens      int64
}

type model struct {
	tab     *Table
	g       admission.Limits
	classes []classModel // in name order, like the table
	def     int
	leases  []*lease

	// concSteady: no class is above its concurrency ceiling and shared
	// slot use is within shared capacity. tokSteady: the token analogue,
	// and the global hold is within the whole budget. Admissions must
	// preserve both; only shrinks (Apply) and overruns break them.
	concSteady, tokSteady bool
}

func (m *model) hasBudget() bool { return m.g.TokenBudget != nil }

func (m *model) effective(p admission.Priority) int64 {
	b := m.g.TokenBudget
	if b == nil {
		return 0
	}
	if p == admission.High {
		return b.Budget
	}
	return max(0, b.Budget-b.HighPriorityReserve)
}

// inEffect returns class i's floors in effect: floor * limit / sum of the
// floors, rounded down, while the limit (MaxConcurrent, the whole budget)
// is below the sum; the configured floors otherwise.
func (m *model) inEffect(i int) (floor int, tokFloor int64) {
	var sum int
	var tokSum int64
	for _, c := range m.classes {
		sum += c.limits.ProtectedConcurrent
		tokSum += c.limits.ProtectedInFlightTokens
	}
	l := m.classes[i].limits
	floor, tokFloor = l.ProtectedConcurrent, l.ProtectedInFlightTokens
	if sum > m.g.MaxConcurrent {
		floor = floor * m.g.MaxConcurrent / sum
	}
	if b := m.g.TokenBudget; b != nil && tokSum > b.Budget {
		tokFloor = tokFloor * b.Budget / tokSum
	}
	return floor, tokFloor
}

// usage recomputes, from the live leases, class i's slots and tokens.
func (m *model) usage(i int) (slots int, tokens int64) {
	for _, l := range m.leases {
		if l.class == i {
			if !l.abandoned {
				slots++
			}
			tokens += l.held
		}
	}
	return slots, tokens
}

func (m *model) gate() (slots int, tokens int64) {
	for i := range m.classes {
		s, t := m.usage(i)
		slots += s
		tokens += t
	}
	return slots, tokens
}

// sums is the sums of the floors in effect and of the protected use.
func (m *model) sums() (floors int, tokFloors int64, protInUse int, protTokInUse int64) {
	for i := range m.classes {
		s, t := m.usage(i)
		f, tf := m.inEffect(i)
		floors += f
		tokFloors += tf
		protInUse += min(s, f)
		protTokInUse += min(t, tf)
	}
	return
}

func (m *model) capacity(p admission.Priority, slotHeld bool) Capacity {
	slots, tokens := m.gate()
	if slotHeld {
		slots++
	}
	return Capacity{MaxConcurrent: m.g.MaxConcurrent, InFlight: slots, SlotHeld: slotHeld, InFlightTokens: tokens, Budget: m.effective(p)}
}

// refCheck is SPEC F17 transcribed naively, with the reference library's
// "only what is borrowed is checked" rule.
func (m *model) refCheck(i int, reserved int64, p admission.Priority) (admission.Reason, admission.Constraint, admission.Resources) {
	c := m.classes[i].limits
	floor, tokFloor := m.inEffect(i)
	slots, tokens := m.usage(i)
	gslots, gtokens := m.gate()
	floors, tokFloors, protInUse, protTokInUse := m.sums()
	res := admission.Resources{
		BorrowedConcurrency: slots >= floor,
		BorrowedTokens:      max(0, reserved-max(0, tokFloor-tokens)),
	}
	switch {
	case c.MaxInFlightTokens != nil && tokens+reserved > *c.MaxInFlightTokens:
		return admission.BudgetLimit, admission.ConstraintClass, res
	case c.MaxConcurrent != nil && slots >= *c.MaxConcurrent:
		return admission.ConcurrencyLimit, admission.ConstraintClass, res
	case floors > 0 && res.BorrowedConcurrency &&
		max(0, gslots-protInUse)+1 > max(0, m.g.MaxConcurrent-floors):
		return admission.ConcurrencyLimit, admission.ConstraintClassProtection, res
	case m.hasBudget() && tokFloors > 0 && res.BorrowedTokens > 0 &&
		max(0, gtokens-protTokInUse)+res.BorrowedTokens > max(0, m.effective(p)-tokFloors):
		return admission.BudgetLimit, admission.ConstraintClassProtection, res
	}
	return admission.NoReason, "", res
}

// steadiness recomputes concSteady and tokSteady from the state.
func (m *model) steadiness() (conc, tok bool) {
	floors, tokFloors, protInUse, protTokInUse := m.sums()
	gslots, gtokens := m.gate()
	conc = max(0, gslots-protInUse) <= max(0, m.g.MaxConcurrent-floors) && gslots <= m.g.MaxConcurrent
	tok = true
	if m.hasBudget() {
		tok = max(0, gtokens-protTokInUse) <= max(0, m.g.TokenBudget.Budget-tokFloors) && gtokens <= m.g.TokenBudget.Budget
	}
	for i, c := range m.classes {
		s, t := m.usage(i)
		if c.limits.MaxConcurrent != nil && s > *c.limits.MaxConcurrent {
			conc = false
		}
		if c.limits.MaxInFlightTokens != nil && t > *c.limits.MaxInFlightTokens {
			tok = false
		}
	}
	return conc, tok
}

// genLimits draws a valid class table for the key set names and new global
// limits: the floors are drawn within what is left of the global limits,
// or, for a runtime replacement (overcommit), regardless of them, so that
// they may sum above the limits.
func genLimits(t *rapid.T, names []string, hasBudget, overcommit bool) (admission.Limits, map[string]admission.ClassLimits) {
	g := admission.Limits{MaxConcurrent: rapid.IntRange(0, 6).Draw(t, "maxConcurrent"), MaxQueue: 0}
	if hasBudget {
		b := rapid.Int64Range(0, 1000).Draw(t, "budget")
		g.TokenBudget = &admission.BudgetLimits{Budget: b, HighPriorityReserve: rapid.Int64Range(0, b).Draw(t, "reserve")}
	}
	left, tokLeft := g.MaxConcurrent, int64(0)
	if hasBudget {
		tokLeft = g.TokenBudget.Budget
	}
	out := make(map[string]admission.ClassLimits, len(names))
	for _, name := range names {
		var l admission.ClassLimits
		if rapid.Bool().Draw(t, name+".hasFloor") {
			if overcommit {
				l.ProtectedConcurrent = rapid.IntRange(0, 4).Draw(t, name+".floor")
			} else {
				l.ProtectedConcurrent = rapid.IntRange(0, left).Draw(t, name+".floor")
				left -= l.ProtectedConcurrent
			}
		}
		if rapid.Bool().Draw(t, name+".hasMax") {
			l.MaxConcurrent = ip(rapid.IntRange(l.ProtectedConcurrent, l.ProtectedConcurrent+4).Draw(t, name+".max"))
		}
		if hasBudget {
			if rapid.Bool().Draw(t, name+".hasTokFloor") {
				if overcommit {
					l.ProtectedInFlightTokens = rapid.Int64Range(0, 600).Draw(t, name+".tokFloor")
				} else {
					l.ProtectedInFlightTokens = rapid.Int64Range(0, tokLeft).Draw(t, name+".tokFloor")
					tokLeft -= l.ProtectedInFlightTokens
				}
			}
			if rapid.Bool().Draw(t, name+".hasMaxTok") {
				l.MaxInFlightTokens = i64p(rapid.Int64Range(l.ProtectedInFlightTokens, l.ProtectedInFlightTokens+600).Draw(t, name+".maxTok"))
			}
		}
		out[name] = l
	}
	return g, out
}

func newModel(t *rapid.T) *model {
	n := rapid.IntRange(1, 4).Draw(t, "classes")
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("c%d", i)
	}
	hasBudget := rapid.Bool().Draw(t, "hasBudget")
	g, lim := genLimits(t, names, hasBudget, false)
	def := rapid.IntRange(0, n-1).Draw(t, "default")
	tab, err := New("Config.Classes", admission.Classes{Default: names[def], Limits: lim}, g)
	if err != nil {
		t.Fatalf("New on a valid table: %v", err)
	}
	m := &model{tab: tab, g: g, def: def}
	for _, name := range names {
		m.classes = append(m.classes, classModel{name: name, limits: lim[name]})
	}
	m.concSteady, m.tokSteady = m.steadiness()
	if !m.concSteady || !m.tokSteady {
		t.Fatalf("an idle table is not steady")
	}
	return m
}

func (m *model) pickLease(t *rapid.T, ok func(*lease) bool) (int, *lease) {
	var idx []int
	for i, l := range m.leases {
		if ok(l) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		t.Skip("no such lease")
	}
	i := idx[rapid.IntRange(0, len(idx)-1).Draw(t, "lease")]
	return i, m.leases[i]
}

func (m *model) handle(t *rapid.T, i int) Class {
	name := m.classes[i].name
	if i == m.def && rapid.Bool().Draw(t, "byDefault") {
		name = ""
	}
	c, err := m.tab.Lookup(name)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", name, err)
	}
	return c
}

// acquire is one acquisition through the mini actor.
func (m *model) acquire(t *rapid.T) {
	i := rapid.IntRange(0, len(m.classes)-1).Draw(t, "class")
	c := m.handle(t, i)
	var reserved int64
	if m.hasBudget() {
		reserved = rapid.Int64Range(0, 400).Draw(t, "reserved")
	}
	p := admission.Priority(rapid.IntRange(0, 1).Draw(t, "priority"))

	wantWhy, wantCon, wantRes := m.refCheck(i, reserved, p)
	why, con := m.tab.Check(c, m.capacity(p, false), reserved)
	if why != wantWhy || con != wantCon {
		t.Fatalf("Check(%s, %d, %v) = %v/%q, model says %v/%q", m.classes[i].name, reserved, p, why, con, wantWhy, wantCon)
	}
	if res := m.tab.Resources(c, reserved); res != wantRes {
		t.Fatalf("Resources = %+v, model says %+v", res, wantRes)
	}
	gslots, gtokens := m.gate()
	reject := func(r admission.Reason) {
		m.tab.Reject(c, r)
		m.classes[i].rejected++
	}
	if m.hasBudget() && gtokens+reserved > m.effective(p) {
		reject(admission.BudgetLimit)
		return
	}
	if why != admission.NoReason {
		reject(why)
		return
	}
	if gslots >= m.g.MaxConcurrent {
		// The actor would queue or reject at the gate.
		reject(admission.ConcurrencyLimit)
		return
	}
	// Postcheck with the slot held decides the same.
	if why, con := m.tab.Check(c, m.capacity(p, true), reserved); why != admission.NoReason {
		t.Fatalf("postcheck rejects %v/%q after the precheck admitted", why, con)
	}
	res := m.tab.Admit(c, reserved)
	if res != wantRes {
		t.Fatalf("Admit returned %+v, model says %+v", res, wantRes)
	}
	m.leases = append(m.leases, &lease{class: i, reserved: reserved, held: reserved, res: res})
	cm := &m.classes[i]
	cm.admitted++
	cm.reserved += reserved
	if res.BorrowedConcurrency {
		cm.borrowedAdmissions++
	}
	cm.borrowedTokens += res.BorrowedTokens

	// SPEC I1: new admissions never exceed the limits they were checked
	// against; from a steady state they keep it steady.
	slots, tokens := m.usage(i)
	lim := cm.limits
	if lim.MaxConcurrent != nil && slots > *lim.MaxConcurrent {
		t.Fatalf("class %s at %d slots, above its ceiling %d", cm.name, slots, *lim.MaxConcurrent)
	}
	if lim.MaxInFlightTokens != nil && tokens > *lim.MaxInFlightTokens {
		t.Fatalf("class %s at %d tokens, above its ceiling %d", cm.name, tokens, *lim.MaxInFlightTokens)
	}
	floors, tokFloors, protInUse, protTokInUse := m.sums()
	gslots, gtokens = m.gate()
	if floors > 0 && res.BorrowedConcurrency && max(0, gslots-protInUse) > max(0, m.g.MaxConcurrent-floors) {
		t.Fatalf("a borrowed slot pushed shared use to %d, above %d", gslots-protInUse, m.g.MaxConcurrent-floors)
	}
	if tokFloors > 0 && res.BorrowedTokens > 0 && max(0, gtokens-protTokInUse) > max(0, m.effective(p)-tokFloors) {
		t.Fatalf("borrowed tokens pushed shared token use to %d, above %d", gtokens-protTokInUse, m.effective(p)-tokFloors)
	}
	conc, tok := m.steadiness()
	if m.concSteady && !conc {
		t.Fatalf("an admission broke the concurrency steady state")
	}
	if m.tokSteady && !tok {
		t.Fatalf("an admission broke the token steady state")
	}
	m.concSteady, m.tokSteady = conc, tok
}

func (m *model) release(t *rapid.T) {
	idx, l := m.pickLease(t, func(*lease) bool { return true })
	c := Class(l.class + 1)
	s := Settlement{Held: l.held, SlotAbandoned: l.abandoned}
	if rapid.Bool().Draw(t, "hasUsage") {
		s.Consumed = rapid.Int64Range(0, 500).Draw(t, "consumed")
		s.Refunded = max(0, l.held-s.Consumed)
	}
	m.tab.Release(c, s)
	cm := &m.classes[l.class]
	cm.released++
	cm.consumed += s.Consumed
	cm.refunded += s.Refunded
	cm.heldAtRelease += l.held
	m.leases = append(m.leases[:idx], m.leases[idx+1:]...)
	m.concSteady, m.tokSteady = m.steadiness()
}

func (m *model) abandon(t *rapid.T) {
	_, l := m.pickLease(t, func(l *lease) bool { return l.res.BorrowedConcurrency && !l.abandoned })
	cause := admission.AbandonCause(rapid.IntRange(0, 1).Draw(t, "cause"))
	m.tab.Abandon(Class(l.class+1), cause)
	l.abandoned = true
	m.classes[l.class].abandoned++
	m.concSteady, m.tokSteady = m.steadiness()
}

func (m *model) adjust(t *rapid.T) {
	_, l := m.pickLease(t, func(*lease) bool { return m.hasBudget() })
	next := rapid.Int64Range(0, l.held+100).Draw(t, "hold")
	delta := next - l.held
	m.tab.AdjustHold(Class(l.class+1), delta)
	l.held = next
	cm := &m.classes[l.class]
	if delta > 0 {
		cm.overrun += delta
	} else {
		cm.refunded -= delta
		cm.earlyRefunds -= delta
	}
	m.concSteady, m.tokSteady = m.steadiness()
}

func (m *model) apply(t *rapid.T) {
	names := make([]string, len(m.classes))
	for i, c := range m.classes {
		names[i] = c.name
	}
	g, lim := genLimits(t, names, m.hasBudget(), rapid.Bool().Draw(t, "overcommit"))
	u, err := m.tab.Prepare("Limits.Classes", admission.Classes{Limits: lim}, g)
	if err != nil {
		t.Fatalf("Prepare on a valid table: %v", err)
	}
	m.tab.Apply(u)
	m.g = g
	for i := range m.classes {
		m.classes[i].limits = lim[m.classes[i].name]
	}
	m.concSteady, m.tokSteady = m.steadiness()
}

// check compares the table with the model and checks the floor guarantee.
func (m *model) check(t *rapid.T) {
	gslots, gtokens := m.gate()
	st := m.tab.Stats(Capacity{MaxConcurrent: m.g.MaxConcurrent, InFlight: gslots, InFlightTokens: gtokens, Budget: m.effective(admission.High)})
	conf := m.tab.Classes()
	floors, tokFloors, _, _ := m.sums()
	if floors > m.g.MaxConcurrent || (m.hasBudget() && tokFloors > m.g.TokenBudget.Budget) {
		t.Fatalf("the floors in effect sum to %d/%d, above the limits %d/%+v", floors, tokFloors, m.g.MaxConcurrent, m.g.TokenBudget)
	}
	if st.Shared.Slots != max(0, m.g.MaxConcurrent-floors) {
		t.Fatalf("shared capacity %d, model %d", st.Shared.Slots, max(0, m.g.MaxConcurrent-floors))
	}
	if m.hasBudget() && st.Shared.Tokens != max(0, m.g.TokenBudget.Budget-tokFloors) {
		t.Fatalf("shared token capacity %d, model %d", st.Shared.Tokens, max(0, m.g.TokenBudget.Budget-tokFloors))
	}
	var protInUse int
	var protTokInUse int64
	for i, cm := range m.classes {
		cs := classOf(st, cm.name)
		slots, tokens := m.usage(i)
		unreleasedAbandoned := int64(0)
		for _, l := range m.leases {
			if l.class == i && l.abandoned {
				unreleasedAbandoned++
			}
		}
		switch {
		case cs.InFlight != slots || cs.InFlightTokens != tokens:
			t.Fatalf("%s: in flight %d/%d tokens, model %d/%d", cm.name, cs.InFlight, cs.InFlightTokens, slots, tokens)
		case cs.Admitted-cs.Released != int64(cs.InFlight)+unreleasedAbandoned:
			t.Fatalf("%s: admitted %d - released %d != in flight %d + abandoned unreleased %d",
				cm.name, cs.Admitted, cs.Released, cs.InFlight, unreleasedAbandoned)
		case cs.Admitted != cm.admitted || cs.Released != cm.released || cs.Abandonments() != cm.abandoned || cs.Rejections() != cm.rejected:
			t.Fatalf("%s: counters %+v, model %+v", cm.name, cs, cm)
		case cs.Reserved != cm.reserved || cs.Consumed != cm.consumed || cs.Refunded != cm.refunded || cs.Overrun != cm.overrun:
			t.Fatalf("%s: ledger %+v, model %+v", cm.name, cs, cm)
		case cs.BorrowedAdmissions != cm.borrowedAdmissions || cs.BorrowedTokensReserved != cm.borrowedTokens:
			t.Fatalf("%s: borrowed totals %+v, model %+v", cm.name, cs, cm)
		case cs.Reserved+cs.Overrun-cm.earlyRefunds != cm.heldAtRelease+cs.InFlightTokens:
			t.Fatalf("%s: ledger identity broken: %+v", cm.name, cs)
		case cs.ProtectedConcurrentInUse()+cs.BorrowedConcurrent() != cs.InFlight || cs.ProtectedTokensInUse()+cs.BorrowedInFlightTokens() != cs.InFlightTokens:
			t.Fatalf("%s: protected + borrowed != in flight: %+v", cm.name, cs)
		}
		// Stats shows the floors in effect beside the configured ceilings;
		// Classes the configured limits.
		want := cm.limits
		want.ProtectedConcurrent, want.ProtectedInFlightTokens = m.inEffect(i)
		if !reflect.DeepEqual(cs.Limits, want) {
			t.Fatalf("%s: Stats limits %s, model %s (configured %s)", cm.name, fmtLimits(cs.Limits), fmtLimits(want), fmtLimits(cm.limits))
		}
		if got := conf.Limits[cm.name]; !reflect.DeepEqual(got, cm.limits) {
			t.Fatalf("%s: Classes says %s, configured %s", cm.name, fmtLimits(got), fmtLimits(cm.limits))
		}
		if cs.ProtectedConcurrentInUse() != min(slots, want.ProtectedConcurrent) || cs.ProtectedTokensInUse() != min(tokens, want.ProtectedInFlightTokens) {
			t.Fatalf("%s: protected in use %d/%d, model %d/%d", cm.name, cs.ProtectedConcurrentInUse(), cs.ProtectedTokensInUse(),
				min(slots, want.ProtectedConcurrent), min(tokens, want.ProtectedInFlightTokens))
		}
		var byReason, byCause int64
		for _, n := range cs.Rejected {
			byReason += n
		}
		for _, n := range cs.Abandoned {
			byCause += n
		}
		if byReason != cs.Rejections() || byCause != cs.Abandonments() {
			t.Fatalf("%s: by-reason or by-cause sums differ: %+v", cm.name, cs)
		}
		protInUse += cs.ProtectedConcurrentInUse()
		protTokInUse += cs.ProtectedTokensInUse()
	}
	if d := m.tab.Drift(); d != 0 {
		t.Fatalf("the table drifted %d times", d)
	}
	if m.tab.protectedInUse != protInUse || m.tab.protectedTokensInUse != protTokInUse {
		t.Fatalf("incremental protected sums %d/%d, recomputed %d/%d",
			m.tab.protectedInUse, m.tab.protectedTokensInUse, protInUse, protTokInUse)
	}

	// The floor guarantee (SPEC F17): in the steady state a class below its
	// concurrency floor finds a free global slot and passes the class
	// concurrency checks, whatever the other classes do; likewise a High call filling
	// a class's unused token floor fits the budget and every token check.
	if m.concSteady {
		for i, cm := range m.classes {
			slots, _ := m.usage(i)
			floor, _ := m.inEffect(i)
			if slots >= floor {
				continue
			}
			if gslots >= m.g.MaxConcurrent {
				t.Fatalf("%s is below its floor in effect (%d < %d) but the gate is full (%d)", cm.name, slots, floor, gslots)
			}
			capacity := m.capacity(admission.High, false)
			if why, con := m.tab.Check(Class(i+1), capacity, 0); why == admission.ConcurrencyLimit {
				t.Fatalf("%s is below its floor but Check says %v/%q", cm.name, why, con)
			}
		}
	}
	if m.tokSteady && m.hasBudget() {
		for i, cm := range m.classes {
			_, tokens := m.usage(i)
			_, tokFloor := m.inEffect(i)
			room := tokFloor - tokens
			if room <= 0 {
				continue
			}
			if gtokens+room > m.g.TokenBudget.Budget {
				t.Fatalf("%s has %d unused floor tokens but the budget has no room", cm.name, room)
			}
			if why, con := m.tab.Check(Class(i+1), m.capacity(admission.High, false), room); why == admission.BudgetLimit {
				t.Fatalf("%s filling its token floor: %v/%q", cm.name, why, con)
			}
		}
	}
}

func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newModel(t)
		actions := map[string]func(*rapid.T){
			"Acquire":    m.acquire,
			"Release":    m.release,
			"Abandon":    m.abandon,
			"AdjustHold": m.adjust,
			"":           m.check,
		}
		// Half the runs never reconfigure, so the steady state lasts.
		if rapid.Bool().Draw(t, "reconfigure") {
			actions["Apply"] = m.apply
		}
		t.Repeat(actions)
	})
}

// fmtLimits formats class limits with their ceilings dereferenced.
func fmtLimits(l admission.ClassLimits) string {
	ceil := func(p *int) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	ceil64 := func(p *int64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("{floor %d max %s tokFloor %d maxTok %s}", l.ProtectedConcurrent, ceil(l.MaxConcurrent), l.ProtectedInFlightTokens, ceil64(l.MaxInFlightTokens))
}
