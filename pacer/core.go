package pacer

import "math"

// Time in the algorithm is integer microseconds since the Unix epoch. Integer
// microseconds below 2^53 are exact both in Go and in Lua's doubles, so the
// in-process step and the Redis script compare times exactly and store them
// without rounding.
const (
	// graceUs is the slack added to a state's lifetime: a state lives until
	// its queue has run out and then its bucket has drained, plus graceUs.
	graceUs = 120_000_000

	// horizonUs bounds what one call can book (weight/qps) and how far ahead
	// Pace may book: 1e8 s, a little over three years. It keeps every time
	// the algorithm handles far below 2^53 µs.
	horizonUs = 100_000_000_000_000

	// peekUs is the maxWaitUs of Peek: no delay is short enough to record,
	// and the delay is RateLimit's.
	peekUs = -2
)

// state is the stored state of one pacer key.
type state struct {
	level float64 // W: bucket level (upstream's watermark)
	last  int64   // L: time of the last drip, µs
	next  int64   // N: next free slot in the queue, µs
	exp   int64   // logical expiry, µs: from then on the state counts as absent
}

// params are the inputs of one step besides the state and the time. The
// interval and drain fields are derived from the others by interval and
// drainTime; the Lua script derives them itself with the same formulas.
type params struct {
	weight float64 // w, > 0 (a weight-0 call never reaches a store), or < 0 to give weight back (Settle)
	qps    float64 // > 0
	burst  float64 // maxBurst, >= 0
	factor float64 // burst allowance factor, > 0

	intervalUs int64 // interval(weight, qps): the queue time one call books
	drainUs    int64 // drainTime(burst, qps, factor): time to empty a full bucket

	// maxWaitUs is the longest delay the call may be recorded with:
	// 0 for RateLimit, the horizon or Options.MaxDelay for Pace, the time
	// left before the context's deadline for PaceWait, peekUs for Peek
	// (never recorded), and bookWaitUs for Book (always recorded).
	maxWaitUs int64

	// capUs, when positive (Book), is how far from now a queued call's
	// slot may reach: the call books what fits before now+capUs, perhaps
	// nothing.
	capUs int64
}

// stepResult is what one step decides.
type stepResult struct {
	delayUs int64   // the call's delay; 0 when it goes now (below roundUs)
	before  float64 // bucket level before the call, after draining
	commit  bool    // whether the call may be recorded (delayUs <= maxWaitUs)
	next    state   // the state to store if the call is recorded
}

// interval is the queue time, in µs, that a call of weight w books at qps:
// w/qps seconds, rounded up to the microsecond, so that a key never books
// less than its rate allows. The Lua script computes
// math.ceil(weight * 1000000 / qps).
func interval(w, qps float64) int64 {
	return int64(math.Ceil(float64(w*1e6) / qps))
}

// intervalTooSmall reports whether a call of weight w > 0 books less than
// half a microsecond at qps: a weight so small is refused, rather than
// booked as a whole microsecond.
func intervalTooSmall(w, qps float64) bool {
	return w > 0 && !(float64(w*1e6)/qps >= 0.5)
}

// intervalOK reports whether a call of weight w at qps books no more than
// the horizon (and is a number at all).
func intervalOK(w, qps float64) bool {
	iv := float64(w*1e6) / qps
	return iv <= horizonUs
}

// drainTime is the time, in µs, that a full bucket takes to drain, capped at
// the horizon: ceil(burst / (qps*factor) * 1e6), or 0 without a bucket.
func drainTime(burst, qps, factor float64) int64 {
	if !(burst > 0) {
		return 0
	}
	d := math.Ceil(float64(burst/float64(qps*factor)) * 1e6)
	if !(d <= horizonUs) {
		return horizonUs
	}
	return int64(d)
}

