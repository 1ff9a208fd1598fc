package pacer

import (
	"context"
	"slices"
	"time"
)

// Composite combines several pacers on one store, for example a
// requests-per-minute and a tokens-per-minute limit of the same API. A call is decided by every member at the same instant and in one
// atomic step: its delay is the largest of the members' delays, and the
// outcome names the member that set it.
//
// The call is recorded in every member or in none. RateLimit therefore
// records nothing anywhere when any member says "wait" (no member spends
// quota on a call that another member rejects), and Pace records nothing anywhere when any member's delay is longer
// than that member may wait. On the Redis store the atomic step is one script
// over all members' keys, which share a cluster slot through the call key's
// hash tag.
//
// A Composite is immutable and safe for concurrent use.
type Composite struct {
	store   Store
	members []*Pacer
}

// NewComposite combines members. They must share one store (so the decision
// can be atomic) and have distinct names. A Composite without members lets
// every call go.
func NewComposite(members ...*Pacer) (*Composite, error) {
	c := &Composite{members: append([]*Pacer(nil), members...)}
	seen := make(map[string]bool, len(members))
	for i, p := range c.members {
		if p == nil {
			return nil, invalidf("members", "member %d is nil", i)
		}
		if c.store == nil {
			c.store = p.store
		} else if p.store != c.store {
			return nil, invalidf("members", "member %q uses another store; a composite decides atomically in one store", p.opts.Name)
		}
		if seen[p.opts.Name] {
			return nil, invalidf("members", "two members are named %q", p.opts.Name)
		}
		seen[p.opts.Name] = true
	}
	return c, nil
}

// Members returns the composite's pacers, in order.
func (c *Composite) Members() []*Pacer { return append([]*Pacer(nil), c.members...) }

// CompositeOutcome is the result of one composite call.
type CompositeOutcome struct {
	// Outcome is the outcome of the member that set the delay: the first
	// member with the largest delay. When no member must wait, its Delay is
	// zero and its other fields are zero too. Its Fallback is set when the
	// store failed and the failure policy decided.
	Outcome

	// Pacer is the member that set the delay, or nil when no member must
	// wait (or the failure policy decided).
	Pacer *Pacer

	// Members holds every member's outcome, in the order of
	// Composite.Members; it is nil when the store failed, and for a
	// composite without members.
	Members []Outcome
}

// Reason explains the outcome in words:
// "no pacers" for a composite without members, "no delay" when no member
// must wait, and otherwise "pacer <name>" and the member's reason on a second
// line.
func (o CompositeOutcome) Reason() string {
	switch {
	case o.Fallback != nil:
		return o.Outcome.Reason()
	case o.Members == nil:
		return "no pacers"
	case o.Pacer == nil:
		return "no delay"
	}
	return "pacer " + o.Pacer.opts.Name + "\n" + o.Outcome.Reason()
}

// Pace decides when a call on key may go, books it in every member, and
// returns the largest delay: the caller waits CompositeOutcome.Delay, then
// acts. weights gives each member's weight, in the order of Members: none
// means 1 for every member, a single weight applies to every member, and
// otherwise there must be one per member. For requests and tokens per minute:
//
//	c.Pace(ctx, "gpt-4o", 1, float64(tokens))
//
// When a member's delay exceeds its Options.MaxDelay, nothing is recorded
// anywhere and the error matches ErrTooLong. Other errors are as for
// Pacer.Pace.
func (c *Composite) Pace(ctx context.Context, key string, weights ...float64) (CompositeOutcome, error) {
	return c.decide(ctx, key, weights, modePace, -1, 0, false)
}

// PaceWait is Pace followed by the wait, as Pacer.PaceWait: it returns when
// the call may go, or when ctx ends first; and when ctx's deadline comes
// before the call could go, it records nothing and returns at once with an
// error matching ErrTooLong and context.DeadlineExceeded.
func (c *Composite) PaceWait(ctx context.Context, key string, weights ...float64) (CompositeOutcome, error) {
	if c.store == nil {
		return c.decide(ctx, key, weights, modePace, -1, 0, false)
	}
	clk := c.store.waitClock()
	maxWait, byDeadline := deadlineWait(ctx, clk, horizonUs)
	if maxWait < 0 {
		return CompositeOutcome{}, context.DeadlineExceeded
	}
	out, err := c.decide(ctx, key, weights, modePace, maxWait, 0, byDeadline)
	if err != nil || out.Fallback != nil {
		return out, err
	}
	return out, wait(ctx, clk, out.Delay)
}

// RateLimit decides whether a call on key may go now in every member. A zero
// Delay admits the call and records it in every member; a positive Delay
// rejects it, records nothing in any member, and is the exact retry-after
// (the largest of the members' delays), with Pacer naming the member that set
// it. weights are as for Pace; errors and failure policies as for
// Pacer.RateLimit.
func (c *Composite) RateLimit(ctx context.Context, key string, weights ...float64) (CompositeOutcome, error) {
	return c.decide(ctx, key, weights, modeRateLimit, 0, 0, false)
}

// PaceWithin is Pace for a caller that waits itself but only up to maxDelay:
// it books the call in every member only when no member's delay exceeds
// maxDelay (nor that member's Options.MaxDelay); otherwise it records
// nothing and returns the outcome with an error matching ErrTooLong. A
// negative maxDelay is invalid. The caller waits CompositeOutcome.Delay on
// its own clock, as after Pace.
func (c *Composite) PaceWithin(ctx context.Context, key string, maxDelay time.Duration, weights ...float64) (CompositeOutcome, error) {
	if maxDelay < 0 {
		return CompositeOutcome{}, invalidf("maxDelay", "must be >= 0, got %v", maxDelay)
	}
	return c.decide(ctx, key, weights, modePace, min(int64(maxDelay/time.Microsecond), horizonUs), 0, false)
}

