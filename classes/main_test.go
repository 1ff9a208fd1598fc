package classes

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ip(n int) *int       { return &n }
func i64p(n int64) *int64 { return &n }

// limitsOf returns global limits with MaxConcurrent mc and, when budget >=
// 0, a token budget with the given high-priority reserve.
func limitsOf(mc int, budget, reserve int64) admission.Limits {
	l := admission.Limits{MaxConcurrent: mc, MaxQueue: 0}
	if budget >= 0 {
		l.TokenBudget = &admission.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
	}
	return l
}

// mustNew builds a Table or fails the test.
func mustNew(tb testing.TB, c admission.Classes, g admission.Limits) *Table {
	tb.Helper()
	t, err := New("Config.Classes", c, g)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return t
}

// mustLookup resolves a class name or fails the test.
func mustLookup(tb testing.TB, t *Table, name string) Class {
	tb.Helper()
	c, err := t.Lookup(name)
	if err != nil {
		tb.Fatalf("Lookup(%q): %v", name, err)
	}
	return c
}

// sim is a minimal admission actor around a Table: a gate without a queue
// and a token budget, deciding in the order of SPEC F4/F17.
type sim struct {
	t        *Table
	g        admission.Limits
	inFlight int
	tokens   int64
}

func (s *sim) effective(p admission.Priority) int64 {
	b := s.g.TokenBudget
	if b == nil {
		return 0
	}
	if p == admission.High {
		return b.Budget
	}
	return max(0, b.Budget-b.HighPriorityReserve)
}

func (s *sim) capacity(p admission.Priority, slotHeld bool) Capacity {
	return Capacity{
		MaxConcurrent:  s.g.MaxConcurrent,
		InFlight:       s.inFlight,
		SlotHeld:       slotHeld,
		InFlightTokens: s.tokens,
		Budget:         s.effective(p),
	}
}

// try runs one acquisition: global budget, class checks, gate. On success
// it commits and returns the resources.
func (s *sim) try(c Class, reserved int64, p admission.Priority) (admission.Reason, admission.Constraint, admission.Resources) {
	if s.g.TokenBudget != nil && s.tokens+reserved > s.effective(p) {
		s.t.Reject(c, admission.BudgetLimit)
		return admission.BudgetLimit, admission.ConstraintGlobal, admission.Resources{}
	}
	if why, con := s.t.Check(c, s.capacity(p, false), reserved); why != admission.NoReason {
		s.t.Reject(c, why)
		return why, con, admission.Resources{}
	}
	if s.inFlight >= s.g.MaxConcurrent {
		s.t.Reject(c, admission.ConcurrencyLimit)
		return admission.ConcurrencyLimit, admission.ConstraintGlobal, admission.Resources{}
	}
	s.inFlight++
	if why, con := s.t.Check(c, s.capacity(p, true), reserved); why != admission.NoReason {
		panic(fmt.Sprintf("postcheck disagrees with precheck: %v/%v", why, con))
	}
	s.tokens += reserved
	return admission.NoReason, "", s.t.Admit(c, reserved)
}

// classOf returns the statistics of the class named name in st.
func classOf(st *admission.ClassesStats, name string) admission.ClassStats {
	for _, c := range st.Classes {
		if c.Name == name {
			return c
		}
	}
	return admission.ClassStats{}
}
