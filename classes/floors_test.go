package classes

import (
	"math"
	"math/big"
	"reflect"
	"slices"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// TestShrink covers the floors in effect: floor * limit / sum, rounded
// down, while the limit is below the sum; the floors unchanged otherwise.
func TestShrink(t *testing.T) {
	const maxI = math.MaxInt64
	tests := []struct {
		name   string
		floors []int64
		limit  int64
		want   []int64
	}{
		{"no classes", nil, 5, nil},
		{"no floors", []int64{0, 0}, 0, []int64{0, 0}},
		{"limit above the sum", []int64{2, 1, 0}, 10, []int64{2, 1, 0}},
		{"limit equals the sum", []int64{2, 1, 0}, 3, []int64{2, 1, 0}},
		{"exact halves", []int64{6, 4}, 5, []int64{3, 2}},
		{"rounded down", []int64{2, 1}, 2, []int64{1, 0}},               // 4/3, 2/3
		{"rounded down to zero", []int64{1, 1, 1}, 2, []int64{0, 0, 0}}, // 2/3 each
		{"rounded down, uneven", []int64{5, 3, 2}, 7, []int64{3, 2, 1}}, // 3.5, 2.1, 1.4
		{"kill switch", []int64{6, 4}, 0, []int64{0, 0}},
		{"negative limit is zero", []int64{6, 4}, -3, []int64{0, 0}},
		{"zero floor stays zero", []int64{0, 10}, 5, []int64{0, 5}},
		// The product overflows int64 but not the 128-bit arithmetic.
		{"huge, just below the sum", []int64{maxI - 1, 1}, maxI - 1, []int64{maxI - 2, 0}},
		{"huge halves", []int64{maxI / 2, maxI / 2}, maxI / 4, []int64{maxI / 8, maxI / 8}},
		{"huge, sum fits uint64", []int64{maxI, maxI}, maxI, []int64{maxI / 2, maxI / 2}},
		{"rounded down, three quarters", []int64{3, 1}, 3, []int64{2, 0}},
		// The sum itself exceeds 64 bits.
		{"sum above 64 bits", []int64{maxI, maxI, maxI}, maxI, []int64{maxI / 3, maxI / 3, maxI / 3}},
		{"sum above 64 bits, uneven", []int64{maxI, maxI, maxI, 1}, maxI - 1, nil}, // checked against big.Int below
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.floors)
			got := shrink(tc.floors, tc.limit)
			if !slices.Equal(in, tc.floors) {
				t.Fatalf("shrink changed its input: %v", tc.floors)
			}
			want := tc.want
			if want == nil && tc.floors != nil {
				want = bigShrink(tc.floors, tc.limit)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("shrink(%v, %d) = %v, want %v", tc.floors, tc.limit, got, want)
			}
			if b := bigShrink(tc.floors, tc.limit); !slices.Equal(got, b) {
				t.Fatalf("shrink(%v, %d) = %v, big.Int says %v", tc.floors, tc.limit, got, b)
			}
			var sum big.Int
			for i, f := range got {
				if f < 0 || f > tc.floors[i] {
					t.Fatalf("floor %d in effect is %d, configured %d", i, f, tc.floors[i])
				}
				sum.Add(&sum, big.NewInt(f))
			}
			var conf big.Int
			for _, f := range tc.floors {
				conf.Add(&conf, big.NewInt(f))
			}
			if sum.Cmp(big.NewInt(max(0, tc.limit))) > 0 && sum.Cmp(&conf) != 0 {
				t.Fatalf("floors in effect sum to %v, above the limit %d", &sum, tc.limit)
			}
		})
	}
}

// bigShrink is shrink computed naively with big.Int.
func bigShrink(floors []int64, limit int64) []int64 {
	limit = max(0, limit)
	var sum big.Int
	for _, f := range floors {
		sum.Add(&sum, big.NewInt(f))
	}
	out := slices.Clone(floors)
	if sum.Cmp(big.NewInt(limit)) <= 0 {
		return out
	}
	for i, f := range floors {
		var q big.Int
		q.Mul(big.NewInt(f), big.NewInt(limit))
		q.Quo(&q, &sum)
		out[i] = q.Int64()
	}
	return out
}

