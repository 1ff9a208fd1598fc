package actor

import (
	"context"
	"fmt"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/adaptive"
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// The admission pipeline, in the order every call meets its stages:
//
//  1. closed, then the caller's context (validation is the facade's);
//  2. a cool-down or the provider's headroom: a call that may not wait for
//     it (ShedCooldown, or it outlasts the call's queue timeout or
//     deadline) is turned away Cooldown; one that may is held back, in
//     the queue after the capacity checks (or, paced, parked on a timer
//     before its turn);
//  3. the token budget and the class limits, then the slot or the queue
//     (fair across classes, waiting for capacity);
//  4. a paced call's rate turn, booked before it takes a slot or a place
//     in the queue: it waits on a timer until its turn comes;
//  5. at the grant, with the slot held: the cool-down again, the headroom
//     spent, and the rate decided (in-process rates, not paced; with a
//     fleet pool, once the pool has taken the hold, so that a fleet
//     refusal spends no rate turn);
//  6. the remote stages, after the slot: the fleet pool, then a rate
//     (kept in Redis; an in-process one is decided as the verdict
//     arrives). The admission is provisional meanwhile (it holds its
//     slot and tokens, is announced only when confirmed, and Drain waits
//     for it); a worker makes the Redis calls, and its verdict comes back
//     as a message, which confirms the admission or rolls it back, with
//     every refund, here.
//
// Feedback (a provider's answer) arrives as a message too: it starts
// cool-downs, replaces headroom reports and moves the adaptive limit.

// stageConfig is what the stages need from the engine's Config.
type stageConfig struct {
	model    string
	shed     bool
	adaptive *Adaptive
	rates    *Rates
	fleet    *fleet.Pool
}

// parkReason is why a call waits on its own timer.
type parkReason uint8

const (
	parkCooldown parkReason = iota // a paced call waits a cool-down out before its turn
	parkTurn                       // a paced call waits for its turn
)

// parkMsg is a parked call's timer firing for generation gen and its
// park seq (a later park of the same call, or an earlier wake, makes it
// stale).
type parkMsg struct {
	r   *AcquireRequest
	gen uint64
	seq uint32
}

// remoteKind is what a remote job decides.
type remoteKind uint8

const (
	remoteAdmit remoteKind = iota // a provisional admission's fleet hold, then its rate
	remoteTurn                    // a paced call's turn on a remote store
)

// remoteJob is a call's remote stages, run on a worker goroutine (never
// inside the actor), and then its verdict, which comes back as the
// message.
type remoteJob struct {
	r       *AcquireRequest
	kind    remoteKind
	set     *rateSet // the call's rates on a remote store, nil for none
	fleet   *fleetStage
	rates   *rateStage
	maxWait time.Duration // remoteTurn: the latest turn the call may take

	why   admission.Reason
	ext   *admission.External
	cause error
	delay time.Duration // remoteTurn: how long until the turn
	panic any
}

// run makes the job's Redis calls with the caller's context. A panic (of
// the caller's context, of a Redis hook) is recovered into the verdict.
func (j *remoteJob) run() {
	defer func() {
		if p := recover(); p != nil {
			j.panic, j.why, j.ext = p, admission.Aborted, nil
			j.cause = fmt.Errorf("bulkhead: panic during the admission's checks: %v", p)
		}
	}()
	ctx := j.r.Ctx
	reserved := j.r.Reservation.Reserved
	switch j.kind {
	case remoteAdmit:
		if j.fleet != nil {
			j.why, j.ext, j.cause = j.fleet.reserve(ctx, j.r.Lease)
		}
		if j.why == admission.NoReason && j.set != nil {
			j.why, j.ext, j.cause = j.rates.decide(ctx, j.set, reserved)
		}
	case remoteTurn:
		j.delay, j.why, j.ext, j.cause = j.rates.pace(ctx, j.set, reserved, j.maxWait)
	}
}

var background = context.Background()

// rateSet returns r's rates, looked up once per call; nil when none apply
// (or the bulkhead has none).
func (s *state) rateSet(r *AcquireRequest) (*rateSet, error) {
	if s.rates == nil {
		return nil, nil
	}
	if !r.setDone {
		set, err := s.rates.set(r.Model, s.tab.Name(r.Class))
		if err != nil {
			return nil, err
		}
		r.set, r.setDone = set, true
	}
	return r.set, nil
}

// paced reports whether r takes a paced turn before its slot.
func (s *state) paced(r *AcquireRequest) bool {
	if s.rates == nil || !s.rates.cfg.Pace || r.turned {
		return false
	}
	set, err := s.rateSet(r)
	return err == nil && set != nil
}

// late reports whether r may not wait d from now: it outlasts what is left
// of its queue timeout, or its context's deadline.
func late(r *AcquireRequest, d time.Duration, now time.Time) bool {
	if r.QueueTimeout > 0 && d >= r.QueueTimeout {
		return true
	}
	return !r.Deadline.IsZero() && r.Deadline.Sub(now) < d
}

// cooldownStage is stage 2 for a new call: it turns r away or parks it
// when its model is cooling down (or it does not fit the headroom), and
// reports whether it did. A call that may wait in the queue goes on: the
// queue holds it after the capacity checks (holdFor).
func (s *state) cooldownStage(r *AcquireRequest) bool {
	if !s.cool.armed() || r.turned {
		return false
	}
	now := s.fx.now()
	d, _, ok := s.cool.left(r.Model, r.Reservation.Reserved, now, false)
	switch {
	case !ok:
		return false
	case s.cool.shed || late(r, d.RetryAfter, now):
		s.rejectCooldown(r, d)
		return true
	case s.paced(r):
		// Before its turn, not after it, so paced calls stay spaced when
		// the cool-down ends.
		s.markHeld(r)
		s.park(r, d.RetryAfter, parkCooldown)
		return true
	}
	return false
}

// holdFor is how long waiter r must be held back in the queue for its
// model's cool-down (HoldCooldown), 0 when it need not be, or when the
// cool-down outlasts what is left of its queue timeout (the check at the
// grant then turns it away).
func (s *state) holdFor(r *AcquireRequest) time.Duration {
	if !s.cool.armed() || s.cool.shed {
		return 0
	}
	now := s.fx.now()
	d, _, ok := s.cool.left(r.Model, r.Reservation.Reserved, now, false)
	if !ok {
		return 0
	}
	if limit := r.queueLeft(now); limit > 0 && d.RetryAfter >= limit {
		return 0
	}
	return d.RetryAfter
}

// markHeld counts r held back by a cool-down, once however many times it
// is.
func (s *state) markHeld(r *AcquireRequest) {
	if !r.held {
		r.held = true
		s.cool.held++
	}
}

// turnStage is stage 4: a paced call books its turn, no later than its
// queue timeout and deadline allow. It reports whether r is done with for
// now: turned away, parked until its turn, or waiting for a remote store.
func (s *state) turnStage(r *AcquireRequest) bool {
	if !s.paced(r) {
		return false
	}
	r.turned = true
	now := s.fx.now()
	maxWait := time.Duration(1<<63 - 1)
	if r.QueueTimeout > 0 {
		// A turn must leave some of the queue timeout for the slot: zero
		// would mean no timeout at all.
		maxWait = r.QueueTimeout - time.Microsecond
	}
	if !r.Deadline.IsZero() {
		maxWait = min(maxWait, r.Deadline.Sub(now))
	}
	maxWait = max(0, maxWait) // 0: only a turn free now
	if s.rates.remote {
		r.checking = true
		s.checking++
		s.fx.startRemote(&remoteJob{r: r, kind: remoteTurn, set: r.set, rates: s.rates, maxWait: maxWait})
		return true
	}
	s.rates.setTime(now)
	delay, why, ext, cause := s.rates.pace(background, r.set, r.Reservation.Reserved, maxWait)
	return s.turned(r, delay, why, ext, cause)
}

// turned goes on with r once its turn is booked (or refused): it reports
// whether r is done with for now.
func (s *state) turned(r *AcquireRequest, delay time.Duration, why admission.Reason, ext *admission.External, cause error) bool {
	switch {
	case why != admission.NoReason:
		s.rejectStage(r, why, ext, cause)
	case delay > 0:
		s.park(r, delay, parkTurn)
	default:
		return false
	}
	return true
}

// park makes r wait d on its own timer, outside the queue (it holds no
// place there, and nothing else).
func (s *state) park(r *AcquireRequest, d time.Duration, why parkReason) {
	r.parked, r.parkFor, r.parkedAt = true, why, s.fx.now()
	r.parkUntil = r.parkedAt.Add(d)
	r.parkSeq++
	s.parkedLine.push(r)
	s.nparked++
	s.fx.armPark(r, d)
}

// unparkRequest takes r off the parked line and stops its timer.
func (s *state) unparkRequest(r *AcquireRequest) {
	s.parkedLine.remove(r)
	s.nparked--
	r.parked = false
	s.fx.stopTimer(r)
}

// unpark goes on with r once its timer has fired: what it waited comes off
// its queue timeout (and, for a turn, is its rate wait), and its decision
// timing starts again. A call whose context has ended stays parked: its
// cancel message, with the context's cause, is on its way.
//
// Calls held back by a cool-down wait until the same moment, and timers
// due together fire in no set order: when one of them wakes, every call
// of the parked line whose cool-down wait is over goes on with it, in the
// order they were parked, so that they take their turns in arrival order.
func (s *state) unpark(m *parkMsg) {
	r := m.r
	// The generation first: a message for an earlier use of r reads
	// nothing else of it (its caller may be reusing it).
	if r.gen != m.gen || r.parkSeq != m.seq || !r.parked || r.ctxEnded() {
		return // answered or woken before the timer's message arrived, or being cancelled
	}
	now := s.fx.now()
	if r.parkFor != parkCooldown {
		s.resume(r, now)
		return
	}
	var due []*AcquireRequest
	for q := s.parkedLine.head; q != nil; q = q.next {
		if q == r || (q.parkFor == parkCooldown && !q.parkUntil.After(now) && !q.ctxEnded()) {
			due = append(due, q)
		}
	}
	for _, q := range due {
		if q.parked { // what went before may have answered it (Close)
			s.resume(q, now)
		}
	}
}

// resume goes on with parked r at now.
func (s *state) resume(r *AcquireRequest, now time.Time) {
	s.unparkRequest(r)
	waited := s.waited(r, now)
	if r.QueueTimeout > 0 {
		r.QueueTimeout = max(time.Microsecond, r.QueueTimeout-waited)
	}
	if r.parkFor == parkTurn {
		r.RateWait += waited
	}
	if !r.Start.IsZero() {
		r.Start = now
	}
	if s.closed {
		s.reject(r, admission.Shutdown, true, nil, "")
		return
	}
	s.proceed(r)
}

// waited returns how long parked r has waited by now, and counts a paced
// turn's wait.
func (s *state) waited(r *AcquireRequest, now time.Time) time.Duration {
	waited := max(0, now.Sub(r.parkedAt))
	if r.parkFor == parkTurn {
		s.rates.paced.Add(1)
		s.rates.pacedNs.Add(int64(waited))
	}
	return waited
}

// verdict takes in a remote job's verdict.
func (s *state) verdict(j *remoteJob) {
	r := j.r
	r.checking = false
	switch j.kind {
	case remoteTurn:
		s.checking--
		if j.panic != nil {
			r.Panic = j.panic
		}
		switch {
		case s.closed && j.why == admission.NoReason:
			s.reject(r, admission.Shutdown, true, nil, "")
		case r.gone != nil && j.why == admission.NoReason:
			// Its caller left while the store booked the turn: the turn is
			// spent, and no cancel message is on its way to end a wait.
			s.reject(r, admission.Aborted, true, r.gone, "")
		case !s.turned(r, j.delay, j.why, j.ext, j.cause):
			s.proceed(r)
		}
		s.checkDrains()
	case remoteAdmit:
		l := r.Lease
		if j.why == admission.NoReason && s.fleet != nil {
			// The in-process rates come after the fleet pool.
			j.why, j.ext, j.cause = s.localRate(r)
		}
		if j.why == admission.NoReason {
			s.confirm(l)
			r.Err = nil
			s.answer(r)
			return
		}
		if s.fleet != nil {
			// Whether or not the pool took the hold, a release tombstones
			// the ID, so that a reserve of it still on its way is refused.
			s.fx.fleetRelease(l)
		}
		r.Err = s.rollback(l, j.why, j.ext, j.cause)
		r.Panic = j.panic
		s.answer(r)
	}
}

// rejectCooldown rejects r for the cool-down d. (d is taken by value, so
// that the callers' copies stay on their stacks when nothing is rejected.)
func (s *state) rejectCooldown(r *AcquireRequest, d admission.CooldownDetail) {
	s.rejectStage(r, admission.Cooldown, &admission.External{Cooldown: &d}, nil)
}

// rejectStage rejects r for a stage's verdict (a cool-down, a rate): it is
// counted and announced with the capacity snapshot, ext completing it.
func (s *state) rejectStage(r *AcquireRequest, why admission.Reason, ext *admission.External, cause error) {
	r.Err = s.rejectOutside(r.Request, r.Priority, r.Reservation.Reserved, r.Class, why, ext, cause, s.timing(r))
	s.answer(r)
}

// grantStages is stage 5, for r whose slot was just granted: its model
// must not be cooling down (a call that was waiting in the queue when the
// cool-down began is turned away with the time left rather than sent into
// another 429), it spends from the model's headroom, and then its rates,
// in-process and not paced, must let it go (a call they turn down gives
// its headroom back); with a fleet pool, they decide once the pool has
// taken the hold. It reports whether r passes; when it does not, the
// slot went back and r was rejected.
func (s *state) grantStages(r *AcquireRequest) bool {
	var gen uint64
	if s.cool.armed() {
		now := s.fx.now()
		d, g, ok := s.cool.left(r.Model, r.Reservation.Reserved, now, true)
		if ok {
			s.returnSlot()
			s.rejectCooldown(r, d)
			return false
		}
		gen = g
	}
	r.Lease.model, r.Lease.headGen = r.Model, gen
	if s.fleet != nil {
		return true // the rates come after the fleet pool (verdict)
	}
	if why, ext, cause := s.localRate(r); why != admission.NoReason {
		s.cool.refund(r.Model, r.Reservation.Reserved, gen)
		r.Lease.headGen = 0
		s.returnSlot()
		s.rejectStage(r, why, ext, cause)
		return false
	}
	return true
}

// localRate decides r's in-process rates, unless they are paced, and
// books them when they let it go: NoReason then, or the reason to turn it
// down, the detail and the cause.
func (s *state) localRate(r *AcquireRequest) (admission.Reason, *admission.External, error) {
	rs := s.rates
	if rs == nil || rs.remote || rs.cfg.Pace {
		return admission.NoReason, nil, nil
	}
	set, err := s.rateSet(r)
	if err != nil || set == nil {
		return admission.NoReason, nil, nil
	}
	rs.setTime(s.fx.now())
	return rs.decide(background, set, r.Reservation.Reserved)
}

// remoteStages reports whether r's admission waits for remote stages: a
// fleet pool, or rates in Redis that are decided (not paced) at the grant.
func (s *state) remoteStages(r *AcquireRequest) (set *rateSet, remote bool) {
	if rs := s.rates; rs != nil && rs.remote && !rs.cfg.Pace {
		set, _ = s.rateSet(r)
	}
	return set, s.fleet != nil || set != nil
}

// noteGrant notes, on admission l, what the adaptive limit's feedback will
// need: the calls in flight, the controller's epoch and, for the gradient
// rule, the time.
func (s *state) noteGrant(l *Lease) {
	if a := s.adapt; a != nil {
		l.inFlight = int(min(s.calls+1, 1<<31-1)) // itself included
		l.epoch = a.epoch()
		if a.ctl.Params().Rule == adaptive.Gradient {
			l.admittedAt = s.fx.now()
		}
	}
}

// releaseStages settles what l's release owes the stages: an overrun
// booked on the rates, and its fleet hold ended.
func (s *state) releaseStages(l *Lease, used int64) {
	if s.fleet != nil {
		s.fx.fleetRelease(l)
	}
	rs := s.rates
	over := used - l.Reservation.Reserved
	if rs == nil || over <= 0 {
		return
	}
	set, err := rs.set(l.model, l.Class)
	if err != nil || set == nil || !set.tokens {
		return
	}
	if rs.remote {
		s.booking++ // Drain waits for it
		s.fx.bookRemote(rs, set, over, l)
		return
	}
	rs.setTime(s.fx.now())
	if dropped := rs.book(background, set, over); dropped > 0 {
		s.fx.warn("bulkhead: overrun larger than a rate window, partly dropped",
			"admission", l.ID.String(), "overrun", over, "dropped", dropped)
	}
}

// bookedOverrun tells the state that an overrun's booking on rates kept
// in Redis is done.
type bookedOverrun struct{}

var bookedMsg = &bookedOverrun{}

// booked counts an overrun's booking done.
func (s *state) booked() {
	s.booking--
	s.checkDrains()
}

// closeStages rejects the parked calls Shutdown: Close ends their wait.
func (s *state) closeStages() {
	for r := s.parkedLine.head; r != nil; r = s.parkedLine.head {
		s.unparkRequest(r)
		s.waited(r, s.fx.now())
		s.reject(r, admission.Shutdown, true, nil, "")
	}
}

// wouldAdmitRequest answers q: capacity, then the cool-down (a call that
// may not wait for it, or would find no room in the queue to be held in,
// is turned away Cooldown), then the rates (not paced: a paced call waits
// for its turn). The rates kept in Redis are left to the caller (q.remote).
func (s *state) wouldAdmitRequest(q *wouldAdmitRequest) {
	cooling := s.cool.armed()
	// While a cool-down may run, the detail says whether the queue has
	// room to hold the call.
	d := s.wouldAdmit(q.class, q.priority, q.reservation, q.detail || cooling)
	model := q.model
	if model == "" {
		model = s.model
	}
	if d.Admit && cooling {
		now := s.fx.now()
		if cd, _, ok := s.cool.left(model, q.reservation.Reserved, now, false); ok {
			held := !s.cool.shed && (q.timeout == 0 || cd.RetryAfter < q.timeout)
			if g := d.Detail; !held || g.MaxConcurrent == 0 || g.MaxQueue == 0 || g.Pending >= g.MaxQueue {
				d.Admit, d.Reason = false, admission.Cooldown
				d.Detail.Cooldown = &cd
			}
		}
	}
	q.result = d
	rs := s.rates
	if !d.Admit || rs == nil || rs.cfg.Pace {
		return
	}
	set, err := rs.set(model, s.tab.Name(q.class))
	if err != nil || set == nil {
		return
	}
	if rs.remote {
		q.remote, q.rates = set, rs
		return
	}
	rs.setTime(s.fx.now())
	if why, rd := rs.peek(background, set, q.reservation.Reserved); why != admission.NoReason {
		q.result.Admit, q.result.Reason = false, why
		if q.result.Detail != nil {
			q.result.Detail.Rate = rd
		}
	}
}
