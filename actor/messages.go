package actor

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
	"github.com/llmbulkhead/bulkhead/clock"
)

// AcquireRequest is one admission attempt. The facade takes it from
// Engine.NewRequest, fills the input fields, passes it to Engine.Acquire and
// gives it back with Engine.PutRequest. The engine replies to it exactly
// once.
type AcquireRequest struct {
	// Ctx is the caller's context: it cancels waiting only. The admission
	// actor never calls its methods while it decides: Done is read on the
	// caller's goroutine when the request is sent, and Err and Cause
	// (guarded against panics) once it has ended; the workers of the remote
	// stages pass it to the Redis calls they make for the call (a panic
	// there is recovered into the call's verdict).
	Ctx context.Context
	// Request is the caller's request, opaque to the engine: it is only
	// carried on events.
	Request any
	// Priority selects the effective token budget.
	Priority admission.Priority
	// Reservation is the call's reservation, computed once by the facade;
	// Reserved is zero without a token budget.
	Reservation admission.Reservation
	// QueueTimeout bounds the wait in the queue; zero waits until Ctx ends.
	QueueTimeout time.Duration
	// Lease is where an admission is recorded; the facade provides it.
	Lease *Lease
	// Start is when the facade began work on the call, for decision timing;
	// zero when nobody listens for admit or reject events.
	Start time.Time
	// Class is the call's admission class, from Engine.LookupClass.
	Class classes.Class
	// BorrowedDeadline, when positive, bounds how long the admission may
	// keep a borrowed slot (Run's borrowed-slot deadline).
	BorrowedDeadline time.Duration
	// Shadow is observe mode's set of reasons to bypass instead of reject:
	// capacity reasons only (budget, concurrency, queue limits, timeout).
	// A call refused for one of them is answered with a bypass (Err nil,
	// Lease.Bypass set) that holds nothing. Empty for every other call.
	Shadow admission.ReasonSet
	// Follower, when set, makes the request the end of a dedup follower
	// rather than an admission attempt: its own wait ended (Aborted, with
	// FollowerCause, or Timeout) or its leader's value cannot be shared
	// (UnshareableResult). It is counted as a rejection of that reason,
	// with a reject event and no detail, and answered with it; or, when it
	// timed out in observe mode with Timeout shadowed and its context alive,
	// bypassed.
	Follower      admission.Reason
	FollowerCause error
	// Model is the call's model (the request's, else the bulkhead's own):
	// cool-downs, provider headroom and per-model rates are kept by model.
	Model string
	// Deadline is when Ctx's deadline falls on the engine's clock, zero
	// for none: a call that would have to wait past it (a cool-down, a
	// paced turn) is turned away at once.
	Deadline time.Time
	// Retry marks a retry of an earlier attempt: the retry budgets count
	// it against the first attempts, and in the queue first attempts go
	// ahead of it (for a while).
	Retry bool

	// Err is the rejection, nil when admitted. Set by the engine.
	Err error

	// Spare is the facade's: a value it keeps with the pooled request
	// across uses (the token a rejected call did not need). The engine
	// never reads it.
	Spare any

	// RateWait is how long the call waited for its rate-limit turn, set by
	// the engine and reported in its timing.
	RateWait time.Duration
	// Panic is set, with Err, when code run for the call's remote checks
	// (its context, a Redis hook) panicked: the facade panics with it on
	// the caller's goroutine.
	Panic any

	// async marks a request of AcquireAsync: its done channel is closed on
	// answer, and it is never pooled.
	async bool
	// cancelSent is set by Engine.Acquire when it withdrew the request: the
	// cancel message may still be in the mailbox, so the request must not
	// be reused.
	cancelSent bool

	// ctxDone is Ctx.Done() and ended why Ctx had ended (nil if it had
	// not), both read on the caller's goroutine before the request is sent:
	// the engine never calls Ctx's methods, which are user code, and only
	// looks at this channel.
	ctxDone <-chan struct{}
	ended   error

	done   chan struct{}
	cancel cancelMsg
	node   mpscNode

	// The engine's own fields, from here on: only the engine's goroutine
	// reads or writes them (the facade never does, reset included).

	// answered is set by the engine when it replies, and cleared as the
	// request's next use arrives.
	answered bool
	// gen counts the request's answers: a timer message carries the
	// generation it was armed for, and one for an earlier use (the request
	// answered, perhaps back in the pool or reused) is told by it before
	// anything else of the request is read.
	gen uint64

	// Owned by the engine while the request is queued: its place, its
	// push number and, for a retry set apart (apart), its push time.
	prev, next *AcquireRequest
	queued     bool
	apart      bool
	seq        uint64
	pushedAt   time.Time
	enqueuedAt time.Time
	// queuedAt is when a request with a queue timeout was queued.
	queuedAt time.Time
	timer    clock.Timer

	// The stages: arrival numbers the calls in the order they came;
	// turned is set once the call has booked its paced turn; parked while
	// it waits outside the queue (for its turn on its own timer, or for a
	// cool-down to end before it), since parkedAt and until parkUntil,
	// for parkFor; paced once counted in the rate statistics' Paced; held
	// once a cool-down held it back; checking while a remote stage decides
	// it; givingBack while the turn it gives back is being returned.
	arrival                               uint64
	turned, parked, paced, held, checking bool
	givingBack                            bool
	parkFor                               parkReason
	parkedAt, parkUntil                   time.Time
	parkSeq                               uint32   // counts its parks, to tell a stale timer message
	set                                   *rateSet // its rates, looked up once
	setDone                               bool
	// gone is the cause of a cancel message that came while the engine
	// held the request nowhere it could withdraw it from: while a remote
	// stage decided it (its verdict answers it), or before the request
	// itself (it is turned away as it arrives).
	gone error
}

