package props_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// TestEngineModel drives the public engine with random sequences of calls
// and checks it, after every step, against a simple model of the SPEC and
// against the invariants of SPEC section I (I1-I5, I8, I11), then at the end
// of each sequence against the events it emitted.
//
// Everything that blocks (a queued Acquire) runs on its own goroutine and is
// tracked by a waiter id; every step waits until the outcomes it causes have
// arrived, so the model always knows the exact state. Time is a mock clock.
func TestEngineModel(t *testing.T) {
	seen := map[string]int{}
	defer func() { t.Logf("outcomes seen: %v", seen) }()
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		m.seen = seen
		// Keys are weights: rapid picks one of them. Close is rare and late
		// so that most of a run happens open, and what follows a Close is
		// still exercised in many runs.
		t.Repeat(map[string]func(*rapid.T){
			"Acquire1":       m.acquire,
			"Acquire2":       m.acquire,
			"Acquire3":       m.acquire,
			"Acquire4":       m.acquire,
			"Acquire5":       m.acquire,
			"AcquireInvalid": m.acquireInvalid,
			"Release1":       m.release,
			"Release2":       m.release,
			"Release3":       m.release,
			"Release4":       m.release,
			"Cancel1":        m.cancel,
			"Cancel2":        m.cancel,
			"AdvanceClock1":  m.advance,
			"AdvanceClock2":  m.advance,
			"ApplyLimits1":   m.applyLimits,
			"ApplyLimits2":   m.applyLimits,
			"SetBudget":      m.setBudget,
			"WouldAdmit":     m.wouldAdmit,
			"DrainDoneCtx":   m.drainDoneCtx,
			"Close":          m.closeLate,
			"":               m.check,
		})
		m.finish(t)
	})
}

// noReason is the zero Reason: admitted. (The root package does not
// re-export admission.NoReason.)
const noReason bulkhead.Reason = 0

// unit is the granularity of queue timeouts and clock advances.
const unit = 10 * time.Millisecond

// settle bounds every wait for an outcome the model expects. It is generous:
// a correct engine answers in microseconds.
const settle = 10 * time.Second

type outcome struct {
	tok *bulkhead.Permit
	err error
}

// waiter is one Acquire running on its own goroutine.
type waiter struct {
	id       int
	prio     bulkhead.Priority
	res      bulkhead.Reservation // Reserved is 0 without a budget
	enqueued time.Time
	deadline time.Time // zero: no queue timeout
	cancel   context.CancelFunc
	ch       chan outcome
}

// hold is one admission the model knows of.
type hold struct {
	tok      *bulkhead.Permit
	id       bulkhead.ID
	prio     bulkhead.Priority
	res      bulkhead.Reservation
	rev      int64
	released bool
}

// rejectKey is what the model predicts of a reject event.
type rejectKey struct {
	reason bulkhead.Reason
	rev    int64
	prio   bulkhead.Priority
	// wait is the exact queue wait, or -1 for a queue timeout (whose wait
	// depends on when the timer's message is handled).
	wait time.Duration
}

// eventLog records what listeners saw, on the events goroutine.
type eventLog struct {
	mu        sync.Mutex
	admits    []bulkhead.AdmitEvent
	rejects   []bulkhead.RejectEvent
	releases  []bulkhead.ReleaseEvent
	reconfigs []bulkhead.ReconfigureEvent
}

func (l *eventLog) hooks() bulkhead.Hooks {
	return bulkhead.Hooks{
		Admit: func(e bulkhead.AdmitEvent) {
			l.mu.Lock()
			l.admits = append(l.admits, e)
			l.mu.Unlock()
		},
		Reject: func(e bulkhead.RejectEvent) {
			l.mu.Lock()
			l.rejects = append(l.rejects, e)
			l.mu.Unlock()
		},
		Release: func(e bulkhead.ReleaseEvent) {
			l.mu.Lock()
			l.releases = append(l.releases, e)
			l.mu.Unlock()
		},
		Reconfigure: func(e bulkhead.ReconfigureEvent) {
			l.mu.Lock()
			l.reconfigs = append(l.reconfigs, e)
			l.mu.Unlock()
		},
	}
}

type machine struct {
	b          *bulkhead.Bulkhead
	clk        *clock.Mock
	hasBudget  bool
	exactUsage bool          // every release reports usage <= its reservation
	cfgTimeout time.Duration // Config.QueueTimeout
	maxTok     int64         // bound of drawn reservations

	// The model.
	limits   bulkhead.Limits
	closed   bool
	queue    []*waiter // in arrival order
	holds    []*hold   // every admission, released or not
	inFlight int
	nextID   int

	gate   bulkhead.GateStats // counters only; gauges come from the model
	calls  bulkhead.CallStats
	ledger struct {
		inFlight, reserved, consumed, refunded int64
		releasedReserved                       int64 // sum of holds at release
	}

	// What the events must show.
	ev         *eventLog
	admitOrder []bulkhead.ID
	admitWait  map[bulkhead.ID]time.Duration
	rejects    map[rejectKey]int
	releases   map[bulkhead.ID]bulkhead.ReleaseEvent
	reconfigs  []bulkhead.ReconfigureEvent

	// Per step.
	prev         bulkhead.Stats
	stepAdmits   []*hold // admissions of this step, in order
	stepEnqueued bool
	tokensFrozen bool // the step may not change any token counter (I4)
	stepDescr    string
	finished     bool
	steps        int

	// seen counts what the runs exercised, to show the test reaches the
	// interesting cases.
	seen map[string]int
}