// apply prepares and applies next with the global limits g, failing the
// test on an error, and moves the sim to g.
func (s *sim) apply(tb testing.TB, next admission.Classes, g admission.Limits) {
	tb.Helper()
	u, err := s.t.Prepare("Limits.Classes", next, g)
	if err != nil {
		tb.Fatalf("Prepare: %v", err)
	}
	s.t.Apply(u)
	s.g = g
}

// TestRuntimeFloors: a runtime limit below the sum of the floors shrinks
// the floors in effect, which every check, Resources, Detail and Stats use;
// the configured floors stay in Classes and come back with the limit.
func TestRuntimeFloors(t *testing.T) {
	cl := admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedConcurrent: 6, ProtectedInFlightTokens: 600},
		"b": {ProtectedConcurrent: 4, ProtectedInFlightTokens: 400, MaxConcurrent: ip(8)},
		"c": {},
	}}
	g := limitsOf(10, 1000, 100)
	tab := mustNew(t, cl, g)
	s := &sim{t: tab, g: g}
	a, b, c := mustLookup(t, tab, "a"), mustLookup(t, tab, "b"), mustLookup(t, tab, "c")

	// Halve both limits: floors in effect a 3/300, b 2/200; no shared pool.
	s.apply(t, cl, limitsOf(5, 500, 100))
	if got := tab.Classes(); !reflect.DeepEqual(got.Limits, cl.Limits) {
		t.Fatalf("Classes = %+v, want the configured %+v", got.Limits, cl.Limits)
	}
	st := tab.Stats(s.capacity(admission.High, false))
	wantA := L{ProtectedConcurrent: 3, ProtectedInFlightTokens: 300}
	wantB := L{ProtectedConcurrent: 2, ProtectedInFlightTokens: 200, MaxConcurrent: ip(8)}
	if !reflect.DeepEqual(classOf(st, "a").Limits, wantA) || !reflect.DeepEqual(classOf(st, "b").Limits, wantB) ||
		!reflect.DeepEqual(classOf(st, "c").Limits, L{}) {
		t.Fatalf("Stats limits = %+v %+v %+v, want the floors in effect", classOf(st, "a").Limits, classOf(st, "b").Limits, classOf(st, "c").Limits)
	}
	if st.Shared != (admission.SharedPool{HasTokens: true}) {
		t.Fatalf("shared = %+v, want no shared pool", st.Shared)
	}
	// c has no floor and nothing to borrow.
	if why, con, _ := s.try(c, 0, admission.High); why != concLimit || con != protection {
		t.Fatalf("c: %v/%v, want concurrency protection", why, con)
	}
	// a fills its floor in effect without borrowing (High: the whole budget,
	// as the token floors scale with it), then is refused.
	for i := range 3 {
		if why, con, r := s.try(a, 100, admission.High); why != ok || r != (admission.Resources{}) {
			t.Fatalf("a %d: %v/%v %+v, want admitted within its floor", i+1, why, con, r)
		}
	}
	if r := tab.Resources(a, 1); r != (admission.Resources{BorrowedConcurrency: true, BorrowedTokens: 1}) {
		t.Fatalf("Resources(a) at its floor = %+v", r)
	}
	if why, con, _ := s.try(a, 0, admission.High); why != concLimit || con != protection {
		t.Fatalf("a above its floor in effect: %v/%v", why, con)
	}
	_, cd, _ := tab.Detail(a, s.capacity(admission.High, false), 1)
	if cd.Limits.ProtectedConcurrent != 3 || cd.ProtectedConcurrentInUse() != 3 || cd.InFlight != 3 ||
		cd.Limits.ProtectedInFlightTokens != 300 || cd.ProtectedTokensInUse() != 300 {
		t.Fatalf("a detail = %+v", cd)
	}
	// b still has its floor in effect: 2 slots and 200 tokens.
	if why, _, r := s.try(b, 200, admission.High); why != ok || r != (admission.Resources{}) {
		t.Fatalf("b within its floor: %v %+v", why, r)
	}
	shared, cd, borrow := tab.Detail(b, s.capacity(admission.High, false), 1)
	if *shared != (admission.SharedPool{HasTokens: true}) || borrow != (admission.Resources{BorrowedTokens: 1}) ||
		cd.Limits.ProtectedConcurrent != 2 || cd.InFlight != 1 || cd.InFlightTokens != 200 {
		t.Fatalf("b detail = %+v %+v %+v", *shared, borrow, cd)
	}
	// A zero-token call within b's slot floor borrows nothing and passes.
	if why, _, r := s.try(b, 0, admission.High); why != ok || r != (admission.Resources{}) {
		t.Fatalf("b's second slot: %v %+v", why, r)
	}
	st = tab.Stats(s.capacity(admission.High, false))
	if sa := classOf(st, "a"); sa.ProtectedConcurrentInUse() != 3 || sa.BorrowedConcurrent() != 0 || sa.ProtectedTokensInUse() != 300 {
		t.Fatalf("a stats = %+v", sa)
	}

	// Back to the full limits: the configured floors apply again, and the
	// shared pool reopens (10 - 10 slots: still none; 1000 - 1000 tokens).
	s.apply(t, cl, g)
	st = tab.Stats(s.capacity(admission.High, false))
	if classOf(st, "a").Limits.ProtectedConcurrent != 6 || classOf(st, "b").Limits.ProtectedInFlightTokens != 400 {
		t.Fatalf("floors after the limits came back: %+v %+v", classOf(st, "a").Limits, classOf(st, "b").Limits)
	}
	if why, _, r := s.try(a, 100, admission.High); why != ok || r != (admission.Resources{}) {
		t.Fatalf("a within its restored floor: %v %+v", why, r)
	}

	// A limit above the sum: floors as configured, the rest shared.
	s.apply(t, cl, limitsOf(12, 1200, 100))
	st = tab.Stats(s.capacity(admission.High, false))
	if st.Shared.Slots != 2 || st.Shared.Tokens != 200 || classOf(st, "a").Limits.ProtectedConcurrent != 6 {
		t.Fatalf("above the sum: %+v %+v", st.Shared, classOf(st, "a").Limits)
	}
}

