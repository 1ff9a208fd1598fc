// Package adaptive holds the rules that move a concurrency limit from what
// a provider answers: additive increase and multiplicative decrease
// (AIMD), and a latency gradient. The rules are pure arithmetic over the
// current limit and the samples, with the time of each sample given, so
// they are deterministic: the same samples and times give the same limits.
// The facade serialises the calls and applies the limits.
package adaptive

import (
	"math"
	"math/bits"
	"time"
)

// Rule is the rule a Controller follows.
type Rule uint8

// The rules.
const (
	// AIMD adds Step to the limit for each success that found the limit
	// in use, and multiplies it by Backoff on a drop.
	AIMD Rule = iota
	// Gradient steers the limit by the ratio of long-term to recent
	// latency, and multiplies it by Backoff on a drop.
	Gradient
)

// Outcome is what the provider answered one call.
type Outcome uint8

// The outcomes.
const (
	Success Outcome = iota
	RateLimited
	Overloaded
	Timeout
	Failed
)

// Drop reports whether o says the provider is over its capacity.
func (o Outcome) Drop() bool { return o == RateLimited || o == Overloaded || o == Timeout }

// Params are a Controller's bounds and tunables, already defaulted and
// validated by the facade.
type Params struct {
	Rule Rule
	// Min and Max bound the limit; 1 <= Min <= Max.
	Min, Max int
	// Backoff is the factor of a decrease, in [0.5, 1).
	Backoff float64
	// Step is AIMD's increase, >= 1.
	Step int
	// Tolerance is how much the recent latency may exceed the long-term
	// one before the gradient rule lowers the limit, >= 1.
	Tolerance float64
	// Smoothing is the weight of each gradient move, in (0, 1].
	Smoothing float64
	// Window is the shortest time between two decreases, >= 0.
	Window time.Duration
}

// Sample is one call's answer.
type Sample struct {
	// At is when the answer came.
	At time.Time
	// Outcome is the answer.
	Outcome Outcome
	// Latency is from the call's admission to the answer; zero when
	// unknown.
	Latency time.Duration
	// InFlight is the calls in flight when this one was admitted, itself
	// included; zero when unknown (the limit then counts as used).
	InFlight int
	// Epoch is 1 + the controller's Decreases when the call was admitted;
	// zero when unknown, and then the call's admission is taken to be At
	// less Latency.
	Epoch uint64
}

// Kind is the kind of a Move.
type Kind uint8

// The kinds of moves.
const (
	Hold     Kind = iota // leave the limit (the zero Move)
	Increase             // AIMD: add Step
	Decrease             // multiply by Backoff, at least one lower
	Steer                // gradient: limit*Scale + Add
)

// Move is what a sample asks of the limit. Applying it is Controller.Next.
type Move struct {
	Kind Kind
	// Scale and Add define a Steer move: next = limit*Scale + Add.
	Scale, Add float64
}

// Long and short latency averages of the gradient rule, in samples.
const (
	longWindow  = 100
	shortWindow = 5
	warmup      = 10 // samples averaged plainly before the long average decays
)

// Controller is one rule's state. It is not safe for concurrent use.
type Controller struct {
	p Params
	// last is the limit the last move produced and carry the fraction of
	// it a gradient move left, so small steps add up; a limit someone else
	// set starts with no carry.
	last  int
	carry float64
	// lastDecrease is the time of the last decrease; decreased is false
	// until the first.
	lastDecrease time.Time
	decreased    bool
	decreases    uint64
	// The gradient rule's latency averages, in nanoseconds, and the number
	// of latencies seen.
	long, short float64
	n           int
}

// New returns a controller following p.
func New(p Params) *Controller { return &Controller{p: p, last: -1} }

// Params returns the controller's parameters.
func (c *Controller) Params() Params { return c.p }

// Update observes s and applies its move to limit: Next(limit,
// Observe(limit, s)).
func (c *Controller) Update(limit int, s Sample) int { return c.Next(limit, c.Observe(limit, s)) }

// Observe records sample s, taken while the limit was limit, and returns
// the move it asks for.
//
// A drop (RateLimited, Overloaded, Timeout) asks for a decrease, unless
// the call was admitted before the last decrease (it was sent under the
// old limit, which that decrease already answered) or the last decrease is
// less than Window old: one burst of 429s is one decrease. A Failed call
// says nothing about capacity: Hold. A success found the limit in use
// when at least half of it was in flight at its admission; one that did
// not cannot tell whether more would fit: Hold.
func (c *Controller) Observe(limit int, s Sample) Move {
	switch {
	case s.Outcome == Failed:
		return Move{}
	case s.Outcome.Drop():
		if c.decreased && (c.before(s) || s.At.Sub(c.lastDecrease) < c.p.Window) {
			return Move{}
		}
		c.decreased, c.lastDecrease = true, s.At
		c.decreases++
		return Move{Kind: Decrease}
	}
	if c.p.Rule == Gradient {
		return c.gradient(limit, s)
	}
	if !used(limit, s.InFlight) || c.before(s) {
		return Move{}
	}
	return Move{Kind: Increase}
}

