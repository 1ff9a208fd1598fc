package classes

import (
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// limits is one class's limits, compiled for the hot path.
type limits struct {
	floor     int
	max       int
	hasMax    bool
	tokFloor  int64
	maxTok    int64
	hasMaxTok bool
}

func compile(l admission.ClassLimits) limits {
	c := limits{floor: l.ProtectedConcurrent, tokFloor: l.ProtectedInFlightTokens}
	if l.MaxConcurrent != nil {
		c.max, c.hasMax = *l.MaxConcurrent, true
	}
	if l.MaxInFlightTokens != nil {
		c.maxTok, c.hasMaxTok = *l.MaxInFlightTokens, true
	}
	return c
}

// public returns the limits as a fresh admission.ClassLimits, sharing no
// memory with the table.
func (l limits) public() admission.ClassLimits {
	out := admission.ClassLimits{ProtectedConcurrent: l.floor, ProtectedInFlightTokens: l.tokFloor}
	if l.hasMax {
		n := l.max
		out.MaxConcurrent = &n
	}
	if l.hasMaxTok {
		n := l.maxTok
		out.MaxInFlightTokens = &n
	}
	return out
}

// compiled is a validated class table, in sorted name order, with its
// floors in effect under the limits it was compiled against.
type compiled struct {
	def         int
	names       []string
	limits      []limits
	floors      []inEffect
	sumFloor    sum // of the configured concurrency floors
	sumTokFloor sum // of the configured token floors
}

// Validate checks a class table against the global limits g, as New does,
// and returns the first problem as a *admission.ConfigError whose field
// starts with field, such as "Config.Classes" or "Limits.Classes".
//
// The rules, checked in this order (classes in name order): at least one
// class; no empty name; Default names a class; per class, every number is
// >= 0, each floor is at most its own ceiling, and the token fields are
// set only with a token budget; the sum of the concurrency floors is at
// most g.MaxConcurrent; the sum of the token floors is at most the budget
// (the whole budget: the high-priority reserve is not taken off). So a
// bulkhead that starts with MaxConcurrent 0 has no concurrency floors.
//
// A runtime replacement (see Table.Prepare) follows the same rules but the
// last two: there a limit below the sum of its floors is valid and shrinks
// the floors in effect instead.
func Validate(field string, c admission.Classes, g admission.Limits) error {
	_, err := compileNew(field, c, g)
	return err
}

// compileNew compiles a class table for construction: the floors must fit
// the limits.
func compileNew(field string, c admission.Classes, g admission.Limits) (compiled, error) {
	cc, err := compileTable(field, c, g)
	if err != nil {
		return compiled{}, err
	}
	if cc.sumFloor.above(int64(g.MaxConcurrent)) {
		return compiled{}, admission.Invalidf(field+".Limits",
			"the ProtectedConcurrent floors sum to %s, above MaxConcurrent %d", cc.sumFloor, g.MaxConcurrent)
	}
	if g.TokenBudget != nil && cc.sumTokFloor.above(g.TokenBudget.Budget) {
		return compiled{}, admission.Invalidf(field+".Limits",
			"the ProtectedInFlightTokens floors sum to %s, above the token budget %d", cc.sumTokFloor, g.TokenBudget.Budget)
	}
	return cc, nil
}

func compileTable(field string, c admission.Classes, g admission.Limits) (compiled, error) {
	if len(c.Limits) == 0 {
		return compiled{}, admission.Invalidf(field+".Limits", "must name at least one class")
	}
	names := make([]string, 0, len(c.Limits))
	for name := range c.Limits {
		names = append(names, name)
	}
	slices.Sort(names)
	if names[0] == "" {
		return compiled{}, admission.Invalidf(classField(field, ""), "class names must not be empty")
	}
	def, ok := slices.BinarySearch(names, c.Default)
	switch {
	case c.Default == "":
		return compiled{}, admission.Invalidf(field+".Default", "must name a class, got \"\"")
	case !ok:
		return compiled{}, admission.Invalidf(field+".Default", "names no class: %q is not one of %s", c.Default, quoteAll(names))
	}
	out := compiled{def: def, names: names, limits: make([]limits, len(names))}
	floors, tokFloors := make([]int64, len(names)), make([]int64, len(names))
	for i, name := range names {
		l := c.Limits[name]
		if err := checkClass(classField(field, name), l, g.TokenBudget != nil); err != nil {
			return compiled{}, err
		}
		out.limits[i] = compile(l)
		floors[i], tokFloors[i] = int64(l.ProtectedConcurrent), l.ProtectedInFlightTokens
		out.sumFloor.add(floors[i])
		out.sumTokFloor.add(tokFloors[i])
	}
	var budget int64
	if g.TokenBudget != nil {
		budget = g.TokenBudget.Budget
	}
	out.floors = make([]inEffect, len(names))
	for i, f := range shrink(floors, int64(g.MaxConcurrent)) {
		out.floors[i].floor = int(f)
	}
	for i, f := range shrink(tokFloors, budget) {
		out.floors[i].tokFloor = f
	}
	return out, nil
}

// inEffect is one class's floors in effect: its configured floors, or less
// while a limit is below the sum of the floors (see shrink).
type inEffect struct {
	floor    int
	tokFloor int64
}

// shrink returns the floors in effect under limit: floors unchanged when
// they sum to at most limit, else each floor scaled by limit / sum, rounded
// down, so that they sum to at most limit. A negative limit counts as 0.
// The floors must be non-negative. The arithmetic is exact: the products
// and the sum are taken without overflow, however large the numbers.
func shrink(floors []int64, limit int64) []int64 {
	limit = max(0, limit)
	// The sum, in 128 bits: it fits, as there are fewer than 2^64 floors,
	// each below 2^63.
	var hi, lo uint64
	for _, f := range floors {
		var carry uint64
		lo, carry = bits.Add64(lo, uint64(f), 0)
		hi += carry
	}
	out := slices.Clone(floors)
	if hi == 0 && lo <= uint64(limit) {
		return out
	}
	if hi == 0 {
		// f * limit < sum * 2^63, so the high word of the product is below
		// sum and Div64 cannot overflow.
		for i, f := range floors {
			ph, pl := bits.Mul64(uint64(f), uint64(limit))
			q, _ := bits.Div64(ph, pl, lo)
			out[i] = int64(q) // q <= f
		}
		return out
	}
	total := new(big.Int).Lsh(new(big.Int).SetUint64(hi), 64)
	total.Or(total, new(big.Int).SetUint64(lo))
	l, q := big.NewInt(limit), new(big.Int)
	for i, f := range floors {
		q.Mul(big.NewInt(f), l)
		q.Quo(q, total)
		out[i] = q.Int64() // q <= f
	}
	return out
}

// checkClass checks one class's limits; field is its path, such as
// `Config.Classes.Limits["bg"]`.
func checkClass(field string, l admission.ClassLimits, hasBudget bool) error {
	if l.ProtectedConcurrent < 0 {
		return admission.Invalidf(field+".ProtectedConcurrent", "must be >= 0, got %d", l.ProtectedConcurrent)
	}
	if l.MaxConcurrent != nil {
		if *l.MaxConcurrent < 0 {
			return admission.Invalidf(field+".MaxConcurrent", "must be >= 0, got %d", *l.MaxConcurrent)
		}
		if l.ProtectedConcurrent > *l.MaxConcurrent {
			return admission.Invalidf(field+".ProtectedConcurrent",
				"must not exceed the class's MaxConcurrent (%d), got %d", *l.MaxConcurrent, l.ProtectedConcurrent)
		}
	}
	if l.ProtectedInFlightTokens < 0 {
		return admission.Invalidf(field+".ProtectedInFlightTokens", "must be >= 0, got %d", l.ProtectedInFlightTokens)
	}
	if l.MaxInFlightTokens != nil && *l.MaxInFlightTokens < 0 {
		return admission.Invalidf(field+".MaxInFlightTokens", "must be >= 0, got %d", *l.MaxInFlightTokens)
	}
	if !hasBudget {
		if l.ProtectedInFlightTokens != 0 {
			return admission.Invalidf(field+".ProtectedInFlightTokens", "needs a token budget; the bulkhead has none")
		}
		if l.MaxInFlightTokens != nil {
			return admission.Invalidf(field+".MaxInFlightTokens", "needs a token budget; the bulkhead has none")
		}
	}
	if l.MaxInFlightTokens != nil && l.ProtectedInFlightTokens > *l.MaxInFlightTokens {
		return admission.Invalidf(field+".ProtectedInFlightTokens",
			"must not exceed the class's MaxInFlightTokens (%d), got %d", *l.MaxInFlightTokens, l.ProtectedInFlightTokens)
	}
	return nil
}

// classField names the class in a field path: field.Limits["name"].
func classField(field, name string) string {
	return field + ".Limits[" + strconv.Quote(name) + "]"
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// sum adds non-negative numbers and remembers an overflow.
type sum struct {
	n        int64
	overflow bool
}

func (s *sum) add(v int64) {
	if v > math.MaxInt64-s.n {
		s.overflow = true
		return
	}
	s.n += v
}

// above reports whether the sum exceeds limit.
func (s sum) above(limit int64) bool { return s.overflow || s.n > limit }

// String formats the sum, or says it overflowed.
func (s sum) String() string {
	if s.overflow {
		return "more than " + strconv.FormatInt(math.MaxInt64, 10)
	}
	return strconv.FormatInt(s.n, 10)
}

// Update is a validated replacement of a Table's limits, made by
// Table.Prepare and installed by Table.Apply.
type Update struct {
	t *Table
	c compiled
}

// Prepare validates next as a runtime replacement of t's limits against
// the new global limits g, and returns it ready for Apply. It changes
// nothing, so the caller can validate every other part of a limits
// snapshot before installing any of it.
//
// Errors name fields under field, such as "Limits.Classes". The rules are
// those of Validate except the sums: at runtime g.MaxConcurrent may be
// below the sum of the concurrency floors, and the token budget below the
// sum of the token floors, so a kill switch (MaxConcurrent 0, a budget of
// 0) or a back-off needs no rewrite of the class table. While a limit is
// below the sum of its floors, the floors in effect shrink in proportion:
// a class's floor in effect is floor * limit / sum of the floors, rounded
// down, so they never sum above the limit; at or above the sum the floors
// apply unchanged. Concurrency floors scale with g.MaxConcurrent, token
// floors with the whole token budget g.TokenBudget.Budget (not a
// priority-adjusted one: the floors in effect are the same for every call).
// Every decision, Resources, Detail and Stats use the floors in effect;
// Classes reports the configured ones.
//
// Besides, the replacement must have exactly t's class names (the key set
// is fixed for the bulkhead's life; the error lists the missing and the
// unknown ones), and its Default must be empty (keep the current one) or
// t's default (the default class is fixed too).
func (t *Table) Prepare(field string, next admission.Classes, g admission.Limits) (*Update, error) {
	if t == nil {
		return nil, admission.Invalidf(field, "must be nil: the bulkhead has no admission classes")
	}
	var missing, unknown []string
	for _, name := range t.names {
		if _, ok := next.Limits[name]; !ok {
			missing = append(missing, name)
		}
	}
	for name := range next.Limits {
		if _, ok := t.index[name]; !ok {
			unknown = append(unknown, name)
		}
	}
	if len(missing) > 0 || len(unknown) > 0 {
		slices.Sort(unknown)
		problem := "must have exactly the classes " + quoteAll(t.names) + " (the class set is fixed)"
		if len(missing) > 0 {
			problem += "; missing " + quoteAll(missing)
		}
		if len(unknown) > 0 {
			problem += "; unknown " + quoteAll(unknown)
		}
		return nil, &admission.ConfigError{Field: field + ".Limits", Problem: problem}
	}
	def := t.names[t.def]
	switch next.Default {
	case "":
		next.Default = def
	case def:
	default:
		return nil, admission.Invalidf(field+".Default", "is fixed at %q, got %q", def, next.Default)
	}
	c, err := compileTable(field, next, g)
	if err != nil {
		return nil, err
	}
	return &Update{t: t, c: c}, nil
}

// Apply installs an update that Prepare made for t, with the floors in
// effect that Prepare computed. It revokes nothing: admissions keep their
// slots and tokens, and a lowered ceiling or limit or a raised floor takes
// effect by attrition. In-flight counts and counters are kept.
// Apply panics if u was prepared for another table or was already applied.
func (t *Table) Apply(u *Update) {
	if u == nil || u.t != t || t == nil {
		panic("classes: Apply of an update prepared for another table")
	}
	u.t = nil
	t.install(&u.c)
}
