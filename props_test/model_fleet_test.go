package props_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// The fleet pool in the state machine (SPEC X1): every admission takes a
// hold in a Redis pool that other replicas share, after its slot and before
// its rates. The model knows what Redis holds (its own replica's holds,
// the other replicas', and the ghosts a rewind brings back) and predicts
// every reserve: admitted, refused by the fleet's limits (ConcurrencyLimit
// or BudgetLimit, Constraint "fleet"), refused while the pool relearns
// (FleetUnavailable), or, while its replica is cut off from Redis, decided
// by the failure policy (FailClosed, FailOpen, FailLocalShare), with the
// detail, and Stats.Fleet.
//
// The other replicas are fleet.Pool handles of their own on the same pool;
// they take and release holds, or close, in steps of their own. Redis may
// go away for the bulkhead's replica (a client hook fails its commands),
// lose the pool's state (its keys deleted) or rewind it (restored from a
// snapshot taken earlier); after a loss or a rewind every replica probes
// the pool, sees the new generation and registers its live holds again,
// and the pool admits nobody until its relearn window ends. The pools run
// on a clock of their own (fleetClock), which also gives their scripts
// their time: the model moves it, to end relearn windows and to let a
// failed call be tried again.
//
// Every step ends with Redis holding what the model says (check waits for
// the pool's background releases, adjustments and registrations), so each
// reserve is decided on a state the model knows. Two things would leave a
// reserve's outcome to the order of goroutines: several reserves started
// by one engine message, and an abandoned slot's adjustment racing a
// reserve the abandon lets through. Runs whose fleet limits may be reached
// ("tight") keep both out: no waiting for capacity, no HoldCooldown, no
// pace mode, limits raised by at most one slot over the calls in flight
// while calls wait, and no abandon while calls wait. The other runs
// ("roomy") have limits no replica reaches, FailOpen, and no relearn
// window, so every reserve is admitted whatever the order; there only the
// fleet-wide view in Stats.Fleet depends on which reserve answered last,
// and the model checks it within bounds.

// fleetClock is the pools' clock: it schedules their renewals, retries and
// circuit breaker, and gives their scripts their time (see fleet.New).
type fleetClock struct{ *clock.Mock }

// ScriptMicros is the scripts' time, in µs.
func (c fleetClock) ScriptMicros() int64 { return c.Now().UnixMicro() }

// fleetEpoch is where the pools' clock starts: the scripts take 0 for
// Redis TIME.
var fleetEpoch = time.Unix(1_700_000_000, 0)

// faultHook fails every command of the client it is added to while down:
// the bulkhead's replica cut off from Redis.
type faultHook struct{ down atomic.Bool }

var errRedisDown = errors.New("props_test: Redis is down for this replica")

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.down.Load() {
			cmd.SetErr(errRedisDown)
			return errRedisDown
		}
		return next(ctx, cmd)
	}
}

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.down.Load() {
			for _, c := range cmds {
				c.SetErr(errRedisDown)
			}
			return errRedisDown
		}
		return next(ctx, cmds)
	}
}

// fleetRedis is the Redis of the model's fleet pools: a plain client, for
// the other replicas and the model's own reads, and a client with a fault
// hook, for the bulkhead's pool.
type fleetRedis struct {
	rdb    *redis.Client
	faulty *redis.Client
	fault  *faultHook
}

// newFleetRedis returns the fleet's clients on rdb's server, nil without
// one. A variant's runs follow one another, so they share them.
func newFleetRedis(t *testing.T, rdb *redis.Client) *fleetRedis {
	if rdb == nil {
		return nil
	}
	fr := &fleetRedis{rdb: rdb, fault: &faultHook{}}
	fr.faulty = redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, ContextTimeoutEnabled: true})
	fr.faulty.AddHook(fr.fault)
	t.Cleanup(func() { _ = fr.faulty.Close() })
	return fr
}

// fleetHold is what one admission of the bulkhead holds in the pool.
type fleetHold struct {
	// in: Redis holds it, with slots (0 once its abandon's adjustment
	// reached Redis) and its reservation's tokens.
	in    bool
	slots int64
	// unaccounted: the failure policy admitted it; the pool registers it
	// once Redis answers again.
	unaccounted bool
	// Waiting for Redis to answer again: its abandon's adjustment, its
	// release.
	adjust, release bool
}