// TestRuntimeFloorsRounding: the floors in effect round down, and what the
// rounding leaves over is shared.
func TestRuntimeFloorsRounding(t *testing.T) {
	cl := admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedConcurrent: 2},
		"b": {ProtectedConcurrent: 1},
	}}
	tab := mustNew(t, cl, limitsOf(3, -1, 0))
	s := &sim{t: tab}
	a, b := mustLookup(t, tab, "a"), mustLookup(t, tab, "b")
	// MaxConcurrent 2: a 4/3 -> 1, b 2/3 -> 0; shared 2 - 1 = 1.
	s.apply(t, cl, limitsOf(2, -1, 0))
	st := tab.Stats(s.capacity(admission.High, false))
	if classOf(st, "a").Limits.ProtectedConcurrent != 1 || classOf(st, "b").Limits.ProtectedConcurrent != 0 || st.Shared.Slots != 1 {
		t.Fatalf("stats = %+v %+v %+v", st.Shared, classOf(st, "a").Limits, classOf(st, "b").Limits)
	}
	if why, _, r := s.try(b, 0, admission.Normal); why != ok || !r.BorrowedConcurrency {
		t.Fatalf("b borrows the shared slot: %v %+v", why, r)
	}
	if why, con, _ := s.try(b, 0, admission.Normal); why != concLimit || con != protection {
		t.Fatalf("b again: %v/%v", why, con)
	}
	if why, _, r := s.try(a, 0, admission.Normal); why != ok || r.BorrowedConcurrency {
		t.Fatalf("a within its floor in effect: %v %+v", why, r)
	}
	if s.inFlight != 2 {
		t.Fatalf("in flight %d", s.inFlight)
	}
}

