package bulkhead

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

// CooldownMode says what a call does while its model is cooling down: the
// provider answered a call for that model with a 429 and a Retry-After
// that has not passed yet (see Bulkhead.Feedback).
type CooldownMode uint8

// The cool-down modes.
const (
	// HoldCooldown makes the call wait in the queue until the cool-down
	// ends, bounded by its context and its queue timeout, holding back the
	// calls of its class behind it; then the queue is served in its order
	// again (class by class with a fair queue). A call already waiting for
	// a slot when the cool-down begins is held the same way. Holding needs
	// room in the queue: a call that finds none (MaxQueue 0, or a full
	// queue), or whose cool-down ends after what is left of its queue
	// timeout or its context's deadline, is rejected Cooldown, as with
	// ShedCooldown. In pace mode (RateLimits.Pace) a call waits the
	// cool-down out before it takes its rate turn, so paced calls stay
	// spaced when it ends.
	HoldCooldown CooldownMode = iota
	// ShedCooldown rejects the call Cooldown at once, with the time left
	// as its retry-after.
	ShedCooldown
)

// String returns "hold" or "shed".
func (m CooldownMode) String() string {
	switch m {
	case HoldCooldown:
		return "hold"
	case ShedCooldown:
		return "shed"
	}
	return "cooldown_mode(" + itoa(int64(m)) + ")"
}

