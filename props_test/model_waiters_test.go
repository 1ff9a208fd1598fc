package props_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
)

// The state machine's calls: each runs on its own goroutine, and the
// machine waits for the outcomes it predicts.

// errCallback is what a Run callback returns when the machine makes it fail.
var errCallback = errors.New("callback failed on purpose")

// callback drives one Run callback from the test goroutine: the callback
// says it started, then obeys commands until told to finish.
type callback struct {
	started chan callbackStart // buffered: the callback's first act
	cmds    chan command       // unbuffered
	done    chan runDone       // buffered: what Run returned
	stopper sync.Once
}

func newCallback() *callback {
	return &callback{started: make(chan callbackStart, 1), cmds: make(chan command), done: make(chan runDone, 1)}
}

// stop makes a callback that has not finished return (cleanup only).
func (r *callback) stop() { r.stopper.Do(func() { close(r.cmds) }) }

// callbackStart is what the callback saw of its admission when it started.
type callbackStart struct {
	admissionView
	bypass *bulkhead.Bypass
	ctxErr error
}

// command is a command to a running callback: abandon its borrowed slot, or
// finish (with usage set, or failing).
type command struct {
	abandon bool
	report  *bulkhead.Usage // report usage, with prog
	prog    *bulkhead.Progressive
	usage   *bulkhead.Usage
	fail    bool
	reply   chan commandReply
}

type commandReply struct {
	abandoned bool
	rep       bulkhead.UsageReport // ReportUsage's report and error
	repErr    error
	setErr    error // SetUsage's error
	cause     error // context.Cause of the callback's context when it finished
}

type runDone struct {
	v   int
	err error
}

// fn is the callback.
func (r *callback) fn(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
	r.started <- callbackStart{admissionView: viewOf(rc), bypass: rc.Bypass(), ctxErr: ctx.Err()}
	for cmd := range r.cmds {
		if cmd.abandon {
			cmd.reply <- commandReply{abandoned: rc.AbandonBorrowedConcurrency()}
			continue
		}
		if cmd.report != nil {
			rep, err := rc.ReportUsage(*cmd.report, cmd.prog)
			cmd.reply <- commandReply{rep: rep, repErr: err}
			continue
		}
		var rep commandReply
		if cmd.usage != nil {
			rep.setErr = rc.SetUsage(*cmd.usage)
		}
		rep.cause = context.Cause(ctx)
		cmd.reply <- rep
		if cmd.fail {
			return 0, errCallback
		}
		return 42, nil
	}
	return 0, errors.New("stopped by cleanup")
}

// ended is what a waiter ended with: a token, a started callback, or an
// error.
type ended struct {
	tok   *token
	start *callbackStart
	err   error
}

