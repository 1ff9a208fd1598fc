package actor

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/adaptive"
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// The admission pipeline, in the order every call meets its stages:
//
//  1. closed, then the caller's context (validation is the facade's), then
//     a retry's budgets (retry.go): a retry they have no room for is
//     turned away RetryBudget;
//  2. a cool-down or the provider's headroom: a call that may not wait for
//     it (ShedCooldown, or it outlasts the call's queue timeout or
//     deadline) is turned away Cooldown; one that may is held back, in
//     the queue after the capacity checks (or, paced, in the cooling line
//     before its turn, in the order the calls came, until the engine's
//     hold timer says the cool-down is over);
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
// cool-downs, replaces headroom reports and moves the adaptive limit. A
// cool-down that starts while paced calls of its model hold turns inside
// it sends them back to stage 2 (see coolTurns): their turns are given
// back, and they take new ones after it, in the order they came.

// stageConfig is what the stages need from the engine's Config.
type stageConfig struct {
	model    string
	shed     bool
	adaptive *Adaptive
	rates    *Rates
	fleet    *fleet.Pool
	retry    *admission.RetryConfig
	origin   time.Time
}

// parkReason is why a paced call waits outside the queue.
type parkReason uint8

const (
	// parkCooldown: it waits a cool-down out before its turn, in the
	// cooling line, on the engine's hold timer.
	parkCooldown parkReason = iota
	// parkTurn: it waits for its turn, in the turns line, on its own timer.
	parkTurn
)

