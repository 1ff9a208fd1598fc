package classes

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

type L = admission.ClassLimits

const (
	ok          = admission.NoReason
	concLimit   = admission.ConcurrencyLimit
	budgetLimit = admission.BudgetLimit
	global      = admission.ConstraintGlobal
	class       = admission.ConstraintClass
	protection  = admission.ConstraintClassProtection
)

// TestProbedScenario replays the reference's probe (reference-library 3.4):
// MaxConcurrent 3, fg with floor 1, bg with ceiling 2, no token floors.
func TestProbedScenario(t *testing.T) {
	g := limitsOf(3, 10_000, 0)
	tab := mustNew(t, admission.Classes{Default: "fg", Limits: map[string]L{
		"fg": {ProtectedConcurrent: 1},
		"bg": {MaxConcurrent: ip(2)},
	}}, g)
	s := &sim{t: tab, g: g}
	fg, bg := mustLookup(t, tab, "fg"), mustLookup(t, tab, "bg")
	const reserved = 110

	for i := range 2 {
		why, con, r := s.try(bg, reserved, admission.Normal)
		if why != ok || r != (admission.Resources{BorrowedConcurrency: true, BorrowedTokens: reserved}) {
			t.Fatalf("bg %d: %v/%v %+v, want admitted and borrowed", i+1, why, con, r)
		}
	}
	if why, con, _ := s.try(bg, reserved, admission.Normal); why != concLimit || con != class {
		t.Fatalf("3rd bg: %v/%v, want concurrency_limit/admission_class", why, con)
	}
	why, con, r := s.try(fg, reserved, admission.Normal)
	if why != ok || r.BorrowedConcurrency {
		t.Fatalf("fg within its floor: %v/%v %+v, want admitted, not borrowed", why, con, r)
	}
	if r.BorrowedTokens != reserved {
		t.Fatalf("fg without a token floor borrows all its tokens: %+v", r)
	}
	// The shared pool (3 - 1 = 2) is exhausted by bg.
	if why, con, _ := s.try(fg, reserved, admission.Normal); why != concLimit || con != protection {
		t.Fatalf("2nd fg: %v/%v, want concurrency_limit/admission_class_protection", why, con)
	}

	// The detail of that last rejection.
	shared, cd, borrow := tab.Detail(fg, s.capacity(admission.Normal, false), reserved)
	wantShared := admission.SharedPool{Slots: 2, SlotsInUse: 2, Tokens: 10_000, TokensInUse: 330, HasTokens: true}
	if *shared != wantShared || borrow != (admission.Resources{BorrowedConcurrency: true, BorrowedTokens: reserved}) {
		t.Fatalf("shared = %+v, would borrow %+v; want %+v", *shared, borrow, wantShared)
	}
	wantClass := &admission.ClassUse{Name: "fg", Limits: L{ProtectedConcurrent: 1}, InFlight: 1, InFlightTokens: reserved}
	if !reflect.DeepEqual(cd, wantClass) || cd.ProtectedConcurrentInUse() != 1 || cd.BorrowedInFlightTokens() != reserved {
		t.Fatalf("class detail = %+v, want %+v", cd, wantClass)
	}
	_, cd, _ = tab.Detail(bg, s.capacity(admission.Normal, false), reserved)
	if m := cd.Limits.MaxConcurrent; m == nil || *m != 2 || cd.InFlight != 2 || cd.BorrowedConcurrent() != 2 {
		t.Fatalf("bg detail = %+v", cd)
	}

	st := tab.Stats(s.capacity(admission.High, false))
	if classOf(st, "bg").Rejections() != 1 || classOf(st, "bg").Rejected[concLimit] != 1 ||
		classOf(st, "fg").Rejected[concLimit] != 1 {
		t.Fatalf("rejections: %+v", st.Classes)
	}
	if classOf(st, "bg").BorrowedAdmissions != 2 || classOf(st, "fg").BorrowedAdmissions != 0 {
		t.Fatalf("borrowed admissions: %+v", st.Classes)
	}
}

