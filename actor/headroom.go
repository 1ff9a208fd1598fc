package actor

import (
	"math/bits"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The provider's headroom is state of the state machine: the provider's
// rate-limit headers say what is left of its windows, by model. A call that
// does not fit what is left is held back or shed as for a cool-down (the
// cool-down stage asks the headroom); a call that fits spends from it as
// its slot is granted, and gets it back when its admission is rolled back.

// maxHeadrooms bounds the models with a headroom report kept: beyond it,
// the report that is forgotten first makes room.
const maxHeadrooms = 1024

// headroomStage is the provider's headroom reports, by model: part of the
// cool-down stage.
type headroomStage struct {
	// models is the latest report per model; first is no later than the
	// earliest time one of them is forgotten; gen numbers the reports.
	models  map[string]*headroomReport
	first   time.Time
	gen     uint64
	reports int64
}

func newHeadroomStage() headroomStage {
	return headroomStage{models: map[string]*headroomReport{}}
}

// armed reports whether some report is in force.
func (h *headroomStage) armed() bool { return len(h.models) > 0 }

// purge forgets the reports whose windows are full again; it reads the
// whole table only once its earliest end has come.
func (h *headroomStage) purge(now time.Time) {
	if len(h.models) == 0 || now.Before(h.first) {
		return
	}
	h.first = time.Time{}
	for m, r := range h.models {
		switch {
		case !r.full.After(now):
			delete(h.models, m)
		case h.first.IsZero() || r.full.Before(h.first):
			h.first = r.full
		}
	}
}

// stats returns what is left of each report in force at now, nil for
// none.
func (h *headroomStage) stats(now time.Time) map[string]admission.HeadroomStats {
	if len(h.models) == 0 {
		return nil
	}
	st := make(map[string]admission.HeadroomStats, len(h.models))
	for m, r := range h.models {
		el := now.Sub(r.at)
		st[m] = admission.HeadroomStats{Tokens: r.tokens.remaining(el), Requests: r.reqs.remaining(el),
			TokensLimit: r.tokLim, RequestsLimit: r.reqLim, Reported: r.at, Full: r.full}
	}
	return st
}

// hrWindow is one window of a headroom report: what was left, its limit
// (0: not said) and how long until full, at the report; what admissions
// spent since.
type hrWindow struct {
	on          bool
	left, limit int64
	reset       time.Duration
	spent       int64
}

func newWindow(left, limit int64, reset time.Duration) hrWindow {
	if left < 0 || reset <= 0 {
		return hrWindow{}
	}
	return hrWindow{on: true, left: left, limit: limit, reset: reset}
}

// avail returns what is left at elapsed since the report, before the
// spending: past the reset, the whole limit; ok false past the reset of a
// window whose limit was not said (nothing is known of it then).
func (w *hrWindow) avail(elapsed time.Duration) (int64, bool) {
	if elapsed >= w.reset {
		return w.limit, w.limit > 0
	}
	if w.limit == 0 || elapsed <= 0 {
		return w.left, true
	}
	// left + (limit-left) × elapsed / reset, without overflow: the
	// quotient is below limit-left, as elapsed < reset.
	hi, lo := bits.Mul64(uint64(w.limit-w.left), uint64(elapsed))
	q, _ := bits.Div64(hi, lo, uint64(w.reset))
	return w.left + int64(q), true
}

// wait returns how long after elapsed (since the report) until need fits
// what is left beside the spending, 0 when it fits now. The window is on
// and not yet full.
func (w *hrWindow) wait(elapsed time.Duration, need int64) time.Duration {
	a, _ := w.avail(elapsed)
	if !admission.Exceeds(w.spent, need, a) {
		return 0
	}
	if elapsed >= w.reset {
		return w.reset // full, and spent: another window's worth (the caller caps it)
	}
	toFull := w.reset - elapsed
	k, ok := admission.Add(w.spent, need)
	if w.limit == 0 || !ok || k > w.limit {
		return toFull // fits only once the window is full again, and forgotten
	}
	// The first elapsed e with (limit-left) × e / reset >= k - left.
	d := uint64(w.limit - w.left)
	hi, lo := bits.Mul64(uint64(k-w.left), uint64(w.reset))
	lo, c := bits.Add64(lo, d-1, 0)
	hi += c
	e, _ := bits.Div64(hi, lo, d) // < reset + 1, as k - left <= d
	return min(toFull, max(time.Duration(e)-elapsed, 1))
}

// tracked reports whether the window bounds admissions at elapsed: it was
// said, and it is before its reset or its limit is known (past its reset it
// is full, and what admissions spent still counts against its limit).
func (w *hrWindow) tracked(elapsed time.Duration) bool {
	return w.on && (elapsed < w.reset || w.limit > 0)
}

// remaining returns what is left at elapsed, for the stats: -1 when the
// window is off, or past its reset with no limit said (unknown).
func (w *hrWindow) remaining(elapsed time.Duration) int64 {
	if !w.on {
		return -1
	}
	a, ok := w.avail(elapsed)
	if !ok {
		return -1
	}
	return max(0, a-w.spent)
}

// headroomReport is one model's latest report.
type headroomReport struct {
	at             time.Time
	full           time.Time
	gen            uint64
	tokens, reqs   hrWindow
	tokLim, reqLim int64
}

// report records what the provider said was left for model, at now. A
// report that says nothing usable forgets the model's previous one: it is
// newer.
func (h *headroomStage) report(model string, r *admission.Headroom, now time.Time) {
	tok := newWindow(r.Tokens, r.TokensLimit, r.TokensReset)
	req := newWindow(r.Requests, r.RequestsLimit, r.RequestsReset)
	h.reports++
	if !tok.on && !req.on {
		delete(h.models, model)
		return
	}
	span := max(tok.reset, req.reset)
	h.gen++
	rep := &headroomReport{at: now, full: now.Add(span), gen: h.gen, tokens: tok, reqs: req, tokLim: r.TokensLimit, reqLim: r.RequestsLimit}
	if _, ok := h.models[model]; !ok && len(h.models) >= maxHeadrooms {
		h.purge(now)
		if len(h.models) >= maxHeadrooms {
			first := ""
			for m, o := range h.models {
				if first == "" || o.full.Before(h.models[first].full) {
					first = m
				}
			}
			delete(h.models, first)
		}
	}
	h.models[model] = rep
	if h.first.IsZero() || rep.full.Before(h.first) {
		h.first = rep.full
	}
}

// wait returns how long until a call of model reserving reserved tokens
// fits the model's headroom (0: it fits, or nothing is known), and books
// its spending when book is set and it fits, returning the report's
// generation (0 when nothing was booked).
func (h *headroomStage) wait(model string, reserved int64, now time.Time, book bool) (time.Duration, uint64) {
	rep, ok := h.models[model]
	if !ok {
		return 0, 0
	}
	if !now.Before(rep.full) {
		delete(h.models, model)
		return 0, 0
	}
	el := now.Sub(rep.at)
	var wait time.Duration
	if rep.tokens.tracked(el) {
		wait = rep.tokens.wait(el, max(reserved, 1))
	}
	if rep.reqs.tracked(el) {
		wait = max(wait, rep.reqs.wait(el, 1))
	}
	wait = min(wait, rep.full.Sub(now)) // then the report is forgotten
	if wait > 0 || !book {
		return wait, 0
	}
	rep.tokens.spent = admission.AddSat(rep.tokens.spent, reserved)
	rep.reqs.spent = admission.AddSat(rep.reqs.spent, 1)
	return 0, rep.gen
}

// refund gives back what a call booked against report generation gen of
// model, when that report is still the model's.
func (h *headroomStage) refund(model string, reserved int64, gen uint64) {
	if gen == 0 {
		return
	}
	if rep, ok := h.models[model]; ok && rep.gen == gen {
		rep.tokens.spent = max(0, rep.tokens.spent-reserved)
		rep.reqs.spent = max(0, rep.reqs.spent-1)
	}
}