func newMachine(t *rapid.T) *machine {
	m := &machine{
		clk:       clock.NewMock(),
		admitWait: map[bulkhead.ID]time.Duration{},
		rejects:   map[rejectKey]int{},
		releases:  map[bulkhead.ID]bulkhead.ReleaseEvent{},
		ev:        &eventLog{},
	}
	m.gate.RejectedByReason = map[bulkhead.Reason]int64{}
	m.calls.RejectedByReason = map[bulkhead.Reason]int64{}
	cfg := bulkhead.Config{
		Model:           "gpt-4o",
		MaxConcurrent:   rapid.IntRange(1, 4).Draw(t, "MaxConcurrent"),
		MaxQueue:        rapid.IntRange(0, 4).Draw(t, "MaxQueue"),
		QueueTimeout:    time.Duration(rapid.IntRange(0, 3).Draw(t, "QueueTimeoutUnits")) * unit,
		InitialRevision: int64(rapid.IntRange(0, 3).Draw(t, "InitialRevision")),
		Clock:           m.clk,
	}
	m.cfgTimeout = cfg.QueueTimeout
	m.limits = bulkhead.Limits{Revision: cfg.InitialRevision, MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue}
	m.hasBudget = rapid.IntRange(0, 3).Draw(t, "budgetKind") > 0 // 3 in 4 runs have a budget
	if m.hasBudget {
		budget := int64(0) // 1 in 8 runs: only zero-token calls fit (F7)
		if rapid.IntRange(0, 7).Draw(t, "zeroBudget") > 0 {
			budget = int64(rapid.IntRange(20, 200).Draw(t, "Budget"))
		}
		reserve := int64(rapid.IntRange(0, int(budget)).Draw(t, "HighPriorityReserve"))
		cfg.TokenBudget = &bulkhead.TokenBudget{Budget: budget, HighPriorityReserve: reserve}
		m.limits.TokenBudget = &bulkhead.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
		m.maxTok = budget/6 + 3
	}
	m.exactUsage = rapid.Bool().Draw(t, "exactUsage")
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	m.b = b
	b.Subscribe(m.ev.hooks())
	// On failure, end every waiter and the bulkhead so no goroutine leaks
	// past the failing check (goleak would otherwise hide the real error).
	t.Cleanup(m.cleanup)
	m.prev = normalize(b.Stats())
	return m
}

