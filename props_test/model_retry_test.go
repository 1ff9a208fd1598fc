package props_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// Retries in the model (issue 31, SPEC X5): in half the runs that are not
// paced, calls carry attempt numbers (WithAttempt), and in the queue a
// first attempt goes ahead of the retries of its line (the plain queue, or
// its class and priority in the fair queue) until they have waited the
// aging; in two thirds of those, retry budgets apply: the bulkhead's, its
// classes', or both. The model counts every admission in buckets of a
// tenth of the window, as the engine must, and predicts each retry
// admitted or refused RetryBudget, as it arrives and again as it is granted
// a slot after waiting, with the budget's numbers in the detail, and
// Stats.Retries. A RetryClock step moves the clock by up to three windows
// so that they slide.

// retryModel is the retries' part of the machine.
type retryModel struct {
	on bool
	// aging is the engine's: how long a retry waits behind first attempts
	// that came after it; negative, retries are not set apart.
	aging time.Duration
	// budgets is the retry budgets, nil for none; window their window
	// (the default applied), origin the clock when the bulkhead started.
	budgets *bulkhead.RetryBudgets
	window  time.Duration
	origin  time.Time
	// counted is every admission counted in the windows.
	counted []counted
	// admitted counts the retries admitted.
	admitted int64
}

// counted is an admission the windows count.
type counted struct {
	at    time.Time
	class string
	retry bool
}

// The ratios drawn: each a whole number of millionths, so the model's
// integer share is the engine's.
var retryRatios = []struct {
	ratio float64
	ppm   int64
}{{0, 0}, {0.1, 100_000}, {0.25, 250_000}, {0.5, 500_000}, {1, 1_000_000}}

// drawRetries draws whether calls carry attempt numbers, the queue's
// aging and the retry budgets.
func (m *machine) drawRetries(t *rapid.T, cfg *bulkhead.Config) {
	r := &m.retry
	r.aging = -1
	if m.paced() || !rapid.Bool().Draw(t, "retries") {
		return
	}
	r.on = true
	switch k := rapid.IntRange(0, 7).Draw(t, "retryAgingKind"); k {
	case 0:
		cfg.Queue.RetryAging, r.aging = 0, bulkhead.DefaultRetryAging
	case 1:
		cfg.Queue.RetryAging, r.aging = -time.Second, -1
	default:
		cfg.Queue.RetryAging = time.Duration(k-1) * unit / 2
		r.aging = cfg.Queue.RetryAging
	}
	if rapid.IntRange(0, 2).Draw(t, "retryBudgets") == 0 {
		m.seen[fmt.Sprintf("retries aging=%v budgets=none", r.aging)]++
		return
	}
	b := &bulkhead.RetryBudgets{Window: time.Duration(rapid.IntRange(0, 2).Draw(t, "retryWindowS")) * time.Second}
	r.window = b.Window
	if r.window == 0 {
		r.window = bulkhead.DefaultRetryWindow
	}
	limit := func(name string) bulkhead.RetryLimit {
		return bulkhead.RetryLimit{Ratio: retryRatios[rapid.IntRange(0, len(retryRatios)-1).Draw(t, name+"Ratio")].ratio,
			MinRetries: rapid.IntRange(0, 2).Draw(t, name+"MinRetries")}
	}
	if !m.hasClasses || rapid.Bool().Draw(t, "bulkheadRetryBudget") {
		b.Bulkhead = limit("bulkhead")
	}
	for _, name := range m.names {
		if rapid.Bool().Draw(t, "classRetryBudget") {
			if b.PerClass == nil {
				b.PerClass = map[string]bulkhead.RetryLimit{}
			}
			b.PerClass[name] = limit("class")
		}
	}
	set := b.Bulkhead != (bulkhead.RetryLimit{})
	for _, l := range b.PerClass {
		set = set || l != (bulkhead.RetryLimit{})
	}
	if !set {
		b.Bulkhead.MinRetries = 1 // a budget that sets nothing is invalid
	}
	cfg.RetryBudgets, r.budgets = b, b
	r.origin = m.clk.Now()
	m.seen[fmt.Sprintf("retries aging=%v budgets bulkhead=%v classes=%d", r.aging, b.Bulkhead != (bulkhead.RetryLimit{}), len(b.PerClass))]++
}