// Peek answers what RateLimit would answer now, recording nothing in any
// member: a zero Delay says the call would go, a positive one is the
// retry-after RateLimit would give. It is advisory: by the time the caller
// acts, other calls may have changed the answer. weights, errors and
// failure policies are as for RateLimit.
func (c *Composite) Peek(ctx context.Context, key string, weights ...float64) (CompositeOutcome, error) {
	return c.decide(ctx, key, weights, modeRateLimit, peekUs, 0, false)
}

// Book records weight that has already been spent in every member, as
// Pacer.Book: never waiting, never failing for a delay, and booking in each
// member no further than within from now. Each member's Outcome.Booked is
// the part of its weight that fit. weights are as for Pace; errors and
// failure policies as for Pacer.Book.
func (c *Composite) Book(ctx context.Context, key string, within time.Duration, weights ...float64) (CompositeOutcome, error) {
	capUs, err := bookCap(within)
	if err != nil {
		return CompositeOutcome{}, err
	}
	for _, w := range weights {
		if !(w >= 0) {
			return CompositeOutcome{}, invalidf("weights", "must be >= 0 and finite, got %v", w)
		}
	}
	return c.decide(ctx, key, weights, modeBook, bookWaitUs, capUs, false)
}

// Settle corrects what a call booked in every member to what it used, as
// Pacer.Settle, in one atomic step (one Redis script): each member's delta
// books weight spent beyond what it counted (when positive, no further
// than within from now) or gives back weight it counted but the call did
// not use (when negative); a member whose delta is zero is not asked.
// Each member's Outcome.Booked is what it booked or, negative, what it
// gave back. deltas are given as the weights of Pace; errors and failure
// policies are as for Book.
func (c *Composite) Settle(ctx context.Context, key string, within time.Duration, deltas ...float64) (CompositeOutcome, error) {
	capUs, err := bookCap(within)
	if err != nil {
		return CompositeOutcome{}, err
	}
	return c.decide(ctx, key, deltas, modeBook, bookWaitUs, capUs, false)
}

// decide runs one composite decision. maxWaitUs caps every member's wait; a
// negative value other than peekUs means each member's own Options.MaxDelay.
func (c *Composite) decide(ctx context.Context, key string, weights []float64, m mode, maxWaitUs, capUs int64, byDeadline bool) (CompositeOutcome, error) {
	if err := ctx.Err(); err != nil {
		return CompositeOutcome{}, context.Cause(ctx)
	}
	if len(weights) > 1 && len(weights) != len(c.members) {
		return CompositeOutcome{}, invalidf("weights", "got %d weights for %d members", len(weights), len(c.members))
	}
	if err := checkKey(key); err != nil {
		return CompositeOutcome{}, err
	}
	n := len(c.members)
	if n == 0 {
		return CompositeOutcome{}, nil
	}
	// Small composites keep their requests and results on the stack when
	// the store is local (see below).
	var reqBuf [4]request
	var resBuf [4]stepResult
	var idxBuf [4]int
	reqs, res, idx := reqBuf[:0], resBuf[:0], idxBuf[:0]
	if n > len(reqBuf) {
		reqs, res, idx = make([]request, 0, n), make([]stepResult, 0, n), make([]int, 0, n)
	}
	out := CompositeOutcome{Members: make([]Outcome, n)}
	for i, p := range c.members {
		w := 1.0
		switch len(weights) {
		case 1:
			w = weights[0]
		case n:
			w = weights[i]
		}
		if err := checkDelta("weights", w, p.opts.QPS, capUs > 0); err != nil {
			return CompositeOutcome{}, err
		}
		out.Members[i] = Outcome{Weight: w, MaxBurst: p.opts.MaxBurst}
		if w == 0 {
			continue // never delayed, books nothing: the member is not asked
		}
		mw := maxWaitUs
		if (mw < 0 && mw != peekUs) || (m == modePace && p.maxDelayUs < mw) {
			mw = p.maxDelayUs
		}
		reqs = append(reqs, p.request(key, w, m, mw, capUs))
		idx = append(idx, i)
	}
	if len(reqs) == 0 {
		return out, nil
	}
	res = res[:len(reqs)]
	var commit bool
	var err error
	if l, ok := c.store.(*Local); ok {
		commit, err = l.decide(ctx, reqs, res)
	} else if t, ok := c.store.(*Table); ok {
		commit, err = t.decide(ctx, reqs, res)
	} else {
		// Copies, so that the slices passed through the interface do not
		// move reqBuf and resBuf to the heap on the local path.
		rs := make([]stepResult, len(reqs))
		commit, err = c.store.decide(ctx, slices.Clone(reqs), rs)
		copy(res, rs)
	}
	if err != nil {
		o, err := fallback(ctx, c.store, Outcome{}, m, err)
		return CompositeOutcome{Outcome: o}, err
	}
	best := -1
	for j, i := range idx {
		o := &out.Members[i]
		o.Delay = time.Duration(res[j].delayUs) * time.Microsecond
		o.Level = res[j].before
		o.Booked = booked(&res[j], &reqs[j].p)
		if o.Delay > 0 && (best < 0 || o.Delay > out.Members[best].Delay) {
			best = i
		}
	}
	if best >= 0 {
		out.Outcome = out.Members[best]
		out.Pacer = c.members[best]
	}
	if !commit && m == modePace {
		for j := range res {
			if !res[j].commit {
				limit := reqs[j].p.maxWaitUs
				return out, tooLong(out.Members[idx[j]].Delay, limit, byDeadline && limit == maxWaitUs)
			}
		}
	}
	return out, nil
}
