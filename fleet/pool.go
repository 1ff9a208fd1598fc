package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// retryDelay is the longest wait before a failed release or adjustment is
// sent again.
const retryDelay = 50 * time.Millisecond

// Pool is one replica's handle on a fleet-wide pool: it takes, adjusts,
// renews and releases holds in Redis for the admissions of this process.
//
// Reserve runs on the caller's goroutine, one Redis round trip. Release and
// Adjust never block: a background sender batches them. A background renewer
// extends the leases of the live holds every RenewEvery, registers again the
// holds Redis lost (after a restart, a failover, FLUSHALL, or a lease that
// ran out) and those the failure policy admitted without Redis, and watches
// the pool's generation while holds are live. Renewals go on through
// outages: a hold is never dropped because Redis is down, and it is dropped
// by Redis only when its lease runs out without renewal. While a live
// hold's lease has run out unrenewed, Reserve refuses (Reason Relearning)
// until the renewer has registered every live hold again.
//
// A Pool is safe for concurrent use. Close it to release its holds and stop
// its goroutines.
type Pool struct {
	s   settings
	st  *store
	clk clock.Clock
	log *slog.Logger
	now func() int64 // the scripts' time in µs; nil: Redis TIME (tests)

	mu          sync.Mutex
	closed      bool // no new reserves
	drained     bool // nothing is sent any more
	live        map[ID]*hold
	localSlots  int64
	localTokens int64
	unaccounted int64
	slotLimit   int64
	tokenBudget int64
	reserve     int64
	seen        seen   // the newest state of the pool this replica has seen
	genText     string // genNum in decimal, for the Views
	genNum      int64
	lapseAt     time.Time // when the first live hold's lease runs out unless renewed
	lapsed      bool      // a lease ran out: reserves wait for the renewal
	relQ        []pendingRelease
	// relSent is closed once the release batch on its way has been
	// answered (or failed); nil or closed when none is.
	relSent   chan struct{}
	dirty     map[ID]struct{} // holds with an adjustment to send
	stats     Stats
	fails     int   // consecutive failed Redis calls
	lastErr   error // the last one's error
	openUntil time.Time
	probing   bool
	blindOnce sync.Once // warns that the scripts cannot tell servers apart

	kickSend  chan struct{}
	kickRenew chan struct{}
	stop      chan struct{} // closed: the renewer stops
	stopSend  chan struct{} // closed: the sender stops
	wg        sync.WaitGroup
	reserves  sync.WaitGroup // Reserve calls in flight
	done      chan struct{}  // closed when Close has finished
}

// hold is a live hold of this replica.
type hold struct {
	h           Hold
	seq         uint64
	unaccounted bool      // admitted by the failure policy, not yet in Redis
	leaseEnd    time.Time // when the lease runs out unless renewed
	sent        Hold      // the values Redis last acknowledged
	lastAdjust  time.Time
	due         time.Time // when the waiting adjustment may go
}

type pendingRelease struct {
	id       ID
	deadline time.Time // give up after: the hold has expired by then
}

// New validates cfg and returns a pool, with its background renewer and
// sender running. It does not call Redis: the first Reserve does. Errors
// are *ConfigError.
func New(cfg Config) (*Pool, error) {
	var now func() int64
	if c, ok := cfg.Clock.(scriptClock); ok {
		now = c.ScriptMicros
	}
	return newPool(cfg, now)
}

// scriptClock is a Config.Clock that also gives the pool's scripts their
// time, in µs since the Unix epoch, instead of Redis TIME: a seam for the
// engine's property tests, which run leases, tombstones and relearn windows
// on a mock clock from outside this package. It is not part of the API.
type scriptClock interface{ ScriptMicros() int64 }

func newPool(cfg Config, now func() int64) (*Pool, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	p := &Pool{
		s:           s,
		st:          newStore(&s),
		clk:         s.Clock,
		log:         s.Logger.With("pool", s.Pool),
		now:         now,
		live:        make(map[ID]*hold),
		dirty:       make(map[ID]struct{}),
		slotLimit:   s.MaxConcurrent,
		tokenBudget: s.TokenBudget,
		reserve:     s.HighPriorityReserve,
		kickSend:    make(chan struct{}, 1),
		kickRenew:   make(chan struct{}, 1),
		stop:        make(chan struct{}),
		stopSend:    make(chan struct{}),
		done:        make(chan struct{}),
	}
	p.st.noScript = func(o op) {
		p.mu.Lock()
		p.errorKinds(o).NoScript++
		p.mu.Unlock()
	}
	p.wg.Add(2)
	go p.renewer()
	go p.sender()
	return p, nil
}