// cleanup ends whatever a failed run left behind. finish does the same, with
// checks, on success.
func (m *machine) cleanup() {
	if m.finished {
		return
	}
	for _, w := range m.queue {
		w.cancel()
	}
	m.b.Close()
	for _, h := range m.holds {
		_ = h.tok.Release(nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	_, _ = m.b.Drain(ctx)
	for _, w := range m.queue {
		select {
		case o := <-w.ch:
			if o.tok != nil {
				_ = o.tok.Release(nil)
			}
		case <-ctx.Done():
		}
	}
	_, _ = m.b.Drain(ctx)
}

// ---- Model helpers ----

func (m *machine) effective(p bulkhead.Priority) int64 {
	b := m.limits.TokenBudget
	if p == bulkhead.High {
		return b.Budget
	}
	return max(0, b.Budget-b.HighPriorityReserve)
}

func (m *machine) fits(p bulkhead.Priority, reserved int64) bool {
	return !m.hasBudget || m.ledger.inFlight+reserved <= m.effective(p)
}

// gateReject counts a rejection decided at the gate (it also counts at the
// admission layer).
func (m *machine) gateReject(why bulkhead.Reason) {
	m.gate.Rejected++
	m.gate.RejectedByReason[why]++
	switch why {
	case bulkhead.Aborted:
		m.gate.Aborted++
	case bulkhead.Timeout:
		m.gate.TimedOut++
	}
	m.callReject(why)
}

func (m *machine) callReject(why bulkhead.Reason) {
	m.calls.Rejected++
	m.calls.RejectedByReason[why]++
}

func (m *machine) rejectEvent(why bulkhead.Reason, p bulkhead.Priority, wait time.Duration) {
	m.rejects[rejectKey{why, m.limits.Revision, p, wait}]++
}

// admit records the admission of w, whose slot is already granted, and
// returns the expected hold (its token arrives later).
func (m *machine) admit(w *waiter) *hold {
	m.inFlight++
	m.calls.Admitted++
	if m.hasBudget {
		m.ledger.inFlight += w.res.Reserved
		m.ledger.reserved += w.res.Reserved
	}
	h := &hold{prio: w.prio, res: w.res, rev: m.limits.Revision}
	m.stepAdmits = append(m.stepAdmits, h)
	return h
}

// expect is an outcome the model predicts for a waiter.
type expect struct {
	w      *waiter
	reason bulkhead.Reason // NoReason: admitted
	h      *hold
}

// pump is the model of F3: admit queued waiters in FIFO order while slots
// are free, postchecking the budget with the slot held (F4 step 4).
func (m *machine) pump() []expect {
	var out []expect
	for len(m.queue) > 0 && m.inFlight < m.limits.MaxConcurrent {
		w := m.queue[0]
		m.queue = m.queue[1:]
		m.gate.Admitted++
		if !m.fits(w.prio, w.res.Reserved) {
			m.gate.Released++
			m.callReject(bulkhead.BudgetLimit)
			m.rejectEvent(bulkhead.BudgetLimit, w.prio, m.clk.Now().Sub(w.enqueued))
			out = append(out, expect{w: w, reason: bulkhead.BudgetLimit})
			continue
		}
		out = append(out, expect{w: w, h: m.admit(w)})
	}
	return out
}

// removeWaiter drops w from the model's queue.
func (m *machine) removeWaiter(w *waiter) {
	m.queue = slices.DeleteFunc(m.queue, func(x *waiter) bool { return x == w })
}

// await waits for w's outcome and checks it against e.
func (m *machine) await(t *rapid.T, e expect) {
	t.Helper()
	var o outcome
	select {
	case o = <-e.w.ch:
	case <-time.After(settle):
		t.Fatalf("waiter %d: no outcome within %v, want %v (%s)", e.w.id, settle, reasonName(e.reason), m.stepDescr)
	}
	if !e.w.enqueued.IsZero() {
		m.seen["queued->"+reasonName(e.reason)]++
	}
	if e.reason == noReason {
		if o.err != nil || o.tok == nil {
			t.Fatalf("waiter %d: got %v, want admission (%s)", e.w.id, o.err, m.stepDescr)
		}
		m.adopt(t, e.h, o.tok, e.w)
		return
	}
	if o.tok != nil {
		_ = o.tok.Release(nil)
		t.Fatalf("waiter %d was admitted (revision %d), want %v (%s)", e.w.id, o.tok.LimitRevision(), e.reason, m.stepDescr)
	}
	rej := wantReason(t, o.err, e.reason)
	if rej.Detail == nil || rej.Detail.LimitRevision != m.limits.Revision {
		t.Fatalf("waiter %d: rejection detail %+v, want revision %d", e.w.id, rej.Detail, m.limits.Revision)
	}
	if e.reason == bulkhead.Aborted && !errors.Is(o.err, context.Canceled) {
		t.Fatalf("waiter %d: aborted error %v does not match context.Canceled", e.w.id, o.err)
	}
}

// adopt checks an admitted token against the model's hold and records it.
func (m *machine) adopt(t *rapid.T, h *hold, tok *bulkhead.Permit, w *waiter) {
	t.Helper()
	h.tok, h.id = tok, tok.ID()
	if tok.LimitRevision() != h.rev {
		t.Fatalf("waiter %d admitted under revision %d, want %d (I8, F25)", w.id, tok.LimitRevision(), h.rev)
	}
	if tok.Priority() != h.prio || tok.Class() != "" || tok.Resources() != (bulkhead.Resources{}) {
		t.Fatalf("token fields: priority %v class %q resources %+v", tok.Priority(), tok.Class(), tok.Resources())
	}
	got := tok.Reservation()
	if m.hasBudget != (got != nil) || (got != nil && *got != h.res) {
		t.Fatalf("token reservation %+v, want %+v (budget %v)", got, h.res, m.hasBudget)
	}
	if h.id.String() == "" {
		t.Fatal("zero admission ID")
	}
	for _, o := range m.holds {
		if o.id == h.id {
			t.Fatalf("admission ID %s minted twice", h.id)
		}
	}
	m.holds = append(m.holds, h)
	m.admitOrder = append(m.admitOrder, h.id)
	wait := time.Duration(0)
	if !w.enqueued.IsZero() {
		wait = m.clk.Now().Sub(w.enqueued)
	}
	m.admitWait[h.id] = wait
}

// awaitAll waits for every predicted outcome, then checks that no other
// waiter has ended.
func (m *machine) awaitAll(t *rapid.T, es []expect) {
	t.Helper()
	for _, e := range es {
		m.await(t, e)
	}
	m.noStrayOutcome(t)
}

func (m *machine) noStrayOutcome(t *rapid.T) {
	t.Helper()
	for _, w := range m.queue {
		select {
		case o := <-w.ch:
			if o.tok != nil {
				_ = o.tok.Release(nil)
			}
			t.Fatalf("waiter %d ended while the model has it queued: tok=%v err=%v (%s)", w.id, o.tok != nil, o.err, m.stepDescr)
		default:
		}
	}
}

// waitQueued waits until the engine's queue holds n waiters, failing at once
// if w ends instead.
func (m *machine) waitQueued(t *rapid.T, w *waiter, n int) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for m.b.Stats().Gate.Pending != n {
		select {
		case o := <-w.ch:
			if o.tok != nil {
				_ = o.tok.Release(nil)
			}
			t.Fatalf("waiter %d ended (tok=%v err=%v), want it queued (%s)", w.id, o.tok != nil, o.err, m.stepDescr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter %d never reached the queue (pending %d, want %d)", w.id, m.b.Stats().Gate.Pending, n)
		}
		runtime.Gosched()
	}
}

// ---- Actions ----

func (m *machine) drawPriority(t *rapid.T) bulkhead.Priority {
	if rapid.Bool().Draw(t, "high") {
		return bulkhead.High
	}
	return bulkhead.Normal
}

// drawRequest draws a request and its options (priority and reservation)
// and returns the reservation admission will take.
func (m *machine) drawRequest(t *rapid.T) (*bulkhead.Request, []bulkhead.Option, bulkhead.Priority, bulkhead.Reservation) {
	prio := m.drawPriority(t)
	req := &bulkhead.Request{
		Messages:  []bulkhead.Message{{Role: "user", Content: "hello"}},
		MaxTokens: int64(rapid.IntRange(1, 40).Draw(t, "MaxTokens")),
	}
	var opts []bulkhead.Option
	if prio == bulkhead.High || rapid.Bool().Draw(t, "explicitNormal") {
		opts = append(opts, bulkhead.WithPriority(prio))
	}
	var res bulkhead.Reservation
	if !m.hasBudget {
		return req, opts, prio, res
	}
	if rapid.IntRange(0, 4).Draw(t, "estimator") == 0 {
		est, err := m.b.Estimate(req)
		if err != nil || est == nil {
			t.Fatalf("Estimate: %+v, %v", est, err)
		}
		return req, opts, prio, *est
	}
	in := rapid.Int64Range(0, m.maxTok).Draw(t, "Input")
	out := rapid.Int64Range(0, m.maxTok).Draw(t, "MaxOutput")
	o := bulkhead.Reservation{Input: in, MaxOutput: out}
	if rapid.Bool().Draw(t, "withReserved") {
		o.Reserved = in + out
	}
	opts = append(opts, bulkhead.WithReservation(o))
	return req, opts, prio, bulkhead.Reservation{Input: in, MaxOutput: out, Reserved: in + out}
}

func (m *machine) acquire(t *rapid.T) {
	m.seen["action:acquire"]++
	req, opts, prio, res := m.drawRequest(t)
	timeout := m.cfgTimeout
	switch k := rapid.IntRange(-1, 3).Draw(t, "callTimeoutUnits"); {
	case k >= 0:
		timeout = time.Duration(k) * unit
		opts = append(opts, bulkhead.WithQueueTimeout(timeout))
	}
	ctxDone := rapid.IntRange(0, 9).Draw(t, "ctxDone") == 0
	m.nextID++
	w := &waiter{id: m.nextID, prio: prio, res: res, ch: make(chan outcome, 1)}
	m.stepDescr = fmt.Sprintf("Acquire #%d prio=%v reserved=%d timeout=%v ctxDone=%v", w.id, prio, res.Reserved, timeout, ctxDone)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	if ctxDone {
		cancel()
	}
	before := m.snapshotDetail(prio, res.Reserved)
	go func() {
		tok, err := m.b.Acquire(ctx, req, opts...)
		w.ch <- outcome{tok, err}
	}()

	// The decision order of F3/F4 and section D: closed, done context,
	// budget precheck, free slot, gate.
	why := noReason
	switch {
	case m.closed:
		why = bulkhead.Shutdown
	case ctxDone:
		why = bulkhead.Aborted
	case !m.fits(prio, res.Reserved):
		why = bulkhead.BudgetLimit
	case m.inFlight < m.limits.MaxConcurrent:
		m.gate.Admitted++
		h := m.admit(w)
		m.seen["acquire->admission"]++
		m.awaitAll(t, []expect{{w: w, h: h}})
		return
	case m.limits.MaxConcurrent == 0 || m.limits.MaxQueue == 0:
		why = bulkhead.ConcurrencyLimit
	case len(m.queue) >= m.limits.MaxQueue:
		why = bulkhead.QueueLimit
	}
	if why != noReason {
		m.seen["acquire->"+reasonName(why)]++
		m.tokensFrozen = true
		if why == bulkhead.BudgetLimit {
			m.callReject(why)
		} else {
			m.gateReject(why)
		}
		m.rejectEvent(why, prio, 0)
		o := m.receive(t, w)
		if o.tok != nil {
			_ = o.tok.Release(nil)
			t.Fatalf("%s: admitted, want %v", m.stepDescr, why)
		}
		rej := wantReason(t, o.err, why)
		// F21: the detail is the capacity snapshot at decision time.
		if rej.Detail == nil || !reflect.DeepEqual(core(*rej.Detail), before) {
			t.Fatalf("%s: detail %s, want %s", m.stepDescr, fmtDetail(rej.Detail), fmtDetail(&before))
		}
		return
	}
	// It waits.
	m.seen["acquire->queued"]++
	w.enqueued = m.clk.Now()
	if timeout > 0 {
		w.deadline = w.enqueued.Add(timeout)
	}
	m.queue = append(m.queue, w)
	m.stepEnqueued = true
	m.tokensFrozen = true
	m.waitQueued(t, w, len(m.queue))
	m.noStrayOutcome(t)
}

// receive waits for a waiter's outcome.
func (m *machine) receive(t *rapid.T, w *waiter) outcome {
	t.Helper()
	select {
	case o := <-w.ch:
		return o
	case <-time.After(settle):
		t.Fatalf("%s: no outcome within %v", m.stepDescr, settle)
	}
	return outcome{}
}

// snapshotDetail is the RejectDetail the engine should report now.
func (m *machine) snapshotDetail(p bulkhead.Priority, reserved int64) bulkhead.RejectDetail {
	d := bulkhead.RejectDetail{
		LimitRevision: m.limits.Revision,
		InFlight:      m.inFlight,
		MaxConcurrent: m.limits.MaxConcurrent,
		Pending:       len(m.queue),
		MaxQueue:      m.limits.MaxQueue,
	}
	if m.hasBudget {
		eff := m.effective(p)
		d.TokenBudget = &bulkhead.BudgetDetail{
			Budget:          m.limits.TokenBudget.Budget,
			InFlightTokens:  m.ledger.inFlight,
			EffectiveBudget: eff,
			Available:       max(0, eff-m.ledger.inFlight),
			Requested:       reserved,
		}
	}
	return d
}

// core keeps the fields of a RejectDetail that the model predicts: those of
// a bulkhead without classes.
func core(d bulkhead.RejectDetail) bulkhead.RejectDetail {
	return bulkhead.RejectDetail{
		LimitRevision: d.LimitRevision,
		Constraint:    d.Constraint,
		InFlight:      d.InFlight,
		MaxConcurrent: d.MaxConcurrent,
		Pending:       d.Pending,
		MaxQueue:      d.MaxQueue,
		TokenBudget:   d.TokenBudget,
	}
}

// acquireInvalid makes calls with invalid input: each is a *ConfigError and
// changes nothing (SPEC conventions, F5, F10).
func (m *machine) acquireInvalid(t *rapid.T) {
	ok := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "x"}}}
	cases := []struct {
		name string
		req  *bulkhead.Request
		opts []bulkhead.Option
	}{
		{"nil request", nil, nil},
		{"negative MaxTokens", &bulkhead.Request{MaxTokens: -1}, nil},
		{"negative ExtraInputTokens", &bulkhead.Request{ExtraInputTokens: -1}, nil},
		{"negative queue timeout", ok, []bulkhead.Option{bulkhead.WithQueueTimeout(-unit)}},
		{"WithDetail on Acquire", ok, []bulkhead.Option{bulkhead.WithDetail()}},
		{"unknown priority", ok, []bulkhead.Option{bulkhead.WithPriority(bulkhead.Priority(7))}},
	}
	if m.hasBudget {
		cases = append(cases,
			struct {
				name string
				req  *bulkhead.Request
				opts []bulkhead.Option
			}{"inconsistent reservation", ok, []bulkhead.Option{bulkhead.WithReservation(bulkhead.Reservation{Input: 1, MaxOutput: 1, Reserved: 3})}},
			struct {
				name string
				req  *bulkhead.Request
				opts []bulkhead.Option
			}{"negative reservation", ok, []bulkhead.Option{bulkhead.WithReservation(bulkhead.Reservation{MaxOutput: -1})}},
		)
	}
	c := cases[rapid.IntRange(0, len(cases)-1).Draw(t, "invalidCase")]
	m.stepDescr = "AcquireInvalid " + c.name
	m.tokensFrozen = true
	tok, err := m.b.Acquire(context.Background(), c.req, c.opts...)
	if tok != nil {
		_ = tok.Release(nil)
	}
	var ce *bulkhead.ConfigError
	if tok != nil || !errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || errors.Is(err, bulkhead.ErrRejected) {
		t.Fatalf("%s: Acquire = %v, %v; want a *ConfigError", c.name, tok != nil, err)
	}
}