// drawAttempt draws a call's attempt number, and its option.
func (m *machine) drawAttempt(t *rapid.T, c *call) {
	if !m.retry.on {
		return
	}
	switch rapid.IntRange(0, 3).Draw(t, "attemptKind") {
	case 0:
		return
	case 1:
		c.opts = append(c.opts, bulkhead.WithAttempt(0))
	default:
		c.attempt = rapid.IntRange(1, 2).Draw(t, "attempt")
		c.opts = append(c.opts, bulkhead.WithAttempt(c.attempt))
	}
}

// ppm is a drawn ratio in millionths.
func ppm(ratio float64) int64 {
	for _, r := range retryRatios {
		if r.ratio == ratio {
			return r.ppm
		}
	}
	panic(fmt.Sprintf("ratio %v was not drawn", ratio))
}

// windowStats is the use now of budget l over the window, counting the
// admissions of class (every class for "").
func (m *machine) windowStats(l bulkhead.RetryLimit, class string) bulkhead.RetryBudgetStats {
	r := &m.retry
	width := r.window / 10
	bucket := func(at time.Time) int64 { return int64(at.Sub(r.origin) / width) }
	cur := bucket(m.clk.Now())
	st := bulkhead.RetryBudgetStats{Ratio: l.Ratio, MinRetries: l.MinRetries, Window: r.window}
	for _, c := range r.counted {
		if bucket(c.at) <= cur-10 || class != "" && c.class != class {
			continue
		}
		if c.retry {
			st.Retries++
		} else {
			st.FirstAttempts++
		}
	}
	st.Allowed = max(int64(l.MinRetries), st.FirstAttempts*ppm(l.Ratio)/1_000_000)
	st.Available = max(0, st.Allowed-st.Retries)
	return st
}

// retryOver returns the detail of the budget a retry of class has no room
// in now (the bulkhead's, then its class's), nil when it has room.
func (m *machine) retryOver(class string) *bulkhead.RetryBudgetDetail {
	b := m.retry.budgets
	if b == nil {
		return nil
	}
	check := func(l bulkhead.RetryLimit, of, name string) *bulkhead.RetryBudgetDetail {
		st := m.windowStats(l, of)
		if st.Retries < st.Allowed {
			return nil
		}
		st.Available = 0
		return &bulkhead.RetryBudgetDetail{Class: name, RetryBudgetStats: st}
	}
	if b.Bulkhead != (bulkhead.RetryLimit{}) {
		if d := check(b.Bulkhead, "", ""); d != nil {
			return d
		}
	}
	if l, ok := b.PerClass[class]; ok && l != (bulkhead.RetryLimit{}) {
		return check(l, class, class)
	}
	return nil
}

// retryConstraint is the constraint of a refusal by budget d: with
// classes, the bulkhead's (global) or the class's.
func (m *machine) retryConstraint(d *bulkhead.RetryBudgetDetail) bulkhead.Constraint {
	switch {
	case !m.hasClasses:
		return ""
	case d.Class != "":
		return bulkhead.ConstraintClass
	}
	return bulkhead.ConstraintGlobal
}

// countAdmission counts w's admission, granted now.
func (m *machine) countAdmission(w *waiter) {
	r := &m.retry
	if w.attempt > 0 {
		r.admitted++
		m.cls[w.class].st.Retries.Admitted++
		m.seen["retry admitted"]++
	}
	if r.budgets != nil {
		r.counted = append(r.counted, counted{at: m.clk.Now(), class: w.class, retry: w.attempt > 0})
	}
}

