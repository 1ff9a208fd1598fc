// Package dedup is bulkhead's in-flight deduplication: one actor that owns
// the table of deduplicated calls in flight, keyed by a seeded xxhash64
// digest of their key.
//
// A call joins with its key and digest (Join). The first call of a key is
// its leader: it is registered before it goes to admission, so that later
// calls of the same key can follow it while it queues. A follower is held
// here, holding no capacity, until its leader settles (Settle), when the
// leader's outcome is handed to every follower; or until its own wait ends
// first, by its context (Leave) or by its wait bound (a timer of the
// actor's). A call whose digest matches an entry of another key (a
// collision) runs on its own: it neither follows nor registers, so a
// collision never hands a caller another call's result.
//
// A leader that no follower has joined settles without a message
// (SettleAlone): the table is the actor's alone, but each entry carries
// one atomic state that the actor and its leader race for, so that either
// the first follower's join marks it followed (and the leader then sends
// Settle) or the leader marks it settled first (and that join finds it
// gone, and leads anew). The actor removes such entries as it goes, a few
// at each registration, and counts the keys in flight exactly.
//
// The actor decides nothing about capacity and interprets no outcome: the
// facade says what a call's key is and what its outcome means. It tells its
// parent, the admission actor, of each follower that joins (Joined), so
// that the parent emits the event in order with the others.
package dedup

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cespare/xxhash/v2"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/mpsc"
)

// Key is the full identity of a deduplicated call: two calls share a
// result only when their keys are equal.
type Key struct {
	// Scope is the caller's partition (a tenant, say); "" for none.
	Scope string
	// Class is the call's admission class name, "" without classes.
	Class string
	// Canon is the canonical key of the request. In a Join it may be a
	// view of the caller's buffer (see View): the actor keeps a copy.
	Canon string
}

// Hash is the digest the table is keyed by.
type Hash func(Key) uint64

// NewHash returns the xxhash64, seeded with seed, of scope 0x00 class 0x00
// canon. It allocates nothing.
func NewHash(seed uint64) Hash {
	return func(k Key) uint64 {
		var d xxhash.Digest
		d.ResetWithSeed(seed)
		_, _ = d.WriteString(k.Scope)
		_, _ = d.Write(separator[:])
		_, _ = d.WriteString(k.Class)
		_, _ = d.Write(separator[:])
		_, _ = d.WriteString(k.Canon)
		return d.Sum64()
	}
}

var separator = [1]byte{0}

// NewHashBytes returns the digest of NewHash(seed) over a key already laid
// out as scope 0x00 class 0x00 canon in one buffer: one write instead of
// five. It allocates nothing.
func NewHashBytes(seed uint64) func([]byte) uint64 {
	return func(b []byte) uint64 {
		var d xxhash.Digest
		d.ResetWithSeed(seed)
		_, _ = d.Write(b)
		return d.Sum64()
	}
}

// processSeed is drawn at start-up, so that digests cannot be computed in
// advance (to aim collisions at a key) from outside the process.
var processSeed = func() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}()

// DefaultHash is NewHash with the process's random seed, and
// DefaultHashBytes NewHashBytes with it.
var (
	DefaultHash      = NewHash(processSeed)
	DefaultHashBytes = NewHashBytes(processSeed)
)