// TestCheckOrder: when several class checks fail, the first in the order
// of SPEC F17 names the rejection.
func TestCheckOrder(t *testing.T) {
	g := limitsOf(2, 200, 0)
	newTab := func(t *testing.T) (*Table, Class) {
		tab := mustNew(t, admission.Classes{Default: "x", Limits: map[string]L{
			"p": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 50},
			"x": {MaxConcurrent: ip(1), MaxInFlightTokens: i64p(150)},
		}}, g)
		x := mustLookup(t, tab, "x")
		tab.Admit(x, 140) // x: 1 slot (the whole shared pool), 140 tokens
		return tab, x
	}
	capAt := Capacity{MaxConcurrent: 2, InFlight: 1, InFlightTokens: 140, Budget: 200}
	tests := []struct {
		name     string
		edit     func(tab *Table, x Class)
		reserved int64
		why      admission.Reason
		con      admission.Constraint
	}{
		// Every check fails: token ceiling (140+11 > 150), concurrency
		// ceiling (1 >= 1), concurrency protection (shared 1+1 > 1), token
		// protection (shared tokens 140+11 > 150).
		{"token ceiling first", nil, 11, budgetLimit, class},
		{"then concurrency ceiling", nil, 10, concLimit, class},
		{"then concurrency protection", func(tab *Table, x Class) {
			tab.classes[x-1].limits.hasMax = false
		}, 11 - 1, concLimit, protection},
		{"then token protection", func(tab *Table, x Class) {
			tab.classes[x-1].limits.hasMax = false
			tab.classes[x-1].limits.hasMaxTok = false
			tab.sumFloor = 0 // concurrency protection off
		}, 11, budgetLimit, protection},
		{"token protection exact fit", func(tab *Table, x Class) {
			tab.classes[x-1].limits.hasMax = false
			tab.classes[x-1].limits.hasMaxTok = false
			tab.sumFloor = 0
		}, 10, ok, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab, x := newTab(t)
			if tc.edit != nil {
				tc.edit(tab, x)
			}
			why, con := tab.Check(x, capAt, tc.reserved)
			if why != tc.why || con != tc.con {
				t.Fatalf("Check = %v/%q, want %v/%q", why, con, tc.why, tc.con)
			}
		})
	}
}

// TestConcurrencyProtection covers the formulas of the shared slot pool.
func TestConcurrencyProtection(t *testing.T) {
	g := limitsOf(5, -1, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedConcurrent: 2},
		"b": {ProtectedConcurrent: 1},
		"c": {},
	}}, g)
	s := &sim{t: tab, g: g}
	a, b, c := mustLookup(t, tab, "a"), mustLookup(t, tab, "b"), mustLookup(t, tab, "c")
	// Shared capacity is 5 - 3 = 2.
	for i, want := range []admission.Resources{{}, {}, {BorrowedConcurrency: true}} {
		why, _, r := s.try(a, 0, admission.Normal)
		if why != ok || r != want {
			t.Fatalf("a %d: %v %+v, want %+v", i+1, why, r, want)
		}
	}
	// a holds 2 protected + 1 shared; c takes the last shared slot.
	if why, _, r := s.try(c, 0, admission.Normal); why != ok || !r.BorrowedConcurrency {
		t.Fatalf("c: %v %+v", why, r)
	}
	// The shared pool is full; b still has its floor.
	if why, con, _ := s.try(c, 0, admission.Normal); why != concLimit || con != protection {
		t.Fatalf("c again: %v/%v", why, con)
	}
	if why, con, _ := s.try(a, 0, admission.Normal); why != concLimit || con != protection {
		t.Fatalf("a again: %v/%v", why, con)
	}
	if why, _, r := s.try(b, 0, admission.Normal); why != ok || r.BorrowedConcurrency {
		t.Fatalf("b within floor: %v %+v", why, r)
	}
	// Now the gate is full: b above its floor would borrow and is rejected
	// by protection before the gate (class limits never queue).
	if why, con, _ := s.try(b, 0, admission.Normal); why != concLimit || con != protection {
		t.Fatalf("b above floor: %v/%v", why, con)
	}
	st := tab.Stats(s.capacity(admission.High, false))
	if st.Shared != (admission.SharedPool{Slots: 2, SlotsInUse: 2}) {
		t.Fatalf("shared = %+v", st.Shared)
	}
	// Floors are strict: release b; its idle floor is not lent to c.
	tab.Release(b, Settlement{})
	s.inFlight--
	if why, con, _ := s.try(c, 0, admission.Normal); why != concLimit || con != protection {
		t.Fatalf("c with b idle: %v/%v", why, con)
	}
	// Abandoning a's borrowed slot frees a shared slot.
	tab.Abandon(a, admission.AbandonManual)
	s.inFlight--
	if why, _, r := s.try(c, 0, admission.Normal); why != ok || !r.BorrowedConcurrency {
		t.Fatalf("c after abandon: %v %+v", why, r)
	}
}

