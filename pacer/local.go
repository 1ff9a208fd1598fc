package pacer

import (
	"context"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// numShards is the number of independently locked parts of a Local store.
const numShards = 64

// minSweep is the least number of decisions between two sweeps of a shard.
const minSweep = 256

// idleCheckEvery is how often (in decisions of a shard) a decision also
// looks at one other shard, in turn, and sweeps it if no sweep has run there
// for idleSweepUs, so shards without traffic drop their expired state too.
const (
	idleCheckEvery = 64
	idleSweepUs    = graceUs
)

// LocalOptions configures NewLocal. The zero value is ready to use.
type LocalOptions struct {
	// Clock is the source of time for decisions and for PaceWait's waits.
	// Nil means the wall clock. Tests pass clock.NewMock().
	Clock clock.Clock
}

// Local is the in-process Store: pacer state lives in this process's memory
// and is shared by every Pacer created on it. It is safe for concurrent use.
//
// State is sharded by call key over independently locked maps, so calls on
// different keys rarely contend; a decision holds one lock for a few tens of
// nanoseconds and allocates nothing once the key has state (its first call
// stores the state and a copy of the key). State that has expired (its queue ran out and its bucket drained, plus
// two minutes of slack) counts as absent, and is dropped from memory by
// sweeps that ride on the decisions: a shard sweeps itself after as many
// decisions as it holds keys, and shards without traffic are swept in turn,
// every two minutes or so, by decisions on the others. The memory held is
// thus proportional to the keys in use, with no background goroutine and
// nothing to close. (A store that makes no decisions at all sweeps nothing;
// call Sweep if that matters.)
//
// Time is the clock's monotonic time anchored to its wall time at
// construction, so wall-clock steps do not disturb the pacing of a process.
type Local struct {
	clk    clock.Clock
	base   time.Time // clk.Now() at construction
	baseNs int64     // base as Unix nanoseconds
	seed   maphash.Seed
	cursor atomic.Uint32 // the next shard to check for idle state
	shards [numShards]localShard
}

type localKey struct{ name, key string }

type localShard struct {
	mu     sync.Mutex
	m      map[localKey]*state
	ops    int      // decisions since the last sweep
	swept  int64    // time of the last sweep, µs
	checks int      // decisions since this shard last checked another
	_      [24]byte // keeps shards on separate cache lines
}

// NewLocal returns an empty in-process store.
func NewLocal(opts LocalOptions) *Local {
	c := clock.OrReal(opts.Clock)
	base := c.Now()
	l := &Local{clk: c, base: base, baseNs: base.UnixNano(), seed: maphash.MakeSeed()}
	now := l.nowUs()
	for i := range l.shards {
		l.shards[i].m = make(map[localKey]*state)
		l.shards[i].swept = now
	}
	return l
}

// Len returns the number of keys the store holds state for, expired state
// that no sweep has dropped yet included.
func (l *Local) Len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// Sweep drops every expired state now, instead of waiting for the shards'
// own sweeps. Dropping expired state never changes a decision.
func (l *Local) Sweep() {
	now := l.nowUs()
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		s.sweep(now)
		s.mu.Unlock()
	}
}

// nowUs is the decision time in µs since the Unix epoch.
func (l *Local) nowUs() int64 {
	ns := l.baseNs + int64(l.clk.Now().Sub(l.base))
	us := ns / 1000
	if ns%1000 < 0 {
		us-- // floor, for times before 1970
	}
	return us
}

// shardOf picks the shard of a key by the call key alone, so the pacers of
// one call key (a composite's members) share a shard and one lock.
func (l *Local) shardOf(k *localKey) int {
	return int(maphash.String(l.seed, k.key) % numShards)
}

func (s *localShard) sweep(now int64) {
	for k, st := range s.m {
		if now >= st.exp {
			delete(s.m, k)
		}
	}
	s.ops = 0
	s.swept = now
}

// afterDecision counts a decision and sweeps the shard when it has made as
// many decisions as it holds keys, so a sweep costs O(1) per decision. It
// reports whether the decision should also check another shard.
func (s *localShard) afterDecision(now int64) (checkIdle bool) {
	s.ops++
	if s.ops >= minSweep && s.ops >= len(s.m) {
		s.sweep(now)
	}
	s.checks++
	if s.checks >= idleCheckEvery {
		s.checks = 0
		return true
	}
	return false
}

// sweepIdle sweeps the next shard in turn if it has not been swept for
// idleSweepUs. It never waits for a lock: a busy shard sweeps itself.
func (l *Local) sweepIdle(now int64) {
	s := &l.shards[l.cursor.Add(1)%numShards]
	if s.mu.TryLock() {
		if now-s.swept >= idleSweepUs {
			s.sweep(now)
		}
		s.mu.Unlock()
	}
}

// put stores st under k: in place when the key has state (cur), and
// otherwise as a new entry whose key strings are copies, so the map never
// retains a caller's larger buffer.
func (s *localShard) put(k localKey, cur *state, st state) {
	if cur != nil {
		*cur = st
		return
	}
	k = localKey{name: strings.Clone(k.name), key: strings.Clone(k.key)}
	p := new(state)
	*p = st
	s.m[k] = p
}

// decideOne makes the decision of a single pacer.
func (l *Local) decideOne(r *request) stepResult {
	k := localKey{name: r.name, key: r.key}
	s := &l.shards[l.shardOf(&k)]
	s.mu.Lock()
	now := l.nowUs()
	cur := s.m[k]
	var res stepResult
	if cur != nil {
		res = step(*cur, true, now, &r.p)
	} else {
		res = step(state{}, false, now, &r.p)
	}
	if res.commit {
		s.put(k, cur, res.next)
	}
	checkIdle := s.afterDecision(now)
	s.mu.Unlock()
	if checkIdle {
		l.sweepIdle(now)
	}
	return res
}

// decide makes one decision over several pacers of one call key (the
// members of a composite, which share the key's shard): under the shard's
// lock it runs the step of each, and records all or none.
func (l *Local) decide(_ context.Context, reqs []request, out []stepResult) (bool, error) {
	if len(reqs) == 1 {
		out[0] = l.decideOne(&reqs[0])
		return out[0].commit, nil
	}
	key := reqs[0].key
	s := &l.shards[l.shardOf(&localKey{key: key})]
	var buf [8]*state
	cur := buf[:0]
	s.mu.Lock()
	now := l.nowUs()
	commit := true
	for i := range reqs {
		if reqs[i].key != key {
			s.mu.Unlock()
			panic("pacer: one decision over several call keys")
		}
		c := s.m[localKey{name: reqs[i].name, key: key}]
		cur = append(cur, c)
		if c != nil {
			out[i] = step(*c, true, now, &reqs[i].p)
		} else {
			out[i] = step(state{}, false, now, &reqs[i].p)
		}
		commit = commit && out[i].commit
	}
	if commit {
		for i := range reqs {
			s.put(localKey{name: reqs[i].name, key: key}, cur[i], out[i].next)
		}
	}
	checkIdle := s.afterDecision(now)
	s.mu.Unlock()
	if checkIdle {
		l.sweepIdle(now)
	}
	return commit, nil
}

func (l *Local) waitClock() clock.Clock { return l.clk }

func (l *Local) failure() (FailurePolicy, time.Duration) { return FailError, 0 }
