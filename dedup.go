package bulkhead

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/dedup"
)

// DedupConfig configures in-flight deduplication (Config.Dedup).
//
// With it, identical Runs made while one of them is in flight share one
// execution: the first of a key is the leader and is admitted and runs as
// usual; a Run with the same key made before the leader has returned is a
// follower. A follower never calls its fn, holds no capacity (no slot, no
// tokens, no queue position) and has no admit or release event: it waits
// for the leader and returns the leader's value, or its error (a rejection
// of the leader included, with the follower's own tag). Followers may join
// while the leader waits in the queue. The leader's entry goes when its Run
// returns, however it returns, and before its admission is released (so
// that a Drain, or a listener of its ReleaseEvent, sees it gone): a later
// identical Run leads anew.
//
// A follower waits as long as its own context allows and, when it sets one
// with WithQueueTimeout, its own queue timeout; Config.QueueTimeout does not
// apply to it. When either ends first it is rejected Aborted or Timeout:
// counted in Stats, with a RejectEvent without detail. Its leader goes on,
// and so do the other followers. In Observe mode (see WithMode) a follower
// whose own queue timeout expires, with Timeout among its shadow reasons,
// runs its fn bypassed instead, unless the bulkhead is closed.
//
// A follower shares its leader's rejection whatever its cause, including
// causes of the leader's own: a leader rejected Aborted because its own
// context ended, Timeout because its own queue timeout (WithQueueTimeout
// or Config.QueueTimeout) expired, or Shutdown because Close rejected it
// in the queue, hands that rejection to every follower, even one whose
// context is alive or whose queue timeout is longer. The rejection is
// counted once, the leader's. A follower's Aborted or Timeout of this
// kind matches ErrLeaderRejected (its Cause says so, and names the
// leader's cause without matching it: errors.Is(err, context.Canceled)
// is false), so a caller that must not inherit them retries on it, and
// the retry joins anew or leads; NoDedup opts a call out altogether.
//
// When the leader's fn panics or calls
// runtime.Goexit, the followers get an error matching ErrLeaderPanicked
// (the panic goes on in the leader). With WithBorrowedDeadline, the
// followers get what the leader's Run returns: its *BorrowedDeadlineError
// when the deadline expires first, even as fn returns, else fn's outcome.
//
// Only Run deduplicates, and calls share only with calls of the same
// scope, class, priority, mode and reservation override: the same scope
// (WithDedupScope), with admission classes the same class, the same
// WithPriority, the same WithMode and shadow reasons (WithShadowReasons),
// and either no WithReservation or one that resolves to the same
// reservation. So a follower never gets a rejection (or a bypass) that
// depends on parameters of its leader's that are not its own. Its queue
// timeout, tag and borrowed-slot deadline may differ. NoDedup opts a call
// out. A
// call whose context has already ended is rejected Aborted without joining
// anything. After Close, a Run joins nothing: it is rejected Shutdown like
// any later call, while the followers that joined before Close still get
// their leader's outcome, and Drain waits until they have it (a leader
// rejected in the queue by Close releases nothing, yet Drain waits for
// it). Acquire never deduplicates.
//
// Keys are kept as a seeded 64-bit digest (xxhash64, seeded at random when
// the process starts), and the full key is compared when two digests
// match: a collision never hands a caller another call's result (the
// newcomer runs on its own). The key is stored until the leader returns,
// never logged or sent anywhere.
type DedupConfig struct {
	// KeyFunc returns a call's key: two calls with equal keys are
	// identical. A Request does not carry provider parameters
	// (temperature, tools, a response format...): when calls that differ
	// only in those may be in flight at once, the key must cover them,
	// here or per call with WithDedupKey. An empty key opts the call out. Nil means the default
	// key, a canonical encoding of every field of the Request (model,
	// system prompt, messages and their blocks, MaxTokens,
	// ExtraInputTokens): only requests equal in every field share. A
	// KeyFunc that panics opts the call out too; the panic is logged
	// (Config.Logger) and the call runs on its own.
	KeyFunc func(*Request) string

	// ShareResult, when set, gives each follower its own copy of the
	// leader's value: it is called once per follower (on the follower's
	// goroutine) with the leader's value, and the follower gets what it
	// returns, which must have the type of the follower's Run (or be nil
	// for an interface type). Its error fails that follower alone, with
	// that error; a panic in it goes on in that follower's Run, as fn's
	// would. The leader always gets the original value.
	//
	// Without it, followers share the leader's value itself, except a
	// value for a single consumer, which a follower cannot use: an
	// io.Reader, a channel, a *http.Response with a Body other than
	// http.NoBody, or an iterator (a function of the shape of iter.Seq or
	// iter.Seq2). A follower then gets a rejection UnshareableResult. Only
	// the value itself is inspected, not what it contains.
	ShareResult func(any) (any, error)
}

