package classes

import (
	"math"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Class is a handle on one class of a Table, from Table.Lookup. The zero
// value, None, is no class: every Table method treats it as "no classes".
type Class uint32

// None is the Class of a call on a bulkhead without classes.
const None Class = 0

// Capacity is the admission actor's global view, given to the class checks.
type Capacity struct {
	// MaxConcurrent is the global slot limit: the one the table was built
	// or last updated with, as the floors in effect follow from it.
	MaxConcurrent int
	// InFlight is the global slots in use, as the gate counts them.
	InFlight int
	// SlotHeld says InFlight already counts the deciding call's own slot:
	// false at the precheck, true at the postcheck (the slot is taken and
	// the call is not admitted yet). The checks then leave that slot out.
	SlotHeld bool
	// InFlightTokens is the tokens admitted calls hold globally.
	InFlightTokens int64
	// Budget is the token budget the call may fill: the priority-adjusted
	// effective budget for Check and Detail, the whole budget for Stats.
	// It is ignored without a token budget.
	Budget int64
}

// inFlight is the global slots in use, not counting the deciding call's.
func (g *Capacity) inFlight() int {
	if g.SlotHeld && g.InFlight > 0 {
		return g.InFlight - 1
	}
	return g.InFlight
}

// state is one class: its limits, its usage and its counters.
type state struct {
	name   string
	limits limits // as configured

	// floor and tokFloor are the floors in effect: limits.floor and
	// limits.tokFloor, shrunk while a limit is below the sum of the floors.
	// Every decision uses these.
	floor    int
	tokFloor int64

	inFlight int   // slots held, abandoned ones excluded
	tokens   int64 // tokens held by unreleased admissions

	protectedInUse       int   // min(inFlight, floor)
	protectedTokensInUse int64 // min(tokens, tokFloor)

	counts                 admission.Counts
	ledger                 admission.Ledger
	borrowedAdmissions     int64
	borrowedTokensReserved int64
}

// Table is an admission class table and its usage: the class policy state
// that the admission actor owns. A Table is not safe for concurrent use;
// the actor calls it from its one goroutine. Build one with New.
type Table struct {
	names     []string // sorted; Class i+1 is names[i]
	index     map[string]Class
	def       int
	hasBudget bool
	classes   []state

	sumFloor    int   // sum of the concurrency floors in effect
	sumTokFloor int64 // sum of the token floors in effect

	protectedInUse       int   // sum over classes of min(inFlight, floor)
	protectedTokensInUse int64 // sum over classes of min(tokens, tokFloor)

	// drift counts the gauges found out of range (see Drift); onDrift, when
	// set, is told of each.
	drift   int64
	onDrift func(class, quantity string, got int64)
}

// New validates c against the global limits g (see Validate; errors name
// fields under field, such as "Config.Classes") and returns an idle Table.
// The table has a token budget, for good, when g.TokenBudget is set.
//
// At construction the floors must fit: their sums are at most
// g.MaxConcurrent and the token budget. Later limits may be lower (see
// Prepare).
func New(field string, c admission.Classes, g admission.Limits) (*Table, error) {
	cc, err := compileNew(field, c, g)
	if err != nil {
		return nil, err
	}
	t := &Table{
		names:     cc.names,
		index:     make(map[string]Class, len(cc.names)),
		def:       cc.def,
		hasBudget: g.TokenBudget != nil,
		classes:   make([]state, len(cc.names)),
	}
	for i, name := range cc.names {
		t.index[name] = Class(i + 1)
		t.classes[i].name = name
	}
	t.install(&cc)
	return t, nil
}

// install sets the classes' configured limits and floors in effect from
// cc, and recomputes the sums that depend on the floors.
func (t *Table) install(cc *compiled) {
	t.sumFloor, t.sumTokFloor = 0, 0
	for i := range t.classes {
		k := &t.classes[i]
		k.limits = cc.limits[i]
		k.floor, k.tokFloor = cc.floors[i].floor, cc.floors[i].tokFloor
		t.sumFloor += k.floor
		t.sumTokFloor += k.tokFloor
	}
	t.recount()
}

// Lookup resolves a call's class name: "" is the default class. An unknown
// name is a *admission.ConfigError for field "Class", and so is any name on
// a nil Table (a bulkhead without classes); "" on a nil Table is None. It
// allocates only for an error.
//
// Lookup, Name, Default and Len read only what New fixed for the table's
// life, so they may be called from any goroutine, concurrently with the
// actor's other calls: the facade can resolve a class, and report a bad
// one, before it sends anything to the actor.
func (t *Table) Lookup(name string) (Class, error) {
	if t == nil {
		if name == "" {
			return None, nil
		}
		return None, admission.Invalidf("Class", "is %q, but the bulkhead has no admission classes", name)
	}
	if name == "" {
		return Class(t.def + 1), nil
	}
	if c, ok := t.index[name]; ok {
		return c, nil
	}
	return None, admission.Invalidf("Class", "names no admission class: %q is not one of %s", name, quoteAll(t.names))
}

// Name returns the name of class c, or "" for None.
func (t *Table) Name(c Class) string {
	if t == nil || c == None || int(c) > len(t.names) {
		return ""
	}
	return t.names[c-1]
}

// Default returns the default class, None on a nil Table.
func (t *Table) Default() Class {
	if t == nil {
		return None
	}
	return Class(t.def + 1)
}

// Len returns the number of classes.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.classes)
}

