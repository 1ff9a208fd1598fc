package classes

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

func TestValidate(t *testing.T) {
	type L = admission.ClassLimits
	one := func(name string, l L) admission.Classes {
		return admission.Classes{Default: name, Limits: map[string]L{name: l}}
	}
	two := func(a, b L) admission.Classes {
		return admission.Classes{Default: "fg", Limits: map[string]L{"fg": a, "bg": b}}
	}
	budget := limitsOf(10, 1000, 0)
	noBudget := limitsOf(10, -1, 0)
	tests := []struct {
		name    string
		c       admission.Classes
		g       admission.Limits
		field   string // "" = valid
		problem string // a substring of the problem
	}{
		{"nil map", admission.Classes{Default: "x"}, budget, "Config.Classes.Limits", "at least one class"},
		{"empty map", admission.Classes{Default: "x", Limits: map[string]L{}}, budget, "Config.Classes.Limits", "at least one class"},
		{"empty name", admission.Classes{Default: "x", Limits: map[string]L{"": {}, "x": {}}}, budget, `Config.Classes.Limits[""]`, "must not be empty"},
		{"empty default", admission.Classes{Limits: map[string]L{"x": {}}}, budget, "Config.Classes.Default", "must name a class"},
		{"unknown default", admission.Classes{Default: "y", Limits: map[string]L{"x": {}}}, budget, "Config.Classes.Default", `"y" is not one of ["x"]`},
		{"negative floor", one("x", L{ProtectedConcurrent: -1}), budget, `Config.Classes.Limits["x"].ProtectedConcurrent`, "must be >= 0, got -1"},
		{"negative ceiling", one("x", L{MaxConcurrent: ip(-1)}), budget, `Config.Classes.Limits["x"].MaxConcurrent`, "must be >= 0, got -1"},
		{"floor above ceiling", one("x", L{ProtectedConcurrent: 3, MaxConcurrent: ip(2)}), budget, `Config.Classes.Limits["x"].ProtectedConcurrent`, "must not exceed the class's MaxConcurrent (2), got 3"},
		{"floor equals ceiling", one("x", L{ProtectedConcurrent: 2, MaxConcurrent: ip(2)}), budget, "", ""},
		{"zero ceiling", one("x", L{MaxConcurrent: ip(0)}), budget, "", ""},
		{"negative token floor", one("x", L{ProtectedInFlightTokens: -1}), budget, `Config.Classes.Limits["x"].ProtectedInFlightTokens`, "must be >= 0, got -1"},
		{"negative token ceiling", one("x", L{MaxInFlightTokens: i64p(-5)}), budget, `Config.Classes.Limits["x"].MaxInFlightTokens`, "must be >= 0, got -5"},
		{"token floor above token ceiling", one("x", L{ProtectedInFlightTokens: 11, MaxInFlightTokens: i64p(10)}), budget, `Config.Classes.Limits["x"].ProtectedInFlightTokens`, "must not exceed the class's MaxInFlightTokens (10), got 11"},
		{"token floor equals token ceiling", one("x", L{ProtectedInFlightTokens: 10, MaxInFlightTokens: i64p(10)}), budget, "", ""},
		{"token floor without budget", one("x", L{ProtectedInFlightTokens: 1}), noBudget, `Config.Classes.Limits["x"].ProtectedInFlightTokens`, "needs a token budget"},
		{"token ceiling without budget", one("x", L{MaxInFlightTokens: i64p(0)}), noBudget, `Config.Classes.Limits["x"].MaxInFlightTokens`, "needs a token budget"},
		{"concurrency only without budget", one("x", L{ProtectedConcurrent: 1, MaxConcurrent: ip(5)}), noBudget, "", ""},
		{"floors fit exactly", two(L{ProtectedConcurrent: 6}, L{ProtectedConcurrent: 4}), budget, "", ""},
		{"floors above MaxConcurrent", two(L{ProtectedConcurrent: 6}, L{ProtectedConcurrent: 5}), budget, "Config.Classes.Limits", "sum to 11, above MaxConcurrent 10"},
		{"floors with kill switch", one("x", L{ProtectedConcurrent: 1}), limitsOf(0, -1, 0), "Config.Classes.Limits", "above MaxConcurrent 0"},
		{"token floors fit exactly", two(L{ProtectedInFlightTokens: 600}, L{ProtectedInFlightTokens: 400}), budget, "", ""},
		{"token floors above budget", two(L{ProtectedInFlightTokens: 600}, L{ProtectedInFlightTokens: 401}), budget, "Config.Classes.Limits", "sum to 1001, above the token budget 1000"},
		{"token floors overflow", two(L{ProtectedInFlightTokens: math.MaxInt64}, L{ProtectedInFlightTokens: math.MaxInt64, MaxInFlightTokens: nil}), limitsOf(10, math.MaxInt64, 0), "Config.Classes.Limits", "sum to more than"},
		{"token floors ignore reserve", one("x", L{ProtectedInFlightTokens: 1000}), limitsOf(10, 1000, 1000), "", ""},
		{"first bad class in name order", two(L{ProtectedConcurrent: -1}, L{ProtectedConcurrent: -2}), budget, `Config.Classes.Limits["bg"].ProtectedConcurrent`, "got -2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate("Config.Classes", tc.c, tc.g)
			tab, nerr := New("Config.Classes", tc.c, tc.g)
			if (err == nil) != (nerr == nil) {
				t.Fatalf("Validate says %v, New says %v", err, nerr)
			}
			if tc.field == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if tab == nil || tab.Len() != len(tc.c.Limits) {
					t.Fatalf("New returned %v", tab)
				}
				return
			}
			checkConfigError(t, err, tc.field, tc.problem)
			if tab != nil {
				t.Fatalf("New returned a table with an error")
			}
		})
	}
}