// otherReplica is another replica of the service: a pool handle of its own
// and the holds it took.
type otherReplica struct {
	pool *fleet.Pool
	live []fleet.ID
	held map[fleet.ID]fleet.Hold
}

// fleetView is the fleet-wide state a reserve saw (Stats.Fleet shows the
// last).
type fleetView struct{ slots, tokens, maxConc, budget int64 }

// fleetModel is the model of the bulkhead's fleet pool and of Redis.
type fleetModel struct {
	m      *machine
	fr     *fleetRedis
	pool   *fleet.Pool
	cfg    fleet.Config // the bulkhead's pool's; the others copy it
	clk    fleetClock
	tight  bool
	keys   []string // holds, vals, agg, gone
	down   bool
	gen    string // the pool's generation: its relearn window ends then (µs)
	genEnd int64

	ours   []*hold // admissions that the pool holds or held
	others []*otherReplica
	ghosts map[fleet.ID]fleet.Hold
	snap   *fleetSnapshot
	nextID uint64

	st bulkhead.FleetStats
	// Per step: the reserves Redis decided, the sums before the first
	// one, the smallest reservation among them, and whether an abandon's
	// adjustment was sent before them.
	stepReserves     int
	stepBase         fleetView
	stepMinTokens    int64
	stepTokens       int64
	stepAdjusted     int
	stepAdjustRacing int
	// violation says how a tight run let the order of goroutines decide
	// a reserve: a bug of the model's (see above).
	violation string
}

// fleetSnapshot is the pool's keys at some point, and what they held.
type fleetSnapshot struct {
	dumps map[string]string
	holds map[fleet.ID]fleet.Hold
}

// newFleetModel draws the fleet pool of a run and adds it to cfg: tight
// (limits any replica may reach, any failure policy, a relearn window) in
// two runs in three, else roomy. A tight run leaves out what would let the
// order of goroutines decide a reserve (see above).
func newFleetModel(t *rapid.T, m *machine, cfg *bulkhead.Config, fr *fleetRedis) *fleetModel {
	f := &fleetModel{m: m, fr: fr, clk: fleetClock{clock.NewMockAt(fleetEpoch)}, ghosts: map[fleet.ID]fleet.Hold{}}
	fr.fault.down.Store(false)
	f.tight = rapid.IntRange(0, 2).Draw(t, "fleetTight") > 0
	f.cfg = fleet.Config{
		Client: fr.faulty, Pool: fmt.Sprintf("model%d", rateRuns.Add(1)), MaxConcurrent: 1 << 20, TokenBudget: -1,
		LeaseTTL: time.Hour, GenCheckEvery: time.Hour, CallTimeout: 10 * time.Second, AdjustMinInterval: -1,
		BreakerCooldown: 10 * time.Millisecond, OnFailure: fleet.FailOpen, RelearnWindow: -1, Clock: f.clk,
	}
	if f.tight {
		m.wait, cfg.Queue.WaitForCapacity = false, false
		if m.hold = false; cfg.Adaptive != nil {
			cfg.Adaptive.Cooldown = bulkhead.ShedCooldown
		}
		if m.paced() {
			m.rate.unpace(t)
		}
		f.cfg.MaxConcurrent = int64(rapid.IntRange(-1, 4).Draw(t, "fleetMaxConcurrent"))
		f.cfg.TokenBudget = -1
		if m.hasBudget && rapid.IntRange(0, 2).Draw(t, "fleetBudgetKind") > 0 {
			f.cfg.TokenBudget = int64(rapid.IntRange(0, 120).Draw(t, "fleetBudget"))
			f.cfg.HighPriorityReserve = int64(rapid.IntRange(0, int(f.cfg.TokenBudget)/2).Draw(t, "fleetReserve"))
		}
		f.cfg.OnFailure = rapid.SampledFrom([]fleet.FailurePolicy{fleet.FailClosed, fleet.FailOpen, fleet.FailLocalShare}).Draw(t, "fleetPolicy")
		if f.cfg.OnFailure == fleet.FailLocalShare {
			f.cfg.LocalShare = fleet.Share{Slots: int64(rapid.IntRange(0, 3).Draw(t, "shareSlots")),
				Tokens: int64(rapid.IntRange(0, 100).Draw(t, "shareTokens"))}
		}
		f.cfg.RelearnWindow = time.Duration(rapid.SampledFrom([]int{-1, 5, 20, 50}).Draw(t, "relearnMs")) * time.Millisecond
	}
	// The pool is created deliberately, by a handle with no relearn
	// window: the first use costs no window.
	f.create(t)
	pool, err := fleet.New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.pool = pool
	f.keys = []string{"bh:{" + f.cfg.Pool + "}:holds", "bh:{" + f.cfg.Pool + "}:vals", "bh:{" + f.cfg.Pool + "}:agg", "bh:{" + f.cfg.Pool + "}:gone"}
	f.readGen(t)
	// Closed after the bulkhead (cleanups run last first), with Redis back.
	t.Cleanup(func() {
		fr.fault.down.Store(false)
		for _, o := range f.others {
			_ = o.pool.Close(context.Background())
		}
		_ = pool.Close(context.Background())
	})
	cfg.Fleet = pool
	m.seen[fmt.Sprintf("fleet tight=%v policy=%v window=%v", f.tight, f.cfg.OnFailure, f.cfg.RelearnWindow > 0)]++
	return f
}