// TestTokenProtection covers the token floors and the shared token pool.
func TestTokenProtection(t *testing.T) {
	g := limitsOf(100, 1000, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedInFlightTokens: 300},
		"b": {ProtectedInFlightTokens: 200, MaxInFlightTokens: i64p(800)},
		"c": {},
	}}, g)
	s := &sim{t: tab, g: g}
	a, b, c := mustLookup(t, tab, "a"), mustLookup(t, tab, "b"), mustLookup(t, tab, "c")
	// Shared token capacity is 1000 - 500 = 500.
	steps := []struct {
		c        Class
		reserved int64
		why      admission.Reason
		con      admission.Constraint
		res      admission.Resources
	}{
		{b, 150, ok, "", admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 0}},   // within b's floor
		{b, 150, ok, "", admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 100}}, // 50 from the floor, 100 shared
		{b, 401, budgetLimit, protection, admission.Resources{}},                              // shared 100 + 401 > 500
		{b, 400, ok, "", admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 400}}, // exact fit: shared 500
		{b, 1, budgetLimit, class, admission.Resources{}},                                     // b at 700; 700+101 would pass the ceiling, but shared is full
		{c, 1, budgetLimit, protection, admission.Resources{}},
		{a, 300, ok, "", admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 0}}, // a's floor is intact
		{a, 0, ok, "", admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 0}},   // zero tokens always fit
		{a, 1, budgetLimit, global, admission.Resources{}},                                  // the global budget is full
	}
	for i, st := range steps {
		if i == 4 {
			// b at 700: a reservation of 101 breaks b's ceiling of 800 first.
			st.reserved = 101
		}
		why, con, res := s.try(st.c, st.reserved, admission.Normal)
		if why != st.why || con != st.con || res != st.res {
			t.Fatalf("step %d (%s %d): %v/%q %+v, want %v/%q %+v",
				i, tab.Name(st.c), st.reserved, why, con, res, st.why, st.con, st.res)
		}
	}
	stats := tab.Stats(s.capacity(admission.High, false))
	if stats.Shared.Tokens != 500 || stats.Shared.TokensInUse != 500 {
		t.Fatalf("shared tokens = %+v", stats.Shared)
	}
	sb := classOf(stats, "b")
	if sb.InFlightTokens != 700 || sb.ProtectedTokensInUse() != 200 || sb.BorrowedInFlightTokens() != 500 ||
		sb.Reserved != 700 || sb.BorrowedTokensReserved != 500 || sb.BorrowedAdmissions != 3 {
		t.Fatalf("b = %+v", sb)
	}
	// An early refund of b's hold frees shared tokens; an overrun uses them.
	tab.AdjustHold(b, -100)
	s.tokens -= 100
	if why, _, res := s.try(c, 100, admission.Normal); why != ok || res.BorrowedTokens != 100 {
		t.Fatalf("c after refund: %v %+v", why, res)
	}
	tab.AdjustHold(a, 50) // a overruns its floor by 50: shared now 550 > 500
	s.tokens += 50
	// Shared use is over capacity: new borrowing pauses; a call that
	// borrows nothing (here, a zero-token one) passes.
	if why, con := tab.Check(c, s.capacity(admission.Normal, false), 0); why != ok {
		t.Fatalf("zero tokens after an overrun: %v/%v", why, con)
	}
	if why, con := tab.Check(c, s.capacity(admission.Normal, false), 1); why != budgetLimit || con != protection {
		t.Fatalf("c after a's overrun: %v/%v", why, con)
	}
	if why, con := tab.Check(a, s.capacity(admission.Normal, false), 1); why != budgetLimit || con != protection {
		t.Fatalf("a after its overrun: %v/%v", why, con)
	}
	sa := classOf(tab.Stats(s.capacity(admission.High, false)), "a")
	if sa.Overrun != 50 || sa.InFlightTokens != 350 || sa.BorrowedInFlightTokens() != 50 {
		t.Fatalf("a = %+v", sa)
	}
}