func checkHold(h Hold) error {
	if h.Slots != 0 && h.Slots != 1 {
		return invalidf("Hold.Slots", "must be 0 or 1, got %d", h.Slots)
	}
	if h.Tokens < 0 || h.Tokens > maxAmount {
		return invalidf("Hold.Tokens", "must be in [0, 2^53), got %d", h.Tokens)
	}
	return nil
}

// Reserve takes a fleet-wide hold h for the admission id, in one Redis round
// trip on the caller's goroutine. high marks a high-priority admission, which
// may use Config.HighPriorityReserve.
//
// The Result says whether it was admitted and why not. Everything Redis does
// wrong (no answer within CallTimeout, an error, an open breaker) is decided
// by the failure policy and reported in Result.Fallback, never as an error.
// The error is non-nil only for invalid input (*ConfigError), a closed pool
// (ErrClosed), or the caller's ctx ending before Redis answered (ctx's
// error); then the id is released in the background, so that a reserve that
// did execute leaves no hold behind.
//
// A second Reserve of a held id admits it again with Duplicate set and
// counts nothing twice; a Reserve of an id released already is refused
// (Reason Released).
func (p *Pool) Reserve(ctx context.Context, id ID, h Hold, high bool) (Result, error) {
	if err := checkHold(h); err != nil {
		return Result{}, err
	}
	if id == (ID{}) {
		return Result{}, invalidf("id", "must not be the zero ID")
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	started := p.clk.Now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return Result{}, ErrClosed
	}
	// Close waits for this call, so that its hold is released too.
	p.reserves.Add(1)
	defer p.reserves.Done()
	slotLimit, tokenLimit := p.slotLimit, p.tokenLimitLocked(high)
	view := View{MaxConcurrent: slotLimit, TokenBudget: tokenLimit}
	sn := p.seen
	lapsed := p.lapsedLocked(started)
	if lapsed && p.fails < breakerErrors {
		// Redis may have handed this replica's running calls' capacity to
		// others: take none more before they are registered again.
		p.stats.Reserves.Relearning++
		kick(p.kickRenew)
		p.mu.Unlock()
		return Result{Reason: Relearning}, nil
	}
	skip := p.breakerLocked(started, !lapsed)
	var released []pendingRelease
	var inFlight chan struct{}
	if skip == nil {
		// The releases waiting to be sent go first, in the same script, and
		// a batch already on its way is waited for, so that a reserve right
		// after a release of this replica sees the capacity it freed.
		n := min(len(p.relQ), piggybackReleases)
		released = append(released, p.relQ[:n]...)
		p.relQ = p.relQ[n:]
		inFlight = p.relSent
	}
	p.mu.Unlock()
	if skip != nil {
		return p.fallback(id, h, skip, started, false), nil
	}
	if inFlight != nil {
		wait := p.clk.NewTimer(p.s.CallTimeout)
		select {
		case <-inFlight:
		case <-wait.C(): // a slow release: decide without it
		case <-ctx.Done():
		}
		wait.Stop()
	}
	for attempt := 0; ; attempt++ {
		r, err := p.st.reserve(ctx, p.scriptNow(), sn, id, h, slotLimit, tokenLimit, released)
		if err != nil && len(released) > 0 {
			// Whether or not the script ran, the releases are sent again
			// (a release is idempotent).
			p.mu.Lock()
			p.relQ = append(released, p.relQ...)
			if !p.drained {
				kick(p.kickSend)
			}
			p.mu.Unlock()
		}
		released = nil
		if err != nil {
			var ce *callerError
			if errors.As(err, &ce) {
				p.mu.Lock()
				p.probing = false
				p.queueReleaseLocked(id, started.Add(p.s.LeaseTTL))
				p.mu.Unlock()
				return Result{}, ce.cause
			}
			p.failed(opReserve, err)
			return p.fallback(id, h, unavailable(err), started, true), nil
		}
		view.Slots, view.Tokens, view.Reclaimed = r.slots, r.tokens, r.reclaimed
		var res Result
		switch r.extra[0] {
		case codeAdmitted, codeDuplicate:
			res.Admitted, res.Duplicate = true, r.extra[0] == codeDuplicate
		case codeSlots:
			res.Reason = Slots
		case codeTokens:
			res.Reason = Tokens
		case codeReleased:
			res.Reason = Released
		case codeRelearning:
			res.Reason = Relearning
		default:
			err := fmt.Errorf("%w: reserve code %d", errReply, r.extra[0])
			p.failed(opReserve, err)
			return p.fallback(id, h, unavailable(err), started, true), nil
		}
		p.mu.Lock()
		view.Gen = p.genLocked(r.gen)
		res.View = view
		p.observeLocked(r, view)
		// A rejection that reclaimed a full batch may have left more
		// expired holds: look once more.
		if (res.Reason == Slots || res.Reason == Tokens) && r.reclaimed >= p.s.ReclaimBatch && attempt == 0 {
			p.mu.Unlock()
			continue
		}
		p.countLocked(res)
		if res.Admitted && p.live[id] == nil {
			p.addLocked(id, h, started, false)
		}
		p.mu.Unlock()
		return res, nil
	}
}

