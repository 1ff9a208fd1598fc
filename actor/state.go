package actor

import (
	mrand "math/rand/v2"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// effects is everything the state machine asks of the world outside it:
// the time, and the effects of its decisions. The admission actor
// implements it; the state machine's tests record the calls instead.
// None of the methods may call back into the state.
type effects interface {
	// now reads the clock.
	now() time.Time
	// emit hands an event to the listeners.
	emit(ev *admission.Event)
	// tell sends msg to the child actor of class c.
	tell(c classes.Class, msg any)
	// armTimer starts r's queue timeout: once r.QueueTimeout has passed,
	// a timeoutMsg for r's current generation comes back to the state.
	armTimer(r *AcquireRequest)
	// stopTimer stops r's queue timeout, if one runs.
	stopTimer(r *AcquireRequest)
	// armHold makes a holdMsg come back to the state once d has passed,
	// unless one is due sooner (the end of a cool-down, a waiting retry's
	// aging); stopHold stops that.
	armHold(d time.Duration)
	stopHold()
	// repump makes a pumpMsg come back to the state, unless one is on its
	// way already: the state then looks at the queue again (see
	// state.unblocked).
	repump()
	// answer hands r's answer (r.Err, and r.Lease when admitted) to its
	// caller, who may reuse r at once.
	answer(r *AcquireRequest)
	// armPark makes a parkMsg for r's current generation and park seq
	// come back once d has passed (r.timer holds it).
	armPark(r *AcquireRequest, d time.Duration)
	// armCooldown arms the hold timer (as armHold) for paced call r, which
	// waits d in the cooling line.
	armCooldown(r *AcquireRequest, d time.Duration)
	// startRemote runs j's remote stages off the actor; j comes back as
	// the message with its verdict.
	startRemote(j *remoteJob)
	// fleetRelease and fleetAdjust send l's fleet hold's end or new value
	// to the pool (they never block).
	fleetRelease(l *Lease)
	fleetAdjust(l *Lease, held, seq int64, abandoned bool)
	// bookRemote settles a release on rates kept in Redis, off the actor:
	// deltas are the members' corrections (see rateStage.deltas).
	bookRemote(rs *rateStage, set *rateSet, deltas []float64, l *Lease)
	// warn logs a warning.
	warn(msg string, args ...any)
	// answerDrain hands d's result to its caller.
	answerDrain(d *drainRequest)
	// expire tells the holder of l that its borrowed-slot deadline expired
	// and its slot was abandoned.
	expire(l *Lease)
	// drifted logs that an in-flight count was found out of balance: got
	// is the value it would have taken; args name where (a class).
	drifted(quantity string, got int64, args ...any)
}

// external is what the statistics need from outside the state machine:
// counters that the engine and the class actors keep, passed in by the
// actor when it asks for them.
type external struct {
	doubleReleases int64
	listenerPanics int64
	// deadlines is each class actor's deadline counts, by class handle - 1.
	deadlines []admission.DeadlineStats
}

// state is the admission state machine. Only the admission actor touches
// it, one message at a time. It is pure: its methods never block, never
// call user code, start no timer and read no clock or shared counter; time
// and every effect of a decision go through fx.
type state struct {
	fx  effects
	ids *mrand.ChaCha8

	limits    admission.Limits
	hasBudget bool
	closed    bool

	// The gate.
	inFlight int
	q        queue
	pending  int

	// The admission layer.
	calls  int64 // admitted - released
	tokens int64 // tokens held by admitted calls, provisional ones included
	// provisional counts the admissions waiting for the verdict of their
	// remote stages (the fleet pool, a rate in Redis): Drain waits for
	// them too.
	provisional int64

	// gate counts the slots and the gate-level rejections, admissions
	// every admission, rejection and abandoned slot; ledger is the token
	// budget's totals.
	gate       admission.Counts
	admissions admission.Counts
	ledger     admission.Ledger

	// Observe mode: calls run without admission.
	observe admission.ObserveStats

	listeners [admission.NumEventKinds]int
	drains    []*drainRequest

	// drift counts the global gauges found out of balance; the class
	// table counts its own.
	drift int64

	// tab is the admission class table, nil without classes.
	tab *classes.Table

	// The stages beyond capacity (stages.go, and a file for each stage's
	// holder): model is the bulkhead's own model; cool the cool-downs and
	// the provider's headroom; adapt the adaptive limit, rates the rate
	// limits and fleet the fleet pool, nil when the bulkhead has none. The paced calls waiting outside the queue
	// (nparked of them) stand in turns, each waiting for its turn on its
	// own timer, or in cooling, in the order they came (arrivals numbers
	// the calls), waiting for a cool-down to end before their turns, on
	// the hold timer; checking counts the calls whose paced turn a remote
	// store is deciding.
	model    string
	cool     cooldownStage
	adapt    *adaptiveStage
	rates    *rateStage
	fleet    *fleetStage
	turns    line
	cooling  line
	nparked  int
	arrivals uint64
	checking int
	// booking counts the overruns being booked on rates kept in Redis,
	// after their release: Drain waits for them.
	booking int

	// retry is the retry budgets, nil for none; retries counts the retries
	// admitted, by class handle (index 0 without classes).
	retry   *retryStage
	retries []int64
}

// newState returns the state machine for limits (assumed valid but for
// the class table, which it validates) and the queue policy qp, with its
// effects going to fx and admission IDs drawn from a generator seeded with
// seed.
func newState(limits admission.Limits, qp QueuePolicy, sc stageConfig, fx effects, seed [32]byte) (*state, error) {
	s := &state{
		fx:        fx,
		ids:       mrand.NewChaCha8(seed),
		limits:    limits.Clone(),
		hasBudget: limits.TokenBudget != nil,
		model:     sc.model,
		cool:      newCooldownStage(sc.shed),
		adapt:     newAdaptiveStage(sc.adaptive),
		rates:     newRateStage(sc.rates),
	}
	if sc.fleet != nil {
		s.fleet = &fleetStage{pool: sc.fleet}
	}
	if limits.Classes != nil {
		tab, err := classes.New("Config.Classes", *limits.Classes, limits)
		if err != nil {
			return nil, err
		}
		s.tab = tab
		tab.OnDrift(func(class, quantity string, got int64) {
			fx.drifted(quantity, got, "class", class)
		})
		c := tab.Classes()
		s.limits.Classes = &c
	}
	q, err := newQueue(qp, s.tab.Len(), s.tab)
	if err != nil {
		return nil, err
	}
	s.q = q
	if s.retry, err = newRetryStage(sc.retry, s.tab, sc.origin); err != nil {
		return nil, err
	}
	s.retries = make([]int64, s.tab.Len()+1)
	return s, nil
}

// newID mints a random version 4 UUID.
func (s *state) newID() admission.ID {
	var id admission.ID
	_, _ = s.ids.Read(id[:])
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}
