package metrics

import "github.com/prometheus/client_golang/prometheus"

// descs holds the descriptions of the metrics read from Stats.
type descs struct {
	all    []*prometheus.Desc
	ns     string
	labels prometheus.Labels

	inFlight, admitted, released, rejected, abandoned *prometheus.Desc

	slotsInUse, pending, maxConcurrent, maxQueue, closed, limitRevision, doubleReleases *prometheus.Desc

	tokenBudget, highPriorityReserve, tokensInFlight, tokensAvailable,
	tokensReserved, tokensConsumed, tokensRefunded, tokensOverrun *prometheus.Desc

	sharedMaxConcurrent, sharedInFlight, sharedTokenBudget, sharedTokensInFlight *prometheus.Desc

	classInFlight, classPending, classBorrowedInFlight, classProtectedConcurrent, classMaxConcurrent,
	classAdmitted, classReleased, classBorrowedAdmissions,
	classTokensInFlight, classBorrowedTokensInFlight, classProtectedTokens, classMaxTokens,
	classTokensReserved, classTokensConsumed, classTokensRefunded *prometheus.Desc

	bypassed, raceBypassed, bypassedInFlight, bypassedUsage, bypassedInput, bypassedOutput *prometheus.Desc

	dedupActive, dedupHits *prometheus.Desc

	rateChecked, ratePaced, ratePacedSeconds, rateFallbacks,
	rateOverruns, rateOverrunTokens, rateOverrunErrors *prometheus.Desc
	rateOverrunDropped, suspectUsage, suspectTokens *prometheus.Desc
	rateRefunds, rateRefundedTokens                 *prometheus.Desc

	fleetChecked, fleetAdmitted, fleetPolicyAdmitted,
	fleetInFlight, fleetTokensInFlight, fleetMaxConcurrent, fleetTokenBudget *prometheus.Desc

	eventBacklog, listenerPanics, ledgerDrift *prometheus.Desc
}

func (d *descs) new(name, help string, labels ...string) *prometheus.Desc {
	x := prometheus.NewDesc(prometheus.BuildFQName(d.ns, "", name), help, labels, d.labels)
	d.all = append(d.all, x)
	return x
}