func (m *machine) release(t *rapid.T) {
	m.seen["action:release"]++
	// Mostly a live admission; one in five a double release.
	var live, dead []*hold
	for _, h := range m.holds {
		if h.released {
			dead = append(dead, h)
		} else {
			live = append(live, h)
		}
	}
	pool := live
	if len(dead) > 0 && (len(live) == 0 || rapid.IntRange(0, 4).Draw(t, "double") == 0) {
		pool = dead
	}
	if len(pool) == 0 {
		t.Skip("nothing to release")
	}
	h := pool[rapid.IntRange(0, len(pool)-1).Draw(t, "hold")]
	var usage *bulkhead.Usage
	invalid := false
	if m.exactUsage {
		total := rapid.Int64Range(0, h.res.Reserved).Draw(t, "usageTotal")
		in := rapid.Int64Range(0, total).Draw(t, "usageInput")
		usage = &bulkhead.Usage{Input: in, Output: total - in}
	} else {
		switch rapid.IntRange(0, 3).Draw(t, "usageKind") {
		case 1, 2:
			usage = &bulkhead.Usage{
				Input:  rapid.Int64Range(0, h.res.Reserved+20).Draw(t, "usageInput"),
				Output: rapid.Int64Range(0, h.res.Reserved+20).Draw(t, "usageOutput"),
			}
		case 3:
			invalid = true
			usage = &bulkhead.Usage{Input: -1, Output: 3}
			if rapid.Bool().Draw(t, "negativeOutput") {
				usage = &bulkhead.Usage{Input: 3, Output: -1}
			}
		}
	}
	m.stepDescr = fmt.Sprintf("Release %s (released=%v) usage=%+v", h.id, h.released, usage)
	err := h.tok.Release(usage)
	if h.released {
		// I2, F5: a later Release is a no-op that returns nil.
		m.gate.DoubleReleases++
		m.tokensFrozen = true
		if err != nil {
			t.Fatalf("%s: double release returned %v", m.stepDescr, err)
		}
		return
	}
	if invalid != (err != nil) || (invalid && !errors.Is(err, bulkhead.ErrInvalid)) {
		t.Fatalf("%s: Release returned %v (invalid usage: %v)", m.stepDescr, err, invalid)
	}
	if invalid {
		usage = nil // invalid usage still releases, without the usage
	}
	h.released = true
	m.inFlight--
	m.gate.Released++
	m.calls.Released++
	ev := bulkhead.ReleaseEvent{
		AdmissionID:    h.id,
		LimitRevision:  h.rev,
		Priority:       h.prio,
		ReservedTokens: h.res.Reserved,
		Usage:          usage,
	}
	if m.hasBudget {
		ev.Held = h.res.Reserved
		if usage != nil {
			m.ledger.consumed += usage.Total()
			ev.Refunded = max(0, h.res.Reserved-usage.Total())
			m.ledger.refunded += ev.Refunded
		}
		m.ledger.inFlight -= h.res.Reserved
		m.ledger.releasedReserved += h.res.Reserved
	}
	m.releases[h.id] = ev
	m.awaitAll(t, m.pump())
}