// View returns b as a string without copying it. The string is valid only
// while b is not modified: for a Join's Canon, until the join is answered.
func View(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// Role is what a Join made of a call.
type Role uint8

// The roles.
const (
	// Alone: the call's digest matches an entry of another key; it runs on
	// its own and is not registered.
	Alone Role = iota
	// Leader: the call is the first of its key; it runs, and must Settle.
	Leader
	// Follower: the call waits for its key's leader.
	Follower
)

// Join asks the actor to place a call. The facade fills the input fields,
// sends it, and waits with AwaitRole. A follower then waits for its final
// answer with Answered, and may Leave first.
type Join struct {
	// Digest is Hash(Key).
	Digest uint64
	// Key is the call's key.
	Key Key
	// Call is the caller's call, opaque here: it is carried on the Joined
	// message of a follower.
	Call any
	// Wait bounds a follower's wait; zero waits until its context ends.
	Wait time.Duration

	// Role is set when the join is answered.
	Role Role
	// Outcome is a follower's final answer: its leader's outcome, as the
	// leader gave it to Settle; nil when the follower left first.
	Outcome any
	// Left is why a follower left before its leader settled (Aborted or
	// Timeout), and Cause what ended its context; NoReason otherwise.
	Left  admission.Reason
	Cause error

	// done carries a follower's final answer, and the role when the
	// caller waits for it: placed says who came first (see AwaitRole).
	done     chan struct{}
	placed   atomic.Uint32
	entry    *entry
	answered bool // a follower's final answer was sent
	timer    clock.Timer
	gen      uint64
	leave    Leave
	node     mpsc.Node
}

// NewJoin returns a Join ready to be filled and sent.
func NewJoin() *Join { return &Join{done: make(chan struct{}, 2)} }

// AwaitRole waits until the actor has placed the call.
//
// The actor and the caller race for placed: when the actor has placed
// the call by the time the caller looks (the join ran on the caller's own
// goroutine), no channel is used; else the actor sends the role on done.
func (j *Join) AwaitRole() {
	if j.placed.CompareAndSwap(unplaced, roleAwaited) {
		<-j.done
	}
}

// The states of Join.placed.
const (
	unplaced uint32 = iota
	roleAwaited
	rolePlaced
)

// place hands j its role.
func (j *Join) place() {
	if !j.placed.CompareAndSwap(unplaced, rolePlaced) {
		j.done <- struct{}{}
	}
}

// Answered is the channel that delivers a follower's final answer.
func (j *Join) Answered() <-chan struct{} { return j.done }

// SettleAlone settles a leader's entry without a message when no follower
// has joined it, and reports whether it did: if not, send Settle. When it
// did and wake is true, send WakeDrains: the last key in flight has gone
// while a Drain waits.
func (j *Join) SettleAlone() (settled, wake bool) {
	e := j.entry
	if !e.state.CompareAndSwap(entryOpen, entryAlone) {
		return false, false
	}
	t := e.tally
	return true, t.live.Add(-1) == 0 && t.draining.Load() > 0
}

// Settle returns the message that settles a leader's entry with outcome:
// the entry goes, and every follower gets outcome. Send it once. The
// message belongs to the entry, so the leader's Join may be reused as soon
// as its role is known.
func (j *Join) Settle(outcome any) *Settle {
	e := j.entry
	e.settle = Settle{entry: e, outcome: outcome}
	return &e.settle
}

// Reset clears j for reuse, keeping its channel: a Join may be reused once
// its last answer has been read, unless it was sent to Leave or was a
// follower with a wait bound (a message about it may still be on its way).
func (j *Join) Reset() { *j = Join{done: j.done} }

// Leave returns the message that withdraws a follower whose context ended,
// for cause. A follower already answered keeps its answer. Send it at most
// once; the Join must not be reused after it.
func (j *Join) Leave(cause error) *Leave {
	j.leave = Leave{j: j, cause: cause}
	return &j.leave
}

// Settle ends a leader's entry (see Join.Settle).
type Settle struct {
	entry   *entry
	outcome any
	node    mpsc.Node
}

// Leave withdraws a follower (see Join.Leave).
type Leave struct {
	j     *Join
	cause error
	node  mpsc.Node
}

// The messages of the hot path carry their own queue node, so posting them
// allocates nothing (the engine gives this actor its mailbox).
func (j *Join) MailboxNode() *mpsc.Node   { return &j.node }
func (m *Settle) MailboxNode() *mpsc.Node { return &m.node }
func (m *Leave) MailboxNode() *mpsc.Node  { return &m.node }

// Joined is what the actor tells its parent when a follower joins.
type Joined struct {
	// Call is the follower's Join.Call.
	Call any
	// Class and Scope are those of its key.
	Class, Scope string
}

// WakeDrains tells the actor to answer the drains waiting, if the table has
// emptied (see SettleAlone).
type WakeDrains struct{}

// Close tells the actor that the bulkhead is closed: every later join is
// answered Alone, so that the call goes to admission, which rejects it
// Shutdown. Entries in flight, and their followers, go on: a follower that
// joined before Close still gets its leader's outcome.
type Close struct{}

// Drain waits until the table is empty: every leader has settled. Send it
// once, then wait on Done; Cancel withdraws it when the caller gives up.
type Drain struct {
	// Active is the number of keys in flight when the drain was answered:
	// 0 when the table emptied, more when it was withdrawn first.
	Active int64
	// Waited says the table was not empty when the drain arrived.
	Waited bool
	done   chan struct{}
	cancel DrainCancel
}

// NewDrain returns a drain to send.
func NewDrain() *Drain { return &Drain{done: make(chan struct{}, 1)} }

// Done delivers the drain's one answer.
func (q *Drain) Done() <-chan struct{} { return q.done }

// Cancel returns the message that withdraws q: it is answered at once,
// unless it was answered already. Send it at most once.
func (q *Drain) Cancel() *DrainCancel {
	q.cancel = DrainCancel{q: q}
	return &q.cancel
}

// DrainCancel withdraws a Drain (see Drain.Cancel).
type DrainCancel struct{ q *Drain }

// StatsRequest asks for the actor's statistics.
type StatsRequest struct {
	// Active is the number of keys in flight; Hits counts the followers
	// that ever joined; Draining is the number of drains waiting; Entries
	// is the size of the table, settled entries not yet removed included.
	Active, Hits, Draining, Entries int64
	done                            chan struct{}
}

// NewStatsRequest returns a request to send; Await waits for its answer.
func NewStatsRequest() *StatsRequest { return &StatsRequest{done: make(chan struct{}, 1)} }

// Await waits for the answer.
func (q *StatsRequest) Await() { <-q.done }

type entry struct {
	scope, class string
	canon        []byte
	digest       uint64
	followers    []*Join
	settle       Settle
	// state is raced for by the actor (a follower joins) and the leader
	// (it settles alone); see SettleAlone.
	state atomic.Uint32
	tally *tally
}

// The states of an entry.
const (
	// entryOpen: registered, no follower yet.
	entryOpen uint32 = iota
	// entryFollowed: a follower joined; the leader settles with a message.
	entryFollowed
	// entryAlone: the leader settled without a message; the entry is dead
	// but may still be in the table.
	entryAlone
	// entrySettled: settled with a message and out of the table.
	entrySettled
)

// tally is what a leader that settles alone updates: the keys in flight,
// and the drains waiting for them to reach 0.
type tally struct {
	live, draining atomic.Int64
}

// is reports whether e is the entry of k.
func (e *entry) is(k Key) bool {
	return e.scope == k.Scope && e.class == k.Class && string(e.canon) == k.Canon
}

// maxFree bounds the entries the actor keeps for reuse, and maxFreeCanon
// the key buffer it keeps with one.
const (
	maxFree      = 256
	maxFreeCanon = 4 << 10
)

type fired struct {
	j   *Join
	gen uint64
}

// Actor is the dedup actor.
type Actor struct {
	clk   clock.Clock
	log   *slog.Logger
	table map[uint64]*entry
	hits  int64
	ctx   actor.Context
	// free is settled entries kept for reuse: only the actor touches them.
	free []*entry
	// closed is set by Close: no join registers or follows after it.
	closed bool
	// drains wait for the table to empty.
	drains []*Drain
	// tally counts the keys in flight, shared with the leaders.
	tally *tally
	// order[head:] is the registered entries not yet recycled, oldest
	// first; each registration looks at the oldest two, to remove the dead.
	order []*entry
	head  int
}

// NewActor returns the props of a dedup actor whose followers' wait bounds
// run on clk, and which logs recovered panics to log.
//
// The actor runs on a synchronized dispatcher, so that a join finds the
// actor idle in the common case and is decided on the caller's goroutine,
// and a follower's timer is armed before its join is answered.
func NewActor(clk clock.Clock, log *slog.Logger) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &Actor{clk: clock.OrReal(clk), log: log, table: make(map[uint64]*entry), tally: new(tally)}
	}, actor.WithDispatcher(actor.NewSynchronizedDispatcher(300)))
}