// create creates the pool's state in Redis as a handle with no relearn
// window would.
func (f *fleetModel) create(t *rapid.T) {
	cfg := f.cfg
	cfg.Client, cfg.RelearnWindow = f.fr.rdb, -1
	p, err := fleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.probe(t, p)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// newID returns an ID for a hold of another replica's, or a probe's.
func (f *fleetModel) newID() fleet.ID {
	f.nextID++
	var id fleet.ID
	id[0], id[6] = 0xee, 0x40
	binary.BigEndian.PutUint64(id[8:], f.nextID)
	return id
}

// probe makes p run a script that holds nothing (a reserve of an ID it
// releases in the same script), so that it sees the pool's state as it is.
func (f *fleetModel) probe(t *rapid.T, p *fleet.Pool) {
	id := f.newID()
	p.Release(id)
	res, err := p.Reserve(context.Background(), id, fleet.Hold{}, false)
	if err != nil || res.Admitted || res.Reason != fleet.Released || res.Fallback != nil {
		t.Fatalf("fleet probe: %+v, %v; want it refused as released", res, err)
	}
}

// readGen reads the pool's generation from Redis.
func (f *fleetModel) readGen(t *rapid.T) {
	g, err := f.fr.rdb.HGet(context.Background(), f.keys[2], "gen").Result()
	if err != nil {
		t.Fatalf("the pool's generation: %v", err)
	}
	n, err := strconv.ParseInt(g, 10, 64)
	if err != nil {
		t.Fatalf("the pool's generation %q: %v", g, err)
	}
	f.gen, f.genEnd = g, n
}

// now is the scripts' time.
func (f *fleetModel) now() int64 { return f.clk.ScriptMicros() }

// tokenLimit is the token limit of a reserve of priority high (-1: none).
func (f *fleetModel) tokenLimit(high bool) int64 {
	if f.cfg.TokenBudget < 0 || high {
		return f.cfg.TokenBudget
	}
	return f.cfg.TokenBudget - f.cfg.HighPriorityReserve
}

// holds is what Redis holds, by ID: the bulkhead's admissions (by the ID
// each was admitted with; pending ones have none yet and are left out),
// the other replicas' holds and the ghosts.
func (f *fleetModel) holds() map[fleet.ID]fleet.Hold {
	out := maps.Clone(f.ghosts)
	for _, h := range f.ours {
		if h.fleet.in && h.id != (bulkhead.ID{}) {
			out[fleet.ID(h.id)] = fleet.Hold{Slots: h.fleet.slots, Tokens: h.res.Reserved}
		}
	}
	for _, o := range f.others {
		for _, id := range o.live {
			out[id] = o.held[id]
		}
	}
	return out
}

// sums is what Redis holds in all: slots and tokens.
func (f *fleetModel) sums() (slots, tokens int64) {
	for _, h := range f.ghosts {
		slots, tokens = slots+h.Slots, tokens+h.Tokens
	}
	for _, h := range f.ours {
		if h.fleet.in {
			slots, tokens = slots+h.fleet.slots, tokens+h.res.Reserved
		}
	}
	for _, o := range f.others {
		for _, id := range o.live {
			slots, tokens = slots+o.held[id].Slots, tokens+o.held[id].Tokens
		}
	}
	return slots, tokens
}

// local is what the bulkhead's pool holds itself, Redis answering or not:
// the local share bounds it.
func (f *fleetModel) local() (slots, tokens int64) {
	for _, h := range f.ours {
		if !h.released && (h.fleet.in || h.fleet.unaccounted) {
			if !h.abandoned {
				slots++
			}
			tokens += h.res.Reserved
		}
	}
	return slots, tokens
}

// decide is the reserve script's decision for a hold h of priority high,
// with the view it answers: admitted (Redis then holds it), or why not.
func (f *fleetModel) decide(h fleet.Hold, high bool) (fleet.Reason, fleetView) {
	s, tk := f.sums()
	v := fleetView{s, tk, f.cfg.MaxConcurrent, f.tokenLimit(high)}
	switch {
	case f.now() < f.genEnd:
		return fleet.Relearning, v
	case v.maxConc >= 0 && s+h.Slots > v.maxConc:
		return fleet.Slots, v
	case v.budget >= 0 && tk+h.Tokens > v.budget:
		return fleet.Tokens, v
	}
	v.slots, v.tokens = s+h.Slots, tk+h.Tokens
	return fleet.NoReason, v
}

// fleetVerdict is the fleet stage's verdict on one of the bulkhead's
// calls.
type fleetVerdict struct {
	why         bulkhead.Reason
	cons        bulkhead.Constraint
	detail      *bulkhead.FleetDetail
	neverFits   bool
	unaccounted bool // admitted by the failure policy
}

// reserve is the fleet stage of w, whose slot was just granted: the pool
// takes its hold, or the failure policy admits it, or it is turned away.
func (f *fleetModel) reserve(w *waiter) fleetVerdict {
	f.st.Checked++
	hd := fleet.Hold{Slots: 1, Tokens: w.res.Reserved}
	detail := &bulkhead.FleetDetail{Pool: f.cfg.Pool}
	if f.down {
		detail.Fallback = fleet.ErrUnavailable // the client's error, wrapped (see rejectWant.matches)
		ls, lt := f.local()
		var v fleetVerdict
		switch f.cfg.OnFailure {
		case fleet.FailOpen:
			v.unaccounted = true
		case fleet.FailLocalShare:
			switch {
			case ls+1 > f.cfg.LocalShare.Slots:
				v = fleetVerdict{why: bulkhead.ConcurrencyLimit, cons: bulkhead.ConstraintFleet}
			case lt+hd.Tokens > f.cfg.LocalShare.Tokens:
				v = fleetVerdict{why: bulkhead.BudgetLimit, cons: bulkhead.ConstraintFleet}
			default:
				v.unaccounted = true
			}
		default:
			v.why = bulkhead.FleetUnavailable
		}
		f.m.seen[fmt.Sprintf("fleet down: policy %v, %s", f.cfg.OnFailure, reasonName(v.why))]++
		if v.why == noReason {
			f.st.Admitted++
			f.st.PolicyAdmitted++
		}
		v.detail = detail
		return v
	}
	if f.stepReserves == 0 {
		s, tk := f.sums()
		f.stepBase, f.stepMinTokens, f.stepTokens = fleetView{slots: s, tokens: tk}, hd.Tokens, 0
		f.stepAdjustRacing = f.stepAdjusted
	}
	f.stepReserves++
	f.stepMinTokens = min(f.stepMinTokens, hd.Tokens)
	f.stepTokens += hd.Tokens
	if f.tight && f.stepAdjustRacing > 0 {
		f.violation = "an abandon's fleet adjustment races a reserve"
	}
	why, view := f.decide(hd, w.prio == bulkhead.High)
	f.setView(view)
	detail.InFlight, detail.InFlightTokens, detail.MaxConcurrent, detail.TokenBudget, detail.Generation =
		view.slots, view.tokens, view.maxConc, view.budget, f.gen
	f.m.seen["fleet "+reasonOrAdmitted(why)]++
	switch why {
	case fleet.NoReason:
		f.st.Admitted++
		return fleetVerdict{}
	case fleet.Slots:
		return fleetVerdict{why: bulkhead.ConcurrencyLimit, cons: bulkhead.ConstraintFleet, detail: detail}
	case fleet.Tokens:
		return fleetVerdict{why: bulkhead.BudgetLimit, cons: bulkhead.ConstraintFleet, detail: detail,
			neverFits: view.budget >= 0 && hd.Tokens > view.budget}
	}
	return fleetVerdict{why: bulkhead.FleetUnavailable, detail: detail}
}

func reasonOrAdmitted(r fleet.Reason) string {
	if r == fleet.NoReason {
		return "admitted"
	}
	return r.String()
}

// setView records the view of the last reserve Redis answered.
func (f *fleetModel) setView(v fleetView) {
	f.st.InFlight, f.st.InFlightTokens, f.st.MaxConcurrent, f.st.TokenBudget = v.slots, v.tokens, v.maxConc, v.budget
}

// admitted records admission h, whose fleet verdict was v.
func (f *fleetModel) admitted(h *hold, v fleetVerdict) {
	h.fleet = fleetHold{in: !v.unaccounted, slots: 1, unaccounted: v.unaccounted}
	f.ours = append(f.ours, h)
}

// released is admission h released: so is its hold.
func (f *fleetModel) released(h *hold) {
	switch {
	case h.fleet.in && f.down:
		h.fleet.release = true
	case h.fleet.in:
		h.fleet.in = false
	}
	h.fleet.unaccounted, h.fleet.adjust = false, false
}

// abandoned is admission h giving its slot back: the pool adjusts its
// hold to no slot.
func (f *fleetModel) abandoned(h *hold) {
	f.stepAdjusted++
	switch {
	case h.fleet.in && f.down:
		h.fleet.adjust = true
	case h.fleet.in:
		h.fleet.slots = 0
	}
}

// tightWithWaiters reports whether calls wait in a tight run: a slot that
// comes free then lets one in, whose reserve must not race anything.
func (f *fleetModel) tightWithWaiters() bool { return f != nil && f.tight && len(f.m.queue) > 0 }

// stats is Stats.Fleet as the model has it.
func (f *fleetModel) stats() *bulkhead.FleetStats {
	if f == nil {
		return nil
	}
	st := f.st
	return &st
}

// reconcile checks got, Stats.Fleet, against want when the last reserve
// Redis answered is not known: in a roomy run, several reserves were made
// at once, or one raced an abandon's adjustment. The view must then be one
// that some order could have shown; the model takes it.
func (f *fleetModel) reconcile(t *rapid.T, got, want *bulkhead.FleetStats) {
	if f == nil || got == nil || want == nil {
		return
	}
	uncertain := f.stepReserves > 1 || (f.stepReserves == 1 && f.stepAdjustRacing > 0)
	if !uncertain {
		return
	}
	if f.tight {
		return // serial: a refusal lets the next call in
	}
	// An abandon's adjustment that had not reached Redis leaves its slot
	// counted.
	b := f.stepBase
	lo, hi := b.slots+1, b.slots+int64(f.stepReserves+f.stepAdjustRacing)
	tlo, thi := b.tokens+f.stepMinTokens, b.tokens+f.stepTokens
	if got.InFlight < lo || got.InFlight > hi || got.InFlightTokens < tlo || got.InFlightTokens > thi ||
		got.MaxConcurrent != want.MaxConcurrent || got.TokenBudget != want.TokenBudget {
		t.Fatalf("after %s: Stats.Fleet %+v; want slots in [%d, %d] and tokens in [%d, %d] of %+v", f.m.descr, *got, lo, hi, tlo, thi, *want)
	}
	f.m.seen["fleet view reconciled"]++
	want.InFlight, want.InFlightTokens = got.InFlight, got.InFlightTokens
	f.st.InFlight, f.st.InFlightTokens = got.InFlight, got.InFlightTokens
}

// endStep clears the step's records.
func (f *fleetModel) endStep() {
	if f != nil {
		f.stepReserves, f.stepAdjusted, f.stepAdjustRacing = 0, 0, 0
	}
}

// sync waits until Redis holds what the model says: the pool's background
// releases, adjustments and registrations are done. It fails on a
// violation of the tight runs' rules.
func (f *fleetModel) sync(t *rapid.T) {
	if f == nil {
		return
	}
	if f.violation != "" {
		t.Fatalf("model guard: in a tight fleet run, %s (%s)", f.violation, f.m.descr)
	}
	want := map[string]string{}
	for id, h := range f.holds() {
		want[id.String()] = fmt.Sprintf("%d %d", h.Slots, h.Tokens)
	}
	var got map[string]string
	err := spinUntil("Redis to hold what the model says", func() (bool, error) {
		vals, err := f.fr.rdb.HGetAll(context.Background(), f.keys[1]).Result()
		if err != nil {
			return false, err
		}
		got = map[string]string{}
		for id, v := range vals {
			fs := strings.Fields(v)
			if len(fs) != 3 {
				return false, fmt.Errorf("vals[%s] = %q", id, v)
			}
			got[id] = fs[0] + " " + fs[1]
		}
		return maps.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("after %s: %v\nRedis holds %v\nmodel       %v", f.m.descr, err, got, want)
	}
}

// ---- The fleet's steps ----

// othersStep is another replica taking a hold (mostly), releasing one, or
// closing (its holds go back).
func (f *fleetModel) othersStep(t *rapid.T) {
	m := f.m
	switch k := rapid.IntRange(0, 5).Draw(t, "othersKind"); {
	case k <= 2 || len(f.others) == 0:
		var o *otherReplica
		if i := rapid.IntRange(0, len(f.others)).Draw(t, "replica"); i < len(f.others) {
			o = f.others[i]
		} else if len(f.others) < 2 {
			o = f.newOther(t)
		} else {
			o = f.others[0]
		}
		hd := fleet.Hold{Slots: int64(rapid.IntRange(0, 1).Draw(t, "otherSlots")), Tokens: int64(rapid.IntRange(0, 60).Draw(t, "otherTokens"))}
		high := rapid.Bool().Draw(t, "otherHigh")
		id := f.newID()
		m.descr = fmt.Sprintf("another replica reserves %+v (high %v)", hd, high)
		why, _ := f.decide(hd, high)
		res, err := o.pool.Reserve(context.Background(), id, hd, high)
		if err != nil || res.Admitted != (why == fleet.NoReason) || res.Reason != why || res.Fallback != nil {
			t.Fatalf("%s: %+v, %v; want reason %q", m.descr, res, err, why)
		}
		m.seen["fleet other: "+reasonOrAdmitted(why)]++
		if why == fleet.NoReason {
			o.live = append(o.live, id)
			o.held[id] = hd
		}
	case k <= 4:
		var live []*otherReplica
		for _, o := range f.others {
			if len(o.live) > 0 {
				live = append(live, o)
			}
		}
		if len(live) == 0 {
			t.Skip("no other replica holds anything")
		}
		o := live[rapid.IntRange(0, len(live)-1).Draw(t, "replica")]
		i := rapid.IntRange(0, len(o.live)-1).Draw(t, "otherHold")
		id := o.live[i]
		m.descr = fmt.Sprintf("another replica releases %+v", o.held[id])
		o.live = slices.Delete(o.live, i, i+1)
		delete(o.held, id)
		// A reserve of the ID sends the release first, in its script.
		o.pool.Release(id)
		res, err := o.pool.Reserve(context.Background(), id, fleet.Hold{}, false)
		if err != nil || res.Admitted || res.Reason != fleet.Released {
			t.Fatalf("%s: the reserve after it: %+v, %v", m.descr, res, err)
		}
		m.seen["fleet other: release"]++
	default:
		i := rapid.IntRange(0, len(f.others)-1).Draw(t, "replica")
		o := f.others[i]
		m.descr = fmt.Sprintf("another replica holding %d closes", len(o.live))
		if err := o.pool.Close(context.Background()); err != nil {
			t.Fatalf("%s: %v", m.descr, err)
		}
		f.others = slices.Delete(f.others, i, i+1)
		m.seen["fleet other: close"]++
	}
	m.tokensFrozen = true
}

// newOther starts another replica on the pool.
func (f *fleetModel) newOther(t *rapid.T) *otherReplica {
	cfg := f.cfg
	cfg.Client = f.fr.rdb
	p, err := fleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &otherReplica{pool: p, held: map[fleet.ID]fleet.Hold{}}
	f.others = append(f.others, o)
	return o
}

// outageStep cuts the bulkhead's replica off from Redis, or brings Redis
// back: the breaker lets a call through, the pool registers the holds the
// policy admitted meanwhile and sends what waited.
func (f *fleetModel) outageStep(t *rapid.T) {
	m := f.m
	m.tokensFrozen = true
	if !f.down {
		m.descr = "Redis goes away for this replica"
		f.down = true
		f.fr.fault.down.Store(true)
		m.seen["fleet down"]++
		return
	}
	m.descr = "Redis answers this replica again"
	f.down = false
	f.fr.fault.down.Store(false)
	// Past the breaker's cool-down and the retry delay of the releases
	// and adjustments that failed.
	f.clk.Add(60 * time.Millisecond)
	f.probe(t, f.pool)
	err := spinUntil("the holds admitted during the outage registered", func() (bool, error) {
		return f.pool.Stats().Unaccounted == 0, nil
	})
	if err != nil {
		t.Fatalf("%s: %v", m.descr, err)
	}
	for _, h := range f.ours {
		switch {
		case h.fleet.release:
			h.fleet = fleetHold{}
		case h.fleet.unaccounted:
			h.fleet = fleetHold{in: true, slots: 1}
			if h.abandoned {
				h.fleet.slots = 0
			}
		case h.fleet.adjust:
			h.fleet.adjust, h.fleet.slots = false, 0
		}
	}
	m.seen["fleet up"]++
}

// loseStep is Redis losing the pool's state (a restart without
// persistence, FLUSHALL).
func (f *fleetModel) loseStep(t *rapid.T) {
	if f.down {
		t.Skip("Redis is down for this replica")
	}
	m := f.m
	m.descr = "Redis loses the pool's state"
	m.tokensFrozen = true
	if err := f.fr.rdb.Del(context.Background(), f.keys...).Err(); err != nil {
		t.Fatal(err)
	}
	f.ghosts = map[fleet.ID]fleet.Hold{}
	f.relearn(t)
	m.seen["fleet state lost"]++
}

// rewindStep takes a snapshot of the pool's keys, or brings the pool back
// to the last one (Redis restarted from an older snapshot, a lagging
// replica promoted): the holds taken since are lost, and those released
// since come back as ghosts that nobody releases.
func (f *fleetModel) rewindStep(t *rapid.T) {
	if f.down {
		t.Skip("Redis is down for this replica")
	}
	m := f.m
	m.tokensFrozen = true
	if f.snap == nil || rapid.IntRange(0, 2).Draw(t, "newSnapshot") == 0 {
		m.descr = "a snapshot of the pool"
		dumps := map[string]string{}
		for _, k := range f.keys {
			d, err := f.fr.rdb.Dump(context.Background(), k).Result()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			dumps[k] = d
		}
		f.snap = &fleetSnapshot{dumps: dumps, holds: f.holds()}
		m.seen["fleet snapshot"]++
		return
	}
	m.descr = "Redis comes back with the pool's snapshot"
	// The bulkhead's replica writes first, so it has seen a later state
	// than the snapshot's and tells the rewind.
	f.probe(t, f.pool)
	for k, d := range f.snap.dumps {
		var err error
		if d == "" {
			err = f.fr.rdb.Del(context.Background(), k).Err()
		} else {
			err = f.fr.rdb.RestoreReplace(context.Background(), k, 0, d).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	f.ghosts = map[fleet.ID]fleet.Hold{}
	live := f.holds()
	for id, h := range f.snap.holds {
		if _, ok := live[id]; !ok {
			f.ghosts[id] = h
		}
	}
	if len(f.ghosts) > 0 {
		m.seen["fleet ghosts"]++
	}
	f.relearn(t)
	m.seen["fleet rewound"]++
}

// relearn has every replica probe the pool after a loss or a rewind: each
// sees the new generation and registers its live holds again.
func (f *fleetModel) relearn(t *rapid.T) {
	f.probe(t, f.pool)
	for _, o := range f.others {
		f.probe(t, o.pool)
	}
	f.sync(t)
	f.readGen(t)
	if !f.tight && f.now() < f.genEnd {
		// With no relearn window the new generation still ends a
		// microsecond after the one this replica saw: let it pass, so a
		// roomy run refuses nothing.
		f.clk.Add(time.Duration(f.genEnd-f.now()) * time.Microsecond)
	}
}

// timeStep moves the pools' clock, and so the scripts' time: a relearn
// window may end.
func (f *fleetModel) timeStep(t *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 60).Draw(t, "fleetMs")) * time.Millisecond
	f.m.descr = fmt.Sprintf("the pools' clock moves %v", d)
	f.m.tokensFrozen = true
	relearning := f.now() < f.genEnd
	f.clk.Add(d)
	if relearning && f.now() >= f.genEnd {
		f.m.seen["fleet relearn window over"]++
	}
}