// reset clears the facade's fields (and the answer) for the next use. It
// never writes a field of the engine's own (everything below done, from
// answered on): the engine settles those itself, before it answers (see
// state.answer) and as a new use arrives (state.acquire), and a timer
// message still on its way for an earlier use reads the generation alone,
// which only the engine writes, before it touches anything else.
func (r *AcquireRequest) reset() {
	r.Ctx, r.Request, r.Lease, r.Err = nil, nil, nil, nil
	r.ctxDone, r.ended = nil, nil
	r.Priority, r.Reservation, r.QueueTimeout = 0, admission.Reservation{}, 0
	r.Start = time.Time{}
	r.Class, r.BorrowedDeadline, r.Shadow = classes.None, 0, 0
	r.Follower, r.FollowerCause = admission.NoReason, nil
	r.Model, r.Deadline, r.RateWait, r.Panic = "", time.Time{}, 0, nil
	r.Retry = false
}

func (r *AcquireRequest) MailboxNode() *mpscNode { return &r.node }

// ctxEnded reports whether the request's context has ended, from its Done
// channel alone.
func (r *AcquireRequest) ctxEnded() bool {
	select {
	case <-r.ctxDone:
		return true
	default:
		return false // open, or nil: a context that never ends
	}
}

// cancelMsg asks the engine to withdraw a queued request whose context
// ended; cause is why, read by the sender.
type cancelMsg struct {
	r     *AcquireRequest
	cause error
	node  mpscNode
}

func (c *cancelMsg) MailboxNode() *mpscNode { return &c.node }

// timeoutMsg is a queue timeout firing for generation gen of r.
type timeoutMsg struct {
	r   *AcquireRequest
	gen uint64
}

// Lease is the engine's record of one admission. The facade embeds it in
// the token it hands out, so an admission costs one allocation.
//
// The exported fields are fixed when the call is admitted and never change.
// Everything else is owned by the engine.
type Lease struct {
	// ID is the admission ID.
	ID admission.ID
	// Revision is the limits revision the admission was decided under.
	Revision int64
	// Priority is the call's priority.
	Priority admission.Priority
	// Class is the call's admission class, "" without classes.
	Class string
	// Reservation is the call's reservation; zero without a budget.
	Reservation admission.Reservation
	// Resources is what the admission borrowed.
	Resources admission.Resources
	// Request is the admitted request, opaque to the engine.
	Request any
	// Bypass is set, instead of an admission, for a call that observe mode
	// runs without admitting it: it holds nothing, and its usage reports and
	// release only count in the observe statistics.
	Bypass *Bypass

	engine    *Engine
	releasing atomic.Bool
	rel       releaseMsg

	// provisional is set while an admission waits for the verdict of its
	// remote stages; timing is its decision timing, announced when it is
	// counted (its borrowed-slot deadline starts then too).
	provisional bool
	// model is the call's model; headGen the provider headroom report it
	// spent from (0: none), given back if it is rolled back.
	model   string
	headGen uint64
	// inFlight, epoch and admittedAt are noted at the grant, for the
	// adaptive limit's feedback: the calls in flight then (itself
	// included), the controller's epoch and, for the gradient rule, the
	// time.
	inFlight   int
	epoch      uint64
	admittedAt time.Time
	// booked is closed once an overrun the release booked on rates kept
	// in Redis is booked; nil when it booked none there.
	booked chan struct{}
	timing admission.Timing
	// shadow is the call's observe-mode shadow reasons: a rollback for one
	// of them bypasses instead of rejecting.
	shadow admission.ReasonSet

	held     int64
	sequence int64
	released bool
	// last is the cumulative usage last reported; reported is whether any
	// report has been made.
	last     admission.Usage
	reported bool

	classID   classes.Class
	abandoned bool
	// retry marks a retry's admission; retryBucket is the bucket of the
	// retry budgets' windows it was counted in (see retryStage.take).
	retry       bool
	retryBucket int64
	// deadline is the borrowed-slot deadline, zero when none runs; expired
	// is closed when it expires first. deadlineOff is set when EndDeadline
	// stopped it before the release: it can no longer expire.
	deadline    time.Duration
	expired     chan struct{}
	deadlineOff bool
}