// parkMsg is a turn timer firing for generation gen and park seq seq of
// its call (a later park of the same call, or an earlier end of its wait,
// makes it stale).
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
	res := &j.r.Reservation
	switch j.kind {
	case remoteAdmit:
		if j.fleet != nil {
			j.why, j.ext, j.cause = j.fleet.reserve(ctx, j.r.Lease)
		}
		if j.why == admission.NoReason && j.set != nil {
			j.why, j.ext, j.cause = j.rates.decide(ctx, j.set, res)
		}
	case remoteTurn:
		j.delay, j.why, j.ext, j.cause = j.rates.pace(ctx, j.set, res, j.maxWait)
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

// paced reports whether r takes a paced turn before its slot, and has
// not taken it yet.
func (s *state) paced(r *AcquireRequest) bool { return !r.turned && s.pacedMode(r) }

// pacedMode reports whether r is paced: it waits for a rate turn before
// its slot.
func (s *state) pacedMode(r *AcquireRequest) bool {
	if s.rates == nil || !s.rates.cfg.Pace {
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

// checkCooldown is stage 2 for a new call, and for a paced one whose turn
// has come: it turns r away or parks it when its model is cooling down (or
// it does not fit the headroom), and reports whether it did. A call that
// may wait in the queue goes on: the queue holds it after the capacity
// checks (holdFor).
func (s *state) checkCooldown(r *AcquireRequest) bool {
	if !s.cool.armed() {
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
	case s.pacedMode(r):
		// Before its turn, not after it, so paced calls stay spaced when
		// the cool-down ends. A turn that came inside the cool-down (a
		// store shared with others, which cannot take turns back; the
		// provider's headroom) has passed unused: a new one follows it.
		r.turned = false
		s.parkCooling(r, d.RetryAfter)
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

// bookTurn is stage 4: a paced call books its turn, no later than its
// queue timeout and deadline allow. It reports whether r is done with for
// now: turned away, parked until its turn, or waiting for a remote store.
func (s *state) bookTurn(r *AcquireRequest) bool {
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
	delay, why, ext, cause := s.rates.pace(background, r.set, &r.Reservation, maxWait)
	return s.turned(r, delay, why, ext, cause)
}

// turned goes on with r once its turn is booked (or refused): it reports
// whether r is done with for now.
func (s *state) turned(r *AcquireRequest, delay time.Duration, why admission.Reason, ext *admission.External, cause error) bool {
	switch {
	case why != admission.NoReason:
		s.rejectStage(r, why, ext, cause)
	case delay > 0:
		s.parkTurn(r, delay)
	default:
		return false
	}
	return true
}

// parkTurn makes r wait d for its turn on its own timer, in the turns
// line, outside the queue (it holds no place there, and nothing else).
func (s *state) parkTurn(r *AcquireRequest, d time.Duration) {
	s.park(r, parkTurn)
	r.parkUntil = r.parkedAt.Add(d)
	s.turns.push(r)
	s.fx.armPark(r, d)
}

// parkCooling makes paced r, held back by its model's cool-down, wait d
// (until the cool-down is over) in the cooling line, where the calls stand
// in the order they came, on the engine's one hold timer; it takes its
// turn once the wait is over.
func (s *state) parkCooling(r *AcquireRequest, d time.Duration) {
	s.markHeld(r)
	s.park(r, parkCooldown)
	r.parkUntil = r.parkedAt.Add(d)
	s.cooling.insertByArrival(r)
	s.fx.armCooldown(r, d)
}

// park marks r parked now for why.
func (s *state) park(r *AcquireRequest, why parkReason) {
	r.parked, r.parkFor, r.parkedAt = true, why, s.fx.now()
	r.parkSeq++ // its turn timer's message, if one is on its way, is stale
	s.nparked++
}

// endPark takes r off its line at now: what it waited comes off its queue
// timeout (and, for its turn, is its rate wait), and its decision timing
// starts again.
func (s *state) endPark(r *AcquireRequest, now time.Time) {
	if r.parkFor == parkTurn {
		s.turns.remove(r)
		s.fx.stopTimer(r)
	} else {
		s.cooling.remove(r)
	}
	s.nparked--
	r.parked = false
	waited := max(0, now.Sub(r.parkedAt))
	if r.parkFor == parkTurn {
		r.RateWait += waited
		if !r.paced {
			r.paced = true
			s.rates.paced.Add(1)
		}
		s.rates.pacedNs.Add(int64(waited))
	}
	if r.QueueTimeout > 0 {
		r.QueueTimeout = max(time.Microsecond, r.QueueTimeout-waited)
	}
	if !r.Start.IsZero() {
		r.Start = now
	}
}

// unpark goes on with r once its turn timer has fired. A call whose
// context has ended stays parked: its cancel message, with the context's
// cause, is on its way.
func (s *state) unpark(m *parkMsg) {
	r := m.r
	// The generation first: a message for an earlier use of r reads
	// nothing else of it (its caller may be reusing it).
	if r.gen != m.gen || r.parkSeq != m.seq || !r.parked || r.ctxEnded() {
		return // answered, or its wait ended, before the timer's message arrived; or being cancelled
	}
	s.resume(r, s.fx.now())
}

// wakeCooling goes on, once the hold timer has fired, with the paced calls
// of the cooling line whose cool-down is over, in the order they came, so
// that they take their turns in that order; for the others it arms the
// hold timer again.
func (s *state) wakeCooling() {
	now := s.fx.now()
	for r := s.cooling.head; r != nil; {
		next := r.next // r may park again, but never behind next: it came first
		if !r.ctxEnded() {
			if d, _, ok := s.cool.left(r.Model, r.Reservation.Reserved, now, false); ok {
				s.fx.armHold(d.RetryAfter)
			} else {
				s.resume(r, now)
			}
		}
		r = next
	}
}

// resume goes on with parked r at now.
func (s *state) resume(r *AcquireRequest, now time.Time) {
	s.endPark(r, now)
	if s.closed {
		s.reject(r, admission.Shutdown, true, nil, "")
		return
	}
	s.proceed(r)
}

// coolTurns is a cool-down of model, until the time until, starting (or
// growing) while paced calls of the model wait for turns booked inside it,
// which they may not take: the provider asked for a pause. With
// HoldCooldown, every paced call of the model waiting for its turn gives
// the turn back and waits the cool-down out in the cooling line, to take
// a new turn after it in the order the calls came, spaced by the rate (the
// calls whose turns fall after it too, so that none goes ahead of one that
// came before it); one that may not wait that long is turned away
// Cooldown, as a new call would be. With ShedCooldown, the calls whose
// turns fall inside it are turned away Cooldown. The turns given back go
// back to the rate where they can (giveBack).
func (s *state) coolTurns(model string, until, now time.Time) {
	if s.rates == nil || !s.rates.cfg.Pace || s.turns.head == nil {
		return
	}
	inside := false
	for r := s.turns.head; r != nil && !inside; r = r.next {
		inside = r.Model == model && r.parkUntil.After(now) && r.parkUntil.Before(until)
	}
	if !inside {
		return
	}
	var calls []*AcquireRequest
	for r := s.turns.head; r != nil; r = r.next {
		if r.Model == model && r.parkUntil.After(now) && (!s.cool.shed || r.parkUntil.Before(until)) {
			calls = append(calls, r)
		}
	}
	s.giveBack(calls, now)
	for _, r := range calls {
		if r.ctxEnded() {
			continue // its cancel message is on its way; its turn is given back all the same
		}
		s.endPark(r, now)
		r.turned = false
		d, _, _ := s.cool.left(r.Model, r.Reservation.Reserved, now, false)
		if s.cool.shed || late(r, d.RetryAfter, now) {
			s.rejectCooldown(r, d)
			continue
		}
		s.parkCooling(r, d.RetryAfter)
	}
	s.checkDrains()
}

// giveBack gives the turns of calls, which wait for them and are about to
// give them up, back to the engine's own rate table: on each rate, from
// the earliest of their turns on, unless a call that keeps its turn waits
// for one there after it. Turns it cannot give back stay booked and go
// unused: on a store shared with others (a pacer.Local given in the
// config, Redis), which others book on too, and behind a turn kept.
func (s *state) giveBack(calls []*AcquireRequest, now time.Time) {
	rs := s.rates
	if rs.remote || rs.table == nil || len(calls) == 0 {
		return
	}
	from := map[string]time.Time{}
	for _, r := range calls {
		r.givingBack = true
		r.set.eachBooked(rs.cfg.Weight, &r.Reservation, func(name string) {
			if at, ok := from[name]; !ok || r.parkUntil.Before(at) {
				from[name] = r.parkUntil
			}
		})
	}
	for q := s.turns.head; q != nil; q = q.next {
		if q.givingBack {
			continue
		}
		q.set.eachBooked(rs.cfg.Weight, &q.Reservation, func(name string) {
			if at, ok := from[name]; ok && !q.parkUntil.Before(at) {
				delete(from, name) // a turn kept after the ones given back
			}
		})
	}
	for _, r := range calls {
		r.givingBack = false
	}
	rs.setTime(now)
	for name, at := range from {
		rs.table.Rewind(name, rs.cfg.Name, at)
	}
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
	r.Err = s.rejectOutside(r.Request, r.Priority, r.Reservation, r.Class, why, ext, cause, s.timing(r))
	s.answer(r)
}

// grantStages is stage 5, for r whose slot was just granted: a retry must
// still have room in its retry budgets, its model
// must not be cooling down (a call that was waiting in the queue when the
// cool-down began is turned away with the time left rather than sent into
// another 429), it spends from the model's headroom, and then its rates,
// in-process and not paced, must let it go (a call they turn down gives
// its headroom back); with a fleet pool, they decide once the pool has
// taken the hold. It reports whether r passes; when it does not, the
// slot went back and r was rejected.
func (s *state) grantStages(r *AcquireRequest) bool {
	if r.Retry && s.retry != nil {
		// A retry that waited may find its budget's room taken.
		if d := s.retry.over(r.Class, s.fx.now(), s.tab); d != nil {
			s.returnSlot()
			s.rejectStage(r, admission.RetryBudget, s.retryVerdict(d), nil)
			return false
		}
	}
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
		s.cool.head.refund(r.Model, r.Reservation.Reserved, gen)
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
	return rs.decide(background, set, &r.Reservation)
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

// releaseStages settles what l's release owes the stages: its usage
// settled on the token rates (see rateStage.settle), and its fleet hold
// ended.
func (s *state) releaseStages(l *Lease, m *releaseMsg) {
	if s.fleet != nil {
		s.fx.fleetRelease(l)
	}
	rs := s.rates
	if rs == nil || !m.hasUsage {
		return
	}
	set, err := rs.set(l.model, l.Class)
	if err != nil || set == nil || !set.tokens {
		return
	}
	var buf [2 * numLimitKinds]float64
	deltas, ok := rs.deltas(set, buf[:], &l.Reservation, &m.usage)
	if !ok {
		return
	}
	if rs.remote {
		s.booking++ // Drain waits for it
		s.fx.bookRemote(rs, set, append([]float64(nil), deltas...), l)
		return
	}
	rs.setTime(s.fx.now())
	if dropped := rs.settle(background, set, deltas); dropped > 0 {
		s.fx.warn("bulkhead: overrun larger than a rate window, partly dropped",
			"admission", l.ID.String(), "overrun", slices.Max(deltas), "dropped", dropped) // not deltas itself: buf stays on the stack
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
	for _, l := range []*line{&s.cooling, &s.turns} {
		for r := l.head; r != nil; r = l.head {
			s.endPark(r, s.fx.now())
			s.reject(r, admission.Shutdown, true, nil, "")
		}
	}
}

// wouldAdmitRequest answers q: a retry's budgets, then capacity, then the cool-down (a call that
// may not wait for it, or would find no room in the queue to be held in,
// is turned away Cooldown), then the rates (not paced: a paced call waits
// for its turn). The rates kept in Redis are left to the caller (q.remote).
func (s *state) wouldAdmitRequest(q *wouldAdmitRequest) {
	if q.retry && s.retry != nil && !s.closed {
		if rd := s.retry.over(q.class, s.fx.now(), s.tab); rd != nil {
			q.why = admission.RetryBudget
			if q.detail {
				q.snapshot = s.detail(q.priority, q.reservation.Reserved, q.class, s.retryVerdict(rd).Constraint)
				q.snapshot.RetryBudget = rd
			}
			return
		}
	}
	cooling := s.cool.armed()
	// While a cool-down may run, the detail says whether the queue has
	// room to hold the call.
	why, d := s.wouldAdmit(q.class, q.priority, q.reservation, q.retry, q.detail || cooling)
	model := q.model
	if model == "" {
		model = s.model
	}
	if why == admission.NoReason && cooling {
		now := s.fx.now()
		if cd, _, ok := s.cool.left(model, q.reservation.Reserved, now, false); ok {
			held := !s.cool.shed && (q.timeout == 0 || cd.RetryAfter < q.timeout)
			if !held || d.MaxConcurrent == 0 || d.MaxQueue == 0 || d.Pending >= d.MaxQueue {
				why = admission.Cooldown
				d.Cooldown = &cd
			}
		}
	}
	q.why, q.snapshot = why, d
	rs := s.rates
	if why != admission.NoReason || rs == nil || rs.cfg.Pace {
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
	if rwhy, rd := rs.peek(background, set, &q.reservation); rwhy != admission.NoReason {
		q.why = rwhy
		if d != nil {
			d.Rate = rd
		}
	}
}