// step is the pacing algorithm, a pure function shared by both
// backends: the in-process store runs it under a mutex, and the Redis script
// (script.lua) is a line-by-line transcription of it. Keep the two in step;
// the property test in equiv_test.go checks that they agree.
//
// prev is the stored state and ok whether there is one. now is the decision
// time in µs. A state past its logical expiry counts as absent; expiry is
// therefore part of the result and not an accident of when memory is freed.
//
// The algorithm, with W the bucket level, L the time of the last drip and N
// the next free slot:
//
//	I = max(L, N)                                         (the queue has been empty since I)
//	N = max(N, now)
//	if N <= now: W = max(0, W - (now-I) * qps * factor)   (drain only while idle)
//	L = now
//	W = max(0, W + w)                                     (w < 0: weight given back)
//	if W <= maxBurst and (N <= now or w < 0): the call goes now and N is unchanged
//	else: the call is scheduled at N, N += ceil(w/qps), and
//	      W = maxBurst if it overflowed, else W - w (it is in the queue, not in the bucket)
//
// It departs from upstream's step function in three ways, each on purpose:
//
//   - The bucket drains only for the time since the queue emptied (I),
//     not for the whole time since the last call. Upstream credits the
//     time the queue was busy to the bucket as well, so a saturated key
//     with a burst gets both the queued slot and a drained bucket when the
//     slot comes due: about twice its rate. Draining from I keeps the bound
//     the package promises: over any window of T, a key admits at most
//     maxBurst + qps*T plus one call's weight (the call that overflows an
//     idle bucket books the next slot and goes).
//   - A call goes now only when its delay is zero to the microsecond
//     (upstream let a call less than half a millisecond early through, at
//     high rates hundreds of calls at once), and a call books w/qps rounded
//     up to the microsecond, never down.
//   - Time never runs backwards for a key (now is raised to L when a clock
//     steps back, and a rejection's delay then includes the time until the
//     clock is back at L).
//
// And it adds one: a negative weight gives weight back (Settle), lowering
// the bucket's level, never below empty. Room given back while calls are
// queued waits for the queue to run out (until then, calls queue behind
// the ones booked before them); without give-backs the bucket is always
// full while calls are queued, so this changes nothing else. Over any
// window, what a key admits less what it was given back within the window
// keeps the bound above.
func step(prev state, ok bool, now int64, p *params) stepResult {
	if !ok || now >= prev.exp {
		prev = state{last: now}
	}
	var behind int64 // how far the clock is behind the key's last call
	if now < prev.last {
		behind = prev.last - now
		now = prev.last
	}
	next := prev.next
	if next < now {
		next = now
	}
	level := prev.level
	if next <= now {
		// The queue has been empty since the later of the last call and
		// the end of the last booked slot (prev.next <= now here).
		idle := prev.last
		if prev.next > idle {
			idle = prev.next
		}
		// The explicit conversions keep the compiler from fusing the
		// multiplications and the subtraction (FMA on arm64, ppc64, s390x),
		// so the result is the same double that Lua computes.
		drained := float64(float64(float64(now-idle)/1e6*p.qps) * p.factor)
		level = float64(level - drained)
		if level < 0 {
			level = 0
		}
	}
	before := level
	level = float64(level + p.weight)
	if level < 0 {
		level = 0 // a give-back (Settle) empties the bucket at most
	}
	var delay int64
	if level > p.burst || (p.weight > 0 && next > now) {
		// The call overflows the bucket, or finds calls queued: it takes
		// the next slot. (The bucket has room while calls are queued only
		// when weight was given back meanwhile; that room waits for the
		// queue to run out, so calls keep their turns.)
		delay = next - now
		iv := p.intervalUs
		if p.capUs > 0 {
			iv = min(iv, max(0, now+p.capUs-next))
		}
		next += iv
		if level > p.burst {
			level = p.burst
		} else {
			level = before
		}
	}
	commit := delay <= p.maxWaitUs
	if !commit && p.maxWaitUs <= 0 {
		// A rejection (RateLimit): its retry-after is when the clock will
		// reach the slot, which is later than the delay counted from the
		// key's last call when the clock has stepped back behind it.
		delay += behind
	}
	// The bucket starts to drain when the queue runs out, so the state
	// matters until both have happened, one after the other.
	ttl := next - now + p.drainUs
	return stepResult{
		delayUs: delay,
		before:  before,
		commit:  commit,
		next:    state{level: level, last: now, next: next, exp: now + ttl + graceUs},
	}
}

// together makes the recorded decision of several pacers (the members of a
// composite) agree with the time the call goes, the largest of their
// delays: a member that would have let the call go sooner books its slot
// at that time instead, as a queued call (its bucket is left full, as every
// queued call leaves it, so that nothing goes through the bucket while the
// queue is busy). Without it, a member's earlier slots, used only when the
// slowest member lets the calls go, would bunch: two calls booked a slot
// apart in one member could go closer together than that member's rate
// allows. The Lua script does the same after its loop. (Book, which records
// weight already spent, is left as it is.)
func together(out []stepResult, reqs []request) {
	if reqs[0].p.capUs > 0 {
		return // Book: the weight was spent already, no call goes
	}
	var d int64
	for i := range out {
		d = max(d, out[i].delayUs)
	}
	if d == 0 {
		return
	}
	for i := range out {
		r := &out[i]
		if r.delayUs == d {
			continue
		}
		p := &reqs[i].p
		r.next.level = p.burst
		r.next.next = r.next.last + d + p.intervalUs
		r.next.exp = r.next.next + p.drainUs + graceUs
	}
}