func (d *descs) init(ns string, labels prometheus.Labels) {
	d.ns, d.labels = ns, labels
	const class = "class"

	d.inFlight = d.new("in_flight", "Admissions not yet released: admitted_total - released_total.")
	d.admitted = d.new("admitted_total", "Calls admitted.")
	d.released = d.new("released_total", "Admissions released.")
	d.rejected = d.new("rejected_total", "Calls rejected, by reason and admission class (\"\" without classes).", "reason", class)
	d.abandoned = d.new("abandoned_total", "Borrowed slots given back before release, by cause.", "cause")

	d.slotsInUse = d.new("slots_in_use", "Concurrency slots taken: in_flight less the admissions whose borrowed slot was abandoned.")
	d.pending = d.new("pending", "Calls waiting in the queue for a slot.")
	d.maxConcurrent = d.new("max_concurrent", "Current limit on concurrency slots.")
	d.maxQueue = d.new("max_queue", "Current limit on waiting calls.")
	d.closed = d.new("closed", "1 once the bulkhead is closed, else 0.")
	d.limitRevision = d.new("limit_revision", "Revision of the limits in effect.")
	d.doubleReleases = d.new("double_releases_total", "Release calls on permits already released.")

	d.tokenBudget = d.new("token_budget", "Current token budget: the most tokens admitted calls may hold at once.")
	d.highPriorityReserve = d.new("token_high_priority_reserve", "Part of the token budget only high-priority calls may use.")
	d.tokensInFlight = d.new("tokens_in_flight", "Tokens admitted calls hold now.")
	d.tokensAvailable = d.new("tokens_available", "Token budget not held: token_budget - tokens_in_flight, at least 0.")
	d.tokensReserved = d.new("tokens_reserved_total", "Tokens reserved by admissions.")
	d.tokensConsumed = d.new("tokens_consumed_total", "Tokens consumed, by the usage settled at release.")
	d.tokensRefunded = d.new("tokens_refunded_total", "Reserved tokens given back unused, early and at release.")
	d.tokensOverrun = d.new("tokens_overrun_total", "Hold growth beyond the reservations.")

	d.sharedMaxConcurrent = d.new("shared_max_concurrent", "Slots of the classes' shared pool: max_concurrent less the classes' floors.")
	d.sharedInFlight = d.new("shared_in_flight", "Shared-pool slots in use.")
	d.sharedTokenBudget = d.new("shared_token_budget", "Tokens of the classes' shared pool: token_budget less the classes' token floors.")
	d.sharedTokensInFlight = d.new("shared_tokens_in_flight", "Shared-pool tokens held.")

	d.classInFlight = d.new("class_in_flight", "Slots a class uses.", class)
	d.classPending = d.new("class_pending", "Calls of a class waiting in the queue.", class)
	d.classBorrowedInFlight = d.new("class_borrowed_in_flight", "Slots a class uses from the shared pool.", class)
	d.classProtectedConcurrent = d.new("class_protected_concurrent", "A class's concurrency floor.", class)
	d.classMaxConcurrent = d.new("class_max_concurrent", "A class's concurrency ceiling, for a class that has one.", class)
	d.classAdmitted = d.new("class_admitted_total", "Calls of a class admitted.", class)
	d.classReleased = d.new("class_released_total", "Admissions of a class released.", class)
	d.classBorrowedAdmissions = d.new("class_borrowed_admissions_total", "Admissions of a class that took a shared slot.", class)
	d.classTokensInFlight = d.new("class_tokens_in_flight", "Tokens a class's admissions hold.", class)
	d.classBorrowedTokensInFlight = d.new("class_borrowed_tokens_in_flight", "Tokens a class holds from the shared pool.", class)
	d.classProtectedTokens = d.new("class_protected_tokens", "A class's token floor.", class)
	d.classMaxTokens = d.new("class_max_tokens_in_flight", "A class's token ceiling, for a class that has one.", class)
	d.classTokensReserved = d.new("class_tokens_reserved_total", "Tokens reserved by a class's admissions.", class)
	d.classTokensConsumed = d.new("class_tokens_consumed_total", "Tokens a class consumed, by the usage settled at release.", class)
	d.classTokensRefunded = d.new("class_tokens_refunded_total", "Tokens a class gave back unused.", class)

	d.bypassed = d.new("bypassed_total", "Calls Observe mode ran without admission, by the rejection they were spared.", "reason")
	d.raceBypassed = d.new("race_bypassed_total", "Bypassed calls refused only after they queued (also counted in rejected_total).")
	d.bypassedInFlight = d.new("bypassed_in_flight", "Bypassed calls running now.")
	d.bypassedUsage = d.new("bypassed_usage_reported_total", "Bypassed calls that ended with a final usage.")
	d.bypassedInput = d.new("bypassed_input_tokens_total", "Input tokens of the bypassed calls' final usages.")
	d.bypassedOutput = d.new("bypassed_output_tokens_total", "Output tokens of the bypassed calls' final usages.")

	d.dedupActive = d.new("dedup_active", "Distinct deduplication keys in flight.")
	d.dedupHits = d.new("dedup_hits_total", "Calls that shared the result of an identical call in flight.")

	d.rateChecked = d.new("rate_checked_total", "Calls checked against the rate limits.")
	d.ratePaced = d.new("rate_paced_total", "Calls that waited for a rate-limit turn.")
	d.ratePacedSeconds = d.new("rate_paced_seconds_total", "Time calls waited for rate-limit turns, in all.")
	d.rateFallbacks = d.new("rate_fallbacks_total", "Calls the rate store's failure policy decided.")
	d.rateOverruns = d.new("rate_overruns_total", "Releases that booked usage beyond the reservation on the rate limits.")
	d.rateOverrunTokens = d.new("rate_overrun_tokens_total", "Tokens booked on the rate limits at release beyond the reservations.")
	d.rateOverrunErrors = d.new("rate_overrun_errors_total", "Overrun bookings the rate store failed.")
	d.rateOverrunDropped = d.new("rate_overrun_dropped_tokens_total", "Overrun tokens not booked: an overrun books a rate at most one window ahead.")
	d.rateRefunds = d.new("rate_refunds_total", "Releases that gave tokens back to the input or output token rates (usage below the estimate).")
	d.rateRefundedTokens = d.new("rate_refunded_tokens_total", "Tokens given back to the input or output token rates at release.")
	d.suspectUsage = d.new("usage_suspect_total", "Usage figures above the usage ceiling, clamped to it.")
	d.suspectTokens = d.new("usage_suspect_tokens_total", "Tokens clamped away from usage figures above the usage ceiling.")

	d.fleetChecked = d.new("fleet_checked_total", "Admissions that asked the fleet pool.")
	d.fleetAdmitted = d.new("fleet_admitted_total", "Admissions the fleet pool let through.")
	d.fleetPolicyAdmitted = d.new("fleet_policy_admitted_total", "Admissions the fleet pool's failure policy let through while Redis failed.")
	d.fleetInFlight = d.new("fleet_view_in_flight", "Slots held in the fleet pool by every replica, as its last reply showed.")
	d.fleetTokensInFlight = d.new("fleet_view_tokens_in_flight", "Tokens held in the fleet pool by every replica, as its last reply showed.")
	d.fleetMaxConcurrent = d.new("fleet_view_max_concurrent", "The fleet pool's slot limit, -1 when not enforced.")
	d.fleetTokenBudget = d.new("fleet_view_token_budget", "The fleet pool's token limit, -1 when not enforced.")

	d.eventBacklog = d.new("event_backlog", "Events emitted and not yet handed to every listener.")
	d.listenerPanics = d.new("listener_panics_total", "Event listener calls that panicked.")
	d.ledgerDrift = d.new("ledger_drift_total", "Times the bulkhead found its books out of balance; 0 unless it has a bug.")
}