// TestKillSwitchWithFloors: MaxConcurrent 0 or a budget of 0 is valid with
// floors configured; the floors in effect become 0, so the protections are
// inactive and the global limits decide.
func TestKillSwitchWithFloors(t *testing.T) {
	cl := admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedConcurrent: 2, ProtectedInFlightTokens: 300},
		"b": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 200},
	}}
	g := limitsOf(3, 1000, 0)
	t.Run("MaxConcurrent 0", func(t *testing.T) {
		tab := mustNew(t, cl, g)
		s := &sim{t: tab, g: g}
		a := mustLookup(t, tab, "a")
		if why, _, _ := s.try(a, 10, admission.Normal); why != ok {
			t.Fatalf("before: %v", why)
		}
		s.apply(t, cl, limitsOf(0, 1000, 0))
		st := tab.Stats(s.capacity(admission.High, false))
		if classOf(st, "a").Limits.ProtectedConcurrent != 0 || classOf(st, "b").Limits.ProtectedConcurrent != 0 ||
			classOf(st, "a").Limits.ProtectedInFlightTokens != 300 {
			t.Fatalf("floors in effect = %+v %+v", classOf(st, "a").Limits, classOf(st, "b").Limits)
		}
		if st.Shared.Slots != 0 || st.Shared.SlotsInUse != 1 || classOf(st, "a").BorrowedConcurrent() != 1 {
			t.Fatalf("shared = %+v, a = %+v", st.Shared, classOf(st, "a"))
		}
		// The class checks pass; the gate rejects (it has no slot).
		if why, con := tab.Check(a, s.capacity(admission.Normal, false), 10); why != ok {
			t.Fatalf("Check under the kill switch: %v/%v", why, con)
		}
		if why, con, _ := s.try(a, 10, admission.Normal); why != concLimit || con != global {
			t.Fatalf("under the kill switch: %v/%v, want the gate", why, con)
		}
		if r := tab.Resources(a, 10); !r.BorrowedConcurrency || r.BorrowedTokens != 0 {
			t.Fatalf("Resources = %+v", r)
		}
		// Attrition, then the switch is lifted: the floors are back.
		tab.Release(a, Settlement{Held: 10})
		s.inFlight, s.tokens = 0, 0
		s.apply(t, cl, g)
		if why, _, r := s.try(a, 10, admission.Normal); why != ok || r.BorrowedConcurrency {
			t.Fatalf("after the switch: %v %+v", why, r)
		}
	})
	t.Run("budget 0", func(t *testing.T) {
		tab := mustNew(t, cl, g)
		s := &sim{t: tab, g: g}
		a := mustLookup(t, tab, "a")
		s.apply(t, cl, limitsOf(3, 0, 0))
		st := tab.Stats(s.capacity(admission.High, false))
		if classOf(st, "a").Limits.ProtectedInFlightTokens != 0 || classOf(st, "a").Limits.ProtectedConcurrent != 2 ||
			st.Shared.Tokens != 0 || st.Shared.TokensInUse != 0 {
			t.Fatalf("stats = %+v %+v", classOf(st, "a").Limits, st.Shared)
		}
		// Zero-token calls still run within the slot floors; any token is
		// refused by the global budget.
		if why, _, r := s.try(a, 0, admission.High); why != ok || r != (admission.Resources{}) {
			t.Fatalf("zero tokens: %v %+v", why, r)
		}
		if why, con, _ := s.try(a, 1, admission.High); why != budgetLimit || con != global {
			t.Fatalf("one token: %v/%v", why, con)
		}
		if why, con := tab.Check(a, s.capacity(admission.High, false), 1); why != ok {
			t.Fatalf("class checks with token floors of 0: %v/%v", why, con)
		}
	})
	t.Run("fail-closed start keeps the construction rule", func(t *testing.T) {
		_, err := New("Config.Classes", cl, limitsOf(0, 1000, 0))
		checkConfigError(t, err, "Config.Classes.Limits", "sum to 3, above MaxConcurrent 0")
		_, err = New("Config.Classes", cl, limitsOf(3, 0, 0))
		checkConfigError(t, err, "Config.Classes.Limits", "sum to 500, above the token budget 0")
		zero := admission.Classes{Default: "a", Limits: map[string]L{"a": {}, "b": {MaxConcurrent: ip(0)}}}
		if _, err := New("Config.Classes", zero, limitsOf(0, 0, 0)); err != nil {
			t.Fatalf("a fail-closed start without floors: %v", err)
		}
	})
}