// DedupStats is in-flight deduplication's part of the statistics.
type DedupStats struct {
	// Active is the number of distinct keys in flight: leaders not yet
	// returned.
	Active int64
	// Hits counts the Runs that joined a leader as followers.
	Hits int64
}

// DedupEvent is emitted when a Run joins an identical call in flight as a
// follower (see DedupConfig). A follower has no other event, unless it
// ends on its own (a RejectEvent without detail) or runs bypassed.
type DedupEvent struct {
	// Request is the follower's request, as the caller passed it.
	Request *Request
	// Tag is the follower's tag (see WithTag), "" for none.
	Tag string
	// Class is its admission class, "" without classes.
	Class string
	// Scope is its dedup scope (see WithDedupScope), "" for none.
	Scope string
}

// ErrLeaderRejected matches the rejection of a deduplicated follower that
// shares its leader's own Aborted (the leader's context ended) or Timeout
// (the leader's queue timeout expired), as the error's Cause: the
// follower's own wait had not ended, so a retry may well succeed (it joins
// anew, or leads). Such a rejection does not match the leader's context
// error (context.Canceled, say): the follower's context is its own.
var ErrLeaderRejected = errors.New("bulkhead: " + leaderRejected)

const leaderRejected = "the identical call in flight was rejected for a cause of its own"

// leaderCause is the Cause of a follower's copy of its leader's own
// Aborted or Timeout: it matches ErrLeaderRejected and names the leader's
// cause without wrapping it.
type leaderCause struct{ cause error }

func (c leaderCause) Error() string {
	if c.cause == nil {
		return leaderRejected
	}
	return leaderRejected + " (" + c.cause.Error() + ")"
}

func (c leaderCause) Is(target error) bool { return target == ErrLeaderRejected }

// ErrLeaderPanicked matches the error of a deduplicated follower whose
// leader's fn panicked or called runtime.Goexit, so that no result came.
// The message carries the panic value.
var ErrLeaderPanicked = errors.New("bulkhead: the identical call in flight panicked")

type noDedupOption struct{}

func (noDedupOption) apply(o callOptions) callOptions {
	o.noDedup = true
	return o
}

// NoDedup makes a Run neither join an identical call in flight nor let
// others join it: it runs on its own. It changes nothing without
// Config.Dedup. Run only.
func NoDedup() Option { return noDedupOption{} }

type dedupScopeOption string

func (s dedupScopeOption) apply(o callOptions) callOptions {
	o.dedupScope, o.hasDedupScope = string(s), true
	return o
}

// WithDedupScope puts a Run in dedup scope scope: it shares results only
// with Runs of the same scope (a tenant, say), however identical their
// requests. The default scope is "". Run only, with Config.Dedup set.
func WithDedupScope(scope string) Option { return dedupScopeOption(scope) }

type dedupKeyOption string

func (k dedupKeyOption) apply(o callOptions) callOptions {
	o.dedupKey, o.hasDedupKey = string(k), true
	return o
}

// WithDedupKey gives a Run its dedup key, in place of Config.Dedup.KeyFunc
// or the default key: Runs with equal keys (and equal scope, class,
// priority, mode and reservation override, see DedupConfig) share one
// execution, and an empty key opts the call out. Use it when what
// makes two calls identical is not all in the Request, such as provider
// parameters (temperature, tools, a response format): the Key of a call
// read with package stream covers every field of the provider request.
// Run only, with Config.Dedup set.
func WithDedupKey(key string) Option { return dedupKeyOption(key) }