func (m *machine) cancel(t *rapid.T) {
	if len(m.queue) == 0 {
		t.Skip("nobody queued")
	}
	w := m.queue[rapid.IntRange(0, len(m.queue)-1).Draw(t, "waiter")]
	m.stepDescr = fmt.Sprintf("Cancel waiter %d", w.id)
	m.tokensFrozen = true
	m.removeWaiter(w)
	m.gateReject(bulkhead.Aborted)
	m.rejectEvent(bulkhead.Aborted, w.prio, m.clk.Now().Sub(w.enqueued))
	w.cancel()
	m.awaitAll(t, []expect{{w: w, reason: bulkhead.Aborted}})
}

func (m *machine) advance(t *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 7).Draw(t, "advanceHalfUnits")) * unit / 2
	m.stepDescr = fmt.Sprintf("AdvanceClock %v", d)
	m.tokensFrozen = true
	m.clk.Add(d)
	now := m.clk.Now()
	var es []expect
	for _, w := range slices.Clone(m.queue) {
		if !w.deadline.IsZero() && !w.deadline.After(now) {
			m.removeWaiter(w)
			m.gateReject(bulkhead.Timeout)
			m.rejectEvent(bulkhead.Timeout, w.prio, -1)
			es = append(es, expect{w: w, reason: bulkhead.Timeout})
		}
	}
	m.awaitAll(t, es)
}

func (m *machine) drawLimits(t *rapid.T, rev int64) bulkhead.Limits {
	l := bulkhead.Limits{
		Revision:      rev,
		MaxConcurrent: rapid.IntRange(0, 5).Draw(t, "nextMaxConcurrent"),
		MaxQueue:      rapid.IntRange(0, 5).Draw(t, "nextMaxQueue"),
	}
	if m.hasBudget {
		budget := int64(rapid.IntRange(0, 250).Draw(t, "nextBudget"))
		reserve := int64(rapid.IntRange(0, int(budget/2)).Draw(t, "nextReserve"))
		if rapid.IntRange(0, 5).Draw(t, "reserveOverBudget") == 0 {
			// A runtime change may leave the reserve above the budget (F15).
			reserve = budget + int64(rapid.IntRange(1, 50).Draw(t, "reserveExcess"))
		}
		l.TokenBudget = &bulkhead.BudgetLimits{Budget: budget, HighPriorityReserve: reserve}
	}
	return l
}

func (m *machine) applyLimits(t *rapid.T) {
	cur := m.limits.Revision
	switch kind := rapid.IntRange(0, 5).Draw(t, "applyKind"); kind {
	case 0, 1, 2: // valid and newer
		next := m.drawLimits(t, cur+int64(rapid.IntRange(1, 3).Draw(t, "revStep")))
		m.stepDescr = fmt.Sprintf("ApplyLimits %s", fmtLimits(next))
		res, err := m.b.ApplyLimits(next)
		if err != nil || !res.Applied || res.Reason != "" ||
			!reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, next) {
			t.Fatalf("%s: = %+v, %v; previous want %s", m.stepDescr, res, err, fmtLimits(m.limits))
		}
		m.installed(next)
		m.awaitAll(t, m.pump())
	case 3: // stale: a valid snapshot at a revision not above the current one
		next := m.drawLimits(t, max(0, cur-int64(rapid.IntRange(0, 2).Draw(t, "staleBy"))))
		m.stepDescr = fmt.Sprintf("ApplyLimits stale %s", fmtLimits(next))
		m.tokensFrozen = true
		res, err := m.b.ApplyLimits(next)
		if err != nil || res.Applied || res.Reason != bulkhead.StaleRevision ||
			!reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, m.limits) {
			t.Fatalf("%s: = %+v, %v; want stale_revision with current %s", m.stepDescr, res, err, fmtLimits(m.limits))
		}
	default: // invalid, at a newer revision
		next := m.drawLimits(t, cur+1)
		var breaks []func()
		breaks = append(breaks,
			func() { next.MaxConcurrent = -1 },
			func() { next.MaxQueue = -1 },
			func() { next.Revision = -1 },
		)
		if m.hasBudget {
			breaks = append(breaks,
				func() { next.TokenBudget = nil },
				func() { next.TokenBudget.Budget = -1 },
				func() { next.TokenBudget.HighPriorityReserve = -1 },
			)
		} else {
			breaks = append(breaks, func() { next.TokenBudget = &bulkhead.BudgetLimits{Budget: 5} })
		}
		breaks[rapid.IntRange(0, len(breaks)-1).Draw(t, "breakKind")]()
		m.stepDescr = fmt.Sprintf("ApplyLimits invalid %s", fmtLimits(next))
		m.tokensFrozen = true
		res, err := m.b.ApplyLimits(next)
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || res.Applied {
			t.Fatalf("%s: = %+v, %v; want a *ConfigError", m.stepDescr, res, err)
		}
	}
	if l := m.b.Limits(); !reflect.DeepEqual(l, m.limits) {
		t.Fatalf("%s: Limits() = %s, want %s", m.stepDescr, fmtLimits(l), fmtLimits(m.limits))
	}
}

// installed updates the model for an applied snapshot.
func (m *machine) installed(next bulkhead.Limits) {
	m.reconfigs = append(m.reconfigs, bulkhead.ReconfigureEvent{Previous: m.limits.Clone(), Current: next.Clone()})
	m.limits = next.Clone()
}