// TestRuntimeFloorsAllZero: when every floor in effect rounds down to 0
// the protections are off, as without floors: a full gate decides (and
// would queue) instead of the class protection.
func TestRuntimeFloorsAllZero(t *testing.T) {
	cl := admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedConcurrent: 1},
		"b": {ProtectedConcurrent: 1},
	}}
	tab := mustNew(t, cl, limitsOf(2, -1, 0))
	s := &sim{t: tab}
	s.apply(t, cl, limitsOf(1, -1, 0)) // 1/2 each -> 0
	a, b := mustLookup(t, tab, "a"), mustLookup(t, tab, "b")
	if why, _, r := s.try(a, 0, admission.Normal); why != ok || !r.BorrowedConcurrency {
		t.Fatalf("a: %v %+v", why, r)
	}
	if why, con := tab.Check(b, s.capacity(admission.Normal, false), 0); why != ok {
		t.Fatalf("Check with a full gate: %v/%v", why, con)
	}
	if why, con, _ := s.try(b, 0, admission.Normal); why != concLimit || con != global {
		t.Fatalf("b: %v/%v, want the gate", why, con)
	}
}

// TestRuntimeFloorsHuge: a budget near math.MaxInt64 shrinks the token
// floors exactly, without overflow.
func TestRuntimeFloorsHuge(t *testing.T) {
	const maxI = math.MaxInt64
	cl := admission.Classes{Default: "a", Limits: map[string]L{
		"a": {ProtectedInFlightTokens: maxI - 1},
		"b": {ProtectedInFlightTokens: 1},
	}}
	tab := mustNew(t, cl, limitsOf(4, maxI, 0))
	s := &sim{t: tab}
	s.apply(t, cl, limitsOf(4, maxI-1, 0))
	st := tab.Stats(s.capacity(admission.High, false))
	if got := classOf(st, "a").Limits.ProtectedInFlightTokens; got != maxI-2 {
		t.Fatalf("a's token floor in effect = %d, want %d", got, int64(maxI-2))
	}
	if got := classOf(st, "b").Limits.ProtectedInFlightTokens; got != 0 {
		t.Fatalf("b's token floor in effect = %d, want 0", got)
	}
	if st.Shared.Tokens != 1 {
		t.Fatalf("shared tokens = %+v", st.Shared)
	}
	a, b := mustLookup(t, tab, "a"), mustLookup(t, tab, "b")
	if why, _, r := s.try(a, maxI-2, admission.High); why != ok || r.BorrowedTokens != 0 {
		t.Fatalf("a fills its floor: %v %+v", why, r)
	}
	if why, _, r := s.try(b, 1, admission.High); why != ok || r.BorrowedTokens != 1 {
		t.Fatalf("b borrows the last token: %v %+v", why, r)
	}
	// Floors raised far above the budget at runtime: the sum overflows
	// int64, the floors in effect are still exact.
	raised := admission.Classes{Limits: map[string]L{"a": {ProtectedInFlightTokens: maxI}, "b": {ProtectedInFlightTokens: maxI}}}
	s.apply(t, raised, limitsOf(4, maxI-1, 0))
	st = tab.Stats(s.capacity(admission.High, false))
	if classOf(st, "a").Limits.ProtectedInFlightTokens != (maxI-1)/2 || classOf(st, "b").Limits.ProtectedInFlightTokens != (maxI-1)/2 {
		t.Fatalf("floors in effect = %+v %+v", classOf(st, "a").Limits, classOf(st, "b").Limits)
	}
	if got := tab.Classes(); got.Limits["a"].ProtectedInFlightTokens != maxI {
		t.Fatalf("configured floor = %+v", got.Limits["a"])
	}
}