// TestShrinkKeepsFloors: after a budget shrink leaves the shared token pool
// over capacity, a call within its class's unused token floor is still
// admitted; one that would borrow is not.
func TestShrinkKeepsFloors(t *testing.T) {
	g := limitsOf(10, 1000, 0)
	cl := admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedInFlightTokens: 300},
		"b": {ProtectedInFlightTokens: 200},
		"c": {},
	}}
	tab := mustNew(t, cl, g)
	s := &sim{t: tab, g: g}
	a, b, c := mustLookup(t, tab, "a"), mustLookup(t, tab, "b"), mustLookup(t, tab, "c")
	if why, _, r := s.try(c, 500, admission.Normal); why != ok || r.BorrowedTokens != 500 {
		t.Fatalf("c 500: %v %+v", why, r)
	}
	s.g = limitsOf(10, 900, 0)
	u, err := tab.Prepare("Limits.Classes", cl, s.g)
	if err != nil {
		t.Fatal(err)
	}
	tab.Apply(u)
	// Shared capacity is now 900 - 500 = 400, and c uses 500 of it.
	if why, con, r := s.try(a, 300, admission.Normal); why != ok || r.BorrowedTokens != 0 {
		t.Fatalf("a within its floor: %v/%v %+v", why, con, r)
	}
	if why, con, _ := s.try(a, 1, admission.Normal); why != budgetLimit || con != protection {
		t.Fatalf("a beyond its floor: %v/%v", why, con)
	}
	if why, con, _ := s.try(b, 100, admission.Normal); why != ok {
		t.Fatalf("b within its floor: %v/%v", why, con)
	}
}

// TestPriorityAdjustedBudget: the shared token pool is taken from the
// call's effective budget, in the check and in the detail; Stats uses the
// whole budget.
func TestPriorityAdjustedBudget(t *testing.T) {
	g := limitsOf(100, 1000, 200)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedInFlightTokens: 300},
		"b": {},
	}}, g)
	s := &sim{t: tab, g: g}
	b := mustLookup(t, tab, "b")
	// Normal: shared = 800 - 300 = 500; High: 1000 - 300 = 700.
	if why, con, _ := s.try(b, 501, admission.Normal); why != budgetLimit || con != protection {
		t.Fatalf("normal 501: %v/%v", why, con)
	}
	shared, _, borrow := tab.Detail(b, s.capacity(admission.Normal, false), 501)
	if shared.Tokens != 500 || borrow.BorrowedTokens != 501 {
		t.Fatalf("normal detail = %+v, would borrow %+v", *shared, borrow)
	}
	if why, _, _ := s.try(b, 500, admission.Normal); why != ok {
		t.Fatalf("normal 500: %v", why)
	}
	if why, con, _ := s.try(b, 201, admission.High); why != budgetLimit || con != protection {
		t.Fatalf("high 201: %v/%v", why, con)
	}
	if why, _, _ := s.try(b, 200, admission.High); why != ok {
		t.Fatalf("high 200: %v", why)
	}
	shared, _, borrow = tab.Detail(b, s.capacity(admission.High, false), 1)
	if shared.Tokens != 700 || shared.TokensInUse != 700 || borrow.BorrowedTokens != 1 {
		t.Fatalf("high detail = %+v, would borrow %+v", *shared, borrow)
	}
	st := tab.Stats(Capacity{MaxConcurrent: 100, InFlight: s.inFlight, InFlightTokens: s.tokens, Budget: 1000})
	if st.Shared.Tokens != 700 || st.Shared.TokensInUse != 700 {
		t.Fatalf("stats shared = %+v", st.Shared)
	}
	// a's floor is whole for high priority.
	a := mustLookup(t, tab, "a")
	if why, _, r := s.try(a, 300, admission.High); why != ok || r.BorrowedTokens != 0 {
		t.Fatalf("a high within floor: %v %+v", why, r)
	}
}

