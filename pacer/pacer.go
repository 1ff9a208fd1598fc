package pacer

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// Default burst allowance factors, used when Options.BurstFactor is zero.
const (
	DefaultPaceFactor      = 0.5 // Pace and PaceWait
	DefaultRateLimitFactor = 1.0 // RateLimit
)

// MaxQPS is the highest Options.QPS: pacer state is kept in whole
// microseconds, so a weight-1 call must book at least one. For higher rates,
// count in larger units (thousands of tokens, say).
const MaxQPS = 1e6

// Horizon is the longest delay Pace and PaceWait ever record, and the most
// that one call may book (weight/QPS seconds): 1e8 seconds, a little over
// three years. It keeps every time the algorithm handles exact.
const Horizon = time.Duration(horizonUs) * time.Microsecond

// Store keeps pacer state: NewLocal for one process, NewRedis for many.
// Pacers created on the same store with the same name share their state.
type Store interface {
	// decide runs one decision over the pacers of reqs at one instant and
	// records it in all of them or in none; it reports whether it recorded.
	decide(ctx context.Context, reqs []request, out []stepResult) (bool, error)
	// waitClock is the clock PaceWait waits on.
	waitClock() clock.Clock
	// failure returns the failure policy and FailClosed's delay.
	failure() (FailurePolicy, time.Duration)
}

var (
	_ Store = (*Local)(nil)
	_ Store = (*Redis)(nil)
)

// Options configures a Pacer.
type Options struct {
	// Name identifies the pacer within its store: pacers with the same name
	// on the same store share their state (each applying its own options),
	// and a Composite names the member that set its delay by it. It must be
	// non-empty and must not contain '{' or '}'.
	Name string

	// QPS is the target rate in weight units per second (a weight-1 call per
	// 1/QPS seconds). It must be > 0 and at most MaxQPS (1e6). For a
	// per-minute limit L, use L/60. State is kept in whole microseconds, so
	// each call books weight/QPS seconds rounded up to the microsecond:
	// exact to a thousandth when a call books a millisecond or more, and
	// never more than the rate (at rates where a call books a few
	// microseconds, the rounding makes the key somewhat slower).
	QPS float64

	// MaxBurst is the volume of the bucket: the weight that may go at once
	// on top of the steady rate after a quiet period. From idle, MaxBurst+1
	// weight-1 calls go without delay (the first overflowing call is free and
	// books the next slot). Zero, the default, means no burst. It must be >= 0
	// and finite.
	MaxBurst float64

	// BurstFactor is the rate at which the bucket drains, as a fraction of
	// QPS, when no call is queued. Zero selects DefaultPaceFactor (0.5) for
	// Pace and PaceWait and DefaultRateLimitFactor (1) for RateLimit. It must
	// be between 0 and 1: a bucket that drained faster than the rate would
	// let a key through faster than its rate.
	BurstFactor float64

	// MaxDelay is the longest delay that Pace and PaceWait record: a longer
	// call records nothing and fails with ErrTooLong. Zero means the package
	// Horizon (three years), which also caps larger values. It must be >= 0.
	MaxDelay time.Duration
}

// Pacer paces calls or limits their rate: per call key, at most
// QPS weight units per second on average, with MaxBurst of burst allowance.
//
// A Pacer is immutable and safe for concurrent use; it holds no state of its
// own (the store does), so it is cheap to create. To change a pacer's
// options, create a new Pacer with the same name on the same store: the state
// carries over.
type Pacer struct {
	store      Store
	opts       Options
	factor     [numModes]float64
	drainUs    [numModes]int64
	maxDelayUs int64
}

// mode is how a call is decided and recorded.
type mode uint8

const (
	modePace      mode = iota // record the call whatever its delay (up to Options.MaxDelay)
	modeRateLimit             // record the call only if it goes now
	modeBook                  // record weight already spent, up to a cap, whatever the delay
	numModes
)

// request is one pacer's part of a decision.
type request struct {
	name, key string
	p         params
}

