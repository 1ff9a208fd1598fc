package dedup

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// parent spawns the dedup actor as its child, and records what the child
// tells it.
type parent struct {
	props  *actor.Props
	child  chan *actor.PID
	joined chan *Joined
}

func (p *parent) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.child <- ctx.Spawn(p.props)
	case *Joined:
		p.joined <- m
	}
}

type harness struct {
	sys    *actor.ActorSystem
	pid    *actor.PID
	clk    *clock.Mock
	joined chan *Joined
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	quiet := actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) })
	h := &harness{sys: actor.NewActorSystem(quiet), clk: clock.NewMock(), joined: make(chan *Joined, 100)}
	p := &parent{props: NewActor(h.clk, nil), child: make(chan *actor.PID, 1), joined: h.joined}
	h.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }))
	h.pid = <-p.child
	t.Cleanup(func() { h.sys.Shutdown() })
	return h
}

func (h *harness) join(k Key, hash Hash, wait time.Duration, call any) *Join {
	j := NewJoin()
	j.Key, j.Digest, j.Wait, j.Call = k, hash(k), wait, call
	h.sys.Root.Send(h.pid, j)
	j.AwaitRole()
	return j
}

func (h *harness) stats() (int64, int64) {
	q := NewStatsRequest()
	h.sys.Root.Send(h.pid, q)
	q.Await()
	return q.Active, q.Hits
}

func answered(t *testing.T, j *Join) {
	t.Helper()
	select {
	case <-j.Answered():
	case <-time.After(10 * time.Second):
		t.Fatal("follower not answered")
	}
}

func notAnswered(t *testing.T, j *Join) {
	t.Helper()
	select {
	case <-j.Answered():
		t.Fatal("follower answered early")
	default:
	}
}

func TestLeaderFollowersSettle(t *testing.T) {
	h := newHarness(t)
	k := Key{Scope: "s", Class: "c", Canon: "req"}
	lead := h.join(k, DefaultHash, 0, "L")
	if lead.Role != Leader {
		t.Fatalf("first join: role %v", lead.Role)
	}
	f1 := h.join(k, DefaultHash, 0, "F1")
	f2 := h.join(k, DefaultHash, 0, "F2")
	if f1.Role != Follower || f2.Role != Follower {
		t.Fatalf("roles %v %v", f1.Role, f2.Role)
	}
	for _, want := range []string{"F1", "F2"} {
		if j := <-h.joined; j.Call != want || j.Class != "c" || j.Scope != "s" {
			t.Fatalf("joined %+v, want %s", j, want)
		}
	}
	if a, hits := h.stats(); a != 1 || hits != 2 {
		t.Fatalf("stats %d %d", a, hits)
	}
	notAnswered(t, f1)
	h.sys.Root.Send(h.pid, lead.Settle("out"))
	answered(t, f1)
	answered(t, f2)
	if f1.Outcome != "out" || f2.Outcome != "out" || f1.Left != admission.NoReason {
		t.Fatalf("outcomes %v %v %v", f1.Outcome, f2.Outcome, f1.Left)
	}
	if a, hits := h.stats(); a != 0 || hits != 2 {
		t.Fatalf("stats after %d %d", a, hits)
	}
	// The key leads anew.
	if j := h.join(k, DefaultHash, 0, nil); j.Role != Leader {
		t.Fatalf("after settle: role %v", j.Role)
	}
}

func TestKeysPartition(t *testing.T) {
	h := newHarness(t)
	base := Key{Scope: "s", Class: "c", Canon: "req"}
	others := []Key{{Scope: "t", Class: "c", Canon: "req"}, {Scope: "s", Class: "d", Canon: "req"}, {Scope: "s", Class: "c", Canon: "req2"}}
	h.join(base, DefaultHash, 0, nil)
	for _, k := range others {
		if j := h.join(k, DefaultHash, 0, nil); j.Role != Leader {
			t.Fatalf("%+v: role %v", k, j.Role)
		}
	}
	if a, hits := h.stats(); a != 4 || hits != 0 {
		t.Fatalf("stats %d %d", a, hits)
	}
}

func TestCollisionRunsAlone(t *testing.T) {
	h := newHarness(t)
	same := func(Key) uint64 { return 7 }
	lead := h.join(Key{Canon: "a"}, same, 0, nil)
	other := h.join(Key{Canon: "b"}, same, 0, nil)
	if lead.Role != Leader || other.Role != Alone {
		t.Fatalf("roles %v %v", lead.Role, other.Role)
	}
	if a, hits := h.stats(); a != 1 || hits != 0 {
		t.Fatalf("a collision registered or joined: %d %d", a, hits)
	}
	// The same key still follows.
	if f := h.join(Key{Canon: "a"}, same, 0, nil); f.Role != Follower {
		t.Fatalf("same key: role %v", f.Role)
	}
}

