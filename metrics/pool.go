package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmbulkhead/bulkhead/fleet"
)

// PoolLabel is the label that names a fleet pool on the metrics of a
// PoolCollector.
const PoolLabel = "pool"

// PoolCollector exports the counters of one replica's handle on a fleet
// pool (package fleet): its reserves, Redis errors, lease renewals and the
// fleet-wide state its last reply showed. Every metric is labelled
// pool="<the pool's name>". Register it beside the Collector of the
// bulkhead that uses the pool: their names do not overlap.
//
// Its values are read from fleet.Pool.Stats at each scrape. A PoolCollector
// is safe for concurrent use.
type PoolCollector struct {
	p   *fleet.Pool
	all []*prometheus.Desc

	reserves, errs, policyAdmissions, policyRejections,
	inFlight, tokensInFlight, limitSlots, limitTokens, localHolds, localTokens,
	renews, reclaimed, stateLosses, lapses, unaccounted, releaseBacklog, adjusts, breakerOpen *prometheus.Desc
}

// NewPoolCollector returns a PoolCollector of p's metrics. Of opts,
// Namespace, Name and ConstLabels apply as for New (ConstLabels must not
// use the label names pool, outcome, op, kind, status or result either);
// the buckets have no use here. An invalid Options is an error; so is a nil
// p.
func NewPoolCollector(p *fleet.Pool, opts Options) (*PoolCollector, error) {
	if p == nil {
		return nil, errors.New("metrics: nil *fleet.Pool")
	}
	ns, labels, err := names(opts, PoolLabel, "outcome", "op", "kind", "status", "result")
	if err != nil {
		return nil, err
	}
	labels[PoolLabel] = p.Name()
	c := &PoolCollector{p: p}
	d := func(name, help string, variable ...string) *prometheus.Desc {
		x := prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, variable, labels)
		c.all = append(c.all, x)
		return x
	}
	c.reserves = d("fleet_reserve_total", "Reserves of this replica, by outcome.", "outcome")
	c.errs = d("fleet_errors_total", "Failed Redis calls, by operation and kind of error.", "op", "kind")
	c.policyAdmissions = d("fleet_policy_admissions_total", "Reserves the failure policy admitted while Redis could not decide.")
	c.policyRejections = d("fleet_policy_rejections_total", "Reserves the failure policy rejected while Redis could not decide.")
	c.inFlight = d("fleet_in_flight", "Slots held in the pool by every replica, as the last reply showed.")
	c.tokensInFlight = d("fleet_tokens_in_flight", "Tokens held in the pool by every replica, as the last reply showed.")
	c.limitSlots = d("fleet_limit_slots", "The pool's slot limit, -1 when not enforced.")
	c.limitTokens = d("fleet_limit_tokens", "The pool's token limit, -1 when not enforced.")
	c.localHolds = d("fleet_local_holds", "Live holds of this replica.")
	c.localTokens = d("fleet_local_tokens", "Tokens the live holds of this replica hold.")
	c.renews = d("fleet_renew_total", "Lease renewals, one per hold, by status.", "status")
	c.reclaimed = d("fleet_reclaimed_total", "Expired holds, of any replica, this replica reclaimed.")
	c.stateLosses = d("fleet_state_loss_total", "Times this replica saw Redis lose or rewind the pool's state.")
	c.lapses = d("fleet_lease_lapse_total", "Times a lease of this replica's live holds ran out unrenewed (reserves refused until they are registered again).")
	c.unaccounted = d("fleet_unaccounted_admissions", "Live holds the failure policy admitted and not yet registered with Redis.")
	c.releaseBacklog = d("fleet_release_backlog", "Releases waiting to be sent to Redis.")
	c.adjusts = d("fleet_adjust_total", "Usage adjustments, by result.", "result")
	c.breakerOpen = d("fleet_breaker_open", "1 while the circuit breaker is open and reserves skip Redis, else 0.")
	if err := prometheus.NewRegistry().Register(c); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return c, nil
}

// Describe sends the descriptions of every metric the PoolCollector
// collects. It implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.all {
		ch <- d
	}
}

// Collect reads the pool's Stats once and sends every metric. It implements
// prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	s := sink(ch)

	r := st.Reserves
	for outcome, n := range map[string]uint64{
		"admitted": r.Admitted, "duplicate": r.Duplicate, "rejected_slots": r.RejectedSlots,
		"rejected_tokens": r.RejectedTokens, "relearning": r.Relearning, "released": r.Released, "error": r.Error,
	} {
		counter(c.reserves, n, outcome)
	}
	e := st.Errors
	for op, kinds := range map[string]fleet.ErrorKinds{
		"reserve": e.Reserve, "release": e.Release, "adjust": e.Adjust, "renew": e.Renew, "gen": e.Gen,
	} {
		counter(c.errs, kinds.Timeout, op, "timeout")
		counter(c.errs, kinds.Conn, op, "conn")
		counter(c.errs, kinds.NoScript, op, "noscript")
		counter(c.errs, kinds.Other, op, "other")
	}
	counter(c.policyAdmissions, st.PolicyAdmissions)
	counter(c.policyRejections, st.PolicyRejections)

	s.gauge(c.inFlight, st.LastView.Slots)
	s.gauge(c.tokensInFlight, st.LastView.Tokens)
	s.gauge(c.limitSlots, st.LastView.MaxConcurrent)
	s.gauge(c.limitTokens, st.LastView.TokenBudget)
	s.gauge(c.localHolds, st.LocalHolds)
	s.gauge(c.localTokens, st.LocalTokens)

	for status, n := range map[string]uint64{
		"renewed": st.Renews.Renewed, "reinstated": st.Renews.Reinstated, "released": st.Renews.Released, "lost": st.Renews.Lost,
	} {
		counter(c.renews, n, status)
	}
	counter(c.reclaimed, st.Reclaimed)
	counter(c.stateLosses, st.StateLosses)
	counter(c.lapses, st.Lapses)
	s.gauge(c.unaccounted, st.Unaccounted)
	s.gauge(c.releaseBacklog, st.ReleaseBacklog)
	for result, n := range map[string]uint64{
		"applied": st.Adjusts.Applied, "stale": st.Adjusts.Stale, "lost": st.Adjusts.Lost, "coalesced": st.Adjusts.Coalesced,
	} {
		counter(c.adjusts, n, result)
	}
	s.gauge(c.breakerOpen, boolValue(st.BreakerOpen))
}