// deduper is a bulkhead's deduplication: its configuration and its key
// buffers. The table is the dedup actor's.
type deduper struct {
	keyFunc func(*Request) string
	share   func(any) (any, error)
	// hash is a key's digest; hashBytes is the same digest of a key laid
	// out in one buffer, nil when a test replaces hash.
	hash      dedup.Hash
	hashBytes func([]byte) uint64
	bufs      sync.Pool
	// leaders keeps the leaders that settled alone.
	leaders sync.Pool
}

func newDeduper(cfg DedupConfig) *deduper {
	d := &deduper{keyFunc: cfg.KeyFunc, share: cfg.ShareResult, hash: dedup.DefaultHash, hashBytes: dedup.DefaultHashBytes}
	d.bufs.New = func() any { return new([]byte) }
	d.leaders.New = func() any { return new(leader) }
	return d
}

// maxPooledKey is the largest key buffer kept for reuse: a huge request
// does not pin its buffer.
const maxPooledKey = 64 << 10

// key returns the call's dedup key, partitioned by scope and class, and
// its digest. The key is in a pooled buffer to put back once it is no
// longer read: scope 0x00 class 0x00, then the key's Canon: the
// parameters of r that decide its admission (see appendPartition) and its
// key (o's, KeyFunc's or the default one). It returns no buffer when the
// call opts out.
func (d *deduper) key(b *Bulkhead, req *Request, r *actor.AcquireRequest, o *callOptions, class string) (k dedup.Key, digest uint64, buf *[]byte) {
	key, user := o.dedupKey, o.hasDedupKey
	if !user && d.keyFunc != nil {
		key, user = d.userKey(b, req), true
	}
	if user && key == "" {
		return dedup.Key{}, 0, nil
	}
	buf = d.bufs.Get().(*[]byte)
	all := append((*buf)[:0], o.dedupScope...)
	all = append(all, 0)
	all = append(all, class...)
	all = append(all, 0)
	off := len(all)
	all = appendPartition(all, r, o)
	if user {
		all = append(all, key...)
	} else {
		all = appendCanonical(all, req)
	}
	*buf = all
	k = dedup.Key{Scope: o.dedupScope, Class: class, Canon: dedup.View(all[off:])}
	if d.hashBytes != nil {
		return k, d.hashBytes(all), buf
	}
	return k, d.hash(k), buf
}

// appendPartition appends the parameters of a call that its admission
// depends on, besides its scope and class: its priority, its mode and
// shadow reasons, whether it is a retry (a retry budget may refuse it), and
// its reservation when WithReservation overrides it (as reserve resolved
// it). Only calls with equal
// parameters share, so a follower never gets a rejection that it, alone,
// would not get for these. Fixed size but for the override.
func appendPartition(buf []byte, r *actor.AcquireRequest, o *callOptions) []byte {
	retry := byte(0)
	if r.Retry {
		retry = 1
	}
	buf = append(buf, byte(r.Priority), byte(o.mode), byte(r.Shadow), byte(r.Shadow>>8), retry)
	if o.reservation == nil {
		return append(buf, 0)
	}
	buf = append(buf, 1)
	buf = binary.AppendVarint(buf, r.Reservation.Input)
	buf = binary.AppendVarint(buf, r.Reservation.MaxOutput)
	return binary.AppendVarint(buf, r.Reservation.Reserved)
}

func (d *deduper) putBuffer(buf *[]byte) {
	if buf != nil && cap(*buf) <= maxPooledKey {
		d.bufs.Put(buf)
	}
}

// userKey calls KeyFunc; a panic is logged and opts the call out.
func (d *deduper) userKey(b *Bulkhead, req *Request) (key string) {
	defer func() {
		if p := recover(); p != nil {
			b.eng.LogError("bulkhead: Config.Dedup.KeyFunc panicked; the call runs without deduplication", "panic", p)
			key = ""
		}
	}()
	return d.keyFunc(req)
}

