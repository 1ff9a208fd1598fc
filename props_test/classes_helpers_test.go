package props_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
)

// cmClock is a mock clock that counts the timers registered with AfterFunc.
//
// A borrowed-slot deadline's timer is registered by the class's child actor,
// asynchronously, after the admission has been answered. A test that moves
// the mock clock while the child actor is between reading the time and
// registering its timer gets the timer registered relative to the moved
// time, so it fires late (see TestBorrowedDeadlineTimerRegisteredLate). The
// state machine therefore waits, before every Add, until every deadline it
// expects has its timer registered: the only AfterFunc user in these tests
// (they set no queue timeouts).
type cmClock struct {
	*clock.Mock
	registered atomic.Int64
}

func (c *cmClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Mock.AfterFunc(d, f)
	c.registered.Add(1)
	return t
}

// errCMCallback is what a Run callback returns when the state machine makes it
// fail.
var errCMCallback = errors.New("callback failed on purpose")

// cmRun drives one Run callback from the test goroutine: the callback says
// it started, then obeys commands until told to finish.
type cmRun struct {
	started chan cmStart // buffered: the callback's first act
	cmds    chan cmCmd   // unbuffered
	done    chan cmDone  // buffered: what Run returned
	stopper sync.Once
}

func newCMRun() *cmRun {
	return &cmRun{started: make(chan cmStart, 1), cmds: make(chan cmCmd), done: make(chan cmDone, 1)}
}

// stop makes a callback that has not finished return (cleanup only).
func (r *cmRun) stop() { r.stopper.Do(func() { close(r.cmds) }) }

// cmStart is what the callback saw of its admission when it started.
type cmStart struct {
	id        bulkhead.ID
	rev       int64
	prio      bulkhead.Priority
	class     string
	res       *bulkhead.Reservation
	resources bulkhead.Resources
	admission bulkhead.Admission
	ctxErr    error
}

// cmCmd is a command to a running callback: abandon its borrowed slot, or
// finish (with usage set, or failing).
type cmCmd struct {
	abandon bool
	usage   *bulkhead.Usage
	fail    bool
	reply   chan cmReply
}

type cmReply struct {
	abandoned bool
	setErr    error // SetUsage's error
	cause     error // context.Cause of the callback's context when it finished
}

type cmDone struct {
	v   int
	err error
}

// fn is the callback.
func (r *cmRun) fn(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
	r.started <- cmStart{
		id: rc.AdmissionID(), rev: rc.LimitRevision(), prio: rc.Priority(), class: rc.Class(),
		res: rc.Reservation(), resources: rc.Resources(), admission: rc.Admission(), ctxErr: ctx.Err(),
	}
	for cmd := range r.cmds {
		if cmd.abandon {
			cmd.reply <- cmReply{abandoned: rc.AbandonBorrowedConcurrency()}
			continue
		}
		var rep cmReply
		if cmd.usage != nil {
			rep.setErr = rc.SetUsage(*cmd.usage)
		}
		rep.cause = context.Cause(ctx)
		cmd.reply <- rep
		if cmd.fail {
			return 0, errCMCallback
		}
		return 42, nil
	}
	return 0, errors.New("stopped by cleanup")
}

// cmEventKind names an event in the ordered log.
type cmEventKind int

const (
	cmEvAdmit cmEventKind = iota
	cmEvAbandon
	cmEvRelease
)

type cmOrdered struct {
	kind cmEventKind
	id   bulkhead.ID
}

// cmEvents records what listeners saw.
type cmEvents struct {
	mu        sync.Mutex
	order     []cmOrdered
	admits    []bulkhead.AdmitEvent
	rejects   []bulkhead.RejectEvent
	releases  []bulkhead.ReleaseEvent
	abandons  []bulkhead.AbandonEvent
	reconfigs []bulkhead.ReconfigureEvent
}