// Bypass is what observe mode records of a call it bypassed.
type Bypass struct {
	// Reason is the rejection the call was spared.
	Reason admission.Reason
	// Race is true when the call was refused only after it had queued.
	Race bool
	// Detail is the capacity snapshot of the refusal.
	Detail *admission.RejectDetail
}

// Deadline returns the admission's borrowed-slot deadline and a channel
// closed when it expires before the admission ends; a nil channel when no
// deadline applies (none was asked for, or the slot was not borrowed).
func (l *Lease) Deadline() (time.Duration, <-chan struct{}) { return l.deadline, l.expired }

// Abandon gives the admission's borrowed slot back early. It
// returns true only on the first effective call, and only for a borrowed,
// unreleased admission.
func (l *Lease) Abandon() bool {
	if l.releasing.Load() {
		return false
	}
	q := &abandonRequest{l: l, done: make(chan struct{}, 1)}
	l.engine.call(q, q.done)
	return q.result
}

// Sync returns once the engine has handled every message sent before it,
// this lease's release included.
func (l *Lease) Sync() {
	q := &syncRequest{done: make(chan struct{}, 1)}
	l.engine.call(q, q.done)
}

// EndDeadline ends the admission's borrowed-slot deadline ahead of its
// release, so that what the call returns is settled before the release:
// it reports whether the deadline had expired first (the slot was then
// abandoned); when it reports false, the deadline never expires.
func (l *Lease) EndDeadline() (expired bool) {
	q := &endDeadlineRequest{l: l, done: make(chan struct{}, 1)}
	l.engine.call(q, q.done)
	select {
	case <-l.expired:
		return true
	default:
		return false
	}
}

// endDeadlineRequest asks to end a lease's borrowed-slot deadline.
type endDeadlineRequest struct {
	l    *Lease
	done chan struct{}
}

// abandonRequest asks to abandon a lease's borrowed slot.
type abandonRequest struct {
	l      *Lease
	result bool
	done   chan struct{}
}

// releaseMsg settles a lease. It lives inside the Lease, so releasing
// allocates nothing.
type releaseMsg struct {
	l        *Lease
	usage    admission.Usage
	hasUsage bool
	node     mpscNode
}

func (m *releaseMsg) MailboxNode() *mpscNode { return &m.node }

// settleUsage makes m's usage the final usage of its lease: the release's
// own, else the last report, if any.
func (m *releaseMsg) settleUsage() {
	if m.hasUsage && !m.usage.Valid() {
		m.hasUsage = false // the facade validates; never count a bad sum
	}
	if !m.hasUsage && m.l.reported {
		m.usage, m.hasUsage = m.l.last, true
	}
}

// Settled returns once the engine has handled the lease's release and,
// when the release booked an overrun on rates kept in Redis, once that is
// booked: the calls after it see it.
func (l *Lease) Settled() {
	l.Sync()
	if c := l.booked; c != nil {
		<-c
	}
}

// Released reports whether Release has been called on the lease.
func (l *Lease) Released() bool { return l.releasing.Load() }