// TestNoFloors: with classes but no floors every admission borrows, and the
// protection checks never fire (the global gate decides).
func TestNoFloors(t *testing.T) {
	for _, budget := range []int64{-1, 1000} {
		g := limitsOf(2, budget, 0)
		tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {}, "b": {MaxConcurrent: ip(5)}}}, g)
		s := &sim{t: tab, g: g}
		reserved := int64(0)
		if budget >= 0 {
			reserved = 40
		}
		for _, name := range []string{"a", "b"} {
			c := mustLookup(t, tab, name)
			if r := tab.Resources(c, reserved); r != (admission.Resources{BorrowedConcurrency: true, BorrowedTokens: reserved}) {
				t.Fatalf("Resources = %+v", r)
			}
			why, _, r := s.try(c, reserved, admission.Normal)
			if why != ok || r != (admission.Resources{BorrowedConcurrency: true, BorrowedTokens: reserved}) {
				t.Fatalf("budget %d %s: %v %+v", budget, name, why, r)
			}
		}
		// The gate is full: the class checks pass and the gate rejects (or,
		// in the actor, queues).
		a := mustLookup(t, tab, "a")
		if why, con := tab.Check(a, s.capacity(admission.Normal, false), reserved); why != ok {
			t.Fatalf("Check with a full gate: %v/%v", why, con)
		}
		if why, con, _ := s.try(a, reserved, admission.Normal); why != concLimit || con != global {
			t.Fatalf("full gate: %v/%v", why, con)
		}
	}
}

// TestSlotHeld: the postcheck, with the call's slot counted in InFlight,
// decides like the precheck without it.
func TestSlotHeld(t *testing.T) {
	g := limitsOf(3, -1, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {ProtectedConcurrent: 1}, "b": {}}}, g)
	b := mustLookup(t, tab, "b")
	tab.Admit(b, 0)
	pre := Capacity{MaxConcurrent: 3, InFlight: 1}
	post := Capacity{MaxConcurrent: 3, InFlight: 2, SlotHeld: true}
	if why, _ := tab.Check(b, pre, 0); why != ok {
		t.Fatalf("precheck: %v", why)
	}
	if why, _ := tab.Check(b, post, 0); why != ok {
		t.Fatalf("postcheck: %v", why)
	}
	// Counted as the precheck's, the held slot would exhaust the pool.
	if why, con := tab.Check(b, Capacity{MaxConcurrent: 3, InFlight: 2}, 0); why != concLimit || con != protection {
		t.Fatalf("without SlotHeld: %v/%v", why, con)
	}
	_, dpre, _ := tab.Detail(b, pre, 0)
	spost, dpost, _ := tab.Detail(b, post, 0)
	if !reflect.DeepEqual(dpre, dpost) || spost.SlotsInUse != 1 {
		t.Fatalf("detail differs: %+v %+v %+v", dpre, dpost, spost)
	}
	// A stray SlotHeld with nothing in flight does not go negative.
	if why, _ := tab.Check(b, Capacity{MaxConcurrent: 3, SlotHeld: true}, 0); why != ok {
		t.Fatalf("empty: %v", why)
	}
}

func TestLookup(t *testing.T) {
	tab := mustNew(t, admission.Classes{Default: "fg", Limits: map[string]L{"fg": {}, "bg": {}}}, limitsOf(1, -1, 0))
	for name, want := range map[string]string{"": "fg", "fg": "fg", "bg": "bg"} {
		c := mustLookup(t, tab, name)
		if c == None || tab.Name(c) != want {
			t.Fatalf("Lookup(%q) = %v (%q)", name, c, tab.Name(c))
		}
	}
	if tab.Default() != mustLookup(t, tab, "fg") || tab.Len() != 2 {
		t.Fatal("Default or Len")
	}
	_, err := tab.Lookup("FG")
	checkConfigError(t, err, "Class", `"FG" is not one of ["bg" "fg"]`)
	if tab.Name(None) != "" || tab.Name(Class(3)) != "" {
		t.Fatal("Name of a foreign class")
	}
}