// appendCanonical appends the default key of r to buf: every field of the
// request, in a fixed order, strings length-prefixed and integers as
// varints, so that two requests have equal keys exactly when they are equal
// field by field. (A test checks that it covers every field.)
func appendCanonical(buf []byte, r *Request) []byte {
	buf = append(buf, 1) // the encoding's version
	buf = appendString(buf, r.Model)
	buf = appendString(buf, r.System)
	buf = appendBlocks(buf, r.SystemBlocks)
	buf = binary.AppendUvarint(buf, uint64(len(r.Messages)))
	for i := range r.Messages {
		m := &r.Messages[i]
		buf = appendString(buf, m.Role)
		buf = appendString(buf, m.Content)
		buf = appendBlocks(buf, m.Blocks)
	}
	buf = binary.AppendVarint(buf, r.MaxTokens)
	return binary.AppendVarint(buf, r.ExtraInputTokens)
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

func appendBlocks(buf []byte, bs []Block) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(bs)))
	for i := range bs {
		buf = appendString(buf, bs[i].Type)
		buf = appendString(buf, bs[i].Text)
	}
	return buf
}

// shared is a leader's outcome, as its followers get it.
type shared struct {
	v   any
	err error
	// typ is the type of the leader's Run.
	typ reflect.Type
	// failed says fn panicked (with panicValue) or called runtime.Goexit
	// (panicValue nil).
	failed     bool
	panicValue any
}

// join places a deduplicated Run prepared as r: nil when it does not take
// part (an empty key, or a context already ended, which admission rejects
// at once), else its Join, with its role.
func (b *Bulkhead) join(ctx context.Context, req *Request, r *actor.AcquireRequest, o *callOptions) *dedup.Join {
	if done := ctx.Done(); done != nil {
		select {
		case <-done:
			return nil
		default:
		}
	}
	d := b.dedup
	key, digest, buf := d.key(b, req, r, o, b.eng.ClassName(r.Class))
	if buf == nil {
		return nil
	}
	defer d.putBuffer(buf)
	j := b.eng.NewJoin()
	j.Key, j.Digest = key, digest
	j.Call = r.Request
	if o.hasQueueTimeout {
		j.Wait = o.queueTimeout
	}
	b.eng.Join(j)
	return j
}

// runDedup is Run with deduplication on.
func runDedup[T any](ctx context.Context, b *Bulkhead, req *Request, fn func(context.Context, *RunContext) (T, error), o *callOptions) (T, error) {
	var zero T
	r, p, err := b.prepare(ctx, req, o, "Run", b.eng.NewRequest)
	if err != nil {
		return zero, err
	}
	j := b.join(ctx, req, r, o)
	switch {
	case j != nil && j.Role == dedup.Leader:
		return lead(ctx, b, r, p, o, fn, j)
	case j != nil && j.Role == dedup.Follower:
		return follow(ctx, b, r, p, o, fn, j)
	case j != nil:
		b.eng.PutJoin(j) // alone: the actor is done with it
	}
	if p, err = b.send(r, p, o.tag); err != nil {
		return zero, err
	}
	return runPermit(ctx, p, fn)
}

// lead runs a leader, and settles its entry with its outcome however its
// Run returns: with a value or an error (a rejection included), a panic
// (which goes on) or runtime.Goexit. When fn runs, the entry is settled
// before the admission is released (see leadAdmitted), so that whoever
// sees the release, a Drain included, sees the entry gone.
func lead[T any](ctx context.Context, b *Bulkhead, r *actor.AcquireRequest, p *Permit, o *callOptions, fn func(context.Context, *RunContext) (T, error), j *dedup.Join) (v T, err error) {
	d := b.dedup
	l := d.leaders.Get().(*leader)
	l.b, l.j, l.typ = b, j, reflect.TypeFor[T]()
	returned, detached := false, false
	defer func() {
		if returned {
			settle(l, v, err)
		} else if l.claim() {
			pv := recover()
			l.settleFailed(pv)
			d.putLeader(l, detached)
			if pv != nil {
				panic(pv)
			}
			return
		} // else settled by leadAdmitted: the panic or Goexit goes on
		d.putLeader(l, detached)
	}()
	p, err = b.send(r, p, o.tag)
	if err == nil {
		rc := &p.run
		rc.p = p
		if _, expired := p.l.Deadline(); expired != nil {
			detached = true // fn's goroutine may outlive this Run
			v, err = runWithDeadline(ctx, p, fn, l)
		} else {
			v, err = leadAdmitted(ctx, p, fn, l, nil)
		}
	}
	returned = true
	return v, err
}