// countLocked counts the outcome of a reserve that Redis decided.
func (p *Pool) countLocked(res Result) {
	rs := &p.stats.Reserves
	switch {
	case res.Duplicate:
		rs.Duplicate++
	case res.Admitted:
		rs.Admitted++
	case res.Reason == Slots:
		rs.RejectedSlots++
	case res.Reason == Tokens:
		rs.RejectedTokens++
	case res.Reason == Released:
		rs.Released++
	case res.Reason == Relearning:
		rs.Relearning++
	}
}

// fallback applies the failure policy to a reserve that Redis could not
// decide; sent says whether the reserve went to Redis (and may have run).
func (p *Pool) fallback(id ID, h Hold, cause error, started time.Time, sent bool) Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Reserves.Error++
	res := Result{Fallback: cause}
	switch p.s.OnFailure {
	case FailOpen:
		res.Admitted = true
	case FailLocalShare:
		share := p.s.LocalShare
		switch {
		case p.localSlots+h.Slots > share.Slots:
			res.Reason = Slots
		case p.localTokens+h.Tokens > share.Tokens:
			res.Reason = Tokens
		default:
			res.Admitted = true
		}
	default:
		res.Reason = Unavailable
	}
	if !res.Admitted {
		p.stats.PolicyRejections++
		if sent {
			// The reserve may have run with its reply lost: undo it.
			p.queueReleaseLocked(id, started.Add(p.s.LeaseTTL))
		}
		return res
	}
	p.stats.PolicyAdmissions++
	if hd := p.live[id]; hd != nil {
		res.Duplicate, res.Unaccounted = true, hd.unaccounted
		return res
	}
	res.Unaccounted = true
	p.addLocked(id, h, started, true)
	return res
}

// addLocked records a new live hold.
func (p *Pool) addLocked(id ID, h Hold, started time.Time, unaccounted bool) {
	hd := &hold{h: h, unaccounted: unaccounted, leaseEnd: started.Add(p.s.LeaseTTL)}
	if len(p.live) == 0 || hd.leaseEnd.Before(p.lapseAt) {
		p.lapseAt = hd.leaseEnd
	}
	if !unaccounted {
		hd.sent = h
	} else {
		p.unaccounted++
	}
	p.live[id] = hd
	p.localSlots += h.Slots
	p.localTokens += h.Tokens
}

// removeLocked forgets a live hold and returns it (nil if not live).
func (p *Pool) removeLocked(id ID) *hold {
	hd := p.live[id]
	if hd == nil {
		return nil
	}
	delete(p.live, id)
	delete(p.dirty, id)
	p.localSlots -= hd.h.Slots
	p.localTokens -= hd.h.Tokens
	if hd.unaccounted {
		p.unaccounted--
	}
	return hd
}

func (p *Pool) tokenLimitLocked(high bool) int64 {
	if p.tokenBudget < 0 || high {
		return p.tokenBudget
	}
	return p.tokenBudget - p.reserve
}

func (p *Pool) scriptNow() int64 {
	if p.now == nil {
		return 0
	}
	return p.now()
}

// piggybackReleases bounds the releases a reserve sends along.
const piggybackReleases = 64

// Release ends the hold of id. It never blocks: the release is queued for
// the background sender, which sends the releases of many calls in one
// script and retries a failed one until it succeeds or the hold's lease has
// run out anyway. The hold stops being renewed at once. Releasing an id
// Redis does not hold (released already, expired, never reserved) changes
// nothing there, but keeps a late Reserve of it from taking a hold. After
// Close, Release does nothing. A Reserve made while releases wait to be sent
// sends them first, in its own script, so it sees the capacity they free.
func (p *Pool) Release(id ID) {
	now := p.clk.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	deadline := now.Add(p.s.LeaseTTL)
	if hd := p.removeLocked(id); hd != nil {
		deadline = hd.leaseEnd
	}
	p.queueReleaseLocked(id, deadline)
}