// Receive handles one message. A panic is recovered here, with the caller
// of a join answered (as Alone: the call runs on its own), so the actor is
// never restarted with an empty table.
func (a *Actor) Receive(ctx actor.Context) {
	a.ctx = ctx
	msg := ctx.Message()
	defer func() {
		if p := recover(); p != nil {
			a.recovered(msg, p)
		}
	}()
	switch m := msg.(type) {
	case *Join:
		a.join(m)
	case *Settle:
		a.settleEntry(m)
	case *Leave:
		a.leaveEntry(m.j, admission.Aborted, m.cause)
	case *fired:
		if m.j.gen == m.gen {
			a.leaveEntry(m.j, admission.Timeout, nil)
		}
	case *StatsRequest:
		m.Active, m.Hits, m.Draining, m.Entries = a.tally.live.Load(), a.hits, int64(len(a.drains)), int64(len(a.table))
		m.done <- struct{}{}
	case *Close:
		a.closed = true
	case *Drain:
		a.drain(m)
	case *DrainCancel:
		a.cancelDrain(m.q)
	case *WakeDrains:
		a.checkDrains()
	}
}

func (a *Actor) drain(q *Drain) {
	// Counted before the keys are read: a leader that settles alone
	// meanwhile sees the count and wakes the drains (see SettleAlone).
	a.tally.draining.Add(1)
	if a.tally.live.Load() == 0 {
		a.tally.draining.Add(-1)
		q.done <- struct{}{}
		return
	}
	q.Waited = true
	a.drains = append(a.drains, q)
}