func (l *cmEvents) hooks() bulkhead.Hooks {
	return bulkhead.Hooks{
		Admit: func(e bulkhead.AdmitEvent) {
			l.mu.Lock()
			l.admits = append(l.admits, e)
			l.order = append(l.order, cmOrdered{cmEvAdmit, e.AdmissionID})
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
			l.order = append(l.order, cmOrdered{cmEvRelease, e.AdmissionID})
			l.mu.Unlock()
		},
		Abandon: func(e bulkhead.AbandonEvent) {
			l.mu.Lock()
			l.abandons = append(l.abandons, e)
			l.order = append(l.order, cmOrdered{cmEvAbandon, e.AdmissionID})
			l.mu.Unlock()
		},
		Reconfigure: func(e bulkhead.ReconfigureEvent) {
			l.mu.Lock()
			l.reconfigs = append(l.reconfigs, e)
			l.mu.Unlock()
		},
	}
}

// cmRejectKey is what the model predicts of a reject event.
type cmRejectKey struct {
	reason     bulkhead.Reason
	constraint bulkhead.Constraint
	class      string
	prio       bulkhead.Priority
	rev        int64
}

// cmNormalize drops zero map entries and empty maps, so that two Stats
// compare by value.
func cmNormalize(st bulkhead.Stats) bulkhead.Stats {
	st.Gate.RejectedByReason = cmCleanReasons(st.Gate.RejectedByReason)
	st.Calls.RejectedByReason = cmCleanReasons(st.Calls.RejectedByReason)
	st.Calls.AbandonedByCause = cmCleanCauses(st.Calls.AbandonedByCause)
	if st.Classes != nil {
		c := *st.Classes
		c.Classes = maps.Clone(c.Classes)
		for name, cs := range c.Classes {
			cs.RejectedByReason = cmCleanReasons(cs.RejectedByReason)
			cs.AbandonedByCause = cmCleanCauses(cs.AbandonedByCause)
			cs.Deadlines = bulkhead.DeadlineStats{} // checked on its own: cmCheckDeadlines
			c.Classes[name] = cs
		}
		st.Classes = &c
	}
	return st
}

func cmCleanReasons(in map[bulkhead.Reason]int64) map[bulkhead.Reason]int64 {
	var out map[bulkhead.Reason]int64
	for k, v := range in {
		if v != 0 {
			if out == nil {
				out = map[bulkhead.Reason]int64{}
			}
			out[k] = v
		}
	}
	return out
}

func cmCleanCauses(in map[bulkhead.AbandonCause]int64) map[bulkhead.AbandonCause]int64 {
	var out map[bulkhead.AbandonCause]int64
	for k, v := range in {
		if v != 0 {
			if out == nil {
				out = map[bulkhead.AbandonCause]int64{}
			}
			out[k] = v
		}
	}
	return out
}

// ---- Formatting ----