// leader is a leader's entry, settled once: by the goroutine that ran fn,
// before its release, or by lead when its Run ends first (a rejection, or
// a borrowed-slot deadline that expired while fn runs). It carries the
// outcome its followers get, so that a leader allocates it once.
type leader struct {
	b       *Bulkhead
	j       *dedup.Join
	typ     reflect.Type
	claimed atomic.Bool
	// out is written once claimed, and read by the followers once settled.
	out shared
	// alone says it settled without followers, so that nothing reads out.
	alone bool
}

// putLeader keeps l for the next leader when nothing can read it any more:
// it settled without followers, and fn's goroutine, when it ran on its own
// (detached), cannot outlive the Run.
func (d *deduper) putLeader(l *leader, detached bool) {
	// detached first: fn's goroutine may be settling l right now.
	if !detached && l.alone {
		*l = leader{}
		d.leaders.Put(l)
	}
}

// claim reports whether the caller is the one to settle.
func (l *leader) claim() bool { return l.claimed.CompareAndSwap(false, true) }

// settle settles l's entry with v and err, unless it is settled already.
// The value is boxed only when it is the one the followers get.
func settle[T any](l *leader, v T, err error) {
	if l.claim() {
		l.out.v, l.out.err = v, err
		l.settleClaimed()
	}
}

// settleFailed settles l's entry, once claimed, for a fn that panicked
// with pv (nil: it called runtime.Goexit).
func (l *leader) settleFailed(pv any) {
	l.out.failed, l.out.panicValue = true, pv
	l.settleClaimed()
}

// settleClaimed sends l.out to the followers, once claimed and written.
func (l *leader) settleClaimed() {
	l.out.typ = l.typ
	l.alone = l.b.eng.Settle(l.j, &l.out)
	l.b.eng.PutJoin(l.j)
}

// leadAdmitted is runAdmitted for a leader: it settles the entry with fn's
// outcome before it releases p. expired, when not nil, is the channel of
// the admission's borrowed-slot deadline: once fn returns, the deadline is
// ended before the entry settles, so that the followers get what Run
// returns: the deadline error when it expired first, else fn's outcome.
func leadAdmitted[T any](ctx context.Context, p *Permit, fn func(context.Context, *RunContext) (T, error), l *leader, expired <-chan struct{}) (v T, err error) {
	rc := &p.run
	returned := false
	defer func() {
		var u *admission.Usage
		if !returned {
			pv := recover()
			if l.claim() {
				l.settleFailed(pv)
			}
			p.release(nil)
			if pv != nil {
				panic(pv)
			}
			return
		}
		if expired != nil && p.l.EndDeadline() {
			// The deadline expired first: Run returns its error, and so
			// do the followers. Otherwise it can no longer expire, so
			// Run returns fn's outcome, as the followers do.
			deadline, _ := p.l.Deadline()
			var zero T
			settle[T](l, zero, deadlineError(p, deadline))
		} else {
			settle(l, v, err)
		}
		if err == nil && rc.hasUsage {
			u = (*admission.Usage)(&rc.usage)
		}
		p.release(u)
	}()
	v, err = fn(ctx, rc)
	returned = true
	return v, err
}