func (p *Pool) queueReleaseLocked(id ID, deadline time.Time) {
	if p.drained {
		return
	}
	p.relQ = append(p.relQ, pendingRelease{id: id, deadline: deadline})
	kick(p.kickSend)
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Adjust sets the live hold of id to h, absolute values, as of the usage
// sequence seq (1, 2, 3 ... for one admission). It never blocks. A seq not
// above the last one given changes nothing, here or in Redis, so retried
// and reordered reports are harmless. Adjustments of one hold are sent at
// most once per AdjustMinInterval, the latest values winning, except that
// tokens raised above the last value sent (an overrun) go at once. Slots 0
// gives the hold's slot back (the call no longer counts against
// MaxConcurrent) while its tokens stay held. Invalid values and ids that are
// not live are ignored.
func (p *Pool) Adjust(id ID, h Hold, seq uint64) {
	if checkHold(h) != nil || seq > maxAmount {
		return
	}
	now := p.clk.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	hd := p.live[id]
	if hd == nil || seq <= hd.seq {
		return
	}
	p.localSlots += h.Slots - hd.h.Slots
	p.localTokens += h.Tokens - hd.h.Tokens
	hd.h, hd.seq = h, seq
	if hd.unaccounted {
		return // registering it sends the values
	}
	if _, waiting := p.dirty[id]; waiting {
		p.stats.Adjusts.Coalesced++
	}
	p.dirty[id] = struct{}{}
	next := hd.lastAdjust.Add(p.s.AdjustMinInterval)
	hd.due = next
	if h.Tokens > hd.sent.Tokens || p.s.AdjustMinInterval < 0 || !now.Before(next) {
		hd.due = now
	}
	kick(p.kickSend)
}

// SetLimits changes the pool's limits, as in Config. Every script this
// replica sends afterwards decides by them; holds above new, lower limits
// stay until released, and block new admissions meanwhile.
func (p *Pool) SetLimits(maxConcurrent, tokenBudget, highPriorityReserve int64) error {
	if err := checkLimits("", maxConcurrent, tokenBudget, highPriorityReserve); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.slotLimit, p.tokenBudget, p.reserve = maxConcurrent, tokenBudget, highPriorityReserve
	return nil
}

// Stats returns the pool's counters and gauges.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Unaccounted = p.unaccounted
	s.ReleaseBacklog = int64(len(p.relQ))
	s.BreakerOpen = p.fails >= breakerErrors
	s.LocalHolds = int64(len(p.live))
	s.LocalTokens = p.localTokens
	return s
}

// genLocked returns gen in decimal.
func (p *Pool) genLocked(gen int64) string {
	if gen != p.genNum || p.genText == "" {
		p.genNum, p.genText = gen, strconv.FormatInt(gen, 10)
	}
	return p.genText
}

// observeLocked takes in what a script reply says about the pool. A reply
// of a newer generation than the one this replica knew means Redis lost
// the pool's state, came back with an older one, that another server
// serves it, or that nobody renewed for a lease: the live holds are
// registered again at once. (A reply of
// an older generation comes from a script that ran before the new one
// began, and says nothing new.)
func (p *Pool) observeLocked(r reply, view View) {
	p.succeededLocked()
	p.stats.Reclaimed += uint64(r.reclaimed)
	p.stats.LastView = view
	switch {
	case r.gen == p.seen.gen:
		p.seen.seq = max(p.seen.seq, r.seq)
	case r.gen > p.seen.gen:
		if p.seen.gen != 0 {
			p.stats.StateLosses++
			p.log.Warn("fleet: the pool's state in Redis is new (lost, rewound, on another Redis server, or left unrenewed); registering live holds again",
				"old_gen", p.seen.gen, "gen", r.gen, "live", len(p.live))
			p.notify(StateLost)
			kick(p.kickRenew)
		}
		p.seen = r.seen
	}
}

// lapsedLocked reports whether the lease of one of the live holds has run
// out at now, unrenewed (the process was paused, or Redis unreachable, for
// longer than LeaseTTL). Redis may have reclaimed such a hold and handed
// its capacity out again while its call went on.
func (p *Pool) lapsedLocked(now time.Time) bool {
	lapsed := len(p.live) > 0 && !now.Before(p.lapseAt)
	switch {
	case lapsed && !p.lapsed:
		p.stats.Lapses++
		p.log.Warn("fleet: leases not renewed within LeaseTTL; no new holds until the live ones are registered again",
			"live", len(p.live), "lease_ttl", p.s.LeaseTTL)
		p.notify(LeasesLapsed)
	case !lapsed && p.lapsed:
		p.log.Info("fleet: live holds registered again")
		p.notify(LeasesRestored)
	}
	p.lapsed = lapsed
	return lapsed
}