// retryStats is the model's Stats.Retries, and class's.
func (m *machine) retryStats(class string) bulkhead.RetryStats {
	b := m.retry.budgets
	if class == "" {
		st := bulkhead.RetryStats{Admitted: m.retry.admitted}
		if b != nil && b.Bulkhead != (bulkhead.RetryLimit{}) {
			ws := m.windowStats(b.Bulkhead, "")
			st.Budget = &ws
		}
		return st
	}
	st := bulkhead.RetryStats{Admitted: m.cls[class].st.Retries.Admitted}
	if b == nil {
		return st
	}
	if l, ok := b.PerClass[class]; ok && l != (bulkhead.RetryLimit{}) {
		ws := m.windowStats(l, class)
		st.Budget = &ws
	}
	return st
}

// apart reports whether w, waiting, goes behind the first attempts of its
// line: a retry set apart that has not waited the aging yet.
func (m *machine) apart(w *waiter) bool {
	a := m.retry.aging
	return w.attempt > 0 && a >= 0 && m.clk.Now().Sub(w.enqueued) < a
}

// lineOrder is ws, the waiters of one line in arrival order, in the order
// the engine serves them: first attempts and the retries that have waited
// the aging, in arrival order, then the other retries.
func (m *machine) lineOrder(ws []*waiter) []*waiter {
	out := slices.Clone(ws)
	slices.SortStableFunc(out, func(a, b *waiter) int {
		switch aa, ab := m.apart(a), m.apart(b); {
		case aa == ab:
			return 0
		case aa:
			return 1
		}
		return -1
	})
	return out
}

// retryClock moves the clock on by up to three budget windows, so that
// they slide, when nothing else waits for the clock.
func (m *machine) retryClock(t *rapid.T) {
	if m.retry.budgets == nil {
		t.Skip("no retry budget")
	}
	for _, h := range m.holds {
		if h.deadlineLive() {
			t.Skip("a borrowed-slot deadline runs")
		}
	}
	for _, w := range m.queue {
		if !w.expires.IsZero() {
			t.Skip("a queue timeout runs")
		}
	}
	if len(m.liveFollowers()) > 0 || m.holdPending || m.fleet != nil || m.rate != nil || m.cooling {
		t.Skip("another timer may fire")
	}
	d := time.Duration(rapid.Int64Range(1, 30*int64(m.retry.window/(100*time.Millisecond))).Draw(t, "retryClockTenths")) * m.retry.window / 100
	m.descr = fmt.Sprintf("RetryClock %v", d)
	m.tokensFrozen = true
	m.waitTimers(t)
	m.clk.Add(d)
	m.seen["retry clock"]++
}

// armAging is the engine's hold timer armed at the end of a pump that
// leaves waiters with a slot free, for the moment the first retry set
// apart that has not waited the aging yet will have: the queue is served
// again then, in the order that makes.
func (m *machine) armAging() {
	if m.retry.aging < 0 || len(m.queue) == 0 || m.inFlight >= m.limits.MaxConcurrent {
		return
	}
	var at time.Time
	for _, w := range m.queue {
		if m.apart(w) {
			if a := w.enqueued.Add(m.retry.aging); at.IsZero() || a.Before(at) {
				at = a
			}
		}
	}
	if !at.IsZero() {
		m.armHoldAt(at)
		m.seen["aging timer"]++
	}
}

// noteOrder counts, for the runs' coverage, what the order of the waiter
// at index i of the queue, served next, owes to retries: a first attempt
// that goes ahead of a retry of its class that came before it, and a
// retry that goes in arrival order once it has waited the aging.
func (m *machine) noteOrder(i int) {
	w := m.queue[i]
	for _, x := range m.queue[:i] {
		if x.class == w.class && x.attempt > 0 && w.attempt == 0 && m.apart(x) {
			m.seen["a first attempt went ahead of a retry"]++
			return
		}
	}
	if w.attempt > 0 && m.retry.aging >= 0 && !m.apart(w) {
		for _, x := range m.queue[i+1:] {
			if x.class == w.class && x.attempt == 0 {
				m.seen["an aged retry went ahead of a first attempt"]++
				return
			}
		}
	}
}