func TestLeaveIsolated(t *testing.T) {
	h := newHarness(t)
	k := Key{Canon: "x"}
	lead := h.join(k, DefaultHash, 0, nil)
	f1 := h.join(k, DefaultHash, 0, nil)
	f2 := h.join(k, DefaultHash, 0, nil)
	cause := errors.New("gone")
	h.sys.Root.Send(h.pid, f1.Leave(cause))
	answered(t, f1)
	if f1.Left != admission.Aborted || f1.Cause != cause || f1.Outcome != nil {
		t.Fatalf("left %v %v %v", f1.Left, f1.Cause, f1.Outcome)
	}
	notAnswered(t, f2)
	h.sys.Root.Send(h.pid, lead.Settle(1))
	answered(t, f2)
	if f2.Outcome != 1 {
		t.Fatalf("f2 outcome %v", f2.Outcome)
	}
	// A leave after the answer changes nothing.
	h.sys.Root.Send(h.pid, f2.Leave(cause))
	if _, hits := h.stats(); hits != 2 || f2.Left != admission.NoReason {
		t.Fatalf("late leave: %v", f2.Left)
	}
}

func TestWaitBound(t *testing.T) {
	h := newHarness(t)
	k := Key{Canon: "x"}
	lead := h.join(k, DefaultHash, 0, nil)
	f := h.join(k, DefaultHash, 20*time.Millisecond, nil)
	g := h.join(k, DefaultHash, 50*time.Millisecond, nil)
	h.clk.Add(20 * time.Millisecond)
	answered(t, f)
	if f.Left != admission.Timeout || f.Cause != nil {
		t.Fatalf("f left %v %v", f.Left, f.Cause)
	}
	notAnswered(t, g)
	h.sys.Root.Send(h.pid, lead.Settle("v"))
	answered(t, g)
	// g's timer was stopped: moving past it changes nothing.
	h.clk.Add(time.Second)
	if g.Outcome != "v" || g.Left != admission.NoReason {
		t.Fatalf("g %v %v", g.Outcome, g.Left)
	}
	if a, _ := h.stats(); a != 0 {
		t.Fatalf("active %d", a)
	}
}

func TestHash(t *testing.T) {
	a, b := NewHash(1), NewHash(2)
	k := Key{Scope: "s", Class: "c", Canon: "k"}
	if a(k) == b(k) {
		t.Fatal("the seed changes nothing")
	}
	if a(k) != NewHash(1)(k) {
		t.Fatal("not deterministic for a seed")
	}
	// The separators keep the parts apart.
	if a(Key{Scope: "ab", Canon: "c"}) == a(Key{Scope: "a", Class: "b", Canon: "c"}) {
		t.Fatal("parts run together")
	}
	if n := testing.AllocsPerRun(100, func() { _ = a(k) }); n != 0 {
		t.Fatalf("hash allocates %v", n)
	}
	// One buffer laid out as scope 0x00 class 0x00 canon has the same
	// digest, short keys and keys over a block alike.
	long := Key{Scope: "tenant", Class: "batch", Canon: strings.Repeat("0123456789", 30)}
	for _, k := range []Key{k, {}, long} {
		laid := []byte(k.Scope + "\x00" + k.Class + "\x00" + k.Canon)
		if NewHashBytes(1)(laid) != a(k) || DefaultHashBytes(laid) != DefaultHash(k) {
			t.Fatalf("the digest of %q laid out in one buffer differs", laid)
		}
	}
	one := []byte("s\x00c\x00k")
	if n := testing.AllocsPerRun(100, func() { _ = DefaultHashBytes(one) }); n != 0 {
		t.Fatalf("hash of a buffer allocates %v", n)
	}
	buf := []byte("view")
	if View(buf) != "view" || View(nil) != "" {
		t.Fatal("View")
	}
}

