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

// sweepStep is how many entries each decision examines for expiry, in
// turn, in its shard; migrateStep is how many it moves into a shrunk
// shard's new map.
const (
	sweepStep   = 2
	migrateStep = 4
)

// A shard shrinks (a new entry slice and map, sized to the keys in use)
// when it holds fewer than a quarter of the entries it has room for, and
// has room for at least minShrink.
const minShrink = 256

// idleCheckEvery is how often (in decisions of a shard) a decision also
// looks at one other shard, in turn, and, if that shard's sweep has not gone
// round for idleSweepUs, examines up to idleChunk of its entries, so shards
// without traffic drop their expired state too.
const (
	idleCheckEvery = 64
	idleSweepUs    = graceUs
	idleChunk      = 256
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
// stores the state and a copy of the key). State that has expired (its queue
// ran out and its bucket drained, plus two minutes of slack) counts as
// absent, and is dropped from memory by upkeep that rides on the decisions,
// a few entries at a time: each decision examines two entries of its shard
// for expiry, so a shard goes round all its keys in half as many decisions
// as it holds keys, and shards without traffic are swept in turn, every two
// minutes or so, by decisions on the others. When a shard holds fewer than
// a quarter of the entries it has room for, it moves them to storage sized
// for the keys in use (Go maps never shrink by themselves): one decision
// copies the shard's remaining entries, a single memory copy, and the
// index moves to a new map a few entries per decision. The memory held
// thus follows the keys in use, no decision walks a whole shard's map, and
// there is no background goroutine and nothing to close. (A store that
// makes no decisions at all sweeps nothing; call Sweep if that matters.)
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

// localEntry is one key's state.
type localEntry struct {
	k  localKey
	st state
}

// localShard holds its states in a dense slice, ents, indexed by a map. The
// sweep walks the slice with a cursor, a few entries per decision, and
// removes an expired entry by moving the last one into its place, so no
// decision ever walks the whole shard. Go maps do not shrink, so when the
// shard holds far fewer keys than it has room for, it starts a new slice
// and a new map, and moves the index into the new map a few entries per
// decision; until that is done, a key is looked up in m and then in old.
type localShard struct {
	mu      sync.Mutex
	m       map[localKey]int32 // index in ents
	old     map[localKey]int32 // the map before a shrink, being emptied into m; nil otherwise
	ents    []localEntry
	cursor  int      // the next entry the sweep examines
	migrate int      // during a shrink, the next entry whose index moves to m
	round   int64    // when the sweep's current round began (the cursor was at 0), µs
	swept   int64    // when the last complete round began: state expired then is gone, µs
	checks  int      // decisions since this shard last checked another
	_       [64]byte // keeps shards on separate cache lines
}

// NewLocal returns an empty in-process store.
func NewLocal(opts LocalOptions) *Local {
	c := clock.OrReal(opts.Clock)
	base := c.Now()
	l := &Local{clk: c, base: base, baseNs: base.UnixNano(), seed: maphash.MakeSeed()}
	now := l.nowUs()
	for i := range l.shards {
		l.shards[i].m = make(map[localKey]int32)
		l.shards[i].swept = now
		l.shards[i].round = now
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
		n += len(s.ents)
		s.mu.Unlock()
	}
	return n
}

// Sweep drops every expired state now, and gives back the memory of keys
// no longer in use, instead of waiting for the store's own sweeps. It takes
// time in proportion to the keys held, one shard at a time, and delays only
// the calls on the shard it is sweeping. Dropping expired state never
// changes a decision.
func (l *Local) Sweep() {
	now := l.nowUs()
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		s.cursor, s.round = 0, now
		s.sweep(now, len(s.ents)+1)
		s.finishMigration()
		s.maybeShrink()
		s.finishMigration()
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

// find returns the index in ents of k's entry, or -1.
func (s *localShard) find(k localKey) int {
	if i, ok := s.m[k]; ok {
		return int(i)
	}
	if s.old != nil {
		if i, ok := s.old[k]; ok {
			return int(i)
		}
	}
	return -1
}

// remove drops entry i, moving the last entry into its place.
func (s *localShard) remove(i int) {
	last := len(s.ents) - 1
	k := s.ents[i].k
	delete(s.m, k)
	if s.old != nil {
		delete(s.old, k)
	}
	if i != last {
		moved := s.ents[last]
		s.ents[i] = moved
		s.m[moved.k] = int32(i)
		if s.old != nil {
			delete(s.old, moved.k)
		}
	}
	s.ents[last] = localEntry{} // lets the key strings go
	s.ents = s.ents[:last]
}

// sweep examines up to n entries from the cursor and drops those that have
// expired. When the cursor has gone round the whole shard, it records when
// that round began, and starts the next.
func (s *localShard) sweep(now int64, n int) {
	for ; n > 0; n-- {
		if s.cursor >= len(s.ents) {
			s.cursor = 0
			s.swept, s.round = s.round, now
			return
		}
		if now >= s.ents[s.cursor].st.exp {
			s.remove(s.cursor) // the cursor now points at the moved entry
		} else {
			s.cursor++
		}
	}
}

// stepMigration moves up to n entries' indexes from old to m.
func (s *localShard) stepMigration(n int) {
	if s.old == nil {
		return
	}
	for ; n > 0 && s.migrate < len(s.ents); n-- {
		s.m[s.ents[s.migrate].k] = int32(s.migrate)
		s.migrate++
	}
	if s.migrate >= len(s.ents) {
		s.old = nil // every entry is in m: entries moved below migrate went there too
	}
}

func (s *localShard) finishMigration() { s.stepMigration(len(s.ents) + 1) }

// maybeShrink starts a shrink when the shard holds fewer than a quarter of
// the entries it has room for: a new slice with room for twice the entries
// held, and a new map that the indexes move into a few at a time.
func (s *localShard) maybeShrink() {
	if s.old != nil || cap(s.ents) < minShrink || len(s.ents) >= cap(s.ents)/4 {
		return
	}
	ents := make([]localEntry, len(s.ents), 2*len(s.ents))
	copy(ents, s.ents)
	s.ents = ents
	// No size hint: the map grows as the migration fills it, a table at a
	// time, instead of allocating it whole in this decision.
	s.old, s.m = s.m, make(map[localKey]int32)
	s.migrate = 0
	s.stepMigration(0)
}

// afterDecision does the decision's share of the shard's upkeep, a few
// entries of sweep and of migration, and reports whether the decision should
// also check another shard.
func (s *localShard) afterDecision(now int64) (checkIdle bool) {
	s.sweep(now, sweepStep)
	s.stepMigration(migrateStep)
	s.maybeShrink()
	s.checks++
	if s.checks >= idleCheckEvery {
		s.checks = 0
		return true
	}
	return false
}

// sweepIdle takes the next shard in turn and, if its sweep has not gone
// round for idleSweepUs, does up to idleChunk entries of its upkeep. It
// never waits for a lock: a busy shard sweeps itself.
func (l *Local) sweepIdle(now int64) {
	s := &l.shards[l.cursor.Add(1)%numShards]
	if s.mu.TryLock() {
		if now-s.swept >= idleSweepUs {
			s.sweep(now, idleChunk)
			s.stepMigration(idleChunk)
			s.maybeShrink()
		}
		s.mu.Unlock()
	}
}

// put stores st under k: in place when the key has state (entry i >= 0),
// and otherwise as a new entry whose key strings are copies, so the shard
// never retains a caller's larger buffer.
func (s *localShard) put(k localKey, i int, st state) {
	if i >= 0 {
		s.ents[i].st = st
		return
	}
	k = localKey{name: strings.Clone(k.name), key: strings.Clone(k.key)}
	s.m[k] = int32(len(s.ents))
	s.ents = append(s.ents, localEntry{k: k, st: st})
}

// decideOne makes the decision of a single pacer.
func (l *Local) decideOne(r *request) stepResult {
	k := localKey{name: r.name, key: r.key}
	s := &l.shards[l.shardOf(&k)]
	s.mu.Lock()
	now := l.nowUs()
	res := s.decideOne(now, r)
	checkIdle := s.afterDecision(now)
	s.mu.Unlock()
	if checkIdle {
		l.sweepIdle(now)
	}
	return res
}

// decideOne makes the decision of a single pacer at now in the shard, and
// records it when it commits. The caller holds what guards the shard.
func (s *localShard) decideOne(now int64, r *request) stepResult {
	k := localKey{name: r.name, key: r.key}
	i := s.find(k)
	var res stepResult
	if i >= 0 {
		res = step(s.ents[i].st, true, now, &r.p)
	} else {
		res = step(state{}, false, now, &r.p)
	}
	if res.commit {
		s.put(k, i, res.next)
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
	s := &l.shards[l.shardOf(&localKey{key: reqs[0].key})]
	s.mu.Lock()
	now := l.nowUs()
	commit := s.decide(now, reqs, out)
	checkIdle := s.afterDecision(now)
	s.mu.Unlock()
	if checkIdle {
		l.sweepIdle(now)
	}
	return commit, nil
}

// decide makes one decision at now over several pacers of one call key in
// the shard, and records all or none. The caller holds what guards the
// shard.
func (s *localShard) decide(now int64, reqs []request, out []stepResult) bool {
	key := reqs[0].key
	var buf [8]int
	cur := buf[:0]
	commit := true
	for i := range reqs {
		if reqs[i].key != key {
			panic("pacer: one decision over several call keys")
		}
		c := s.find(localKey{name: reqs[i].name, key: key})
		cur = append(cur, c)
		if c >= 0 {
			out[i] = step(s.ents[c].st, true, now, &reqs[i].p)
		} else {
			out[i] = step(state{}, false, now, &reqs[i].p)
		}
		commit = commit && out[i].commit
	}
	if commit {
		together(out[:len(reqs)], reqs)
		// Appending a new entry moves no other: the indexes in cur hold.
		for i := range reqs {
			s.put(localKey{name: reqs[i].name, key: key}, cur[i], out[i].next)
		}
	}
	return commit
}

func (l *Local) waitClock() clock.Clock { return l.clk }

func (l *Local) failure() (FailurePolicy, time.Duration) { return FailError, 0 }