func checkConfigError(t *testing.T, err error, field, problem string) {
	t.Helper()
	var ce *admission.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("want *admission.ConfigError for %s, got %T %v", field, err, err)
	}
	if !errors.Is(err, admission.ErrInvalid) {
		t.Fatalf("errors.Is(err, ErrInvalid) is false for %v", err)
	}
	if ce.Field != field {
		t.Fatalf("field = %q, want %q (%v)", ce.Field, field, err)
	}
	if !strings.Contains(ce.Problem, problem) {
		t.Fatalf("problem = %q, want it to contain %q", ce.Problem, problem)
	}
}

func TestPrepare(t *testing.T) {
	type L = admission.ClassLimits
	base := admission.Classes{Default: "fg", Limits: map[string]L{
		"fg": {ProtectedConcurrent: 1, ProtectedInFlightTokens: 100},
		"bg": {MaxConcurrent: ip(2)},
	}}
	g := limitsOf(3, 1000, 0)
	with := func(edit func(m map[string]L)) admission.Classes {
		c := base.Clone()
		edit(c.Limits)
		return c
	}
	tests := []struct {
		name    string
		next    admission.Classes
		g       admission.Limits
		field   string
		problem string
	}{
		{"same", base, g, "", ""},
		{"empty default keeps", admission.Classes{Limits: base.Clone().Limits}, g, "", ""},
		{"missing", with(func(m map[string]L) { delete(m, "bg") }), g, "Limits.Classes.Limits", `missing ["bg"]`},
		{"unknown", with(func(m map[string]L) { m["zz"] = L{}; m["aa"] = L{} }), g, "Limits.Classes.Limits", `unknown ["aa" "zz"]`},
		{"missing and unknown", with(func(m map[string]L) { delete(m, "fg"); m["x"] = L{} }), g, "Limits.Classes.Limits", `must have exactly the classes ["bg" "fg"] (the class set is fixed); missing ["fg"]; unknown ["x"]`},
		{"nil limits", admission.Classes{Default: "fg"}, g, "Limits.Classes.Limits", `missing ["bg" "fg"]`},
		{"default changes", admission.Classes{Default: "bg", Limits: base.Clone().Limits}, g, "Limits.Classes.Default", `is fixed at "fg", got "bg"`},
		{"bad class", with(func(m map[string]L) { m["bg"] = L{MaxConcurrent: ip(-1)} }), g, `Limits.Classes.Limits["bg"].MaxConcurrent`, "must be >= 0"},
		// At runtime a limit below the sum of its floors is valid: the
		// floors in effect shrink (TestRuntimeFloors).
		{"floors above new MaxConcurrent", base, limitsOf(0, 1000, 0), "", ""},
		{"kill switch with floors zeroed", with(func(m map[string]L) { m["fg"] = L{ProtectedInFlightTokens: 100} }), limitsOf(0, 1000, 0), "", ""},
		{"token floors above new budget", base, limitsOf(3, 99, 0), "", ""},
		{"budget kill switch", base, limitsOf(3, 0, 0), "", ""},
		{"floors raised above the limits", with(func(m map[string]L) { m["bg"] = L{ProtectedConcurrent: 5, ProtectedInFlightTokens: 5000} }), g, "", ""},
		{"token floors overflow", with(func(m map[string]L) {
			m["fg"] = L{ProtectedInFlightTokens: math.MaxInt64}
			m["bg"] = L{ProtectedInFlightTokens: math.MaxInt64}
		}), limitsOf(3, math.MaxInt64, 0), "", ""},
		{"still no floor above its ceiling", with(func(m map[string]L) { m["bg"] = L{ProtectedConcurrent: 3, MaxConcurrent: ip(2)} }), limitsOf(0, 0, 0),
			`Limits.Classes.Limits["bg"].ProtectedConcurrent`, "must not exceed the class's MaxConcurrent (2), got 3"},
		{"reserve may exceed budget", base, limitsOf(3, 100, 500), "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := mustNew(t, base, g)
			u, err := tab.Prepare("Limits.Classes", tc.next, tc.g)
			if tc.field != "" {
				checkConfigError(t, err, tc.field, tc.problem)
				if u != nil {
					t.Fatal("Prepare returned an update with an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			tab.Apply(u)
			got := tab.Classes()
			if got.Default != "fg" || !reflect.DeepEqual(got.Limits, tc.next.Limits) {
				t.Fatalf("after Apply: %+v, want the configured %+v", got, tc.next.Limits)
			}
		})
	}

	t.Run("nil table", func(t *testing.T) {
		var tab *Table
		_, err := tab.Prepare("Limits.Classes", base, g)
		checkConfigError(t, err, "Limits.Classes", "no admission classes")
	})
	t.Run("Prepare changes nothing", func(t *testing.T) {
		tab := mustNew(t, base, g)
		before := tab.Classes()
		next := with(func(m map[string]L) { m["bg"] = L{MaxConcurrent: ip(1)} })
		if _, err := tab.Prepare("Limits.Classes", next, g); err != nil {
			t.Fatal(err)
		}
		if after := tab.Classes(); *after.Limits["bg"].MaxConcurrent != *before.Limits["bg"].MaxConcurrent {
			t.Fatalf("Prepare changed the table: %+v", after)
		}
	})
	t.Run("Apply of a foreign or spent update panics", func(t *testing.T) {
		a, b := mustNew(t, base, g), mustNew(t, base, g)
		u, err := a.Prepare("Limits.Classes", base, g)
		if err != nil {
			t.Fatal(err)
		}
		mustPanic(t, func() { b.Apply(u) })
		a.Apply(u)
		mustPanic(t, func() { a.Apply(u) })
		mustPanic(t, func() { a.Apply(nil) })
	})
}

func mustPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	f()
}

// TestApplyByAttrition: lowering a ceiling or raising a floor revokes
// nothing; usage and counters survive; new decisions use the new limits.
func TestApplyByAttrition(t *testing.T) {
	type L = admission.ClassLimits
	g := limitsOf(4, 1000, 0)
	tab := mustNew(t, admission.Classes{Default: "a", Limits: map[string]L{
		"a": {MaxConcurrent: ip(3)},
		"b": {},
	}}, g)
	s := &sim{t: tab, g: g}
	a, b := mustLookup(t, tab, "a"), mustLookup(t, tab, "b")
	for range 3 {
		if why, _, _ := s.try(a, 10, admission.Normal); why != admission.NoReason {
			t.Fatalf("a: %v", why)
		}
	}
	// Lower a's ceiling to 1 and give b a floor of 2 (a holds 3 shared
	// slots, so the shared pool of 2 is now over-used: nothing is revoked).
	u, err := tab.Prepare("Limits.Classes", admission.Classes{Limits: map[string]L{
		"a": {MaxConcurrent: ip(1)},
		"b": {ProtectedConcurrent: 2},
	}}, g)
	if err != nil {
		t.Fatal(err)
	}
	tab.Apply(u)
	st := tab.Stats(s.capacity(admission.High, false))
	if classOf(st, "a").InFlight != 3 || classOf(st, "a").InFlightTokens != 30 || classOf(st, "a").Admitted != 3 {
		t.Fatalf("usage lost: %+v", classOf(st, "a"))
	}
	if slots, _ := st.Shared.Available(); st.Shared.Slots != 2 || st.Shared.SlotsInUse != 3 || slots != 0 {
		t.Fatalf("shared = %+v", st.Shared)
	}
	if why, con, _ := s.try(a, 10, admission.Normal); why != admission.ConcurrencyLimit || con != admission.ConstraintClass {
		t.Fatalf("a above its new ceiling: %v/%v", why, con)
	}
	// b is below its floor: it is admitted (the gate has one slot left) and
	// does not borrow.
	if why, _, r := s.try(b, 10, admission.Normal); why != admission.NoReason || r.BorrowedConcurrency {
		t.Fatalf("b within its floor: %v %+v", why, r)
	}
	// Attrition: a releases two; a third release brings a below its ceiling.
	for range 2 {
		tab.Release(a, Settlement{Held: 10})
		s.inFlight--
		s.tokens -= 10
	}
	if why, con, _ := s.try(a, 10, admission.Normal); why != admission.ConcurrencyLimit || con != admission.ConstraintClass {
		t.Fatalf("a at its new ceiling: %v/%v", why, con)
	}
	tab.Release(a, Settlement{Held: 10})
	s.inFlight--
	s.tokens -= 10
	if why, con, r := s.try(a, 10, admission.Normal); why != admission.NoReason || !r.BorrowedConcurrency {
		t.Fatalf("a after attrition: %v/%v %+v", why, con, r)
	}
}