// TestNilTable: a bulkhead without classes calls the same methods.
func TestNilTable(t *testing.T) {
	var tab *Table
	c, err := tab.Lookup("")
	if err != nil || c != None {
		t.Fatalf("Lookup(\"\") = %v, %v", c, err)
	}
	_, err = tab.Lookup("bg")
	checkConfigError(t, err, "Class", "no admission classes")
	if why, con := tab.Check(None, Capacity{}, 5); why != ok || con != "" {
		t.Fatal("Check")
	}
	if tab.Admit(None, 5) != (admission.Resources{}) || tab.Resources(None, 5) != (admission.Resources{}) {
		t.Fatal("Admit")
	}
	tab.Reject(None, concLimit)
	tab.AdjustHold(None, 3)
	tab.Abandon(None, admission.AbandonManual)
	tab.Release(None, Settlement{Held: 5})
	if s, d, r := tab.Detail(None, Capacity{}, 0); s != nil || d != nil || r != (admission.Resources{}) {
		t.Fatal("Detail")
	}
	if tab.Stats(Capacity{}) != nil || tab.Len() != 0 || tab.Default() != None || tab.Name(None) != "" {
		t.Fatal("Stats, Len, Default or Name")
	}
	if cl := tab.Classes(); cl.Default != "" || cl.Limits != nil {
		t.Fatal("Classes")
	}
	// None on a real table is a no-op too.
	real := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {MaxConcurrent: ip(0)}}}, limitsOf(1, -1, 0))
	if why, _ := real.Check(None, Capacity{}, 0); why != ok {
		t.Fatal("Check(None)")
	}
	real.Admit(None, 0)
	if st := real.Stats(Capacity{}); classOf(st, "a").Admitted != 0 {
		t.Fatal("Admit(None) counted")
	}
}

// TestSettlement: release, abandon, overrun and refunds, per class, and the
// ledger identity of SPEC F11 per class.
func TestSettlement(t *testing.T) {
	g := limitsOf(10, 10_000, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 100}}}, g)
	a := mustLookup(t, tab, "a")

	r1 := tab.Admit(a, 300) // protected slot, 100 tokens from the floor
	r2 := tab.Admit(a, 200) // borrowed slot, all tokens borrowed
	if r1 != (admission.Resources{BorrowedTokens: 200}) || r2 != (admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 200}) {
		t.Fatalf("resources %+v %+v", r1, r2)
	}
	tab.AdjustHold(a, -40) // r1 early refund: hold 260
	tab.AdjustHold(a, 50)  // r2 overrun: hold 250
	tab.Abandon(a, admission.AbandonDeadline)
	st := classOf(tab.Stats(Capacity{MaxConcurrent: 10, InFlight: 1, InFlightTokens: 510, Budget: 10_000}), "a")
	if st.InFlight != 1 || st.InFlightTokens != 510 || st.Abandonments() != 1 ||
		st.Abandoned != [admission.NumCauses]int64{admission.AbandonDeadline: 1} {
		t.Fatalf("after abandon: %+v", st)
	}
	tab.Release(a, Settlement{Held: 260, Consumed: 250, Refunded: 10})
	tab.Release(a, Settlement{Held: 250, Consumed: 250, SlotAbandoned: true})
	st = classOf(tab.Stats(Capacity{MaxConcurrent: 10, Budget: 10_000}), "a")
	want := admission.ClassStats{
		ClassUse:               admission.ClassUse{Name: "a", Limits: L{ProtectedConcurrent: 1, ProtectedInFlightTokens: 100}},
		Counts:                 admission.Counts{Admitted: 2, Released: 2, Abandoned: [admission.NumCauses]int64{admission.AbandonDeadline: 1}},
		Ledger:                 admission.Ledger{Reserved: 500, Consumed: 500, Refunded: 50, Overrun: 50},
		BorrowedAdmissions:     1,
		BorrowedTokensReserved: 400,
	}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("settled:\n got %+v\nwant %+v", st, want)
	}
	// Ledger: reserved + overrun - early refunds == holds at release + in flight.
	if st.Reserved+st.Overrun-40 != 260+250+st.InFlightTokens {
		t.Fatal("ledger identity")
	}
	tab.Reject(a, budgetLimit)
	tab.Reject(a, budgetLimit)
	tab.Reject(a, admission.Shutdown)
	st = classOf(tab.Stats(Capacity{}), "a")
	if st.Rejections() != 3 || st.Rejected != [admission.NumReasons]int64{budgetLimit: 2, admission.Shutdown: 1} {
		t.Fatalf("rejections %+v", st)
	}
}