// follow waits for a follower's outcome and returns it as the follower's
// own: the leader's value (or ShareResult's copy of it), or error.
func follow[T any](ctx context.Context, b *Bulkhead, r *actor.AcquireRequest, p *Permit, o *callOptions, fn func(context.Context, *RunContext) (T, error), j *dedup.Join) (T, error) {
	var zero T
	reusable := b.eng.Follow(ctx, j)
	left, cause, outcome := j.Left, j.Cause, j.Outcome
	if reusable {
		b.eng.PutJoin(j)
	}
	if left != admission.NoReason {
		return followerEnd(ctx, b, r, p, o, fn, left, cause)
	}
	s := outcome.(*shared)
	want := reflect.TypeFor[T]()
	switch {
	case s.failed:
		b.unused(r, p)
		if s.panicValue == nil {
			return zero, fmt.Errorf("%w: it called runtime.Goexit", ErrLeaderPanicked)
		}
		return zero, fmt.Errorf("%w: %v", ErrLeaderPanicked, s.panicValue)
	case s.err != nil:
		b.unused(r, p)
		return zero, sharedError(s.err, o.tag)
	case s.typ != want:
		b.unused(r, p)
		return zero, invalidf("Run", "an identical call in flight returns %v, this one %v: give them different keys or scopes", s.typ, want)
	}
	if b.dedup.share != nil {
		b.unused(r, p)
		x, err := b.dedup.share(s.v)
		if err != nil {
			return zero, err
		}
		v, ok := as[T](x)
		if !ok {
			return zero, invalidf("Config.Dedup.ShareResult", "returned %T for a Run of %v", x, want)
		}
		return v, nil
	}
	if unshareable(s.v) {
		return followerEnd(ctx, b, r, p, o, fn, admission.UnshareableResult, nil)
	}
	b.unused(r, p)
	v, _ := as[T](s.v)
	return v, nil
}

// followerEnd ends a follower on its own, for why: a rejection, counted
// and emitted, or in observe mode a bypass, after which fn runs.
func followerEnd[T any](ctx context.Context, b *Bulkhead, r *actor.AcquireRequest, p *Permit, o *callOptions, fn func(context.Context, *RunContext) (T, error), why admission.Reason, cause error) (T, error) {
	r.Follower, r.FollowerCause = why, cause
	p, err := b.send(r, p, o.tag) // a follower's end runs no remote check
	if err != nil {
		var zero T
		return zero, err
	}
	return runPermit(ctx, p, fn)
}

// unused gives back the request a follower did not send, with its permit.
func (b *Bulkhead) unused(r *actor.AcquireRequest, p *Permit) {
	r.Spare = p
	b.eng.PutRequest(r)
}

// as returns x as a T: x's own value, or the zero T for a nil x when T is
// an interface type.
func as[T any](x any) (T, bool) {
	v, ok := x.(T)
	if !ok && x == nil && reflect.TypeFor[T]().Kind() == reflect.Interface {
		return v, true
	}
	return v, ok
}

// sharedError is a leader's error as a follower gets it: a rejection or a
// deadline error copied with the follower's own tag, anything else as is.
// A rejection for the leader's own context or queue timeout says so in its
// Cause (see ErrLeaderRejected).
func sharedError(err error, tag string) error {
	switch e := err.(type) {
	case *RejectedError:
		c := *e
		c.Tag = tag
		if c.Reason == Aborted || c.Reason == Timeout {
			c.Cause = leaderCause{cause: e.Cause}
		}
		return &c
	case *BorrowedDeadlineError:
		c := *e
		c.Tag = tag
		return &c
	}
	return err
}

// unshareable reports whether v is for a single consumer: an io.Reader, a
// channel, a *http.Response with a body, or an iterator function.
func unshareable(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case *http.Response:
		return x != nil && x.Body != nil && x.Body != http.NoBody
	case io.Reader:
		return true
	}
	t := reflect.TypeOf(v)
	switch t.Kind() {
	case reflect.Chan:
		return true
	case reflect.Func:
		return isIterator(t)
	}
	return false
}

// isIterator reports whether t has the shape of iter.Seq or iter.Seq2:
// func(yield func(...) bool), yield taking one or two values.
func isIterator(t reflect.Type) bool {
	if t.NumIn() != 1 || t.NumOut() != 0 {
		return false
	}
	y := t.In(0)
	return y.Kind() == reflect.Func && (y.NumIn() == 1 || y.NumIn() == 2) && y.NumOut() == 1 && y.Out(0).Kind() == reflect.Bool
}