// breakerLocked returns the error that skips Redis while the breaker is
// open, or nil to call Redis (as the probe, once the cooldown is over, if
// probe allows).
func (p *Pool) breakerLocked(now time.Time, probe bool) error {
	if p.fails < breakerErrors {
		return nil
	}
	if !probe || p.probing || now.Before(p.openUntil) {
		return fmt.Errorf("%w: circuit breaker open after %d consecutive failures, the last: %w", ErrUnavailable, p.fails, p.lastErr)
	}
	p.probing = true
	return nil
}

// failed counts a failed Redis call.
func (p *Pool) failed(o op, err error) {
	now := p.clk.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.errorKinds(o)
	switch {
	case errors.Is(err, errTimedOut) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		k.Timeout++
	case isConn(err):
		k.Conn++
	default:
		k.Other++
	}
	p.fails++
	p.lastErr = err
	p.probing = false
	if p.fails >= breakerErrors {
		if p.fails == breakerErrors {
			p.log.Warn("fleet: Redis failing; circuit breaker open", "err", err, "policy", p.s.OnFailure.String())
			p.notify(BreakerOpened)
		}
		p.openUntil = now.Add(p.s.BreakerCooldown)
	}
}

// succeededLocked notes a Redis call that answered.
func (p *Pool) succeededLocked() {
	if p.fails >= breakerErrors {
		p.log.Info("fleet: Redis answering again; circuit breaker closed")
		p.notify(BreakerClosed)
	}
	p.fails, p.lastErr, p.probing = 0, nil, false
	if p.unaccounted > 0 {
		kick(p.kickRenew)
	}
}

func (p *Pool) errorKinds(o op) *ErrorKinds {
	e := &p.stats.Errors
	switch o {
	case opReserve:
		return &e.Reserve
	case opRelease:
		return &e.Release
	case opAdjust:
		return &e.Adjust
	case opRenew:
		return &e.Renew
	}
	return &e.Gen
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isConn(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, errNoAnswer)
}

// Close stops new reserves (they return ErrClosed), releases every
// remaining live hold in batches, and stops the pool's goroutines. It waits
// for the releases until ctx ends; releases still unsent then are dropped
// (their holds expire with their leases) and ctx's error is returned.
// Close is idempotent: later calls wait for the first and return nil.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.done
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.reserves.Wait() // each ends within CallTimeout
	p.stopGoroutines()
	p.mu.Lock()
	for id, hd := range p.live {
		p.relQ = append(p.relQ, pendingRelease{id: id, deadline: hd.leaseEnd})
		p.removeLocked(id)
	}
	p.mu.Unlock()
	err := p.drain(ctx)
	p.mu.Lock()
	p.drained = true
	p.mu.Unlock()
	p.st.inflight.Wait()
	close(p.done)
	return err
}

func (p *Pool) stopGoroutines() {
	close(p.stop)
	close(p.stopSend)
	p.wg.Wait()
}

// drain sends the queued releases until none is left or ctx ends.
func (p *Pool) drain(ctx context.Context) error {
	for {
		next := p.flushReleases()
		p.mu.Lock()
		left := len(p.relQ)
		p.mu.Unlock()
		if left == 0 {
			return nil
		}
		d := next.Sub(p.clk.Now())
		if d <= 0 {
			continue
		}
		t := p.clk.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			p.mu.Lock()
			p.relQ = nil
			p.mu.Unlock()
			return fmt.Errorf("fleet: Close: %d releases not sent: %w", left, ctx.Err())
		case <-t.C():
		}
	}
}

// crash abandons the pool as a crashed process would: its goroutines stop,
// nothing is released or renewed again, and its holds stay in Redis until
// their leases run out. For tests.
func (p *Pool) crash() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed, p.drained = true, true
	p.live, p.relQ, p.dirty = map[ID]*hold{}, nil, map[ID]struct{}{}
	p.mu.Unlock()
	p.stopGoroutines()
	p.st.inflight.Wait()
	close(p.done)
}

// Name returns the pool's name, Config.Pool.
func (p *Pool) Name() string { return p.s.Pool }

// Limits returns the limits the pool's next reserves use (see SetLimits):
// the fleet-wide concurrency, token budget and high-priority reserve (-1:
// not enforced).
func (p *Pool) Limits() (maxConcurrent, tokenBudget, highPriorityReserve int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slotLimit, p.tokenBudget, p.reserve
}