// TestCopies: what Stats, Detail and Classes return shares no memory with
// the table, and New keeps no reference to its input.
func TestCopies(t *testing.T) {
	in := admission.Classes{Default: "a", Limits: map[string]L{"a": {MaxConcurrent: ip(2), MaxInFlightTokens: i64p(50)}}}
	tab := mustNew(t, in, limitsOf(5, 100, 0))
	a := mustLookup(t, tab, "a")
	*in.Limits["a"].MaxConcurrent = 99
	in.Limits["b"] = L{}
	tab.Admit(a, 10)
	tab.Reject(a, concLimit)

	st := tab.Stats(Capacity{MaxConcurrent: 5, InFlight: 1, InFlightTokens: 10, Budget: 100})
	cs := classOf(st, "a")
	*cs.Limits.MaxConcurrent = 7
	*cs.Limits.MaxInFlightTokens = 7
	cs.Rejected[concLimit] = 9
	cl := tab.Classes()
	*cl.Limits["a"].MaxConcurrent = 8
	_, d, _ := tab.Detail(a, Capacity{}, 0)
	*d.Limits.MaxConcurrent = 6
	*d.Limits.MaxInFlightTokens = 6

	again := tab.Stats(Capacity{MaxConcurrent: 5, InFlight: 1, InFlightTokens: 10, Budget: 100})
	ca := classOf(again, "a")
	if *ca.Limits.MaxConcurrent != 2 || *ca.Limits.MaxInFlightTokens != 50 || ca.Rejected[concLimit] != 1 ||
		again.Shared.Tokens != 100 || len(again.Classes) != 1 {
		t.Fatalf("state leaked through a copy: %+v %+v", ca, again.Shared)
	}
	if why, _ := tab.Check(a, Capacity{MaxConcurrent: 5, InFlight: 1}, 0); why != ok {
		t.Fatalf("the table's limits changed: %v", why)
	}
	if got := tab.Classes(); *got.Limits["a"].MaxConcurrent != 2 || got.Default != "a" {
		t.Fatalf("Classes = %+v", got)
	}
}

// TestHotPathAllocs: the per-call methods do not allocate.
func TestHotPathAllocs(t *testing.T) {
	g := limitsOf(8, 10_000, 100)
	tab := mustNew(t, admission.Classes{Default: "fg", Limits: map[string]L{
		"fg": {ProtectedConcurrent: 2, ProtectedInFlightTokens: 1000, MaxConcurrent: ip(6)},
		"bg": {MaxConcurrent: ip(4), MaxInFlightTokens: i64p(5000)},
	}}, g)
	capAt := Capacity{MaxConcurrent: 8, InFlight: 3, InFlightTokens: 700, Budget: 9_900}
	allocs := testing.AllocsPerRun(1000, func() {
		c, err := tab.Lookup("bg")
		if err != nil {
			panic(err)
		}
		if why, _ := tab.Check(c, capAt, 300); why != ok {
			panic(why)
		}
		capAt.SlotHeld = true
		if why, _ := tab.Check(c, capAt, 300); why != ok {
			panic(why)
		}
		capAt.SlotHeld = false
		_ = tab.Resources(c, 300)
		r := tab.Admit(c, 300)
		tab.AdjustHold(c, -10)
		tab.AdjustHold(c, 20)
		if r.BorrowedConcurrency {
			tab.Abandon(c, admission.AbandonManual)
		}
		tab.Release(c, Settlement{Held: 310, Consumed: 200, Refunded: 110, SlotAbandoned: r.BorrowedConcurrency})
		tab.Reject(c, admission.QueueLimit)
		d, _ := tab.Lookup("")
		_, _ = tab.Check(d, capAt, 1)
	})
	if allocs != 0 {
		t.Fatalf("hot path allocates %v times", allocs)
	}
}

func TestLookupErrorIsConfigError(t *testing.T) {
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {}}}, limitsOf(1, -1, 0))
	_, err := tab.Lookup("nope")
	if !errors.Is(err, admission.ErrInvalid) {
		t.Fatalf("%v", err)
	}
}

// BenchmarkDecision is one class decision on the admission path: lookup,
// precheck, postcheck, admit and release.
func BenchmarkDecision(b *testing.B) {
	g := limitsOf(64, 1_000_000, 0)
	tab := mustNew(b, admission.Classes{Default: "fg", Limits: map[string]L{
		"fg":    {ProtectedConcurrent: 8, ProtectedInFlightTokens: 10_000},
		"bg":    {MaxConcurrent: ip(32)},
		"batch": {MaxConcurrent: ip(16), MaxInFlightTokens: i64p(100_000)},
	}}, g)
	capAt := Capacity{MaxConcurrent: 64, InFlight: 10, InFlightTokens: 20_000, Budget: 1_000_000}
	b.ReportAllocs()
	for b.Loop() {
		c, _ := tab.Lookup("bg")
		if why, _ := tab.Check(c, capAt, 500); why != ok {
			b.Fatal(why)
		}
		capAt.SlotHeld = true
		_, _ = tab.Check(c, capAt, 500)
		capAt.SlotHeld = false
		tab.Admit(c, 500)
		tab.Release(c, Settlement{Held: 500})
	}
}