func (m *machine) setBudget(t *rapid.T) {
	n := int64(rapid.IntRange(-1, 250).Draw(t, "SetBudget"))
	m.stepDescr = fmt.Sprintf("SetBudget %d", n)
	res, err := m.b.SetBudget(n)
	if !m.hasBudget || n < 0 {
		m.tokensFrozen = true
		if !errors.Is(err, bulkhead.ErrInvalid) || res.Applied {
			t.Fatalf("%s: = %+v, %v; want an invalid-input error", m.stepDescr, res, err)
		}
		return
	}
	next := m.limits.Clone()
	next.Revision++
	next.TokenBudget.Budget = n
	if err != nil || !res.Applied || !reflect.DeepEqual(res.Previous, m.limits) || !reflect.DeepEqual(res.Current, next) {
		t.Fatalf("%s: = %+v, %v; want %s", m.stepDescr, res, err, fmtLimits(next))
	}
	m.installed(next)
	m.awaitAll(t, m.pump())
}

// wouldAdmit checks the advisory decision; it changes nothing (F23).
func (m *machine) wouldAdmit(t *rapid.T) {
	req, opts, prio, res := m.drawRequest(t)
	detail := rapid.Bool().Draw(t, "withDetail")
	if detail {
		opts = append(opts, bulkhead.WithDetail())
	}
	m.stepDescr = fmt.Sprintf("WouldAdmit prio=%v reserved=%d", prio, res.Reserved)
	m.tokensFrozen = true
	d, err := m.b.WouldAdmit(req, opts...)
	if err != nil {
		t.Fatalf("%s: %v", m.stepDescr, err)
	}
	// F23: closed, capacity, free slot, would queue, else the gate reason.
	why := noReason
	switch {
	case m.closed:
		why = bulkhead.Shutdown
	case !m.fits(prio, res.Reserved):
		why = bulkhead.BudgetLimit
	case m.inFlight < m.limits.MaxConcurrent:
	case m.limits.MaxConcurrent == 0 || m.limits.MaxQueue == 0:
		why = bulkhead.ConcurrencyLimit
	case len(m.queue) >= m.limits.MaxQueue:
		why = bulkhead.QueueLimit
	}
	if d.Admit != (why == noReason) || d.Reason != why {
		t.Fatalf("%s: = %+v, want reason %q", m.stepDescr, d, why)
	}
	if want := m.snapshotDetail(prio, res.Reserved); detail != (d.Detail != nil) || (detail && !reflect.DeepEqual(core(*d.Detail), want)) {
		t.Fatalf("%s: detail %s, want %s (asked: %v)", m.stepDescr, fmtDetail(d.Detail), fmtDetail(&want), detail)
	}
}

// drainDoneCtx calls Drain with a context that has already ended: it must
// report what is outstanding and cancel nothing (F33).
func (m *machine) drainDoneCtx(t *rapid.T) {
	idle := m.inFlight == 0 && len(m.queue) == 0
	if idle && m.closed {
		// A drained, closed bulkhead stops event delivery; that is the
		// final Drain's job (see TestDrainDoneCtxOnClosedIdleKeepsEvents).
		t.Skip("closed and idle")
	}
	m.stepDescr = "Drain(done ctx)"
	m.tokensFrozen = true
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := m.b.Drain(ctx)
	want := bulkhead.DrainResult{Drained: idle}
	if !idle {
		want.InFlight, want.Pending = m.inFlight, len(m.queue)
	}
	if res != want || (idle && err != nil) || (!idle && !errors.Is(err, context.Canceled)) {
		t.Fatalf("%s: = %+v, %v; want %+v", m.stepDescr, res, err, want)
	}
	m.noStrayOutcome(t)
}

// closeLate is the Close action: early in a run it asks WouldAdmit instead,
// so that most of a run happens open.
func (m *machine) closeLate(t *rapid.T) {
	if m.steps < 20 {
		m.wouldAdmit(t)
		return
	}
	m.seen["action:close"]++
	m.close(t)
}

func (m *machine) close(t *rapid.T) {
	m.stepDescr = "Close"
	m.tokensFrozen = true
	var es []expect
	if !m.closed {
		for _, w := range m.queue {
			m.gateReject(bulkhead.Shutdown)
			m.rejectEvent(bulkhead.Shutdown, w.prio, m.clk.Now().Sub(w.enqueued))
			es = append(es, expect{w: w, reason: bulkhead.Shutdown})
		}
		m.queue = nil
	}
	m.closed = true
	m.b.Close()
	m.awaitAll(t, es)
}

// ---- Invariants ----

// wantStats is the model's Stats.
func (m *machine) wantStats() bulkhead.Stats {
	st := bulkhead.Stats{Limits: m.limits.Clone(), Gate: m.gate, Calls: m.calls}
	st.Gate.InFlight = m.inFlight
	st.Gate.Pending = len(m.queue)
	st.Gate.MaxConcurrent = m.limits.MaxConcurrent
	st.Gate.MaxQueue = m.limits.MaxQueue
	st.Gate.Closed = m.closed
	st.Gate.RejectedByReason = maps.Clone(m.gate.RejectedByReason)
	st.Calls.InFlight = int64(m.inFlight)
	st.Calls.RejectedByReason = maps.Clone(m.calls.RejectedByReason)
	if m.hasBudget {
		b := m.limits.TokenBudget
		st.TokenBudget = &bulkhead.BudgetStats{
			Budget:              b.Budget,
			HighPriorityReserve: b.HighPriorityReserve,
			InFlightTokens:      m.ledger.inFlight,
			Available:           max(0, b.Budget-m.ledger.inFlight),
			TotalReserved:       m.ledger.reserved,
			TotalConsumed:       m.ledger.consumed,
			TotalRefunded:       m.ledger.refunded,
		}
	}
	return normalize(st)
}

// normalize drops zero map entries and empty maps so that two Stats compare
// by value.
func normalize(st bulkhead.Stats) bulkhead.Stats {
	clean := func(in map[bulkhead.Reason]int64) map[bulkhead.Reason]int64 {
		out := map[bulkhead.Reason]int64{}
		for k, v := range in {
			if v != 0 {
				out[k] = v
			}
		}
		return out
	}
	st.Gate.RejectedByReason = clean(st.Gate.RejectedByReason)
	st.Calls.RejectedByReason = clean(st.Calls.RejectedByReason)
	if len(st.Calls.AbandonedByCause) == 0 {
		st.Calls.AbandonedByCause = nil
	}
	return st
}