// Release settles the lease: it returns the slot and the token hold and, when
// usage is not nil, records it. Only the first call has an effect; it returns
// true then and false on every later call.
func (l *Lease) Release(usage *admission.Usage) bool {
	if !l.releasing.CompareAndSwap(false, true) {
		l.engine.doubleReleases.Add(1)
		return false
	}
	l.rel.l = l
	if usage != nil {
		l.rel.usage, l.rel.hasUsage = *usage, true
	}
	l.engine.send(&l.rel)
	return true
}

// queueLeft is what is left at now of r's queue timeout: all of it for a
// call not queued yet, 0 for no bound.
func (r *AcquireRequest) queueLeft(now time.Time) time.Duration {
	if r.QueueTimeout <= 0 || !r.queued {
		return r.QueueTimeout
	}
	return max(time.Nanosecond, r.QueueTimeout-now.Sub(r.queuedAt))
}

// holdMsg tells the state that a hold's time has passed.
type holdMsg struct{ gen uint64 }

// pumpMsg tells the state to look at the queue again (see
// state.unblocked).
type pumpMsg struct{}

// wouldAdmitRequest asks for an advisory decision.
type wouldAdmitRequest struct {
	node        mpscNode
	class       classes.Class
	priority    admission.Priority
	reservation admission.Reservation
	model       string
	timeout     time.Duration // the bulkhead's queue timeout
	retry       bool
	detail      bool
	// why and snapshot are the answer: why the call would be turned away,
	// and the capacity snapshot when asked for (or while a cool-down may
	// run: see wouldAdmitRequest).
	why      admission.Reason
	snapshot *admission.RejectDetail
	// remote is the call's rates in Redis, for the caller to ask.
	remote *rateSet
	rates  *rateStage
	done   chan struct{}
}

// statsRequest asks for a copy of the statistics.
type statsRequest struct {
	result admission.Stats
	done   chan struct{}
}

// limitsRequest asks for the current limits.
type limitsRequest struct {
	result admission.Limits
	done   chan struct{}
}

// applyRequest asks to install a limits snapshot. With setBudget, the
// snapshot is the current one with Budget replaced and the revision raised
// by one.
type applyRequest struct {
	next      admission.Limits
	setBudget bool
	budget    int64
	result    admission.ApplyResult
	err       error
	done      chan struct{}
}

// closeRequest closes the engine.
type closeRequest struct{ done chan struct{} }

// syncRequest is only answered: a barrier behind every message sent before
// it.
type syncRequest struct{ done chan struct{} }

// drainRequest waits until the engine is idle. closed is whether the
// engine was closed when it answered.
type drainRequest struct {
	result admission.DrainResult
	closed bool
	done   chan struct{}
}

// drainCancel withdraws a drain request whose caller gave up.
type drainCancel struct{ d *drainRequest }

// subscribeRequest adds a listener.
type subscribeRequest struct {
	sub  *subscription
	done chan struct{}
}

// unsubscribeMsg removes a listener.
type unsubscribeMsg struct{ sub *subscription }

// eventsOffRequest stops the emission of events for good; flushed is
// closed once every event emitted before it has been delivered.
type eventsOffRequest struct {
	flushed chan struct{}
	done    chan struct{}
}

// usageRequest reports cumulative usage for a lease.
type usageRequest struct {
	node        mpscNode
	l           *Lease
	usage       admission.Usage
	progressive *admission.Progressive
	result      admission.UsageResult
	err         error
	done        chan struct{}
}

// fail answers a request whose handler panicked, with err where the request
// carries an error, and returns its reply channel.
func (q *applyRequest) fail(err error) chan struct{}  { q.err = err; return q.done }
func (q *usageRequest) fail(err error) chan struct{}  { q.err = err; return q.done }
func (q *wouldAdmitRequest) fail(error) chan struct{} { return q.done }
func (q *statsRequest) fail(error) chan struct{}      { return q.done }
func (q *limitsRequest) fail(error) chan struct{}     { return q.done }
func (q *closeRequest) fail(error) chan struct{}      { return q.done }
func (q *abandonRequest) fail(error) chan struct{}    { return q.done }
func (q *subscribeRequest) fail(error) chan struct{}  { return q.done }
func (q *eventsOffRequest) fail(error) chan struct{}  { return q.done }

// The pooled requests carry their own queue node: each is posted at most
// once per use, and reused only after its answer.
func (q *wouldAdmitRequest) MailboxNode() *mpscNode { return &q.node }
func (q *usageRequest) MailboxNode() *mpscNode      { return &q.node }
