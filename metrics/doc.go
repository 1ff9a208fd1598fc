// Package metrics exports a bulkhead's statistics and timings as Prometheus
// metrics, for any program that embeds a bulkhead.
//
// New returns a Collector for one *bulkhead.Bulkhead. It registers nothing
// by itself: register it on the program's own registry, and serve that
// registry, for example with promhttp.HandlerFor. Give each bulkhead of a
// program its own Options.Name, which becomes the label bulkhead="<Name>".
//
//	reg := prometheus.NewRegistry()
//	c, err := metrics.New(b, metrics.Options{Name: "gpt-4o"})
//	if err != nil { ... }
//	defer c.Close()
//	reg.MustRegister(c)
//
// Counters and gauges are read from Bulkhead.Stats at each scrape, so
// counters are exact and never go down, and all of one scrape's values come
// from one instant. Histograms are fed from the bulkhead's events from New
// on, until Close.
//
// # Metrics
//
// With the default namespace, "bulkhead". Every metric also carries the
// labels of Options.Name and Options.ConstLabels.
//
// Admissions:
//
//	bulkhead_admitted_total                      calls admitted
//	bulkhead_released_total                      admissions released
//	bulkhead_in_flight                           admissions not yet released (admitted - released)
//	bulkhead_rejected_total{reason,class}        rejections, by reason ("queue_limit"...) and class ("" without classes)
//	bulkhead_abandoned_total{cause}              borrowed slots given back early ("manual", "deadline")
//	bulkhead_usage_suspect_total                 usage figures above Config.UsageCeiling, clamped to it
//	bulkhead_usage_suspect_tokens_total          tokens clamped away from those figures
//
// Concurrency gate and queue:
//
//	bulkhead_slots_in_use                        slots taken (in flight less abandoned borrowed slots)
//	bulkhead_pending                             calls waiting in the queue
//	bulkhead_max_concurrent, bulkhead_max_queue  current limits
//	bulkhead_closed                              1 once closed
//	bulkhead_limit_revision                      revision of the limits in effect
//	bulkhead_double_releases_total               releases of permits already released
//
// Token budget, with a budget only:
//
//	bulkhead_token_budget, bulkhead_token_high_priority_reserve
//	bulkhead_tokens_in_flight                    tokens held
//	bulkhead_tokens_available                    budget not held
//	bulkhead_tokens_reserved_total               reservations of admissions
//	bulkhead_tokens_consumed_total               usage settled at release
//	bulkhead_tokens_refunded_total               reserved tokens given back unused
//	bulkhead_tokens_overrun_total                hold growth beyond the reservations
//
// Admission classes, with classes only:
//
//	bulkhead_shared_max_concurrent, bulkhead_shared_in_flight          the shared pool's slots
//	bulkhead_shared_token_budget, bulkhead_shared_tokens_in_flight     its tokens (with a budget)
//	bulkhead_class_in_flight{class}, bulkhead_class_borrowed_in_flight{class}
//	bulkhead_class_protected_concurrent{class}, bulkhead_class_max_concurrent{class} (when set)
//	bulkhead_class_admitted_total{class}, bulkhead_class_released_total{class}
//	bulkhead_class_borrowed_admissions_total{class}
//	bulkhead_class_tokens_in_flight{class}, bulkhead_class_borrowed_tokens_in_flight{class}     (with a budget)
//	bulkhead_class_protected_tokens{class}, bulkhead_class_max_tokens_in_flight{class} (when set)
//	bulkhead_class_tokens_reserved_total{class}, _consumed_total{class}, _refunded_total{class}
//
// Observe mode:
//
//	bulkhead_bypassed_total{reason}              calls run without admission, by the rejection spared
//	bulkhead_race_bypassed_total                 of those, refused only after they queued
//	bulkhead_bypassed_in_flight                  bypassed calls running
//	bulkhead_bypassed_usage_reported_total       bypassed calls that ended with a usage
//	bulkhead_bypassed_input_tokens_total, bulkhead_bypassed_output_tokens_total
//
// Deduplication, with Config.Dedup only:
//
//	bulkhead_dedup_active                        distinct keys in flight
//	bulkhead_dedup_hits_total                    calls that shared another's result
//
// Rate limits, with Config.RateLimits only:
//
//	bulkhead_rate_checked_total, bulkhead_rate_paced_total, bulkhead_rate_paced_seconds_total
//	bulkhead_rate_fallbacks_total                calls the store's failure policy decided
//	bulkhead_rate_overruns_total, bulkhead_rate_overrun_tokens_total, bulkhead_rate_overrun_errors_total
//	bulkhead_rate_overrun_dropped_tokens_total   overrun tokens not booked (at most one window ahead)
//
// Fleet pool, with Config.Fleet only:
//
//	bulkhead_fleet_checked_total, bulkhead_fleet_admitted_total, bulkhead_fleet_policy_admitted_total
//	bulkhead_fleet_view_in_flight, bulkhead_fleet_view_tokens_in_flight   fleet-wide, from the pool's last reply
//	bulkhead_fleet_view_max_concurrent, bulkhead_fleet_view_token_budget  the pool's limits (-1: not enforced)
//
// Events and health:
//
//	bulkhead_event_backlog                       events not yet handed to every listener
//	bulkhead_listener_panics_total               listener calls that panicked
//	bulkhead_ledger_drift_total                  books found out of balance (0 unless a bug)
//
// Histograms, fed from events:
//
//	bulkhead_queue_wait_seconds{outcome}         queue wait of each decided call ("admitted", "rejected"); 0 when it never queued
//	bulkhead_decision_seconds{outcome}           the bulkhead's own time on each decided call
//	bulkhead_rate_wait_seconds{outcome}          wait for a rate-limit turn (with Config.RateLimits)
//	bulkhead_release_consumed_tokens             final usage of each release that has one
//	bulkhead_release_refunded_tokens             tokens each such release gave back (with a budget)
//
// Every rejection reason appears in bulkhead_rejected_total from the start,
// at 0, and so does every reason Observe mode can bypass in
// bulkhead_bypassed_total.
//
// NewPoolCollector exports the counters of a fleet pool (package fleet) in
// the same way, each labelled pool="<the pool's name>":
//
//	bulkhead_fleet_reserve_total{outcome}        reserves ("admitted", "duplicate", "rejected_slots", "rejected_tokens", "relearning", "released", "error")
//	bulkhead_fleet_errors_total{op,kind}         failed Redis calls (op "reserve", "release", "adjust", "renew", "gen"; kind "timeout", "conn", "noscript", "other")
//	bulkhead_fleet_policy_admissions_total, bulkhead_fleet_policy_rejections_total   reserves the failure policy decided
//	bulkhead_fleet_in_flight, bulkhead_fleet_tokens_in_flight   fleet-wide, from the last reply
//	bulkhead_fleet_limit_slots, bulkhead_fleet_limit_tokens     the pool's limits (-1: not enforced)
//	bulkhead_fleet_local_holds, bulkhead_fleet_local_tokens     this replica's live holds
//	bulkhead_fleet_renew_total{status}           lease renewals ("renewed", "reinstated", "released", "lost")
//	bulkhead_fleet_reclaimed_total               expired holds this replica reclaimed
//	bulkhead_fleet_state_loss_total              times Redis lost or rewound the pool's state
//	bulkhead_fleet_lease_lapse_total             times this replica's leases ran out unrenewed
//	bulkhead_fleet_unaccounted_admissions        holds admitted by the failure policy, not yet in Redis
//	bulkhead_fleet_release_backlog               releases waiting to be sent
//	bulkhead_fleet_adjust_total{result}          usage adjustments ("applied", "stale", "lost", "coalesced")
//	bulkhead_fleet_breaker_open                  1 while the circuit breaker is open
package metrics