// TestDrain: a drain is answered at once on an empty table; otherwise it
// waits until the last entry settles (a follower leaving does not end it),
// and a cancelled one is answered at once with the keys in flight.
func TestDrain(t *testing.T) {
	h := newHarness(t)
	drain := func() *Drain {
		q := NewDrain()
		h.sys.Root.Send(h.pid, q)
		return q
	}
	pending := func(q *Drain) bool {
		select {
		case <-q.Done():
			return false
		default:
			return true
		}
	}
	if q := drain(); pending(q) || q.Waited || q.Active != 0 {
		t.Fatalf("drain of an empty table: pending %v, %+v", pending(q), q)
	}
	a := h.join(Key{Canon: "a"}, DefaultHash, 0, nil)
	b := h.join(Key{Canon: "b"}, DefaultHash, 0, nil)
	f := h.join(Key{Canon: "a"}, DefaultHash, 0, nil)
	waiting, given := drain(), drain()
	h.sys.Root.Send(h.pid, given.Cancel())
	<-given.Done()
	if !given.Waited || given.Active != 2 {
		t.Fatalf("cancelled drain %+v, want 2 keys in flight", given)
	}
	h.sys.Root.Send(h.pid, f.Leave(nil))
	answered(t, f)
	h.sys.Root.Send(h.pid, a.Settle("a"))
	h.stats() // behind the settlement
	if !pending(waiting) {
		t.Fatal("drain answered with a key in flight")
	}
	h.sys.Root.Send(h.pid, b.Settle("b"))
	<-waiting.Done()
	if !waiting.Waited || waiting.Active != 0 {
		t.Fatalf("drain %+v", waiting)
	}
}

func (h *harness) entries() int64 {
	q := NewStatsRequest()
	h.sys.Root.Send(h.pid, q)
	q.Await()
	return q.Entries
}

// TestSettleAlone: a leader that no follower joined settles without a
// message: its key is no longer in flight at once, the next call of the
// key leads anew, and the dead entries are removed as calls register, so
// the table stays small however long another leader lives. A leader with
// a follower cannot settle alone.
func TestSettleAlone(t *testing.T) {
	h := newHarness(t)
	long := h.join(Key{Canon: "long-lived"}, DefaultHash, 0, nil)
	k := Key{Canon: "k"}
	first := h.join(k, DefaultHash, 0, nil)
	if settled, wake := first.SettleAlone(); !settled || wake {
		t.Fatalf("SettleAlone = %v, %v; want settled, no drain to wake", settled, wake)
	}
	if a, _ := h.stats(); a != 1 {
		t.Fatalf("active %d, want 1 (the long-lived leader)", a)
	}
	again := h.join(k, DefaultHash, 0, nil)
	if again.Role != Leader {
		t.Fatalf("after settling alone: role %v, want Leader", again.Role)
	}
	f := h.join(k, DefaultHash, 0, "F")
	if f.Role != Follower {
		t.Fatalf("role %v, want Follower", f.Role)
	}
	if settled, _ := again.SettleAlone(); settled {
		t.Fatal("a leader with a follower settled alone")
	}
	h.sys.Root.Send(h.pid, again.Settle("out"))
	answered(t, f)
	if f.Outcome != "out" {
		t.Fatalf("follower outcome %v", f.Outcome)
	}
	for i := range 1000 {
		j := h.join(Key{Canon: fmt.Sprint("key-", i)}, DefaultHash, 0, nil)
		if settled, _ := j.SettleAlone(); !settled {
			t.Fatalf("leader %d did not settle alone", i)
		}
	}
	if n := h.entries(); n > 4 {
		t.Fatalf("%d entries in the table with 1 key in flight", n)
	}
	if a, _ := h.stats(); a != 1 {
		t.Fatalf("active %d, want 1", a)
	}
	h.sys.Root.Send(h.pid, long.Settle(nil))
	if a, _ := h.stats(); a != 0 {
		t.Fatalf("active %d, want 0", a)
	}
}

// TestSettleAloneWakesDrain: a drain waiting for the last key in flight is
// woken when that key's leader settles alone.
func TestSettleAloneWakesDrain(t *testing.T) {
	h := newHarness(t)
	j := h.join(Key{Canon: "k"}, DefaultHash, 0, nil)
	q := NewDrain()
	h.sys.Root.Send(h.pid, q)
	sq := NewStatsRequest()
	h.sys.Root.Send(h.pid, sq) // behind the drain
	if sq.Await(); sq.Draining != 1 {
		t.Fatalf("%d drains waiting, want 1", sq.Draining)
	}
	settled, wake := j.SettleAlone()
	if !settled || !wake {
		t.Fatalf("SettleAlone = %v, %v; want settled and a drain to wake", settled, wake)
	}
	h.sys.Root.Send(h.pid, &WakeDrains{})
	<-q.Done()
	if !q.Waited || q.Active != 0 {
		t.Fatalf("drain %+v", q)
	}
}
