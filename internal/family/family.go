// Package family is the one list of the metric families read from a
// bulkhead's Stats: their names, meanings, kinds, labels and units, and how
// each reads its values from one Stats snapshot. The Prometheus collector
// (package metrics) and the OpenTelemetry instruments (package
// otelbulkhead) both export this list, so they offer the same figures.
package family

import (
	"maps"
	"slices"
	"strings"

	"github.com/llmbulkhead/bulkhead"
)

// Kind says how a family's values behave.
type Kind uint8

// The kinds.
const (
	// Counter only goes up.
	Counter Kind = iota
	// UpDown is a count of things present now (calls in flight, tokens
	// held): it goes up and down, and the values of several bulkheads add
	// up.
	UpDown
	// Gauge is a setting or a state (a limit, a revision, a flag): its
	// values do not add up.
	Gauge
)

// Emit reports one value of a family, with the values of its labels in
// the family's order.
type Emit func(v float64, labelValues ...string)

// Family is one metric family read from Stats.
type Family struct {
	// Name is the family's name without its namespace, in Prometheus form:
	// "admitted_total", "rate_paced_seconds_total".
	Name string
	// Help says what the family counts.
	Help string
	// Kind is how its values behave.
	Kind Kind
	// Unit is its unit in UCUM form: "{call}", "{token}", "s", "1".
	Unit string
	// Float is set when its values are fractional (seconds).
	Float bool
	// Labels names its labels, in the order Read gives their values.
	Labels []string
	// Read emits the family's values in st; nothing when st lacks the
	// feature the family describes.
	Read func(st *bulkhead.Stats, emit Emit)
}

// DurationBuckets returns the bucket bounds, in seconds, of the histograms
// of waits and decision times: from 1 microsecond, where admission
// decisions fall, to 60 seconds, the longest queue waits.
func DurationBuckets() []float64 {
	return []float64{
		0.000001, 0.000005, 0.00001, 0.00005, 0.0001, 0.0005,
		0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60,
	}
}

// TokenBuckets returns the bucket bounds of the per-release usage
// histograms: from 10 to 1,000,000 tokens.
func TokenBuckets() []float64 {
	return []float64{
		10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
		10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
	}
}

// Histogram is a histogram fed from the bulkhead's events.
type Histogram struct {
	// Name is its name without its namespace, in Prometheus form.
	Name string
	// Help says what it observes.
	Help string
	// Unit is its unit in UCUM form.
	Unit string
}

// The histograms fed from events. The time histograms have a label
// "outcome" ("admitted", "rejected").
var (
	QueueWait = Histogram{Name: "queue_wait_seconds", Unit: "s",
		Help: "Time calls waited in the queue for a slot, by outcome; 0 for a call that never queued."}
	DecisionTime = Histogram{Name: "decision_seconds", Unit: "s",
		Help: "Time the bulkhead spent deciding calls, queue wait excluded, by outcome."}
	RateWait = Histogram{Name: "rate_wait_seconds", Unit: "s",
		Help: "Time calls waited for a rate-limit turn before asking for a slot, by outcome; 0 for a call that did not wait."}
	Consumed = Histogram{Name: "release_consumed_tokens", Unit: tokens,
		Help: "Tokens each released admission consumed, by its final usage; releases without usage are not observed."}
	Refunded = Histogram{Name: "release_refunded_tokens", Unit: tokens,
		Help: "Tokens each release with a final usage gave back unused."}
	Histograms = []Histogram{QueueWait, DecisionTime, RateWait, Consumed, Refunded}
)

// Outcome is the label of the time histograms.
const Outcome = "outcome"

// Label names.
const (
	Reason = "reason"
	Class  = "class"
	Cause  = "cause"
)

func i(v int64) float64 { return float64(v) }

