package pacer

import (
	"context"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// Table is the Store for a single owner that makes one decision at a time
// and says what time it is: an actor that owns its rate state, an event
// loop, a simulation. It keeps pacer state in memory like Local, with the
// same results for the same calls at the same times, but it has no lock and
// no clock of its own: every decision is made at the time last given to
// SetTime. It is not safe for concurrent use.
//
// Expired state is dropped a few entries per decision, as in Local.
// PaceWait on a Table waits on the wall clock.
type Table struct {
	now int64 // µs since the Unix epoch
	sh  localShard
}

// NewTable returns an empty Table, its time at the Unix epoch until
// SetTime moves it.
func NewTable() *Table {
	return &Table{sh: localShard{m: make(map[localKey]int32)}}
}

// SetTime sets the time of the decisions that follow. Time may step back:
// for a key, it never runs backwards (see Options), as on every store.
func (t *Table) SetTime(now time.Time) {
	ns := now.UnixNano()
	us := ns / 1000
	if ns%1000 < 0 {
		us-- // floor, for times before 1970
	}
	t.now = us
}

// Len returns the number of keys the table holds state for, expired state
// that no sweep has dropped yet included.
func (t *Table) Len() int { return len(t.sh.ents) }

// decideOne makes the decision of a single pacer.
func (t *Table) decideOne(r *request) stepResult {
	res := t.sh.decideOne(t.now, r)
	t.sh.afterDecision(t.now)
	return res
}

func (t *Table) decide(_ context.Context, reqs []request, out []stepResult) (bool, error) {
	if len(reqs) == 1 {
		out[0] = t.decideOne(&reqs[0])
		return out[0].commit, nil
	}
	commit := t.sh.decide(t.now, reqs, out)
	t.sh.afterDecision(t.now)
	return commit, nil
}

func (t *Table) waitClock() clock.Clock { return clock.New() }

func (t *Table) failure() (FailurePolicy, time.Duration) { return FailError, 0 }

var _ Store = (*Table)(nil)
