package pacer

import (
	"context"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// numShards is the number of independently locked parts of a Local store.
const numShards = 64

// minSweep is the least number of decisions between two sweeps of a shard.
const minSweep = 256

// LocalOptions configures NewLocal. The zero value is ready to use.
type LocalOptions struct {
	// Clock is the source of time for decisions and for PaceWait's waits.
	// Nil means the wall clock. Tests pass clock.NewMock().
	Clock clock.Clock
}

// Local is the in-process Store: pacer state lives in this process's memory
// and is shared by every Pacer created on it. It is safe for concurrent use.
//
// State is sharded by key over independently locked maps, so calls on
// different keys rarely contend; a decision holds one lock for a few tens of
// nanoseconds and allocates nothing (a key's first call stores a copy of the
// key). State that has expired (its queue ran out and its bucket drained, plus
// two minutes of slack) counts as absent, and is dropped from memory by a
// sweep that each shard runs after as many decisions as it holds keys, so the
// memory held is proportional to the keys in use, with no background
// goroutine and nothing to close.
//
// Time is the clock's monotonic time anchored to its wall time at
// construction, so wall-clock steps do not disturb the pacing of a process.
type Local struct {
	clk    clock.Clock
	base   time.Time // clk.Now() at construction
	baseNs int64     // base as Unix nanoseconds
	seed   maphash.Seed
	shards [numShards]localShard
}

type localKey struct{ name, key string }

type localShard struct {
	mu  sync.Mutex
	m   map[localKey]state
	ops int      // decisions since the last sweep
	_   [40]byte // keeps shards on separate cache lines
}

// NewLocal returns an empty in-process store.
func NewLocal(opts LocalOptions) *Local {
	c := clock.OrReal(opts.Clock)
	base := c.Now()
	l := &Local{clk: c, base: base, baseNs: base.UnixNano(), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].m = make(map[localKey]state)
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
	ns := l.baseNs + int64(l.clk.Since(l.base))
	us := ns / 1000
	if ns%1000 < 0 {
		us-- // floor, for times before 1970
	}
	return us
}

func (l *Local) shardOf(k *localKey) int {
	return int(maphash.Comparable(l.seed, *k) % numShards)
}

func (s *localShard) sweep(now int64) {
	for k, st := range s.m {
		if now >= st.exp {
			delete(s.m, k)
		}
	}
	s.ops = 0
}

// afterDecision counts a decision and sweeps the shard when it has made as
// many decisions as it holds keys, so a sweep costs O(1) per decision.
func (s *localShard) afterDecision(now int64) {
	s.ops++
	if s.ops >= minSweep && s.ops >= len(s.m) {
		s.sweep(now)
	}
}

// put stores st under k, copying the key strings when k is new so the map
// never retains a caller's larger buffer.
func (s *localShard) put(k localKey, st state, existed bool) {
	if !existed {
		k = localKey{name: strings.Clone(k.name), key: strings.Clone(k.key)}
	}
	s.m[k] = st
}

// decideOne makes the decision of a single pacer.
func (l *Local) decideOne(r *request) stepResult {
	k := localKey{name: r.name, key: r.key}
	s := &l.shards[l.shardOf(&k)]
	s.mu.Lock()
	now := l.nowUs()
	prev, ok := s.m[k]
	res := step(prev, ok, now, &r.p)
	if res.commit {
		s.put(k, res.next, ok)
	}
	s.afterDecision(now)
	s.mu.Unlock()
	return res
}

// decide makes one decision over several pacers: it holds every shard
// involved (in index order, so two decisions cannot deadlock), runs the step
// of each, and records all or none.
func (l *Local) decide(_ context.Context, reqs []request, out []stepResult) (bool, error) {
	if len(reqs) == 1 {
		out[0] = l.decideOne(&reqs[0])
		return out[0].commit, nil
	}
	keys := make([]localKey, len(reqs))
	idx := make([]int, len(reqs))
	for i := range reqs {
		keys[i] = localKey{name: reqs[i].name, key: reqs[i].key}
		idx[i] = l.shardOf(&keys[i])
	}
	order := slices.Compact(slices.Sorted(slices.Values(idx)))
	for _, i := range order {
		l.shards[i].mu.Lock()
	}
	now := l.nowUs()
	commit := true
	existed := make([]bool, len(reqs))
	for i := range reqs {
		prev, ok := l.shards[idx[i]].m[keys[i]]
		existed[i] = ok
		out[i] = step(prev, ok, now, &reqs[i].p)
		commit = commit && out[i].commit
	}
	if commit {
		for i := range reqs {
			l.shards[idx[i]].put(keys[i], out[i].next, existed[i])
		}
	}
	for _, i := range order {
		l.shards[i].afterDecision(now)
		l.shards[i].mu.Unlock()
	}
	return commit, nil
}

func (l *Local) waitClock() clock.Clock { return l.clk }

func (l *Local) failure() (FailurePolicy, time.Duration) { return FailError, 0 }