func (a *Actor) cancelDrain(q *Drain) {
	for i, w := range a.drains {
		if w == q {
			a.drains = append(a.drains[:i], a.drains[i+1:]...)
			a.tally.draining.Add(-1)
			q.Active = a.tally.live.Load()
			q.done <- struct{}{}
			return
		}
	}
}

// checkDrains answers the drains once the table is empty.
func (a *Actor) checkDrains() {
	if len(a.drains) == 0 || a.tally.live.Load() > 0 {
		return
	}
	a.tally.draining.Add(-int64(len(a.drains)))
	for _, q := range a.drains {
		q.done <- struct{}{}
	}
	clear(a.drains)
	a.drains = a.drains[:0]
}

func (a *Actor) recovered(msg, p any) {
	if a.log != nil {
		a.log.Error("bulkhead: recovered panic in dedup actor", "panic", fmt.Sprint(p), "message", fmt.Sprintf("%T", msg))
	}
	switch m := msg.(type) {
	case *Join:
		if m.placed.Load() != rolePlaced && len(m.done) == 0 && m.entry == nil {
			m.Role = Alone
			m.place()
		}
	case *StatsRequest:
		if len(m.done) == 0 {
			m.done <- struct{}{}
		}
	}
}

func (a *Actor) join(j *Join) {
	e := a.table[j.Digest]
	if e != nil && e.state.Load() == entryAlone {
		// Its leader settled alone: the entry is dead, so the key leads
		// anew (the entry is recycled from order).
		delete(a.table, j.Digest)
		e = nil
	}
	switch {
	case a.closed:
		j.Role = Alone // closed: admission rejects the call Shutdown
	case e == nil:
		a.sweep()
		e = a.newEntry()
		e.scope, e.class, e.canon, e.digest = j.Key.Scope, j.Key.Class, append(e.canon, j.Key.Canon...), j.Digest
		a.table[j.Digest] = e
		a.pushOrder(e)
		a.tally.live.Add(1)
		j.Role, j.entry = Leader, e
	case !e.is(j.Key):
		j.Role = Alone // a collision: never share another key's result
	case !e.state.CompareAndSwap(entryOpen, entryFollowed) && e.state.Load() != entryFollowed:
		// Its leader settled alone just now: the key leads anew.
		delete(a.table, j.Digest)
		a.join(j)
		return
	default:
		j.Role, j.entry = Follower, e
		a.hits++
		e.followers = append(e.followers, j)
		if j.Wait > 0 {
			msg := &fired{j: j, gen: j.gen}
			root, self := a.ctx.ActorSystem().Root, a.ctx.Self()
			j.timer = a.clk.AfterFunc(j.Wait, func() { root.Send(self, msg) })
		}
		a.ctx.Send(a.ctx.Parent(), &Joined{Call: j.Call, Class: j.Key.Class, Scope: j.Key.Scope})
	}
	// The canonical key may be a view of the caller's buffer, which the
	// caller reuses once answered.
	j.Key.Canon = ""
	j.place()
}