// get returns the state of c, or nil for None, a nil Table or a Class that
// is not t's.
func (t *Table) get(c Class) *state {
	if t == nil || c == None || int(c) > len(t.classes) {
		return nil
	}
	return &t.classes[c-1]
}

// sharedInUse is max(0, in flight - sum over classes of min(class in
// flight, class floor)), leaving the deciding call's held slot out. Here,
// and in all that follows, a floor is a floor in effect.
func (t *Table) sharedInUse(g *Capacity) int {
	return max(0, g.inFlight()-t.protectedInUse)
}

func (t *Table) sharedCapacity(g *Capacity) int {
	return max(0, g.MaxConcurrent-t.sumFloor)
}

func (t *Table) sharedTokensInUse(g *Capacity) int64 {
	return max(0, g.InFlightTokens-t.protectedTokensInUse)
}

func (t *Table) sharedTokenCapacity(g *Capacity) int64 {
	return max(0, g.Budget-t.sumTokFloor)
}

// borrowsSlot reports whether a new admission of k takes a shared slot.
func (k *state) borrowsSlot() bool { return k.inFlight >= k.floor }

// borrowedTokens is the part of reserved that k's unused token floor does
// not cover: max(0, reserved - max(0, tokFloor - tokens)).
func (k *state) borrowedTokens(reserved int64) int64 {
	return max(0, reserved-max(0, k.tokFloor-k.tokens))
}

// Check runs the class checks for a call of class c reserving reserved
// tokens, in this order, after the global budget check (which is the
// caller's): the class token ceiling, the class concurrency ceiling, the
// concurrency protection, the token protection. It returns the reason and
// constraint of the first that fails, or NoReason and "" when all pass. It changes nothing and does not allocate.
//
// The actor calls it at the precheck (g.SlotHeld false), before it takes
// a global slot, and again at the postcheck with the slot held (g.SlotHeld
// true); WouldAdmit calls it like a precheck. g.Budget is the call's
// priority-adjusted effective budget.
//
// The protections check only what the call borrows: the concurrency
// protection applies when the class is at or above its floor, the token
// protection when part of the reservation is not covered by the class's
// unused token floor. So a call within its class's floors is never
// rejected by them, even while the shared pool is over capacity after a
// shrink or an overrun (new borrowing pauses until attrition restores it).
// They are active only when some class has a concurrency floor, and with a
// token budget and some token floor: otherwise they would repeat the global
// checks (and the global gate, which may queue, must not reject).
//
// The floors here are the floors in effect (see Prepare): while
// MaxConcurrent or the token budget is below the sum of the configured
// floors, they are shrunk in proportion, and when they all shrink to 0 (a
// kill switch) the protections are inactive, as without floors.
func (t *Table) Check(c Class, g Capacity, reserved int64) (admission.Reason, admission.Constraint) {
	k := t.get(c)
	if k == nil {
		return admission.NoReason, ""
	}
	l := &k.limits
	if t.hasBudget && l.hasMaxTok && admission.Exceeds(k.tokens, reserved, l.maxTok) {
		return admission.BudgetLimit, admission.ConstraintClass
	}
	if l.hasMax && k.inFlight >= l.max {
		return admission.ConcurrencyLimit, admission.ConstraintClass
	}
	if t.sumFloor > 0 && k.borrowsSlot() && t.sharedInUse(&g)+1 > t.sharedCapacity(&g) {
		return admission.ConcurrencyLimit, admission.ConstraintClassProtection
	}
	if t.hasBudget && t.sumTokFloor > 0 {
		if b := k.borrowedTokens(reserved); b > 0 && admission.Exceeds(t.sharedTokensInUse(&g), b, t.sharedTokenCapacity(&g)) {
			return admission.BudgetLimit, admission.ConstraintClassProtection
		}
	}
	return admission.NoReason, ""
}