// used reports whether a call admitted with inFlight in flight found the
// limit in use.
func used(limit, inFlight int) bool { return inFlight == 0 || inFlight >= limit-inFlight }

// before reports whether the call of s was admitted before the last
// decrease: it was sent under the old limit, and says nothing about the
// new one.
func (c *Controller) before(s Sample) bool {
	if s.Epoch != 0 {
		return s.Epoch-1 < c.decreases
	}
	return c.decreased && !s.At.Add(-s.Latency).After(c.lastDecrease)
}

// Decreases returns the number of decreases the controller has decided,
// for the Epoch of the calls admitted now.
func (c *Controller) Decreases() uint64 { return c.decreases }

// gradient records a success's latency and returns the gradient rule's
// move: the limit times the ratio of long-term to recent latency (times
// Tolerance, kept within [0.5, 1]), plus a queue allowance of the square
// root of the limit, blended in by Smoothing.
func (c *Controller) gradient(limit int, s Sample) Move {
	if s.Latency <= 0 {
		return Move{}
	}
	lat := float64(s.Latency)
	c.n++
	switch {
	case c.n == 1:
		c.long, c.short = lat, lat
	case c.n <= warmup:
		c.long = float64(c.long + (lat-c.long)/float64(c.n))
		c.short = ewma(c.short, lat, shortWindow)
	default:
		c.long = ewma(c.long, lat, longWindow)
		c.short = ewma(c.short, lat, shortWindow)
	}
	if c.long > 2*c.short {
		// Latency is back to normal after a long overload: let the
		// long-term average catch up faster than its decay would.
		c.long = float64(c.long * 0.95)
	}
	if !used(limit, s.InFlight) || c.before(s) {
		return Move{}
	}
	g := math.Max(0.5, math.Min(1, float64(c.p.Tolerance*c.long)/c.short))
	q := math.Sqrt(float64(max(limit, 1)))
	sm := c.p.Smoothing
	// limit*(1-sm) + (limit*g + q)*sm
	return Move{Kind: Steer, Scale: float64(1-sm) + float64(g*sm), Add: float64(q * sm)}
}

// ewma moves avg towards v with the weight of an n-sample average.
func ewma(avg, v float64, n int) float64 {
	a := 2 / float64(n+1)
	return float64(avg + float64(a*(v-avg)))
}

// Next applies m to limit and returns the new limit, within [Min, Max].
// An increase adds Step; a decrease multiplies by Backoff and lowers the
// limit by at least one; a steer keeps the fraction it leaves for the next
// steer, as long as nobody else changes the limit meanwhile. A limit
// outside the bounds (one the caller set) is brought within them by the
// next move, whatever it is, except Hold.
func (c *Controller) Next(limit int, m Move) int {
	est := float64(limit)
	if limit == c.last {
		est += c.carry
	}
	var next float64
	switch m.Kind {
	case Hold:
		return limit
	case Increase:
		next = float64(limit) + float64(c.p.Step)
	case Decrease:
		next = math.Min(math.Floor(float64(est*c.p.Backoff)), float64(limit-1))
	case Steer:
		next = float64(est*m.Scale) + m.Add
	}
	// Clamp before converting: float64(Max) may not be an int (2^63).
	var out int
	switch {
	case next >= float64(c.p.Max):
		out, next = c.p.Max, float64(c.p.Max)
	case next <= float64(c.p.Min):
		out, next = c.p.Min, float64(c.p.Min)
	default:
		out = int(next)
	}
	c.last, c.carry = out, 0
	if m.Kind == Steer {
		c.carry = max(0, next-float64(out))
	}
	return out
}

// Scale returns v × n / d, rounded down, for v >= 0 and 0 <= n <= d, 0 < d,
// without overflow: the budget that goes with a limit of n out of d.
func Scale(v int64, n, d int) int64 {
	hi, lo := bits.Mul64(uint64(v), uint64(n))
	q, _ := bits.Div64(hi, lo, uint64(d)) // hi < d as n <= d
	return int64(q)
}