func (a *Actor) newEntry() *entry {
	if n := len(a.free); n > 0 {
		e := a.free[n-1]
		a.free = a.free[:n-1]
		return e
	}
	return &entry{tally: a.tally}
}

// sweep looks at the two oldest entries of order: a dead one (settled) is
// taken out of the table, if still there, and recycled; a live one goes to
// the back. Each registration adds one entry and looks at two, so the
// dead entries in the table stay few, however long a leader lives.
func (a *Actor) sweep() {
	for range 2 {
		if a.head == len(a.order) {
			return
		}
		e := a.order[a.head]
		a.order[a.head] = nil
		a.head++
		if a.head == len(a.order) {
			a.order, a.head = a.order[:0], 0
		}
		switch e.state.Load() {
		case entryAlone, entrySettled:
			if a.table[e.digest] == e {
				delete(a.table, e.digest)
			}
			a.recycle(e)
		default:
			a.pushOrder(e)
		}
	}
}

// pushOrder appends e to order, moving the live part to the front rather
// than growing when the front has room.
func (a *Actor) pushOrder(e *entry) {
	if a.head > 0 && len(a.order) == cap(a.order) {
		n := copy(a.order, a.order[a.head:])
		clear(a.order[n:])
		a.order, a.head = a.order[:n], 0
	}
	a.order = append(a.order, e)
}

// recycle keeps dead entry e for reuse, within bounds.
func (a *Actor) recycle(e *entry) {
	clear(e.followers)
	e.followers = e.followers[:0]
	e.settle = Settle{}
	e.scope, e.class = "", ""
	if cap(e.canon) > maxFreeCanon {
		e.canon = nil
	}
	e.canon = e.canon[:0]
	e.state.Store(entryOpen)
	if len(a.free) < maxFree {
		a.free = append(a.free, e)
	}
}

func (a *Actor) settleEntry(m *Settle) {
	e := m.entry
	if e == nil || a.table[e.digest] != e {
		return // settled twice: the entry may be another key's by now
	}
	delete(a.table, e.digest)
	for _, f := range e.followers {
		f.Outcome = m.outcome
		a.answer(f)
	}
	// Recycled from order, once swept.
	e.state.Store(entrySettled)
	a.tally.live.Add(-1)
	a.checkDrains()
}

// leaveEntry withdraws follower j, unless it was answered already.
func (a *Actor) leaveEntry(j *Join, why admission.Reason, cause error) {
	if j.answered || j.entry == nil {
		return
	}
	fs := j.entry.followers
	for i, f := range fs {
		if f == j {
			j.entry.followers = append(fs[:i], fs[i+1:]...)
			break
		}
	}
	j.Left, j.Cause = why, cause
	a.answer(j)
}

// answer sends follower j its final answer.
func (a *Actor) answer(j *Join) {
	j.answered = true
	j.gen++
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
	j.done <- struct{}{}
}