// Resources returns what an admission of class c reserving reserved tokens
// would borrow now: the shared slot when the class is at or above its
// floor, and the part of the reservation its unused token floor does not
// cover. A class without floors always borrows. None borrows nothing. The
// floors are those in effect, as in Check.
func (t *Table) Resources(c Class, reserved int64) admission.Resources {
	k := t.get(c)
	if k == nil {
		return admission.Resources{}
	}
	return admission.Resources{BorrowedConcurrency: k.borrowsSlot(), BorrowedTokens: k.borrowedTokens(reserved)}
}

// setInFlight moves k's slot count to n, keeping the protected sum. A
// negative n is drift: counted, reported and taken as 0.
func (t *Table) setInFlight(k *state, n int) {
	if n < 0 {
		t.drifted(k, "in-flight slots", int64(n))
		n = 0
	}
	p := min(n, k.floor)
	t.protectedInUse += p - k.protectedInUse
	k.protectedInUse = p
	k.inFlight = n
}

// addTokens moves k's token count by delta, keeping the protected sum. A
// count that would fall below 0, or pass math.MaxInt64 (the caller checks
// the global hold first, and a class never holds more than the whole), is
// drift: counted, reported and taken as the bound it crossed.
func (t *Table) addTokens(k *state, delta int64) {
	n := k.tokens + delta
	switch {
	case delta > 0 && n < k.tokens:
		t.drifted(k, "in-flight tokens overflow", delta)
		n = math.MaxInt64
	case n < 0:
		t.drifted(k, "in-flight tokens", n)
		n = 0
	}
	p := min(n, k.tokFloor)
	t.protectedTokensInUse += p - k.protectedTokensInUse
	k.protectedTokensInUse = p
	k.tokens = n
}

// drifted records that a gauge of k went out of range.
func (t *Table) drifted(k *state, quantity string, got int64) {
	t.drift++
	if t.onDrift != nil {
		t.onDrift(k.name, quantity, got)
	}
}

// Drift returns how many times a class's gauge (its in-flight slots or
// tokens) was found out of range: a release, abandonment or hold change
// that would have taken it below zero (or a hold past math.MaxInt64). The
// gauge is then set to the bound it crossed, so admission goes on, but the
// books no longer balance: it is 0 unless the caller's accounting is
// broken. 0 on a nil Table.
func (t *Table) Drift() int64 {
	if t == nil {
		return 0
	}
	return t.drift
}

// OnDrift sets the function told of each drift (see Drift) as it is found,
// with the class, the quantity and the out-of-range value; for logging. It
// is called on the caller's goroutine, inside the Table method that found
// it.
func (t *Table) OnDrift(f func(class, quantity string, got int64)) {
	if t != nil {
		t.onDrift = f
	}
}

// recount recomputes the protected sums after the floors changed.
func (t *Table) recount() {
	t.protectedInUse, t.protectedTokensInUse = 0, 0
	for i := range t.classes {
		k := &t.classes[i]
		k.protectedInUse = min(k.inFlight, k.floor)
		k.protectedTokensInUse = min(k.tokens, k.tokFloor)
		t.protectedInUse += k.protectedInUse
		t.protectedTokensInUse += k.protectedTokensInUse
	}
}

// Admit commits an admission of class c holding reserved tokens, which
// passed Check, and returns its Resources, computed before the counters
// move. It takes one class slot, adds reserved to the class's tokens and
// counts the admission, the reservation and what it borrowed. Without a
// token budget reserved must be 0. It does not allocate.
func (t *Table) Admit(c Class, reserved int64) admission.Resources {
	r := t.Hold(c, reserved)
	t.Count(c, reserved, r)
	return r
}