// start launches c's call, an Acquire or a Run, on its own goroutine.
func (m *machine) start(c call, run bool) *waiter {
	m.nextID++
	w := &waiter{
		id: m.nextID, req: c.req, class: c.class, prio: c.prio, res: c.res, deadline: c.deadline, timeout: c.timeout,
		observe: c.observe, shadow: c.shadow, attempt: c.attempt,
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	if c.ctxDone {
		cancel()
	}
	m.all = append(m.all, w)
	if run {
		w.run = newCallback()
		go func() {
			v, err := bulkhead.Run(ctx, m.b, w.req, w.run.fn, c.opts...)
			d := runDone{v, err}
			w.last.Store(&d)
			w.run.done <- d
		}()
	} else {
		w.ch = make(chan outcome, 1)
		go func() {
			tok, err := m.b.Acquire(ctx, w.req, c.opts...)
			w.ch <- outcome{tok, err}
		}()
	}
	return w
}

// receive waits for w's outcome.
func (m *machine) receive(t *rapid.T, w *waiter) ended {
	t.Helper()
	timeout := time.After(settle)
	if w.run == nil {
		select {
		case o := <-w.ch:
			return ended{tok: o.tok, err: o.err}
		case <-timeout:
		}
	} else {
		select {
		case s := <-w.run.started:
			return ended{start: &s}
		case d := <-w.run.done:
			if d.err == nil {
				t.Fatalf("waiter %d: Run returned %d without running its callback (%s)", w.id, d.v, m.descr)
			}
			return ended{err: d.err}
		case <-timeout:
		}
	}
	t.Fatalf("waiter %d: no outcome within %v (%s)", w.id, settle, m.descr)
	return ended{}
}

// poll returns w's outcome if it has one already.
func (m *machine) poll(w *waiter) (ended, bool) {
	if w.run == nil {
		select {
		case o := <-w.ch:
			return ended{tok: o.tok, err: o.err}, true
		default:
		}
		return ended{}, false
	}
	select {
	case s := <-w.run.started:
		return ended{start: &s}, true
	case d := <-w.run.done:
		return ended{err: d.err}, true
	default:
	}
	return ended{}, false
}

// failAdmitted stops what an unexpected admission started.
func (w *waiter) failAdmitted(o ended) {
	if w.run != nil && o.start != nil {
		w.run.stop()
	}
	discard(o.tok)
}

func (w *waiter) String() string {
	return fmt.Sprintf("waiter %d (class %q prio %v reserved %d)", w.id, w.class, w.prio, w.res.Reserved)
}

// await waits for e's waiter to end and checks how.
func (m *machine) await(t *rapid.T, e expect) {
	t.Helper()
	o := m.receive(t, e.w)
	if !e.w.enqueued.IsZero() {
		m.seen["queued->"+reasonName(e.reason)]++
	}
	if e.bypass != nil {
		m.adoptBypass(t, e.bypass, o)
		return
	}
	if e.reason == noReason {
		if o.err != nil {
			t.Fatalf("%v: %v, want admission (%s)\ndetail %s", e.w, o.err, m.descr, fmtDetail(detailOf(o.err)))
		}
		m.adopt(t, e.h, o)
		return
	}
	want := e.reject.ev.Detail
	if o.err == nil {
		e.w.failAdmitted(o)
		t.Fatalf("%v was admitted, want %v (%s)\nmodel detail %s", e.w, e.reason, m.descr, fmtDetail(want))
	}
	rej := wantReason(t, o.err, e.reason)
	// F21: the detail is the capacity snapshot at decision time.
	if !e.reject.matches(rej.Detail) {
		t.Fatalf("%v rejected %v (%s) with detail\n got %s\nwant %s", e.w, e.reason, m.descr, fmtDetail(rej.Detail), fmtDetail(want))
	}
	if e.reason == bulkhead.Aborted && !errors.Is(o.err, context.Canceled) {
		t.Fatalf("%v: aborted error %v does not match context.Canceled", e.w, o.err)
	}
}

// adopt checks an admission's token or run context against the model's
// hold and records it.
func (m *machine) adopt(t *rapid.T, h *hold, o ended) {
	t.Helper()
	var a admissionView
	if h.w.run == nil {
		h.tok = o.tok
		a = viewOf(o.tok)
	} else {
		a = o.start.admissionView
		if o.start.ctxErr != nil {
			t.Fatalf("%v: callback started with ctx error %v", h.w, o.start.ctxErr)
		}
	}
	h.id = a.id
	if o.start != nil && o.start.bypass != nil {
		t.Fatalf("%v: admitted, but its RunContext says bypassed %+v (%s)", h.w, *o.start.bypass, m.descr)
	}
	if a.rev != h.rev || a.prio != h.prio || a.class != h.class || a.resources != h.resources {
		t.Fatalf("%v admitted with revision %d priority %v class %q resources %+v; want %d %v %q %+v (I8, F18, F25) (%s)",
			h.w, a.rev, a.prio, a.class, a.resources, h.rev, h.prio, h.class, h.resources, m.descr)
	}
	if m.hasBudget != (a.res != nil) || (a.res != nil && *a.res != h.res) {
		t.Fatalf("%v: reservation %+v, want %+v (budget %v)", h.w, a.res, h.res, m.hasBudget)
	}
	if a.id == (bulkhead.ID{}) || a.id.String() == "" {
		t.Fatal("zero admission ID")
	}
	if _, dup := m.admitWait[a.id]; dup {
		t.Fatalf("admission ID %s minted twice", a.id)
	}
	m.holds = append(m.holds, h)
	m.admitOrder = append(m.admitOrder, a.id)
	wait := time.Duration(0)
	if !h.w.enqueued.IsZero() {
		wait = m.clk.Now().Sub(h.w.enqueued)
	}
	m.admitWait[a.id] = wait
}

// awaitAll waits for every predicted outcome, then checks that nothing else
// has ended.
func (m *machine) awaitAll(t *rapid.T, es []expect) {
	t.Helper()
	for _, e := range es {
		m.await(t, e)
	}
	m.noStray(t)
}

// noStray checks that no queued waiter has an outcome and that no running
// callback's Run has returned.
func (m *machine) noStray(t *rapid.T) {
	t.Helper()
	for _, w := range m.queue {
		if o, ok := m.poll(w); ok {
			w.failAdmitted(o)
			t.Fatalf("%v ended (admitted %v, err %v) while the model has it queued (%s)", w, o.err == nil, o.err, m.descr)
		}
	}
	for _, h := range m.holds {
		if h.w.run == nil || h.released || h.expired {
			continue
		}
		select {
		case d := <-h.w.run.done:
			t.Fatalf("Run of %s (class %s, resources %+v, deadline %v) returned %d, %v while its callback runs (%s)",
				h.id, h.class, h.resources, h.w.deadline, d.v, d.err, m.descr)
		default:
		}
	}
	for _, b := range m.bypassed {
		if b.released {
			continue
		}
		select {
		case d := <-b.w.run.done:
			t.Fatalf("bypassed Run of %s returned %d, %v while its callback runs (%s)", b.id, d.v, d.err, m.descr)
		default:
		}
	}
}

// waitQueued waits until the engine's queue holds n waiters, failing if w
// ends instead.
func (m *machine) waitQueued(t *rapid.T, w *waiter, n int) {
	t.Helper()
	err := spinUntil(fmt.Sprintf("%v reaching the queue as number %d", w, n), func() (bool, error) {
		if o, ok := m.poll(w); ok {
			w.failAdmitted(o)
			return false, fmt.Errorf("%v ended (admitted %v, err %v), want it queued", w, o.err == nil, o.err)
		}
		return m.b.Stats().Gate.Pending == n, nil
	})
	if err != nil {
		t.Fatalf("%v (%s)", err, m.descr)
	}
}

// waitTimers waits until the engine has registered every timer the model
// expects (queue timeouts and borrowed-slot deadlines), so that moving the
// clock fires exactly those.
func (m *machine) waitTimers(t *rapid.T) {
	t.Helper()
	err := spinUntil("registering timers", func() (bool, error) {
		n := m.clk.registered.Load()
		if n > m.timers {
			return false, fmt.Errorf("%d timers registered, want %d", n, m.timers)
		}
		return n == m.timers, nil
	})
	if err != nil {
		t.Fatalf("%v (%s)", err, m.descr)
	}
}

// awaitReturn waits for the Run of w, whose callback was told to finish,
// to return what it returned: errCallback when it failed, else 42.
func (m *machine) awaitReturn(t *rapid.T, w *waiter, fail bool) {
	t.Helper()
	select {
	case d := <-w.run.done:
		if fail && (d.v != 0 || !errors.Is(d.err, errCallback)) || !fail && (d.v != 42 || d.err != nil) {
			t.Fatalf("%s: Run returned %d, %v", m.descr, d.v, d.err)
		}
	case <-time.After(settle):
		t.Fatalf("%s: Run did not return", m.descr)
	}
}

// command sends cmd to h's running callback and waits for its reply.
func (m *machine) command(t *rapid.T, h *hold, cmd command) commandReply {
	t.Helper()
	cmd.reply = make(chan commandReply, 1)
	select {
	case h.w.run.cmds <- cmd:
	case <-time.After(settle):
		t.Fatalf("%s: the callback does not take commands", m.descr)
	}
	select {
	case rep := <-cmd.reply:
		return rep
	case <-time.After(settle):
		t.Fatalf("%s: the callback did not reply", m.descr)
	}
	return commandReply{}
}