func cmFmtInt(p *int) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func cmFmtInt64(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func cmFmtClassLimits(l bulkhead.ClassLimits) string {
	return fmt.Sprintf("{floor %d max %s tokFloor %d maxTok %s}", l.ProtectedConcurrent, cmFmtInt(l.MaxConcurrent),
		l.ProtectedInFlightTokens, cmFmtInt64(l.MaxInFlightTokens))
}

func cmFmtClasses(c *bulkhead.Classes) string {
	if c == nil {
		return "<nil>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "{default %q", c.Default)
	for _, name := range slices.Sorted(maps.Keys(c.Limits)) {
		fmt.Fprintf(&b, " %s:%s", name, cmFmtClassLimits(c.Limits[name]))
	}
	return b.String() + "}"
}

func cmFmtLimits(l bulkhead.Limits) string {
	return fmtLimits(l) + " classes " + cmFmtClasses(l.Classes)
}

func cmFmtDetail(d *bulkhead.RejectDetail) string {
	if d == nil {
		return "<nil>"
	}
	s := fmtDetail(d)
	if sc := d.SharedCapacity; sc != nil {
		s += fmt.Sprintf(" shared %+v", sc.Concurrency)
		if sc.TokenBudget != nil {
			s += fmt.Sprintf(" sharedTokens %+v", *sc.TokenBudget)
		}
	}
	if c := d.Class; c != nil {
		s += fmt.Sprintf(" class {%s in %d floor %d pInUse %d borrowed %d availP %d max %s avail %s}", c.ID, c.InFlight,
			c.ProtectedConcurrent, c.ProtectedConcurrentInUse, c.BorrowedConcurrent, c.AvailableProtectedConcurrent,
			cmFmtInt(c.MaxConcurrent), cmFmtInt(c.AvailableConcurrent))
		if tb := c.TokenBudget; tb != nil {
			s += fmt.Sprintf(" classTokens {in %d floor %d pInUse %d borrowed %d availP %d max %s avail %s req %d}",
				tb.InFlightTokens, tb.ProtectedInFlightTokens, tb.ProtectedTokensInUse, tb.BorrowedInFlightTokens,
				tb.AvailableProtectedTokens, cmFmtInt64(tb.MaxInFlightTokens), cmFmtInt64(tb.Available), tb.Requested)
		}
	}
	return s
}

func cmFmtStats(st bulkhead.Stats) string {
	s := fmt.Sprintf("limits %s\n  gate %+v\n  calls %+v", cmFmtLimits(st.Limits), st.Gate, st.Calls)
	if st.TokenBudget != nil {
		s += fmt.Sprintf("\n  budget %+v", *st.TokenBudget)
	}
	if c := st.Classes; c != nil {
		s += fmt.Sprintf("\n  classes default %q shared {max %d in %d avail %d}", c.Default, c.Shared.MaxConcurrent,
			c.Shared.InFlight, c.Shared.AvailableConcurrent)
		if c.Shared.TokenBudget != nil {
			s += fmt.Sprintf(" sharedTokens %+v", *c.Shared.TokenBudget)
		}
		for _, name := range slices.Sorted(maps.Keys(c.Classes)) {
			cs := c.Classes[name]
			s += fmt.Sprintf("\n    %s: limits %s in %d pInUse %d borrowed %d tok %d pTok %d bTok %d adm %d rel %d aband %d %v rej %d %v "+
				"reserved %d consumed %d refunded %d overrun %d borrowedAdm %d borrowedTok %d",
				name, cmFmtClassLimits(cs.Limits), cs.InFlight, cs.ProtectedConcurrentInUse, cs.BorrowedConcurrent,
				cs.InFlightTokens, cs.ProtectedTokensInUse, cs.BorrowedInFlightTokens, cs.Admitted, cs.Released,
				cs.Abandoned, cs.AbandonedByCause, cs.Rejected, cs.RejectedByReason, cs.TotalReserved, cs.TotalConsumed,
				cs.TotalRefunded, cs.TotalOverrun, cs.TotalBorrowedAdmissions, cs.TotalBorrowedTokensReserved)
		}
	}
	return s
}

// cmCheckDeadlines checks each class actor's deadline telemetry against the
// rest of the class's stats: every deadline started is running, expired or
// ended, and every abandonment by deadline follows an expiry.
func cmCheckDeadlines(st bulkhead.Stats) error {
	if st.Classes == nil {
		return nil
	}
	for name, cs := range st.Classes.Classes {
		d := cs.Deadlines
		if d.Active < 0 || d.Started != d.Active+d.Expired+d.Ended {
			return fmt.Errorf("class %s: deadlines %+v do not add up", name, d)
		}
		if byDeadline := cs.AbandonedByCause[bulkhead.AbandonDeadline]; d.Expired < byDeadline {
			return fmt.Errorf("class %s: %d abandoned by deadline but %d deadlines expired", name, byDeadline, d.Expired)
		}
	}
	return nil
}