// Hold takes a slot and reserved tokens for a call of class c and returns
// what it borrows, without counting an admission or its reservation: Admit
// is Hold then Count. A hold that an outside check turns down afterwards is
// given back by Unhold.
func (t *Table) Hold(c Class, reserved int64) admission.Resources {
	k := t.get(c)
	if k == nil {
		return admission.Resources{}
	}
	r := admission.Resources{BorrowedConcurrency: k.borrowsSlot(), BorrowedTokens: k.borrowedTokens(reserved)}
	t.setInFlight(k, k.inFlight+1)
	t.addTokens(k, reserved)
	return r
}

// Count counts the admission of a call of class c reserving reserved
// tokens, whose Hold borrowed r.
func (t *Table) Count(c Class, reserved int64, r admission.Resources) {
	k := t.get(c)
	if k == nil {
		return
	}
	k.counts.Admitted++
	k.ledger.Reserved = admission.AddSat(k.ledger.Reserved, reserved)
	if r.BorrowedConcurrency {
		k.borrowedAdmissions++
	}
	k.borrowedTokensReserved = admission.AddSat(k.borrowedTokensReserved, r.BorrowedTokens)
}

// Unhold gives back a Hold of held tokens that was never counted as an
// admission: the slot and the tokens return, and no counter moves.
func (t *Table) Unhold(c Class, held int64) {
	k := t.get(c)
	if k == nil {
		return
	}
	t.setInFlight(k, k.inFlight-1)
	t.addTokens(k, -held)
}

// Reject counts a rejection, for reason why, of a call of class c. The
// actor calls it for every rejection of a call whose class is known,
// whatever the reason.
func (t *Table) Reject(c Class, why admission.Reason) {
	k := t.get(c)
	if k == nil {
		return
	}
	if int(why) < len(k.counts.Rejected) {
		k.counts.Rejected[why]++
	}
}

// AdjustHold records that an unreleased admission of class c changed its
// token hold by delta (the new hold less the old): a rise is an overrun
// (usage beyond the reservation), a fall an early refund. The caller
// adjusts the global hold and ledger the same way.
func (t *Table) AdjustHold(c Class, delta int64) {
	k := t.get(c)
	if k == nil || delta == 0 {
		return
	}
	t.addTokens(k, delta)
	if delta > 0 {
		k.ledger.Overrun = admission.AddSat(k.ledger.Overrun, delta)
	} else {
		k.ledger.Refunded = admission.AddSat(k.ledger.Refunded, -delta)
	}
}

// Abandon records that an admission of class c gave its borrowed slot back
// early: the class's slot count falls by one, its tokens stay held until
// Release. The caller has checked that the admission borrowed its slot, is
// unreleased and was not abandoned before.
func (t *Table) Abandon(c Class, cause admission.AbandonCause) {
	k := t.get(c)
	if k == nil {
		return
	}
	t.setInFlight(k, k.inFlight-1)
	if int(cause) < len(k.counts.Abandoned) {
		k.counts.Abandoned[cause]++
	}
}

// Settlement is the release of one admission, as the actor settled it on
// the global ledger.
type Settlement struct {
	// Held is the admission's hold at release, returned to the class.
	Held int64
	// Consumed is the usage added to the ledger's consumed total, 0 when
	// none was counted.
	Consumed int64
	// Refunded is the part of Held given back unused.
	Refunded int64
	// SlotAbandoned says the admission's slot was abandoned earlier, so the
	// class's slot count has already fallen.
	SlotAbandoned bool
}

// Release settles an admission of class c: its hold returns to the class,
// its slot too unless it was abandoned, and the release, consumption and
// refund are counted.
func (t *Table) Release(c Class, s Settlement) {
	k := t.get(c)
	if k == nil {
		return
	}
	if !s.SlotAbandoned {
		t.setInFlight(k, k.inFlight-1)
	}
	t.addTokens(k, -s.Held)
	k.counts.Released++
	k.ledger.Consumed = admission.AddSat(k.ledger.Consumed, s.Consumed)
	k.ledger.Refunded = admission.AddSat(k.ledger.Refunded, s.Refunded)
}