// TestNoRetryWaitsLongerThanItsAging: one slot, a long queue, first
// attempts and retries arriving at random, the clock moving and the slot
// freeing at random. Every call is admitted in the order the rule says
// (at each release: the first attempts and the retries that have waited
// the aging, in arrival order, then the other retries), and no retry waits
// for ever: once it has waited the aging, at most the calls that were
// waiting ahead of it when it came are admitted before it.
func TestNoRetryWaitsLongerThanItsAging(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := clock.NewMock()
		aging := time.Duration(rapid.IntRange(1, 10).Draw(t, "agingUnits")) * unit
		b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1, MaxQueue: 1000, Clock: clk,
			Queue: bulkhead.QueuePolicy{RetryAging: aging}})
		if err != nil {
			t.Fatal(err)
		}
		type agingCall struct {
			n        int
			retry    bool
			fut      *bulkhead.AcquireFuture
			queuedAt time.Time
			ahead    int // calls waiting when it came
			admitted int // admissions before its own, from the time it had waited the aging
		}
		var (
			waiting []*agingCall
			holder  *bulkhead.Permit
			n       int
		)
		t.Cleanup(func() {
			b.Close()
			for _, c := range waiting {
				if p, err := c.fut.Result(); err == nil {
					_ = p.Release(nil)
				}
			}
			if holder != nil {
				_ = holder.Release(nil)
			}
			ctx, cancel := context.WithTimeout(context.Background(), settle)
			defer cancel()
			_, _ = b.Drain(ctx)
		})
		req := newRequest()
		// admitted waits for the one call the release (or arrival) let in.
		admitted := func() *bulkhead.Permit {
			var got *bulkhead.Permit
			err := spinUntil("an admission", func() (bool, error) {
				for i, c := range waiting {
					select {
					case <-c.fut.Done():
					default:
						continue
					}
					p, err := c.fut.Result()
					if err != nil {
						return false, err
					}
					// The rule's choice among the waiters, at this time.
					want := -1
					for j, w := range waiting {
						if !w.retry || clk.Now().Sub(w.queuedAt) >= aging {
							want = j
							break
						}
					}
					if want < 0 {
						want = 0
					}
					if i != want {
						return false, fmt.Errorf("admitted call %d, want call %d (waiting %d)", c.n, waiting[want].n, len(waiting))
					}
					for _, w := range waiting {
						if w != c && w.retry && clk.Now().Sub(w.queuedAt) >= aging {
							w.admitted++
							if w.admitted > w.ahead {
								return false, fmt.Errorf("retry %d, waiting %v with %d calls ahead when it came, let %d calls go first since it aged",
									w.n, clk.Now().Sub(w.queuedAt), w.ahead, w.admitted)
							}
						}
					}
					waiting = slices.Delete(waiting, i, i+1)
					got = p
					return true, nil
				}
				return false, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		arrive := func(retry bool) {
			n++
			attempt := 0
			if retry {
				attempt = 1
			}
			c := &agingCall{n: n, retry: retry, queuedAt: clk.Now(), ahead: len(waiting)}
			c.fut = b.AcquireAsync(context.Background(), req, bulkhead.WithAttempt(attempt))
			waiting = append(waiting, c)
			if holder == nil {
				holder = admitted()
				return
			}
			if err := spinUntil("the call to queue", func() (bool, error) { return b.Stats().Gate.Pending == len(waiting), nil }); err != nil {
				t.Fatal(err)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"first": func(*rapid.T) { arrive(false) },
			"retry": func(*rapid.T) { arrive(true) },
			"tick": func(t *rapid.T) {
				clk.Add(time.Duration(rapid.IntRange(1, 30).Draw(t, "tickMs")) * time.Millisecond)
			},
			"release": func(*rapid.T) {
				if holder == nil {
					t.Skip("nothing admitted")
				}
				_ = holder.Release(nil)
				holder = nil
				if len(waiting) > 0 {
					holder = admitted()
				}
			},
			"": func(*rapid.T) {},
		})
		// The slot goes on freeing, with time passing: every retry is
		// admitted.
		for holder != nil {
			clk.Add(unit)
			_ = holder.Release(nil)
			holder = nil
			if len(waiting) > 0 {
				holder = admitted()
			}
		}
	})
}
