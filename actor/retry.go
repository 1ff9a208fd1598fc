package actor

import (
	"math"
	"math/bits"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// The retry budgets: a call that says it is a retry (AcquireRequest.Retry)
// is admitted only while each budget it falls under (the bulkhead's own,
// its class's) has room: the retries admitted over the budget's sliding
// window must stay below the larger of its floor and its ratio of the
// first attempts admitted over the same window. The check is made as the
// call arrives, right after the context (a retry over budget is turned
// away at once, RetryBudget), and again as it is granted its slot (a
// retry that waited, in the queue or for a paced turn, may find the room
// taken by then). An admission is counted in the windows as it is granted
// (a provisional one included, so that no two retries take the same room
// while a remote stage decides them) and taken back if it is rolled back.

// retryBuckets is the number of buckets a window is counted in: an
// admission counts for between 9/10 of the window and the whole window
// after it is granted.
const retryBuckets = 10

// ppm is a ratio's unit: a millionth.
const ppm = 1_000_000

// retryLimit is one budget's rule: its ratio in millionths and its floor.
type retryLimit struct {
	ppm, floor int64
	// spec is the budget as configured, for details and statistics.
	spec admission.RetryLimit
}

// allowed is the most retries the limit allows beside firsts first
// attempts: the larger of its floor and its ratio of firsts, rounded down.
// It never overflows: the product is taken in 128 bits.
func (l *retryLimit) allowed(firsts int64) int64 {
	hi, lo := bits.Mul64(uint64(max(firsts, 0)), uint64(l.ppm))
	share := int64(math.MaxInt64)
	if hi < ppm {
		q, _ := bits.Div64(hi, lo, ppm)
		share = int64(min(q, math.MaxInt64))
	}
	return max(l.floor, share)
}

// retryWindow counts one budget's admissions, first attempts and retries,
// in buckets: bucket k%retryBuckets holds those granted in the k-th width
// of time since the stage's origin, for the retryBuckets most recent k.
type retryWindow struct {
	limit   retryLimit
	firsts  [retryBuckets]int64
	retries [retryBuckets]int64
}

// sums returns the first attempts and the retries in the window, each
// saturating at math.MaxInt64.
func (w *retryWindow) sums() (firsts, retries int64) {
	for i := range retryBuckets {
		firsts = admission.AddSat(firsts, w.firsts[i])
		retries = admission.AddSat(retries, w.retries[i])
	}
	return firsts, retries
}

// clear empties the buckets of the steps widths after bucket cur, which
// the window moves onto.
func (w *retryWindow) clear(cur, steps int64) {
	if steps >= retryBuckets {
		w.firsts, w.retries = [retryBuckets]int64{}, [retryBuckets]int64{}
		return
	}
	for k := cur + 1; k <= cur+steps; k++ {
		w.firsts[k%retryBuckets], w.retries[k%retryBuckets] = 0, 0
	}
}

// add counts n (1, or -1 to take one back) admissions in bucket k.
func (w *retryWindow) add(k int64, retry bool, n int64) {
	b := &w.firsts[k%retryBuckets]
	if retry {
		b = &w.retries[k%retryBuckets]
	}
	if n > 0 {
		*b = admission.AddSat(*b, n)
	} else {
		*b = max(0, *b+n)
	}
}

// stats is the window's use now, under its limit.
func (w *retryWindow) stats(window time.Duration) admission.RetryBudgetStats {
	firsts, retries := w.sums()
	s := w.limit.spec
	return admission.RetryBudgetStats{Ratio: s.Ratio, MinRetries: s.MinRetries, Window: window,
		FirstAttempts: firsts, Retries: retries, Allowed: w.limit.allowed(firsts)}
}

// retryStage is the retry budgets of a bulkhead that has any: the
// bulkhead's own window, nil for none, and each class's, by class handle,
// nil for a class without one. They share one clock: origin is bucket 0's
// start, width a bucket's span, and cur the bucket of the latest time the
// windows were moved to.
type retryStage struct {
	window time.Duration
	width  time.Duration
	origin time.Time
	cur    int64
	bulk   *retryWindow
	class  []*retryWindow
}

// newRetryStage returns the retry budgets of cfg, nil for none, for the
// class table tab, counted from origin.
func newRetryStage(cfg *admission.RetryConfig, tab *classes.Table, origin time.Time) (*retryStage, error) {
	if cfg == nil {
		return nil, nil
	}
	rs := &retryStage{window: cfg.Window, width: max(cfg.Window/retryBuckets, 1), origin: origin}
	if l := cfg.Bulkhead; l != nil {
		rs.bulk = &retryWindow{limit: newRetryLimit(*l)}
	}
	for name, l := range cfg.PerClass {
		if tab == nil {
			return nil, admission.Invalidf("Config.RetryBudgets.PerClass", "needs admission classes (Config.Classes)")
		}
		c, err := tab.Lookup(name)
		if err != nil || name == "" {
			return nil, admission.Invalidf("Config.RetryBudgets.PerClass", "names class %q, which is not in Config.Classes", name)
		}
		if rs.class == nil {
			rs.class = make([]*retryWindow, tab.Len()+1)
		}
		rs.class[c] = &retryWindow{limit: newRetryLimit(l)}
	}
	return rs, nil
}

func newRetryLimit(l admission.RetryLimit) retryLimit {
	return retryLimit{ppm: l.PPM, floor: int64(l.MinRetries), spec: l}
}

// windows calls f with each window that counts the admissions of class c,
// the bulkhead's, then c's (class set), until f returns false.
func (rs *retryStage) windows(c classes.Class, f func(w *retryWindow, class bool) bool) {
	if rs.bulk != nil && !f(rs.bulk, false) {
		return
	}
	if int(c) < len(rs.class) && rs.class[c] != nil {
		f(rs.class[c], true)
	}
}

// advance moves the windows on to now: the buckets they leave behind are
// emptied. A time before the latest one (a clock set back) counts in the
// latest bucket.
func (rs *retryStage) advance(now time.Time) {
	k := int64(max(0, now.Sub(rs.origin)) / rs.width)
	if k <= rs.cur {
		return
	}
	steps := k - rs.cur
	if rs.bulk != nil {
		rs.bulk.clear(rs.cur, steps)
	}
	for _, w := range rs.class {
		if w != nil {
			w.clear(rs.cur, steps)
		}
	}
	rs.cur = k
}

// over returns the detail of the first budget a retry of class c has no
// room in now (the bulkhead's, then its class's), nil when it has room in
// all of them. tab names the class for the detail.
func (rs *retryStage) over(c classes.Class, now time.Time, tab *classes.Table) *admission.RetryBudgetDetail {
	rs.advance(now)
	var d *admission.RetryBudgetDetail
	rs.windows(c, func(w *retryWindow, class bool) bool {
		st := w.stats(rs.window)
		if st.Retries < st.Allowed {
			return true
		}
		d = &admission.RetryBudgetDetail{RetryBudgetStats: st}
		if class {
			d.Class = tab.Name(c)
		}
		return false
	})
	return d
}

// count counts an admission of class c granted now, a retry or a first
// attempt, in its windows, and returns its bucket (for take).
func (rs *retryStage) count(c classes.Class, retry bool, now time.Time) int64 {
	rs.advance(now)
	rs.windows(c, func(w *retryWindow, _ bool) bool {
		w.add(rs.cur, retry, 1)
		return true
	})
	return rs.cur
}

// take takes back an admission of class c counted in bucket k (an
// admission rolled back), unless the windows have left that bucket behind.
func (rs *retryStage) take(c classes.Class, retry bool, k int64) {
	if k <= rs.cur-retryBuckets {
		return
	}
	rs.windows(c, func(w *retryWindow, _ bool) bool {
		w.add(k, retry, -1)
		return true
	})
}

// stats is the budgets' use now: the bulkhead's, and each class's by
// class handle - 1 (nil for a class without one).
func (rs *retryStage) stats(now time.Time, n int) (*admission.RetryBudgetStats, []*admission.RetryBudgetStats) {
	rs.advance(now)
	var bulk *admission.RetryBudgetStats
	if rs.bulk != nil {
		st := rs.bulk.stats(rs.window)
		bulk = &st
	}
	var per []*admission.RetryBudgetStats
	if rs.class != nil {
		per = make([]*admission.RetryBudgetStats, n)
		for c := 1; c < len(rs.class); c++ {
			if w := rs.class[c]; w != nil {
				st := w.stats(rs.window)
				per[c-1] = &st
			}
		}
	}
	return bulk, per
}

// checkRetry turns r away RetryBudget, and reports whether it did, when r
// is a retry that a budget has no room for now.
func (s *state) checkRetry(r *AcquireRequest) bool {
	if !r.Retry || s.retry == nil {
		return false
	}
	d := s.retry.over(r.Class, s.fx.now(), s.tab)
	if d == nil {
		return false
	}
	s.rejectStage(r, admission.RetryBudget, s.retryVerdict(d), nil)
	return true
}

// retryVerdict is the verdict of budget d refusing a retry: with classes,
// the constraint names the bulkhead's budget (global) or the class's.
func (s *state) retryVerdict(d *admission.RetryBudgetDetail) *admission.External {
	ext := &admission.External{Retry: d}
	if s.tab != nil {
		ext.Constraint = admission.ConstraintGlobal
		if d.Class != "" {
			ext.Constraint = admission.ConstraintClass
		}
	}
	return ext
}

// countRetry counts admission l, granted now for r, in the retry budgets'
// windows.
func (s *state) countRetry(l *Lease, r *AcquireRequest) {
	l.retry = r.Retry
	if s.retry != nil {
		l.retryBucket = s.retry.count(r.Class, r.Retry, s.fx.now())
	}
}

// uncountRetry takes provisional admission l, rolled back, out of the
// retry budgets' windows.
func (s *state) uncountRetry(l *Lease) {
	if s.retry != nil {
		s.retry.take(l.classID, l.retry, l.retryBucket)
	}
}
