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
//
// As its one owner books every turn on it, a Table can also take turns
// back (Rewind).
type Table struct {
	now int64 // µs since the Unix epoch
	sh  localShard
	// booked is, per key with weight that Book recorded in its queue, the
	// end of that weight's slot: Rewind gives back nothing before it.
	booked map[localKey]int64
}

// NewTable returns an empty Table, its time at the Unix epoch until
// SetTime moves it.
func NewTable() *Table {
	return &Table{sh: localShard{m: make(map[localKey]int32)}, booked: map[localKey]int64{}}
}

// Rewind gives back the turns booked on key in the pacer named name from
// at on: the key's queue, which ends at its next free slot, ends at at
// instead, when it ended later. It is for the owner of the table, which
// alone books on it, when the calls it paced with those turns will not go
// at them (a provider asked for a pause): every call with a turn from at
// on must give it back, and books again. Rewind never goes back before the
// table's time, nor before weight that Book recorded in the queue (spent
// already, it stays booked). The bucket stays full, as a busy queue leaves
// it, so the calls booked again go no sooner than their rate allows: over
// any window, the key admits no more than it would had the turns given
// back never been booked.
func (t *Table) Rewind(name, key string, at time.Time) {
	k := localKey{name: name, key: key}
	i := t.sh.find(k)
	if i < 0 {
		return
	}
	st := &t.sh.ents[i].st
	to := max(timeUs(at), t.now, t.booked[k])
	if t.now >= st.exp || st.next <= to {
		return
	}
	st.next = to
}

// noteBooked records, after a Book decision that committed, where the
// weight it recorded in a member's queue (not in its bucket) ends; it
// forgets the ends already past as the record grows.
func (t *Table) noteBooked(r *request, res *stepResult) {
	if r.p.capUs <= 0 || !res.commit || !(float64(res.before+r.p.weight) > r.p.burst) || res.next.next <= t.now {
		return
	}
	if len(t.booked) >= 64 && len(t.booked) >= len(t.sh.ents) {
		for k, end := range t.booked {
			if end <= t.now {
				delete(t.booked, k)
			}
		}
	}
	t.booked[localKey{name: r.name, key: r.key}] = res.next.next
}

// SetTime sets the time of the decisions that follow. Time may step back:
// for a key, it never runs backwards (see Options), as on every store.
func (t *Table) SetTime(now time.Time) { t.now = timeUs(now) }

// timeUs is t in µs since the Unix epoch, rounded down.
func timeUs(t time.Time) int64 {
	ns := t.UnixNano()
	us := ns / 1000
	if ns%1000 < 0 {
		us-- // floor, for times before 1970
	}
	return us
}

// Len returns the number of keys the table holds state for, expired state
// that no sweep has dropped yet included.
func (t *Table) Len() int { return len(t.sh.ents) }

// decideOne makes the decision of a single pacer.
func (t *Table) decideOne(r *request) stepResult {
	res := t.sh.decideOne(t.now, r)
	t.noteBooked(r, &res)
	t.sh.afterDecision(t.now)
	return res
}

func (t *Table) decide(_ context.Context, reqs []request, out []stepResult) (bool, error) {
	if len(reqs) == 1 {
		out[0] = t.decideOne(&reqs[0])
		return out[0].commit, nil
	}
	commit := t.sh.decide(t.now, reqs, out)
	for i := range reqs {
		t.noteBooked(&reqs[i], &out[i])
	}
	t.sh.afterDecision(t.now)
	return commit, nil
}

func (t *Table) waitClock() clock.Clock { return clock.New() }

func (t *Table) failure() (FailurePolicy, time.Duration) { return FailError, 0 }

var _ Store = (*Table)(nil)
