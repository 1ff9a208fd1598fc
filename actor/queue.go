package actor

import (
	"math"
	"math/bits"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// QueuePolicy is the engine's form of bulkhead.QueuePolicy; the facade
// converts and validates it, and the root type documents the fields.
type QueuePolicy struct {
	Fair            bool
	Weights         map[string]int
	WaitForCapacity bool
	// RetryAging is how long a waiting retry lets the first attempts that
	// came after it go ahead (see queue.pick); negative, retries are not
	// set apart: they wait in arrival order with everyone.
	RetryAging time.Duration
}

// line is a first-in, first-out line of waiting requests, linked through
// their prev and next fields (a request is in one line at a time).
type line struct {
	head, tail *AcquireRequest
}

func (q *line) push(r *AcquireRequest) {
	r.prev, r.next = q.tail, nil
	if q.tail == nil {
		q.head = r
	} else {
		q.tail.next = r
	}
	q.tail = r
}

// insertByArrival puts r in the line behind the requests that came before
// it (a line kept in arrival order).
func (q *line) insertByArrival(r *AcquireRequest) {
	at := q.tail
	for at != nil && at.arrival > r.arrival {
		at = at.prev
	}
	if at == q.tail {
		q.push(r)
		return
	}
	r.prev = at
	if at == nil {
		r.next, q.head = q.head, r
	} else {
		r.next, at.next = at.next, r
	}
	r.next.prev = r
}

func (q *line) remove(r *AcquireRequest) {
	if r.prev == nil {
		q.head = r.next
	} else {
		r.prev.next = r.next
	}
	if r.next == nil {
		q.tail = r.prev
	} else {
		r.next.prev = r.prev
	}
	r.prev, r.next = nil, nil
}

// queue holds the waiting requests. Plain, it is one line in arrival order.
// Fair, each class has two lanes, High priority then Normal, and the class
// served next is the backlogged one with the lowest virtual token counter:
// the tokens it has been admitted, divided by its weight, in millionths of
// a token (a class that becomes backlogged is first lifted to the counter
// of the class served last, so an idle class cannot save up credit).
//
// Retries (AcquireRequest.Retry) are set apart, unless aging is negative:
// each line has a second line beside it for its retries, and a first
// attempt goes ahead of the retries of its line (the plain queue, or one
// class and priority of the fair queue) until a retry has waited aging:
// from then on it goes in arrival order with the first attempts (see
// pick), so that no retry waits for ever.
type queue struct {
	plain line
	// retries is the plain queue's retries, set apart.
	retries line
	fair    bool
	// wait lets a call that fails only a capacity check (the token budget,
	// a class limit) wait for it.
	wait bool
	// aging is QueuePolicy.RetryAging; seq numbers the pushes, so that the
	// lines, each in push order, merge in it; apart counts the retries set
	// apart (the clock is read for them only), and apartIn those of each
	// class handle.
	aging   time.Duration
	seq     uint64
	apart   int
	apartIn []int

	// Per class handle (index 0 is classes.None): the lines (fair only:
	// High first attempts, High retries, Normal first attempts, Normal
	// retries), the number waiting, the counter and the weight (fair only).
	lanes   [][4]line
	waiting []int
	vtc     []int64
	weight  []int64
	// last is the counter of the class served last.
	last int64
	// classes counts the classes with waiters.
	classes int
	// blocked is the pump's scratch: classes whose first waiter does not
	// fit, skipped for the rest of the pass (first in, first out within a
	// class), and nblocked how many.
	blocked  []bool
	nblocked int
}

// unit is a fair queue counter's unit: a millionth of a token, so that
// weights up to MaxWeight divide a token exactly enough.
const unit = 1_000_000

// newQueue returns the queue of a bulkhead with n classes (0 without) and
// the policy p, whose weights are resolved through tab.
func newQueue(p QueuePolicy, n int, tab *classes.Table) (queue, error) {
	q := queue{fair: p.Fair, wait: p.WaitForCapacity, aging: p.RetryAging, waiting: make([]int, n+1), blocked: make([]bool, n+1),
		apartIn: make([]int, n+1)}
	if !p.Fair {
		return q, nil
	}
	if tab == nil {
		return q, admission.Invalidf("Queue.Fair", "needs admission classes (Config.Classes): the fair queue serves class by class")
	}
	q.lanes = make([][4]line, n+1)
	q.vtc = make([]int64, n+1)
	q.weight = make([]int64, n+1)
	for i := range q.weight {
		q.weight[i] = 1
	}
	for name, w := range p.Weights {
		c, err := tab.Lookup(name)
		if err != nil {
			return q, admission.Invalidf("Queue.Weights", "names class %q, which is not in Config.Classes", name)
		}
		if w < 1 || w > MaxWeight {
			return q, admission.Invalidf("Queue.Weights", "class %q: weight must be between 1 and %d, got %d", name, MaxWeight, w)
		}
		q.weight[c] = int64(w)
	}
	return q, nil
}

// MaxWeight is the largest class weight of a fair queue.
const MaxWeight = 1_000_000

// lane is the line r waits in.
func (q *queue) lane(r *AcquireRequest) *line {
	if !q.fair {
		if r.apart {
			return &q.retries
		}
		return &q.plain
	}
	i := 2
	if r.Priority == admission.High {
		i = 0
	}
	if r.apart {
		i++
	}
	return &q.lanes[r.Class][i]
}

// ahead reports whether a new call of class c and priority p, a retry or
// a first attempt, would wait behind waiters of its class at now: any of
// them, or with fair queuing, for a High priority call, the class's High
// priority waiters; but a first attempt goes ahead of the retries set
// apart that have not waited the aging.
func (q *queue) ahead(c classes.Class, p admission.Priority, retry bool, now time.Time) bool {
	if retry || q.apartIn[c] == 0 {
		if q.fair && p == admission.High {
			return q.lanes[c][0].head != nil || q.lanes[c][1].head != nil
		}
		return q.waiting[c] > 0
	}
	agedHead := func(l *line) bool { return l.head != nil && q.aged(l.head, now) }
	l := &q.lanes
	switch {
	case q.fair && p == admission.High:
		return (*l)[c][0].head != nil || agedHead(&(*l)[c][1])
	case q.fair:
		return (*l)[c][0].head != nil || (*l)[c][1].head != nil || (*l)[c][2].head != nil || agedHead(&(*l)[c][3])
	case q.waiting[c] > q.apartIn[c]:
		return true // a first attempt of c waits
	}
	for w := q.retries.head; w != nil && q.aged(w, now); w = w.next {
		if w.Class == c {
			return true
		}
	}
	return false
}

// setsApart reports whether r waits apart from the first attempts: a
// retry, in a queue that sets them apart. Its push time is needed then.
func (q *queue) setsApart(r *AcquireRequest) bool { return r.Retry && q.aging >= 0 }

// aged reports whether retry r, set apart, has waited aging at now.
func (q *queue) aged(r *AcquireRequest, now time.Time) bool { return now.Sub(r.pushedAt) >= q.aging }

// pick is the one of f, a first attempt, and rt, a retry set apart, each
// at its line's cursor (nil at its end), that goes first at now: the
// retry when it has waited aging and came first, else the first attempt,
// else the retry. Along a line of retries those that have waited aging
// come first, so the two lines merge into one order: first attempts and
// retries that have waited aging in arrival order, then the other
// retries.
func (q *queue) pick(f, rt *AcquireRequest, now time.Time) *AcquireRequest {
	if rt == nil || f != nil && (f.seq < rt.seq || !q.aged(rt, now)) {
		return f
	}
	return rt
}

// untilAged is how long after now the first retry set apart that has not
// waited aging yet will have, false when there is none.
func (q *queue) untilAged(now time.Time) (time.Duration, bool) {
	var soonest time.Duration
	found := false
	check := func(l *line) {
		w := l.head
		for w != nil && q.aged(w, now) {
			w = w.next
		}
		if w != nil {
			if d := w.pushedAt.Add(q.aging).Sub(now); !found || d < soonest {
				soonest, found = d, true
			}
		}
	}
	if !q.fair {
		check(&q.retries)
	}
	for c := range q.lanes {
		check(&q.lanes[c][1])
		check(&q.lanes[c][3])
	}
	return soonest, found
}

// push adds r at the end of its line. A retry set apart must have its
// push time (pushedAt) set.
func (q *queue) push(r *AcquireRequest) {
	q.seq++
	r.seq = q.seq
	if q.setsApart(r) {
		r.apart = true
		q.apart++
		q.apartIn[r.Class]++
	}
	c := r.Class
	if q.waiting[c] == 0 {
		q.classes++
		if q.fair {
			// An idle class starts level with the class served last: it
			// saved up no credit while it was idle.
			q.vtc[c] = max(q.vtc[c], q.last)
		}
	}
	q.waiting[c]++
	q.lane(r).push(r)
}

// remove takes r out of its line.
func (q *queue) remove(r *AcquireRequest) {
	q.lane(r).remove(r)
	if r.apart {
		r.apart = false
		q.apart--
		q.apartIn[r.Class]--
	}
	if q.waiting[r.Class]--; q.waiting[r.Class] == 0 {
		q.classes--
	}
}

// charge is what an admission of class c reserving reserved tokens adds to
// its counter: at least one token's worth (so calls without a budget are
// shared by count), divided by the weight, saturating.
func (q *queue) charge(c classes.Class, reserved int64) int64 {
	hi, lo := bits.Mul64(uint64(max(reserved, 1)), unit)
	if hi >= uint64(q.weight[c]) {
		return math.MaxInt64
	}
	v, _ := bits.Div64(hi, lo, uint64(q.weight[c]))
	return int64(min(v, math.MaxInt64))
}

// served charges class c for an admission reserving reserved tokens. Only
// differences between counters matter, so when they grow large every
// counter moves down by the smallest.
func (q *queue) served(c classes.Class, reserved int64) {
	if !q.fair {
		return
	}
	q.vtc[c] = admission.AddSat(q.vtc[c], q.charge(c, reserved))
	q.last = q.vtc[c]
	if q.last >= 1<<61 {
		low := q.last
		for _, v := range q.vtc[1:] {
			low = min(low, v)
		}
		for i := range q.vtc {
			q.vtc[i] = max(0, q.vtc[i]-low)
		}
		q.last -= low
	}
}

// unserve takes back the charge of an admission turned down after all
// (a provisional admission rolled back).
func (q *queue) unserve(c classes.Class, reserved int64) {
	if q.fair {
		q.vtc[c] = max(0, q.vtc[c]-q.charge(c, reserved))
	}
}

// first is the first waiter of class c whose context has not ended at now:
// High priority first, then in arrival order, first attempts ahead of
// retries (see pick). Waiters whose context ended are passed over: their
// cancel message is on its way.
func (q *queue) first(c classes.Class, now time.Time) *AcquireRequest {
	for i := 0; i < len(q.lanes[c]); i += 2 {
		if w := q.pick(live(q.lanes[c][i].head), live(q.lanes[c][i+1].head), now); w != nil {
			return w
		}
	}
	return nil
}

// live is the first waiter from w on whose context has not ended, nil for
// none.
func live(w *AcquireRequest) *AcquireRequest {
	for ; w != nil && w.ctxEnded(); w = w.next {
	}
	return w
}

// next is the fair queue's next candidate at now: the first waiter of the
// backlogged class, not blocked in this pass, with the lowest counter
// (ties to the lower class handle). nil when there is none.
func (q *queue) next(now time.Time) *AcquireRequest {
	for {
		best := -1
		for i, n := range q.waiting {
			if n > 0 && !q.blocked[i] && (best < 0 || q.vtc[i] < q.vtc[best]) {
				best = i
			}
		}
		if best < 0 {
			return nil
		}
		if w := q.first(classes.Class(best), now); w != nil {
			return w
		}
		q.block(classes.Class(best)) // only waiters whose context ended
	}
}

// block skips class c for the rest of the pump's pass.
func (q *queue) block(c classes.Class) {
	if !q.blocked[c] {
		q.blocked[c] = true
		q.nblocked++
	}
}

// allBlocked reports whether every class with waiters is blocked.
func (q *queue) allBlocked() bool { return q.nblocked >= q.classes }

// clearBlocked starts a pump's pass.
func (q *queue) clearBlocked() {
	clear(q.blocked)
	q.nblocked = 0
}

// each calls f for every waiter, in arrival order (with fair queuing,
// class by class, High priority first); f may remove the waiter it is
// given.
func (q *queue) each(f func(*AcquireRequest)) {
	if !q.fair {
		eachMerged(&q.plain, &q.retries, f)
		return
	}
	for c := range q.lanes {
		for i := 0; i < len(q.lanes[c]); i += 2 {
			eachMerged(&q.lanes[c][i], &q.lanes[c][i+1], f)
		}
	}
}

// eachMerged calls f for every waiter of lines a and b, in push order.
func eachMerged(a, b *line, f func(*AcquireRequest)) {
	x, y := a.head, b.head
	for x != nil || y != nil {
		w := x
		if x == nil || y != nil && y.seq < x.seq {
			w, y = y, y.next
		} else {
			x = x.next
		}
		f(w)
	}
}