func sum(m map[bulkhead.Reason]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// check runs after every step.
func (m *machine) check(t *rapid.T) {
	m.steps++
	m.seen["steps"]++
	got := normalize(m.b.Stats())
	prev := m.prev
	defer func() {
		m.prev = got
		m.stepAdmits = nil
		m.stepEnqueued = false
		m.tokensFrozen = false
	}()

	// The model: the parts of Stats it knows (parts added for features it
	// does not drive, such as classes, are left out).
	if want := m.wantStats(); !reflect.DeepEqual(got.Limits, want.Limits) || !reflect.DeepEqual(got.Gate, want.Gate) ||
		!reflect.DeepEqual(got.Calls, want.Calls) || !reflect.DeepEqual(got.TokenBudget, want.TokenBudget) {
		t.Fatalf("after %s:\nstats %s\nmodel %s", m.stepDescr, fmtStats(got), fmtStats(want))
	}

	// The invariants, from Stats alone where they can be.
	g, c := got.Gate, got.Calls
	// I1: new admissions never exceed a limit; a value above its limit
	// (after a shrink) only falls.
	if c.Admitted > prev.Calls.Admitted && g.InFlight > g.MaxConcurrent {
		t.Fatalf("I1: %s admitted up to %d in flight over MaxConcurrent %d", m.stepDescr, g.InFlight, g.MaxConcurrent)
	}
	if g.InFlight > g.MaxConcurrent && g.InFlight > prev.Gate.InFlight {
		t.Fatalf("I1: in flight %d over MaxConcurrent %d rose from %d", g.InFlight, g.MaxConcurrent, prev.Gate.InFlight)
	}
	if m.stepEnqueued && g.Pending > g.MaxQueue {
		t.Fatalf("I1: %s queued up to %d pending over MaxQueue %d", m.stepDescr, g.Pending, g.MaxQueue)
	}
	if g.Pending > g.MaxQueue && g.Pending > prev.Gate.Pending {
		t.Fatalf("I1: pending %d over MaxQueue %d rose from %d", g.Pending, g.MaxQueue, prev.Gate.Pending)
	}
	// F3: no waiter waits while a slot is free.
	if g.Pending > 0 && g.InFlight < g.MaxConcurrent {
		t.Fatalf("F3: %d waiting with %d of %d slots in use", g.Pending, g.InFlight, g.MaxConcurrent)
	}
	if tb := got.TokenBudget; tb != nil {
		ptb := prev.TokenBudget
		if n := len(m.stepAdmits); n > 0 {
			// Tokens rise only through admissions, each fitting the effective
			// budget of its priority; the last one bounds what is held now.
			last := m.stepAdmits[n-1]
			if eff := m.effective(last.prio); tb.InFlightTokens > eff {
				t.Fatalf("I1: %s left %d tokens held over the effective budget %d of a %v admission", m.stepDescr, tb.InFlightTokens, eff, last.prio)
			}
		}
		if tb.InFlightTokens > tb.Budget && tb.InFlightTokens > ptb.InFlightTokens {
			t.Fatalf("I1: tokens %d over budget %d rose from %d", tb.InFlightTokens, tb.Budget, ptb.InFlightTokens)
		}
		// I4: rejections (and cancellations, timeouts, stale applies...)
		// change no token counter.
		if m.tokensFrozen && (tb.InFlightTokens != ptb.InFlightTokens || tb.TotalReserved != ptb.TotalReserved ||
			tb.TotalConsumed != ptb.TotalConsumed || tb.TotalRefunded != ptb.TotalRefunded || tb.TotalOverrun != ptb.TotalOverrun) {
			t.Fatalf("I4: %s changed the ledger from %+v to %+v", m.stepDescr, *ptb, *tb)
		}
		// I6 (F11) without ReportUsage: no overrun, no early refund, so
		// TotalReserved == sum of holds at release + InFlightTokens.
		if tb.TotalOverrun != 0 || tb.TotalReserved != m.ledger.releasedReserved+tb.InFlightTokens {
			t.Fatalf("I6: ledger %+v, holds released %d", *tb, m.ledger.releasedReserved)
		}
		if tb.InFlightTokens < 0 || tb.Available != max(0, tb.Budget-tb.InFlightTokens) {
			t.Fatalf("budget gauges %+v", *tb)
		}
	}
	// I5.
	if c.Admitted-c.Released != c.InFlight || c.InFlight != int64(g.InFlight) || g.Admitted-g.Released != int64(g.InFlight) {
		t.Fatalf("I5: calls %d-%d=%d, gate %d-%d, gate in flight %d", c.Admitted, c.Released, c.InFlight, g.Admitted, g.Released, g.InFlight)
	}
	if c.Rejected != sum(c.RejectedByReason) || g.Rejected != sum(g.RejectedByReason) ||
		g.Aborted != g.RejectedByReason[bulkhead.Aborted] || g.TimedOut != g.RejectedByReason[bulkhead.Timeout] {
		t.Fatalf("I5: rejected %d by reason %v; gate %d by reason %v", c.Rejected, c.RejectedByReason, g.Rejected, g.RejectedByReason)
	}
	// I8: revisions only rise.
	if got.Limits.Revision < prev.Limits.Revision {
		t.Fatalf("I8: revision fell from %d to %d", prev.Limits.Revision, got.Limits.Revision)
	}
	if got.Events.ListenerPanics != 0 {
		t.Fatalf("listener panics: %d", got.Events.ListenerPanics)
	}
}

// finish ends the run: Close rejects the queue, every hold is released, a
// real Drain drains, and then the events are checked (I2, I3, I11, F30, F31).
func (m *machine) finish(t *rapid.T) {
	m.close(t)
	m.check(t)
	for _, h := range m.holds {
		if !h.released {
			var u *bulkhead.Usage
			if m.exactUsage {
				u = &bulkhead.Usage{Input: h.res.Input, Output: h.res.MaxOutput}
			}
			m.stepDescr = "final Release " + h.id.String()
			if err := h.tok.Release(u); err != nil {
				t.Fatalf("%s: %v", m.stepDescr, err)
			}
			h.released = true
			m.inFlight--
			m.gate.Released++
			m.calls.Released++
			ev := bulkhead.ReleaseEvent{AdmissionID: h.id, LimitRevision: h.rev, Priority: h.prio, ReservedTokens: h.res.Reserved, Usage: u}
			if m.hasBudget {
				ev.Held = h.res.Reserved
				if u != nil {
					m.ledger.consumed += u.Total()
				}
				m.ledger.inFlight -= h.res.Reserved
				m.ledger.releasedReserved += h.res.Reserved
			}
			m.releases[h.id] = ev
			m.check(t)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	res, err := m.b.Drain(ctx)
	if err != nil || res != (bulkhead.DrainResult{Drained: true}) {
		t.Fatalf("I3: final Drain = %+v, %v", res, err)
	}
	m.finished = true

	// I3: nothing in flight or pending, zero tokens.
	st := m.b.Stats()
	if st.Gate.InFlight != 0 || st.Gate.Pending != 0 || st.Calls.InFlight != 0 || st.Calls.Admitted != st.Calls.Released {
		t.Fatalf("I3: not idle after drain: %s", fmtStats(st))
	}
	if tb := st.TokenBudget; tb != nil {
		if tb.InFlightTokens != 0 {
			t.Fatalf("I3: %d tokens held after drain", tb.InFlightTokens)
		}
		// F11: with exact usage and no overrun, reserved == consumed + refunded.
		if m.exactUsage && tb.TotalReserved != tb.TotalConsumed+tb.TotalRefunded {
			t.Fatalf("F11: exact usage but reserved %d != consumed %d + refunded %d", tb.TotalReserved, tb.TotalConsumed, tb.TotalRefunded)
		}
	}
	m.checkEvents(t, st)
}

func (m *machine) checkEvents(t *rapid.T, st bulkhead.Stats) {
	m.ev.mu.Lock()
	defer m.ev.mu.Unlock()
	ev := m.ev

	// Admit events: exactly one per admission, in the model's order (I2,
	// I11: FIFO among waiters never cancelled), with the admission's own
	// revision and reservation (I8) and its queue wait (F31).
	if len(ev.admits) != len(m.admitOrder) || int64(len(ev.admits)) != st.Calls.Admitted {
		t.Fatalf("I2: %d admit events, %d admissions, stats %d", len(ev.admits), len(m.admitOrder), st.Calls.Admitted)
	}
	byID := map[bulkhead.ID]*hold{}
	for _, h := range m.holds {
		byID[h.id] = h
	}
	for i, e := range ev.admits {
		if e.AdmissionID != m.admitOrder[i] {
			t.Fatalf("I11: admit event %d is %s, want %s (order %v)", i, e.AdmissionID, m.admitOrder[i], m.admitOrder)
		}
		h := byID[e.AdmissionID]
		if e.LimitRevision != h.rev || e.Priority != h.prio || e.Reserved != h.res.Reserved || e.Class != "" || e.Request == nil {
			t.Fatalf("admit event %+v, want revision %d priority %v reserved %d", e, h.rev, h.prio, h.res.Reserved)
		}
		if e.DecisionDuration != 0 || e.QueueWait != m.admitWait[h.id] {
			t.Fatalf("F31: admit event timing %+v, want queue wait %v (mock clock)", e.Timing, m.admitWait[h.id])
		}
	}

	// Release events: exactly one per admission, as the model settled it.
	if len(ev.releases) != len(m.releases) || int64(len(ev.releases)) != st.Calls.Released {
		t.Fatalf("I2: %d release events, want %d (stats %d)", len(ev.releases), len(m.releases), st.Calls.Released)
	}
	seen := map[bulkhead.ID]bool{}
	for _, e := range ev.releases {
		want, ok := m.releases[e.AdmissionID]
		if !ok || seen[e.AdmissionID] {
			t.Fatalf("I2: unexpected or repeated release event %+v", e)
		}
		seen[e.AdmissionID] = true
		if e.Request == nil || e.LimitRevision != want.LimitRevision || e.Priority != want.Priority || e.Class != "" ||
			e.Reserved != want.Reserved || e.Resources != (bulkhead.Resources{}) || e.Held != want.Held ||
			e.Refunded != want.Refunded || e.UsageSequence != 0 || !reflect.DeepEqual(e.Usage, want.Usage) {
			t.Fatalf("release event\n got %+v\nwant %+v", e, want)
		}
	}

	// Reject events: the model's multiset (reason, revision, priority, wait).
	got := map[rejectKey]int{}
	for _, e := range ev.rejects {
		k := rejectKey{e.Reason, e.LimitRevision, e.Priority, e.QueueWait}
		if e.Reason == bulkhead.Timeout {
			if e.QueueWait <= 0 {
				t.Fatalf("F31: timeout reject event with queue wait %v", e.QueueWait)
			}
			k.wait = -1
		}
		if e.DecisionDuration != 0 || e.Detail == nil || e.Detail.LimitRevision != e.LimitRevision {
			t.Fatalf("reject event %+v", e)
		}
		got[k]++
	}
	if !maps.Equal(got, m.rejects) || int64(len(ev.rejects)) != st.Calls.Rejected {
		t.Fatalf("reject events %v, want %v (stats %d)", got, m.rejects, st.Calls.Rejected)
	}

	// Reconfigure events: one per applied snapshot, in order, revisions
	// rising (I8).
	if len(ev.reconfigs) != len(m.reconfigs) {
		t.Fatalf("%d reconfigure events, want %d", len(ev.reconfigs), len(m.reconfigs))
	}
	for i, e := range ev.reconfigs {
		if !reflect.DeepEqual(e, m.reconfigs[i]) || e.Current.Revision <= e.Previous.Revision {
			t.Fatalf("reconfigure event %d: %s -> %s, want %s -> %s", i,
				fmtLimits(e.Previous), fmtLimits(e.Current), fmtLimits(m.reconfigs[i].Previous), fmtLimits(m.reconfigs[i].Current))
		}
	}
}

// ---- Formatting and shared helpers ----

// wantReason checks that err is a rejection for reason why.
func wantReason(t interface {
	Helper()
	Fatalf(string, ...any)
}, err error, why bulkhead.Reason) *bulkhead.RejectedError {
	t.Helper()
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("error = %v, want a rejection %v", err, why)
	}
	if rej.Reason != why {
		t.Fatalf("reason = %v, want %v (err %v)", rej.Reason, why, err)
	}
	if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, why.Sentinel()) {
		t.Fatalf("errors.Is fails for %v", err)
	}
	return rej
}

func reasonName(r bulkhead.Reason) string {
	if r == noReason {
		return "admission"
	}
	return r.String()
}

func fmtLimits(l bulkhead.Limits) string {
	s := fmt.Sprintf("{rev %d conc %d queue %d", l.Revision, l.MaxConcurrent, l.MaxQueue)
	if l.TokenBudget != nil {
		s += fmt.Sprintf(" budget %d reserve %d", l.TokenBudget.Budget, l.TokenBudget.HighPriorityReserve)
	}
	return s + "}"
}

func fmtDetail(d *bulkhead.RejectDetail) string {
	if d == nil {
		return "<nil>"
	}
	s := fmt.Sprintf("%+v", *d)
	if d.TokenBudget != nil {
		s += fmt.Sprintf(" budget %+v", *d.TokenBudget)
	}
	return s
}

func fmtStats(st bulkhead.Stats) string {
	s := fmt.Sprintf("limits %s gate %+v calls %+v", fmtLimits(st.Limits), st.Gate, st.Calls)
	if st.TokenBudget != nil {
		s += fmt.Sprintf(" budget %+v", *st.TokenBudget)
	}
	return s
}
