package gateway

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// gate is what a Handler knows of one bulkhead's capacity, to turn a call
// away before reading its body. While the Handler's calls in the bulkhead
// reach the capacity the bulkhead last reported (its slots and queue
// positions, in the detail of a refusal), a new call is first checked with
// the bulkhead's advisory answer (WouldAdmit, for its class and priority);
// one it would turn away for want of a slot or a queue position is
// answered at once, its body discarded unparsed. Otherwise, and below the
// capacity, calls take the full path: read, parsed, admitted or refused by
// the bulkhead itself.
type gate struct {
	b *bulkhead.Bulkhead
	// calls counts the Handler's calls in the bulkhead, from their
	// admission to their end.
	calls atomic.Int64
	// capacity is MaxConcurrent + MaxQueue as the bulkhead last said; -1
	// before it has said.
	capacity atomic.Int64
	// early counts the calls turned away before their body was read: for
	// ConcurrencyLimit, then QueueLimit.
	early [2]atomic.Int64
}

func newGate(b *bulkhead.Bulkhead) *gate {
	g := &gate{b: b}
	g.capacity.Store(-1)
	return g
}

// learn notes the capacity a decision's detail reports.
func (g *gate) learn(d *bulkhead.RejectDetail) {
	if d != nil {
		g.capacity.Store(int64(d.MaxConcurrent) + int64(d.MaxQueue))
	}
}

// full reports whether the Handler's calls reach the bulkhead's capacity,
// as last reported.
func (g *gate) full() bool {
	c := g.capacity.Load()
	return c >= 0 && g.calls.Load() >= c
}

// The request and options of the early check, made once (the bulkhead
// only reads them).
var (
	anyCall       = &bulkhead.Request{}
	noReservation = bulkhead.WithReservation(bulkhead.Reservation{}) // capacity alone decides
	withDetail    = bulkhead.WithDetail()
	highPriority  = bulkhead.WithPriority(bulkhead.High)
)

// capacityRefusal reports whether reason is a refusal for want of a slot
// or a queue position.
func capacityRefusal(reason bulkhead.Reason) bool {
	return reason == bulkhead.ConcurrencyLimit || reason == bulkhead.QueueLimit
}

// shedEarly answers req, a call in format for route rp, before its body is
// read when rp's bulkhead is at its capacity and would turn the call away
// for it (see gate), and reports whether it did. A retry its retry budget
// refuses takes the full path, so that it is answered for its budget. A
// route whose admission options need the parsed call (Route.Options
// without Build) is never checked early.
func (h *Handler) shedEarly(w http.ResponseWriter, req *http.Request, format stream.Format, rp *routeProxy) bool {
	g := rp.gate
	if rp.admission == nil || !g.full() {
		return false
	}
	class, high := rp.admission(req)
	attempt, err := stream.AttemptOf(req.Header, rp.attempt)
	if err != nil { // the full path answers it
		return false
	}
	opts := make([]bulkhead.Option, 2, 5)
	opts[0], opts[1] = noReservation, withDetail
	if class != "" {
		opts = append(opts, bulkhead.WithClass(class))
	}
	if high {
		opts = append(opts, highPriority)
	}
	if attempt > 0 {
		// A retry over its budget is answered for that (by the full path,
		// which counts it), not for the capacity it would not get anyway.
		opts = append(opts, bulkhead.WithAttempt(attempt))
	}
	d, err := g.b.WouldAdmit(anyCall, opts...)
	if err != nil { // an unknown class, say: the full path answers it
		return false
	}
	g.learn(d.Detail)
	if d.Admit || !capacityRefusal(d.Reason) {
		return false
	}
	if d.Reason == bulkhead.ConcurrencyLimit {
		g.early[0].Add(1)
	} else {
		g.early[1].Add(1)
	}
	tag := req.Header.Get(RequestIDHeader)
	if len(tag) > bulkhead.MaxTagLen {
		tag = ""
	}
	if n := noteOf(req.Context()); n != nil {
		n.route = rp.index
	}
	h.refuseEarly(w, req, format, rp.maxBody, RejectionOf(format, &bulkhead.RejectedError{Reason: d.Reason, Detail: d.Detail, Tag: tag}), endShed)
	return true
}

// earlyCollector exports the calls a Handler turned away before reading
// their body, by bulkhead and reason: the bulkheads' own counters
// (bulkhead_rejected_total) do not see them.
type earlyCollector struct {
	desc  *prometheus.Desc
	h     *Handler
	names map[*bulkhead.Bulkhead]string
}

func newEarlyCollector(h *Handler, names map[*bulkhead.Bulkhead]string) *earlyCollector {
	return &earlyCollector{h: h, names: names, desc: prometheus.NewDesc("bulkhead_gateway_rejected_early_total",
		"Calls the gateway turned away before reading their body, the bulkhead having no slot or queue position for them; not in bulkhead_rejected_total.",
		[]string{"bulkhead", "reason"}, nil)}
}

func (c *earlyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *earlyCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.gatesMu.Lock()
	gates := make(map[*bulkhead.Bulkhead]*gate, len(c.h.gates))
	for b, g := range c.h.gates {
		gates[b] = g
	}
	c.h.gatesMu.Unlock()
	for b, g := range gates {
		for i, reason := range [...]bulkhead.Reason{bulkhead.ConcurrencyLimit, bulkhead.QueueLimit} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(g.early[i].Load()), c.names[b], reason.String())
		}
	}
}