// New returns a pacer that keeps its state in store.
func New(store Store, opts Options) (*Pacer, error) {
	if store == nil {
		return nil, invalidf("store", "must not be nil")
	}
	if opts.Name == "" {
		return nil, invalidf("Options.Name", "must not be empty")
	}
	if err := checkName("Options.Name", opts.Name); err != nil {
		return nil, err
	}
	if !(opts.QPS > 0) || math.IsInf(opts.QPS, 1) {
		return nil, invalidf("Options.QPS", "must be > 0 and finite, got %v", opts.QPS)
	}
	if opts.QPS > MaxQPS {
		return nil, invalidf("Options.QPS", "must be at most %g (a weight-1 call books at least a microsecond), got %v; count in larger units for higher rates", float64(MaxQPS), opts.QPS)
	}
	if !(opts.MaxBurst >= 0) || math.IsInf(opts.MaxBurst, 1) {
		return nil, invalidf("Options.MaxBurst", "must be >= 0 and finite, got %v", opts.MaxBurst)
	}
	if !(opts.BurstFactor >= 0 && opts.BurstFactor <= 1) {
		return nil, invalidf("Options.BurstFactor", "must be between 0 and 1 (0 selects the default), got %v", opts.BurstFactor)
	}
	if opts.MaxDelay < 0 {
		return nil, invalidf("Options.MaxDelay", "must be >= 0, got %v", opts.MaxDelay)
	}
	p := &Pacer{store: store, opts: opts, maxDelayUs: horizonUs}
	if opts.MaxDelay > 0 && opts.MaxDelay < Horizon {
		p.maxDelayUs = int64(opts.MaxDelay / time.Microsecond)
	}
	p.factor = [numModes]float64{DefaultPaceFactor, DefaultRateLimitFactor, DefaultPaceFactor}
	if opts.BurstFactor > 0 {
		p.factor = [numModes]float64{opts.BurstFactor, opts.BurstFactor, opts.BurstFactor}
	}
	for m := range p.factor {
		p.drainUs[m] = drainTime(opts.MaxBurst, opts.QPS, p.factor[m])
	}
	return p, nil
}

// Name returns the pacer's name.
func (p *Pacer) Name() string { return p.opts.Name }

// Options returns the options the pacer was created with.
func (p *Pacer) Options() Options { return p.opts }

// Outcome is the result of one call.
type Outcome struct {
	// Delay is how long the call must wait before it goes, to the
	// microsecond; zero means "go now", and only a call that goes now is
	// admitted by RateLimit (a call a microsecond early waits, or is
	// rejected, like any other).
	//
	// For Pace the call is booked that far ahead; for RateLimit a positive
	// Delay is a rejection (nothing was recorded) and the exact retry-after:
	// a call retried that much later goes, unless another call took the slot
	// first.
	Delay time.Duration

	// Level is the bucket level (the watermark) that the call found,
	// after draining and before adding its weight.
	Level float64

	// Weight is the call's weight and MaxBurst the pacer's bucket volume,
	// kept for Reason.
	Weight, MaxBurst float64

	// Booked is the weight the call recorded: Weight when it was recorded,
	// 0 when nothing was (a RateLimit rejection, a Pace beyond its maximum
	// delay, a Peek, a weight of 0), and for Book the part of Weight that
	// fit. For a Settle that gave weight back it is negative: the weight
	// given back, at most the bucket's level.
	Booked float64

	// Fallback is nil for a decision of the store. It is non-nil (and
	// matches ErrUnavailable) when the store failed and the outcome was
	// decided by the RedisOptions.OnFailure policy instead: it is the
	// store's error, so the caller can log or count the outage.
	Fallback error
}

// DelayMs returns Delay in whole milliseconds, rounded half up, and at least
// 1 for any positive Delay: zero exactly when the call goes now.
func (o Outcome) DelayMs() int64 {
	ms := int64((o.Delay + time.Millisecond/2) / time.Millisecond)
	if ms == 0 && o.Delay > 0 {
		ms = 1
	}
	return ms
}