// TestLookupConcurrentWithActor: Lookup and Name may run on other
// goroutines while the actor decides (run with -race).
func TestLookupConcurrentWithActor(t *testing.T) {
	g := limitsOf(4, 100, 0)
	cl := admission.Classes{Default: "a", Limits: map[string]L{"a": {ProtectedConcurrent: 1}, "b": {}}}
	tab := mustNew(t, cl, g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			c, err := tab.Lookup("b")
			if err != nil || tab.Name(c) != "b" || tab.Default() == None || tab.Len() != 2 {
				panic("lookup")
			}
		}
	}()
	b := mustLookup(t, tab, "b")
	for range 1000 {
		tab.Admit(b, 1)
		_, _ = tab.Check(b, Capacity{MaxConcurrent: 4, InFlight: 1, Budget: 100}, 1)
		u, err := tab.Prepare("Limits.Classes", cl, g)
		if err != nil {
			t.Fatal(err)
		}
		tab.Apply(u)
		tab.Release(b, Settlement{Held: 1})
	}
	<-done
}

// TestDrift: a settlement that would take a class's gauges below zero is
// counted and reported, and the gauge stops at zero; nothing is hidden.
func TestDrift(t *testing.T) {
	g := limitsOf(10, 10_000, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 100}}}, g)
	a := mustLookup(t, tab, "a")
	type drift struct {
		class, quantity string
		got             int64
	}
	var seen []drift
	tab.OnDrift(func(class, quantity string, got int64) { seen = append(seen, drift{class, quantity, got}) })

	tab.Admit(a, 30)
	tab.Release(a, Settlement{Held: 30})
	if tab.Drift() != 0 || len(seen) != 0 {
		t.Fatalf("a balanced settlement drifted: %d %+v", tab.Drift(), seen)
	}
	tab.Admit(a, 30)
	tab.Release(a, Settlement{Held: 50})    // 20 tokens more than held
	tab.Release(a, Settlement{Held: 0})     // a slot never taken
	tab.Abandon(a, admission.AbandonManual) // and another
	tab.AdjustHold(a, -5)                   // a refund of nothing
	want := []drift{{"a", "in-flight tokens", -20}, {"a", "in-flight slots", -1}, {"a", "in-flight slots", -1}, {"a", "in-flight tokens", -5}}
	if tab.Drift() != 4 || !reflect.DeepEqual(seen, want) {
		t.Fatalf("drift %d, reported %+v; want 4, %+v", tab.Drift(), seen, want)
	}
	st := classOf(tab.Stats(Capacity{MaxConcurrent: 10, Budget: 10_000}), "a")
	if st.InFlight != 0 || st.InFlightTokens != 0 || st.ProtectedConcurrentInUse() != 0 || st.ProtectedTokensInUse() != 0 {
		t.Fatalf("gauges after drift: %+v", st)
	}
	if (*Table)(nil).Drift() != 0 {
		t.Fatal("a nil table drifted")
	}
}

// TestTotalsSaturate: the cumulative totals stop at math.MaxInt64 instead
// of wrapping; the gauges stay exact.
func TestTotalsSaturate(t *testing.T) {
	const top = math.MaxInt64
	g := limitsOf(10, top, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{"a": {}}}, g)
	a := mustLookup(t, tab, "a")
	for range 2 {
		tab.Admit(a, top)
		tab.AdjustHold(a, -top)
		tab.AdjustHold(a, top)
		tab.Release(a, Settlement{Held: top, Consumed: top, Refunded: top})
	}
	st := classOf(tab.Stats(Capacity{MaxConcurrent: 10, Budget: top}), "a")
	if st.Reserved != top || st.Consumed != top || st.Refunded != top || st.Overrun != top ||
		st.BorrowedTokensReserved != top || st.InFlightTokens != 0 || st.Admitted != 2 || tab.Drift() != 0 {
		t.Fatalf("saturated totals: %+v, drift %d", st, tab.Drift())
	}
}