// MarshalText encodes the mode as "hold" or "shed".
func (m CooldownMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// CooldownDetail describes the cool-down that decided a Cooldown rejection.
type CooldownDetail struct {
	// Model is the model cooling down.
	Model string
	// Until is when the cool-down ends, on the bulkhead's clock.
	Until time.Time
	// RetryAfter is the time that was left of it at the decision.
	RetryAfter time.Duration
	// Headroom is set when the provider's reported headroom decided it
	// (the call did not fit what the provider said was left, see
	// Headroom) rather than a 429's Retry-After.
	Headroom bool
}

func (d *CooldownDetail) explain() string {
	if d.Headroom {
		return fmt.Sprintf("model %q has no headroom left at the provider for this call, retry after %v", d.Model, d.RetryAfter)
	}
	return fmt.Sprintf("model %q is cooling down after the provider's 429, retry after %v", d.Model, d.RetryAfter)
}

// CooldownStats is the state of the cool-downs.
type CooldownStats struct {
	// Active maps each model cooling down to the end of its cool-down;
	// nil when none is.
	Active map[string]time.Time
	// Started counts the cool-downs started or extended by feedback.
	Started int64
	// Held counts the calls held back in the queue for a cool-down to end
	// (HoldCooldown), each once; they wait there as Gate.Pending. The calls
	// turned away are in Calls.RejectedByReason, as Cooldown.
	Held int64
	// Headroom maps each model with a provider headroom report in force
	// to what is left of it now (see Headroom); nil when none is. The
	// calls it held are in Held, and those it turned away in
	// Calls.RejectedByReason, as Cooldown.
	Headroom map[string]HeadroomStats
	// HeadroomReports counts the headroom reports received.
	HeadroomReports int64
}

// MaxRetryAfter is the longest cool-down a Feedback may start.
const MaxRetryAfter = 24 * time.Hour

// maxCooldowns bounds the models cooling down at once: beyond it, the
// cool-down that ends first makes room.
const maxCooldowns = 1024

// cooldowns is a bulkhead's cool-downs, by model.
type cooldowns struct {
	// armed is set while some cool-down may be running or some headroom
	// report is in force: the one thing a call reads when none is.
	armed atomic.Bool
	clk   clock.Clock
	shed  bool

	mu    sync.Mutex
	until map[string]time.Time
	// first is no later than the earliest end in until, so a lookup
	// purges only once something may have ended.
	first time.Time
	// head is the latest headroom report per model; headFirst is no later
	// than the earliest time one of them is forgotten; gen numbers the
	// reports.
	head      map[string]*headroom
	headFirst time.Time
	gen       uint64

	started, held, reports atomic.Int64

	// closing is closed by Close: held calls stop waiting, and the engine
	// rejects them Shutdown.
	closing   chan struct{}
	closeOnce sync.Once
}

func newCooldowns(clk clock.Clock, mode CooldownMode) *cooldowns {
	return &cooldowns{clk: clk, shed: mode == ShedCooldown, until: map[string]time.Time{}, head: map[string]*headroom{}, closing: make(chan struct{})}
}

func (c *cooldowns) close() { c.closeOnce.Do(func() { close(c.closing) }) }

// start cools model down until end, or longer when it already is.
func (c *cooldowns) start(model string, end time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started.Add(1)
	if prev, ok := c.until[model]; ok {
		if end.After(prev) {
			c.until[model] = end
		}
		return
	}
	if len(c.until) >= maxCooldowns {
		c.purge(c.clk.Now())
	}
	if len(c.until) >= maxCooldowns {
		// Make room: the cool-down that ends first has the least to say.
		first := ""
		for m, u := range c.until {
			if first == "" || u.Before(c.until[first]) {
				first = m
			}
		}
		delete(c.until, first)
	}
	c.until[model] = end
	if len(c.until) == 1 || end.Before(c.first) {
		c.first = end
	}
	c.armed.Store(true)
}

// purge drops the cool-downs that have ended by now and the headroom
// reports whose windows are full again, and disarms when none is left; it
// reads a whole table only once its earliest end has come. c.mu is held.
func (c *cooldowns) purge(now time.Time) {
	if !now.Before(c.first) {
		c.first = time.Time{}
		for m, u := range c.until {
			switch {
			case !u.After(now):
				delete(c.until, m)
			case c.first.IsZero() || u.Before(c.first):
				c.first = u
			}
		}
	}
	if !c.headFirst.IsZero() && !now.Before(c.headFirst) {
		c.headFirst = time.Time{}
		for m, h := range c.head {
			switch {
			case !h.full.After(now):
				delete(c.head, m)
			case c.headFirst.IsZero() || h.full.Before(c.headFirst):
				c.headFirst = h.full
			}
		}
	}
	c.rearm()
}

// left returns the end of model's cool-down and the time left of it, ok
// false when it is not cooling down; for a call reserving reserved
// tokens, a headroom that does not fit it counts as a cool-down until it
// would (head set). With book, a call that fits books its spending, and
// gen is the report it was booked against (0: none).
func (c *cooldowns) left(model string, reserved int64, book bool) (until time.Time, left time.Duration, head bool, gen uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	c.purge(now)
	if u, cooling := c.until[model]; cooling {
		until, left, ok = u, u.Sub(now), true
	}
	wait, gen := c.headroomWait(model, reserved, now, !ok && book)
	if wait > left {
		return now.Add(wait), wait, true, 0, true
	}
	return until, left, false, gen, ok
}

// stats returns the cool-downs' state.
func (c *cooldowns) stats() CooldownStats {
	st := CooldownStats{Started: c.started.Load(), Held: c.held.Load(), HeadroomReports: c.reports.Load()}
	if !c.armed.Load() {
		return st
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	c.purge(now)
	if len(c.until) > 0 {
		st.Active = maps.Clone(c.until)
	}
	st.Headroom = c.headroomStats(now)
	return st
}

// cooldown refuses a call whose model is cooling down, before it asks for
// a slot, when the call may not wait for the cool-down: in ShedCooldown
// mode, or when the cool-down outlasts its queue timeout or its context's
// deadline. A call that may wait is sent on: the engine holds it in the
// queue until the cool-down ends (grantCheck.Hold).
func (b *Bulkhead) cooldown(ctx context.Context, r *actor.AcquireRequest) {
	c := b.cool
	model := b.modelOfCall(r)
	until, left, head, _, ok := c.left(model, r.Reservation.Reserved, false)
	if !ok || ctx.Err() != nil {
		return
	}
	late := c.shed || (r.QueueTimeout > 0 && left >= r.QueueTimeout)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < left {
		late = true // context deadlines are on the wall clock
	}
	if late {
		refuseCooldown(r, model, until, left, head)
	}
}

// holdOut waits out r's cool-down on the caller's goroutine (a call paced
// by its rate limits, which must not take its rate turn before the
// cool-down ends), bounded by its queue timeout (what is left of it after
// the wait), its context and Close; a cool-down that outlasts the queue
// timeout refuses it. It checks again after each wait: a later 429 may
// have extended the cool-down.
func (b *Bulkhead) holdOut(ctx context.Context, r *actor.AcquireRequest) {
	c := b.cool
	model := b.modelOfCall(r)
	for {
		until, left, head, _, ok := c.left(model, r.Reservation.Reserved, false)
		if !ok || ctx.Err() != nil {
			return
		}
		if r.QueueTimeout > 0 && left >= r.QueueTimeout {
			refuseCooldown(r, model, until, left, head)
			return
		}
		if !b.wait(ctx, left, c.closing, testHookRateWait) {
			return
		}
		b.grant.(grantCheck).Held(r)
		b.waited(r, left)
	}
}

// modelOfCall is the model of the call r carries.
func (b *Bulkhead) modelOfCall(r *actor.AcquireRequest) string {
	req, _ := callOf(r.Request)
	return b.modelOf(req.model())
}

// refuseCooldown sets r's refusal for model's cool-down, ending at until
// with left to go (decided by the provider's headroom when head is set).
func refuseCooldown(r *actor.AcquireRequest, model string, until time.Time, left time.Duration, head bool) {
	r.Refuse = admission.Cooldown
	r.RefuseExt = &admission.External{Cooldown: &admission.CooldownDetail{Model: model, Until: until, RetryAfter: left, Headroom: head}}
}

// modelOf is the model of a call naming model m: m, or Config.Model for
// "".
func (b *Bulkhead) modelOf(m string) string {
	if m != "" {
		return m
	}
	return b.model
}

// wouldAdmitCooldown completes d, an advisory decision to admit made with
// its detail, with the cool-down's answer for a call of req: turned away
// when it may not wait for it, or finds no queue room to be held in.
func (b *Bulkhead) wouldAdmitCooldown(req *Request, reserved int64, d *admission.Decision) {
	model := b.modelOf(req.model())
	until, left, head, _, ok := b.cool.left(model, reserved, false)
	if !ok {
		return
	}
	if !b.cool.shed && (b.timeout == 0 || left < b.timeout) {
		if g := d.Detail; g.MaxConcurrent > 0 && g.MaxQueue > 0 && g.Pending < g.MaxQueue {
			return // it would be held in the queue
		}
	}
	d.Admit, d.Reason = false, admission.Cooldown
	if d.Detail != nil {
		d.Detail.Cooldown = &admission.CooldownDetail{Model: model, Until: until, RetryAfter: left, Headroom: head}
	}
}

// grantCheck is the check the engine makes as it grants a call its slot,
// on the engine's goroutine: the call's model must not be cooling down (a
// call that was waiting in the queue when the cool-down began is turned
// away when its turn comes, with the time left, rather than sent into
// another 429), the call must fit the model's reported headroom, which it
// then spends, and then, when CheckArg carries them, its rate limits on
// the in-process store (a call they turn down gives its headroom back).
// The permit the call will be admitted on is r.Spare; it notes the
// headroom report the call spent from, for a rollback to give it back.
type grantCheck struct{ b *Bulkhead }

// Hold is how long the engine holds r back in the queue, in HoldCooldown
// mode, for its model's cool-down (or headroom) to end: 0 when it is not
// cooling down, or when the cool-down outlasts what is left of r's queue
// timeout (then Check turns it away).
func (g grantCheck) Hold(r *actor.AcquireRequest) time.Duration {
	b := g.b
	if !b.cool.armed.Load() || b.cool.shed {
		return 0
	}
	_, left, _, _, ok := b.cool.left(b.modelOfCall(r), r.Reservation.Reserved, false)
	if !ok {
		return 0
	}
	if limit := r.QueueLeft(b.clk.Now()); limit > 0 && left >= limit {
		return 0
	}
	return left
}

// Held counts r held back, once however many times it is.
func (g grantCheck) Held(r *actor.AcquireRequest) {
	if p, _ := r.Spare.(*Permit); p != nil && !p.held {
		p.held = true
		g.b.cool.held.Add(1)
	}
}

func (g grantCheck) Check(r *actor.AcquireRequest) (admission.Reason, *admission.External) {
	b := g.b
	if b.adapt != nil {
		if p, _ := r.Spare.(*Permit); p != nil {
			b.adapt.grant(p)
			p.granted = true
		}
	}
	var model string
	var gen uint64
	if b.cool.armed.Load() {
		model = b.modelOfCall(r)
		until, left, head, g, ok := b.cool.left(model, r.Reservation.Reserved, true)
		if ok {
			return admission.Cooldown, &admission.External{Cooldown: &admission.CooldownDetail{Model: model, Until: until, RetryAfter: left, Headroom: head}}
		}
		gen = g
		if p, _ := r.Spare.(*Permit); p != nil {
			p.headGen, p.headModel = gen, model
		}
	}
	if r.CheckArg != nil {
		why, ext := b.rate.Check(r)
		if why != admission.NoReason {
			b.cool.refund(model, r.Reservation.Reserved, gen)
		}
		return why, ext
	}
	return admission.NoReason, nil
}