// Reason explains the outcome in words, for example
// "watermark=1.00/2 + weight=1, delayMs=0": the level the call found with
// two decimals (rounded half up, so 0.125 prints as 0.13), the bucket volume
// and the weight in their shortest decimal form, and DelayMs. When the
// failure policy decided, it is "store failed, delayMs=<n>: <error>".
func (o Outcome) Reason() string {
	if o.Fallback != nil {
		return fmt.Sprintf("store failed, delayMs=%d: %v", o.DelayMs(), o.Fallback)
	}
	return "watermark=" + fixed2(o.Level) + "/" + strconv.FormatFloat(o.MaxBurst, 'f', -1, 64) +
		" + weight=" + strconv.FormatFloat(o.Weight, 'f', -1, 64) + ", delayMs=" + strconv.FormatInt(o.DelayMs(), 10)
}

// fixed2 formats x with two decimals, rounding its exact value half up
// (towards +Inf). strconv rounds an exact tie to even instead; a double is
// exactly halfway between two hundredths only when it is an odd multiple of
// 1/8 (0.125, 0.375, ...), and those are rounded up here.
func fixed2(x float64) string {
	if t := x * 8; t == math.Trunc(t) && math.Mod(t, 2) != 0 {
		x = math.Ceil(x*100) / 100
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// Pace decides when a call of the given weight on key may go, and books it:
// the caller waits Outcome.Delay, then acts. Use weight 1 for a plain call
// and, for example, the token count for a tokens-per-second pacer.
//
// The call is recorded even when it must wait, so concurrent callers are
// spaced weight/QPS apart: at 10 QPS, three simultaneous calls get 0, 100 and
// 200 ms. A call whose delay exceeds Options.MaxDelay records nothing and
// returns the outcome with an error matching ErrTooLong.
//
// The key must be non-empty and must not contain '{' or '}' (on Redis it
// is the key's cluster hash tag). ctx bounds the store's work (the Redis
// round trip), not the wait. Invalid input (a bad key, a weight that is
// negative or not finite) returns an error matching bulkhead.ErrInvalid and
// records nothing.
//
// A call of weight 0 is never delayed and books nothing: the store is not
// asked (so the call goes even while Redis is down), and Outcome.Level is 0. A store failure returns an error
// matching ErrUnavailable, or a decision made by the store's failure policy.
func (p *Pacer) Pace(ctx context.Context, key string, weight float64) (Outcome, error) {
	return p.decide(ctx, key, weight, modePace, p.maxDelayUs, 0, false)
}

// PaceWait is Pace followed by the wait: it returns when the call may go,
// with a nil error, or when ctx ends first, with the context's cause (the
// booked slot is then not given back; callers behind it wait for it anyway).
//
// When ctx has a deadline that the delay would outlast, PaceWait does not
// book the call: it returns at once, with the outcome and an error that
// matches both ErrTooLong and context.DeadlineExceeded.
func (p *Pacer) PaceWait(ctx context.Context, key string, weight float64) (Outcome, error) {
	clk := p.store.waitClock()
	maxWait, byDeadline := deadlineWait(ctx, clk, p.maxDelayUs)
	if maxWait < 0 {
		return Outcome{Weight: weight, MaxBurst: p.opts.MaxBurst}, context.DeadlineExceeded
	}
	out, err := p.decide(ctx, key, weight, modePace, maxWait, 0, byDeadline)
	if err != nil || out.Fallback != nil {
		return out, err
	}
	return out, wait(ctx, clk, out.Delay)
}

// RateLimit decides whether a call of the given weight on key may go now.
// A zero Outcome.Delay admits the call, and records it; a positive Delay
// rejects it, records nothing, and is the exact retry-after.
//
// Errors are as for Pace. Under the FailClosed policy a store failure is a
// rejection with RedisOptions.FailureDelay as retry-after; under FailOpen it
// admits the call.
func (p *Pacer) RateLimit(ctx context.Context, key string, weight float64) (Outcome, error) {
	return p.decide(ctx, key, weight, modeRateLimit, 0, 0, false)
}

// Peek answers what RateLimit would answer now, recording nothing: a zero
// Delay says the call would go, a positive one is the retry-after RateLimit
// would give. It is advisory: by the time the caller acts, other calls may
// have changed the answer. Errors and failure policies are as for
// RateLimit.
func (p *Pacer) Peek(ctx context.Context, key string, weight float64) (Outcome, error) {
	return p.decide(ctx, key, weight, modeRateLimit, peekUs, 0, false)
}

// Book records weight that has already been spent, such as the tokens a
// call used beyond what it was rate-limited or paced for, so that the calls
// after it wait for it. It never waits and never fails for a delay: it
// books the weight in the key's bucket or at the end of its queue, as Pace
// would, but never further than within from now, so that one huge figure
// cannot lock the key out for longer. Outcome.Booked is the part of weight
// that fit (Weight when all of it did); the rest is dropped. within must be
// positive. Errors and failure policies are as for Pace.
func (p *Pacer) Book(ctx context.Context, key string, within time.Duration, weight float64) (Outcome, error) {
	capUs, err := bookCap(within)
	if err == nil && !(weight >= 0) {
		err = invalidf("weight", "must be >= 0 and finite, got %v", weight)
	}
	if err != nil {
		return Outcome{Weight: weight, MaxBurst: p.opts.MaxBurst}, err
	}
	return p.decide(ctx, key, weight, modeBook, bookWaitUs, capUs, false)
}

// Settle corrects what a call booked on key to what it used, once that is
// known. A positive delta is weight spent beyond what the call was paced
// or rate-limited for, booked as Book books it: never waiting, and never
// further than within from now. A negative delta is weight the call
// booked but did not use, given back: the key's bucket level falls by it,
// never below empty, so that the calls after it may go sooner. A delta of
// zero does nothing (the store is not asked). within must be positive.
//
// What a key gives back is only what its bucket holds: a pacer without a
// burst (MaxBurst 0), which spaces its calls by its queue alone, has
// nothing to give back, nor has a key whose state has expired. Room given
// back while calls are queued on the key is used once the queue has run
// out: the calls that come meanwhile queue behind the ones booked before
// them. Over any window of time, a key lets through at most MaxBurst +
// QPS x the window plus one call's weight, plus what was given back within
// the window.
//
// Outcome.Booked is the weight booked or, negative, the weight given
// back. Like Book, a settlement first drains the bucket at the factor of
// Pace (Options.BurstFactor, or DefaultPaceFactor when it is zero): give a
// pacer used with RateLimit an explicit BurstFactor of 1 so that its
// settlements drain as its decisions do. Errors and failure policies are
// as for Book.
func (p *Pacer) Settle(ctx context.Context, key string, within time.Duration, delta float64) (Outcome, error) {
	capUs, err := bookCap(within)
	if err != nil {
		return Outcome{Weight: delta, MaxBurst: p.opts.MaxBurst}, err
	}
	return p.decide(ctx, key, delta, modeBook, bookWaitUs, capUs, false)
}

// bookWaitUs is the maxWaitUs of Book: any delay may be recorded.
const bookWaitUs = 4 * horizonUs

// bookCap checks Book's within and returns it in µs, capped at the horizon.
func bookCap(within time.Duration) (int64, error) {
	if within <= 0 {
		return 0, invalidf("within", "must be > 0, got %v", within)
	}
	return max(1, min(int64(within/time.Microsecond), horizonUs)), nil
}

// booked returns the weight a recorded decision booked: all of it, unless
// a cap cut its slot in the queue short.
func booked(r *stepResult, p *params) float64 {
	if !r.commit {
		return 0
	}
	if p.weight < 0 {
		return max(p.weight, -r.before) // given back: at most what the bucket held
	}
	if p.capUs <= 0 || !(float64(r.before+p.weight) > p.burst) && r.delayUs == 0 {
		return p.weight // not capped, or it went into the bucket
	}
	us := min(p.intervalUs, max(0, p.capUs-r.delayUs))
	if us == p.intervalUs {
		return p.weight
	}
	return p.weight * float64(us) / float64(p.intervalUs)
}

// request builds the pacer's part of a decision.
func (p *Pacer) request(key string, weight float64, m mode, maxWaitUs, capUs int64) request {
	return request{name: p.opts.Name, key: key, p: params{
		weight:     weight,
		qps:        p.opts.QPS,
		burst:      p.opts.MaxBurst,
		factor:     p.factor[m],
		intervalUs: interval(weight, p.opts.QPS),
		drainUs:    p.drainUs[m],
		maxWaitUs:  maxWaitUs,
		capUs:      capUs,
	}}
}

func (p *Pacer) decide(ctx context.Context, key string, weight float64, m mode, maxWaitUs, capUs int64, byDeadline bool) (Outcome, error) {
	out := Outcome{Weight: weight, MaxBurst: p.opts.MaxBurst}
	if err := ctx.Err(); err != nil {
		return out, context.Cause(ctx)
	}
	if err := checkKey(key); err != nil {
		return out, err
	}
	if err := checkDelta("weight", weight, p.opts.QPS, capUs > 0); err != nil {
		return out, err
	}
	if weight == 0 {
		return out, nil // never delayed, books nothing: the store is not asked
	}
	req := p.request(key, weight, m, maxWaitUs, capUs)
	var res stepResult
	if l, ok := p.store.(*Local); ok {
		// The common in-process case, without the slices of the general
		// path: no allocation.
		res = l.decideOne(&req)
	} else if t, ok := p.store.(*Table); ok {
		res = t.decideOne(&req)
	} else {
		var r [1]stepResult
		if _, err := p.store.decide(ctx, []request{req}, r[:]); err != nil {
			return fallback(ctx, p.store, out, m, err)
		}
		res = r[0]
	}
	out.Delay = time.Duration(res.delayUs) * time.Microsecond
	out.Level = res.before
	out.Booked = booked(&res, &req.p)
	if !res.commit && m == modePace {
		return out, tooLong(out.Delay, maxWaitUs, byDeadline)
	}
	return out, nil
}

// fallback turns a store failure into the result the store's policy asks
// for. A failure caused by the caller's own context is returned as it is.
func fallback(ctx context.Context, s Store, out Outcome, m mode, err error) (Outcome, error) {
	if ended(ctx) {
		return out, fmt.Errorf("pacer: %w", err)
	}
	err = unavailable(err)
	policy, delay := s.failure()
	switch {
	case policy == FailOpen:
		out.Fallback = err
		return out, nil
	case policy == FailClosed && m == modeRateLimit:
		out.Fallback = err
		out.Delay = delay
		return out, nil
	}
	return out, err
}

// tooLong is the error of a Pace call that may not wait its delay.
func tooLong(delay time.Duration, maxWaitUs int64, byDeadline bool) error {
	limit := time.Duration(maxWaitUs) * time.Microsecond
	if byDeadline {
		return fmt.Errorf("%w: the delay of %v outlasts the context deadline (%v left): %w",
			ErrTooLong, delay, limit, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: the delay of %v exceeds the limit of %v", ErrTooLong, delay, limit)
}

// deadlineWait returns the longest delay a waiting call may book: maxUs, or
// the time left before ctx's deadline if that is shorter (byDeadline). It
// returns a negative wait when the deadline has passed.
func deadlineWait(ctx context.Context, clk clock.Clock, maxUs int64) (wait int64, byDeadline bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return maxUs, false
	}
	left := dl.Sub(clk.Now())
	if left <= 0 {
		return -1, true
	}
	if us := int64(left / time.Microsecond); us < maxUs {
		return us, true
	}
	return maxUs, false
}

// testHookWait, when set by a test, is called when wait has started its
// timer, so the test can move a mock clock knowing the timer is armed.
var testHookWait func(time.Duration)

// wait waits d on clk, or until ctx ends (returning its cause).
func wait(ctx context.Context, clk clock.Clock, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	if testHookWait != nil {
		testHookWait(d)
	}
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