func b(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// one returns a Read of a single unlabelled value.
func one(v func(st *bulkhead.Stats) int64) func(*bulkhead.Stats, Emit) {
	return func(st *bulkhead.Stats, emit Emit) { emit(i(v(st))) }
}

// part returns a Read of a value of the part of Stats that of returns,
// present only when that part is (a feature the bulkhead has).
func part[P any](of func(*bulkhead.Stats) *P, v func(*P) int64) func(*bulkhead.Stats, Emit) {
	return func(st *bulkhead.Stats, emit Emit) {
		if p := of(st); p != nil {
			emit(i(v(p)))
		}
	}
}

// The parts of Stats that depend on the bulkhead's features.
func budgetOf(st *bulkhead.Stats) *bulkhead.BudgetStats { return st.TokenBudget }
func rateOf(st *bulkhead.Stats) *bulkhead.RateStats     { return st.Rate }
func fleetOf(st *bulkhead.Stats) *bulkhead.FleetStats   { return st.Fleet }
func dedupOf(st *bulkhead.Stats) *bulkhead.DedupStats   { return st.Dedup }

func retryBudgetOf(st *bulkhead.Stats) *bulkhead.RetryBudgetStats { return st.Retries.Budget }

// classBudget returns a class's value of its own retry budget, for a class
// that has one.
func classBudget(v func(*bulkhead.RetryBudgetStats) int64) func(c *bulkhead.ClassStats) (int64, bool) {
	return func(c *bulkhead.ClassStats) (int64, bool) {
		if b := c.Retries.Budget; b != nil {
			return v(b), true
		}
		return 0, false
	}
}

func sharedOf(st *bulkhead.Stats) *bulkhead.SharedPool {
	if st.Classes == nil {
		return nil
	}
	return &st.Classes.Shared
}

func sharedTokensOf(st *bulkhead.Stats) *bulkhead.SharedBudget {
	if st.Classes == nil {
		return nil
	}
	return st.Classes.Shared.TokenBudget
}

// class returns a Read of a value of every class, in name order; tokens
// says it is a token figure, present with a budget only. ok false skips a
// class (a ceiling it does not have).
func class(tokens bool, v func(c *bulkhead.ClassStats) (int64, bool)) func(*bulkhead.Stats, Emit) {
	return func(st *bulkhead.Stats, emit Emit) {
		if st.Classes == nil || tokens && st.TokenBudget == nil {
			return
		}
		for _, name := range ClassNames(st.Classes) {
			c := st.Classes.Classes[name]
			if x, ok := v(&c); ok {
				emit(i(x), name)
			}
		}
	}
}

func always(v int64) (int64, bool) { return v, true }

// Units.
const (
	calls  = "{call}"
	tokens = "{token}"
	slots  = "{slot}"
	events = "{event}"
)

// All is every family, in the order of the guide.
var All = []Family{
	// Admissions.
	{Name: "in_flight", Kind: UpDown, Unit: calls, Help: "Admissions not yet released: admitted_total - released_total.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Calls.InFlight })},
	{Name: "admitted_total", Unit: calls, Help: "Calls admitted.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Calls.Admitted })},
	{Name: "released_total", Unit: calls, Help: "Admissions released.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Calls.Released })},
	{Name: "rejected_total", Unit: calls, Labels: []string{Reason, Class},
		Help: "Calls rejected, by reason and admission class (\"\" without classes).", Read: readRejected},
	{Name: "abandoned_total", Unit: slots, Labels: []string{Cause}, Help: "Borrowed slots given back before release, by cause.",
		Read: func(st *bulkhead.Stats, emit Emit) {
			for _, c := range []bulkhead.AbandonCause{bulkhead.AbandonManual, bulkhead.AbandonDeadline} {
				emit(i(st.Calls.AbandonedByCause[c]), c.String())
			}
		}},

	// The concurrency gate and the queue.
	{Name: "slots_in_use", Kind: UpDown, Unit: slots, Help: "Concurrency slots taken: in_flight less the admissions whose borrowed slot was abandoned.",
		Read: one(func(st *bulkhead.Stats) int64 { return int64(st.Gate.InFlight) })},
	{Name: "pending", Kind: UpDown, Unit: calls, Help: "Calls waiting in the queue for a slot.",
		Read: one(func(st *bulkhead.Stats) int64 { return int64(st.Gate.Pending) })},
	{Name: "max_concurrent", Kind: Gauge, Unit: slots, Help: "Current limit on concurrency slots.",
		Read: one(func(st *bulkhead.Stats) int64 { return int64(st.Gate.MaxConcurrent) })},
	{Name: "max_queue", Kind: Gauge, Unit: calls, Help: "Current limit on waiting calls.",
		Read: one(func(st *bulkhead.Stats) int64 { return int64(st.Gate.MaxQueue) })},
	{Name: "closed", Kind: Gauge, Unit: "1", Help: "1 once the bulkhead is closed, else 0.",
		Read: func(st *bulkhead.Stats, emit Emit) { emit(b(st.Gate.Closed)) }},
	{Name: "limit_revision", Kind: Gauge, Unit: "1", Help: "Revision of the limits in effect.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Limits.Revision })},
	{Name: "double_releases_total", Unit: calls, Help: "Release calls on permits already released.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Gate.DoubleReleases })},

	// The token budget.
	{Name: "token_budget", Kind: Gauge, Unit: tokens, Help: "Current token budget: the most tokens admitted calls may hold at once.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.Budget })},
	{Name: "token_high_priority_reserve", Kind: Gauge, Unit: tokens, Help: "Part of the token budget only high-priority calls may use.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.HighPriorityReserve })},
	{Name: "tokens_in_flight", Kind: UpDown, Unit: tokens, Help: "Tokens admitted calls hold now.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.InFlightTokens })},
	{Name: "tokens_available", Kind: UpDown, Unit: tokens, Help: "Token budget not held: token_budget - tokens_in_flight, at least 0.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.Available })},
	{Name: "tokens_reserved_total", Unit: tokens, Help: "Tokens reserved by admissions.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.TotalReserved })},
	{Name: "tokens_consumed_total", Unit: tokens, Help: "Tokens consumed, by the usage settled at release.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.TotalConsumed })},
	{Name: "tokens_refunded_total", Unit: tokens, Help: "Reserved tokens given back unused, early and at release.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.TotalRefunded })},
	{Name: "tokens_overrun_total", Unit: tokens, Help: "Hold growth beyond the reservations.",
		Read: part(budgetOf, func(tb *bulkhead.BudgetStats) int64 { return tb.TotalOverrun })},

	// Admission classes.
	{Name: "shared_max_concurrent", Kind: Gauge, Unit: slots, Help: "Slots of the classes' shared pool: max_concurrent less the classes' floors.",
		Read: part(sharedOf, func(p *bulkhead.SharedPool) int64 { return int64(p.MaxConcurrent) })},
	{Name: "shared_in_flight", Kind: UpDown, Unit: slots, Help: "Shared-pool slots in use.",
		Read: part(sharedOf, func(p *bulkhead.SharedPool) int64 { return int64(p.InFlight) })},
	{Name: "shared_token_budget", Kind: Gauge, Unit: tokens, Help: "Tokens of the classes' shared pool: token_budget less the classes' token floors.",
		Read: part(sharedTokensOf, func(p *bulkhead.SharedBudget) int64 { return p.Budget })},
	{Name: "shared_tokens_in_flight", Kind: UpDown, Unit: tokens, Help: "Shared-pool tokens held.",
		Read: part(sharedTokensOf, func(p *bulkhead.SharedBudget) int64 { return p.InFlightTokens })},
	{Name: "class_in_flight", Kind: UpDown, Unit: slots, Labels: []string{Class}, Help: "Slots a class uses.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(int64(c.InFlight)) })},
	{Name: "class_pending", Kind: UpDown, Unit: calls, Labels: []string{Class}, Help: "Calls of a class waiting in the queue.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(int64(c.Pending)) })},
	{Name: "class_borrowed_in_flight", Kind: UpDown, Unit: slots, Labels: []string{Class}, Help: "Slots a class uses from the shared pool.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(int64(c.BorrowedConcurrent)) })},
	{Name: "class_protected_concurrent", Kind: Gauge, Unit: slots, Labels: []string{Class}, Help: "A class's concurrency floor.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(int64(c.Limits.ProtectedConcurrent)) })},
	{Name: "class_max_concurrent", Kind: Gauge, Unit: slots, Labels: []string{Class}, Help: "A class's concurrency ceiling, for a class that has one.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) {
			if m := c.Limits.MaxConcurrent; m != nil {
				return int64(*m), true
			}
			return 0, false
		})},
	{Name: "class_admitted_total", Unit: calls, Labels: []string{Class}, Help: "Calls of a class admitted.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.Admitted) })},
	{Name: "class_released_total", Unit: calls, Labels: []string{Class}, Help: "Admissions of a class released.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.Released) })},
	{Name: "class_borrowed_admissions_total", Unit: calls, Labels: []string{Class}, Help: "Admissions of a class that took a shared slot.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.TotalBorrowedAdmissions) })},
	{Name: "class_tokens_in_flight", Kind: UpDown, Unit: tokens, Labels: []string{Class}, Help: "Tokens a class's admissions hold.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.InFlightTokens) })},
	{Name: "class_borrowed_tokens_in_flight", Kind: UpDown, Unit: tokens, Labels: []string{Class}, Help: "Tokens a class holds from the shared pool.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.BorrowedInFlightTokens) })},
	{Name: "class_protected_tokens", Kind: Gauge, Unit: tokens, Labels: []string{Class}, Help: "A class's token floor.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.Limits.ProtectedInFlightTokens) })},
	{Name: "class_max_tokens_in_flight", Kind: Gauge, Unit: tokens, Labels: []string{Class}, Help: "A class's token ceiling, for a class that has one.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) {
			if m := c.Limits.MaxInFlightTokens; m != nil {
				return *m, true
			}
			return 0, false
		})},
	{Name: "class_tokens_reserved_total", Unit: tokens, Labels: []string{Class}, Help: "Tokens reserved by a class's admissions.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.TotalReserved) })},
	{Name: "class_tokens_consumed_total", Unit: tokens, Labels: []string{Class}, Help: "Tokens a class consumed, by the usage settled at release.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.TotalConsumed) })},
	{Name: "class_tokens_refunded_total", Unit: tokens, Labels: []string{Class}, Help: "Tokens a class gave back unused.",
		Read: class(true, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.TotalRefunded) })},

	// Observe mode.
	{Name: "bypassed_total", Unit: calls, Labels: []string{Reason}, Help: "Calls Observe mode ran without admission, by the rejection they were spared.",
		Read: func(st *bulkhead.Stats, emit Emit) {
			for _, r := range reasonsOf(st.Observe.BypassedByReason, Shadowable) {
				emit(i(st.Observe.BypassedByReason[r]), r.String())
			}
		}},
	{Name: "race_bypassed_total", Unit: calls, Help: "Bypassed calls refused only after they queued (also counted in rejected_total).",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Observe.RaceBypassed })},
	{Name: "bypassed_in_flight", Kind: UpDown, Unit: calls, Help: "Bypassed calls running now.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Observe.InFlight })},
	{Name: "bypassed_usage_reported_total", Unit: calls, Help: "Bypassed calls that ended with a final usage.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Observe.UsageReported })},
	{Name: "bypassed_input_tokens_total", Unit: tokens, Help: "Input tokens of the bypassed calls' final usages.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Observe.InputTokens })},
	{Name: "bypassed_output_tokens_total", Unit: tokens, Help: "Output tokens of the bypassed calls' final usages.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Observe.OutputTokens })},

	// Retries and the retry budgets.
	{Name: "retries_admitted_total", Unit: calls, Help: "Retries admitted: calls made as a retry of an earlier attempt.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Retries.Admitted })},
	{Name: "retry_budget_first_attempts", Kind: UpDown, Unit: calls, Help: "First attempts admitted over the retry budget's window.",
		Read: part(retryBudgetOf, func(r *bulkhead.RetryBudgetStats) int64 { return r.FirstAttempts })},
	{Name: "retry_budget_retries", Kind: UpDown, Unit: calls, Help: "Retries admitted over the retry budget's window.",
		Read: part(retryBudgetOf, func(r *bulkhead.RetryBudgetStats) int64 { return r.Retries })},
	{Name: "retry_budget_allowed", Kind: Gauge, Unit: calls, Help: "Retries the retry budget allows over its window now: the larger of its floor and its ratio of the first attempts.",
		Read: part(retryBudgetOf, func(r *bulkhead.RetryBudgetStats) int64 { return r.Allowed })},
	{Name: "class_retries_admitted_total", Unit: calls, Labels: []string{Class}, Help: "Retries of a class admitted.",
		Read: class(false, func(c *bulkhead.ClassStats) (int64, bool) { return always(c.Retries.Admitted) })},
	{Name: "class_retry_budget_first_attempts", Kind: UpDown, Unit: calls, Labels: []string{Class},
		Help: "First attempts of a class admitted over its own retry budget's window, for a class that has one.",
		Read: class(false, classBudget(func(r *bulkhead.RetryBudgetStats) int64 { return r.FirstAttempts }))},
	{Name: "class_retry_budget_retries", Kind: UpDown, Unit: calls, Labels: []string{Class},
		Help: "Retries of a class admitted over its own retry budget's window, for a class that has one.",
		Read: class(false, classBudget(func(r *bulkhead.RetryBudgetStats) int64 { return r.Retries }))},
	{Name: "class_retry_budget_allowed", Kind: Gauge, Unit: calls, Labels: []string{Class},
		Help: "Retries a class's own retry budget allows over its window now, for a class that has one.",
		Read: class(false, classBudget(func(r *bulkhead.RetryBudgetStats) int64 { return r.Allowed }))},

	// Deduplication.
	{Name: "dedup_active", Kind: UpDown, Unit: "{key}", Help: "Distinct deduplication keys in flight.",
		Read: part(dedupOf, func(d *bulkhead.DedupStats) int64 { return d.Active })},
	{Name: "dedup_hits_total", Unit: calls, Help: "Calls that shared the result of an identical call in flight.",
		Read: part(dedupOf, func(d *bulkhead.DedupStats) int64 { return d.Hits })},

	// Rate limits.
	{Name: "rate_checked_total", Unit: calls, Help: "Calls checked against the rate limits.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.Checked })},
	{Name: "rate_paced_total", Unit: calls, Help: "Calls that waited for a rate-limit turn.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.Paced })},
	{Name: "rate_paced_seconds_total", Unit: "s", Float: true, Help: "Time calls waited for rate-limit turns, in all.",
		Read: func(st *bulkhead.Stats, emit Emit) {
			if st.Rate != nil {
				emit(st.Rate.PacedTime.Seconds())
			}
		}},
	{Name: "rate_fallbacks_total", Unit: calls, Help: "Calls the rate store's failure policy decided.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.Fallbacks })},
	{Name: "rate_overruns_total", Unit: calls, Help: "Releases that booked usage beyond the reservation on the rate limits.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.Overruns })},
	{Name: "rate_overrun_tokens_total", Unit: tokens, Help: "Tokens booked on the rate limits at release beyond the reservations.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.OverrunTokens })},
	{Name: "rate_overrun_errors_total", Unit: calls, Help: "Overrun bookings the rate store failed.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.OverrunErrors })},
	{Name: "rate_overrun_dropped_tokens_total", Unit: tokens, Help: "Overrun tokens not booked: an overrun books a rate at most one window ahead.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.OverrunDropped })},
	{Name: "rate_refunds_total", Unit: calls, Help: "Releases that gave tokens back to the input or output token rates (usage below the estimate).",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.Refunds })},
	{Name: "rate_refunded_tokens_total", Unit: tokens, Help: "Tokens given back to the input or output token rates at release.",
		Read: part(rateOf, func(r *bulkhead.RateStats) int64 { return r.RefundedTokens })},

	// Fleet pool.
	{Name: "fleet_checked_total", Unit: calls, Help: "Admissions that asked the fleet pool.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.Checked })},
	{Name: "fleet_admitted_total", Unit: calls, Help: "Admissions the fleet pool let through.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.Admitted })},
	{Name: "fleet_policy_admitted_total", Unit: calls, Help: "Admissions the fleet pool's failure policy let through while Redis failed.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.PolicyAdmitted })},
	{Name: "fleet_view_in_flight", Kind: UpDown, Unit: slots, Help: "Slots held in the fleet pool by every replica, as its last reply showed.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.InFlight })},
	{Name: "fleet_view_tokens_in_flight", Kind: UpDown, Unit: tokens, Help: "Tokens held in the fleet pool by every replica, as its last reply showed.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.InFlightTokens })},
	{Name: "fleet_view_max_concurrent", Kind: Gauge, Unit: slots, Help: "The fleet pool's slot limit, -1 when not enforced.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.MaxConcurrent })},
	{Name: "fleet_view_token_budget", Kind: Gauge, Unit: tokens, Help: "The fleet pool's token limit, -1 when not enforced.",
		Read: part(fleetOf, func(f *bulkhead.FleetStats) int64 { return f.TokenBudget })},

	// Events and health.
	{Name: "event_backlog", Kind: UpDown, Unit: events, Help: "Events emitted and not yet handed to every listener.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Events.Backlog })},
	{Name: "listener_panics_total", Unit: "{panic}", Help: "Event listener calls that panicked.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Events.ListenerPanics })},
	{Name: "ledger_drift_total", Unit: "{drift}", Help: "Times the bulkhead found its books out of balance; 0 unless it has a bug.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.LedgerDrift })},
	{Name: "usage_suspect_total", Unit: "{report}", Help: "Usage figures above the usage ceiling, clamped to it.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Calls.SuspectUsage })},
	{Name: "usage_suspect_tokens_total", Unit: tokens, Help: "Tokens clamped away from usage figures above the usage ceiling.",
		Read: one(func(st *bulkhead.Stats) int64 { return st.Calls.SuspectTokens })},
}

// readRejected reads rejected_total: per class and reason with classes,
// with class "" without. Every known reason is sent, zeros included, so
// that a rate over a reason never misses its series. Should the classes'
// counts fall short of the bulkhead's, the rest is sent with class "", so
// that the series always add up to every rejection.
func readRejected(st *bulkhead.Stats, emit Emit) {
	total := st.Calls.RejectedByReason
	reasons := reasonsOf(total, Reasons)
	if st.Classes == nil {
		for _, r := range reasons {
			emit(i(total[r]), r.String(), "")
		}
		return
	}
	rest := maps.Clone(total)
	if rest == nil {
		rest = map[bulkhead.Reason]int64{}
	}
	for _, name := range ClassNames(st.Classes) {
		byReason := st.Classes.Classes[name].RejectedByReason
		for _, r := range reasonsOf(byReason, reasons) {
			emit(i(byReason[r]), r.String(), name)
			rest[r] -= byReason[r]
		}
	}
	for _, r := range reasonsOf(rest, nil) {
		if rest[r] > 0 {
			emit(i(rest[r]), r.String(), "")
		}
	}
}

// Shadowable is the reasons Observe mode may bypass.
var Shadowable = []bulkhead.Reason{
	bulkhead.ConcurrencyLimit, bulkhead.QueueLimit, bulkhead.Timeout, bulkhead.BudgetLimit,
}

// Reasons is every rejection reason the bulkhead names, in order.
var Reasons = knownReasons()

func knownReasons() []bulkhead.Reason {
	var rs []bulkhead.Reason
	for r := bulkhead.Reason(1); r != 0; r++ {
		if strings.HasPrefix(r.String(), "reason(") {
			break
		}
		rs = append(rs, r)
	}
	return rs
}

// reasonsOf returns base followed by the other keys of m, in order.
func reasonsOf(m map[bulkhead.Reason]int64, base []bulkhead.Reason) []bulkhead.Reason {
	var more []bulkhead.Reason
	for r := range m {
		if !slices.Contains(base, r) {
			more = append(more, r)
		}
	}
	slices.Sort(more)
	return append(slices.Clone(base), more...)
}

// ClassNames returns the names of the classes, in order.
func ClassNames(cs *bulkhead.ClassesStats) []string {
	return slices.Sorted(maps.Keys(cs.Classes))
}
