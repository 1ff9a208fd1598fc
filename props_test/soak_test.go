package props_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// Soak limits: the starting (and largest ever) limits.
const (
	soakWorkers       = 32
	soakDuration      = 2 * time.Second
	soakMaxConcurrent = 15
	soakMaxQueue      = 30
	soakBudget        = 50000
	soakReserve       = 5000
)

// tally is what one worker saw: every call it made ended in exactly one
// outcome, counted here.
type tally struct {
	calls     int64
	admitted  int64
	rejected  map[bulkhead.Reason]int64
	reserved  int64 // sum of reservations of admissions
	consumed  int64 // sum of usage settled at release
	refunded  int64 // sum of max(0, reserved - usage)
	ids       []bulkhead.ID
	applied   []int64 // revisions this worker applied
	doubleRel int64
}

func (t *tally) add(o *tally) {
	t.calls += o.calls
	t.admitted += o.admitted
	for k, v := range o.rejected {
		t.rejected[k] += v
	}
	t.reserved += o.reserved
	t.consumed += o.consumed
	t.refunded += o.refunded
	t.ids = append(t.ids, o.ids...)
	t.applied = append(t.applied, o.applied...)
	t.doubleRel += o.doubleRel
}

// TestSoak runs many goroutines against one bulkhead on the real clock for
// a bounded time, with a random mix of Acquire, Run, Release (with usage,
// without, invalid, twice), cancelled and expiring contexts, queue timeouts,
// WouldAdmit, Stats and ApplyLimits. Then it closes and drains and checks,
// without any assertion on timing, that nothing leaked and that every
// counter agrees with what the callers saw: no slot, token or goroutine
// left (goleak in TestMain), one admit and one release event per admission,
// one outcome per call, and the F11 ledger.
func TestSoak(t *testing.T) {
	b, err := bulkhead.New(bulkhead.Config{
		Model:         "gpt-4o",
		MaxConcurrent: soakMaxConcurrent,
		MaxQueue:      soakMaxQueue,
		TokenBudget:   &bulkhead.TokenBudget{Budget: soakBudget, HighPriorityReserve: soakReserve},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := &eventLog{}
	b.Subscribe(ev.hooks())
	// F30: Stats already reflect a change when its event is seen; a
	// listener checks it now and then (Stats is a round trip).
	var (
		staleMu          sync.Mutex
		admits, releases int64
		stale            string
	)
	seen := func(n *int64) {
		staleMu.Lock()
		defer staleMu.Unlock()
		if *n++; *n%64 != 0 || stale != "" {
			return
		}
		switch st := b.Stats(); {
		case st.Calls.Admitted < admits:
			stale = fmt.Sprintf("F30: %d admit events seen, Stats says %d admitted", admits, st.Calls.Admitted)
		case st.Calls.Released < releases:
			stale = fmt.Sprintf("F30: %d release events seen, Stats says %d released", releases, st.Calls.Released)
		}
	}
	b.Subscribe(bulkhead.Hooks{
		Admit:   func(bulkhead.AdmitEvent) { seen(&admits) },
		Release: func(bulkhead.ReleaseEvent) { seen(&releases) },
	})
	// A listener that always panics: recovered and counted, and admission
	// goes on (F30).
	b.Subscribe(bulkhead.Hooks{Reconfigure: func(bulkhead.ReconfigureEvent) { panic("listener panic") }})

	var revision atomic.Int64 // the revisions ApplyLimits tries
	tallies := make([]*tally, soakWorkers)
	soak(t, b, soakWorkers, soakDuration, func(w int, rng *rand.Rand) func() error {
		tallies[w] = &tally{rejected: map[bulkhead.Reason]int64{}}
		s := &soaker{b: b, rng: rng, t: tallies[w], revision: &revision}
		return s.step
	})
	total := &tally{rejected: map[bulkhead.Reason]int64{}}
	for _, x := range tallies {
		total.add(x)
	}

	st := b.Stats()
	c, tb := st.Calls, st.TokenBudget
	t.Logf("%d calls: %d admitted, rejected %v; %d double releases; %d limits applied",
		total.calls, total.admitted, total.rejected, total.doubleRel, len(total.applied))

	// No slot or token leaks (I3); the counters add up (I5).
	if err := checkIdle(st); err != nil {
		t.Fatal(err)
	}
	if err := checkCounters(st, nil); err != nil {
		t.Fatal(err)
	}
	// One outcome per call, as counted by the bulkhead.
	if c.Admitted != total.admitted || c.Rejected != total.calls-total.admitted ||
		!maps.Equal(normalize(st).Calls.RejectedByReason, total.rejected) {
		t.Fatalf("calls counted %d admitted, %d rejected %v; callers saw %d calls, %d admitted, rejected %v",
			c.Admitted, c.Rejected, c.RejectedByReason, total.calls, total.admitted, total.rejected)
	}
	if st.Gate.DoubleReleases != total.doubleRel {
		t.Fatalf("double releases %d, callers made %d", st.Gate.DoubleReleases, total.doubleRel)
	}
	// The F11 ledger: no ReportUsage, so no overrun and no early refund.
	if tb.TotalReserved != total.reserved || tb.TotalConsumed != total.consumed ||
		tb.TotalRefunded != total.refunded || tb.TotalOverrun != 0 {
		t.Fatalf("ledger %+v; callers reserved %d, settled usage %d, refunds %d",
			*tb, total.reserved, total.consumed, total.refunded)
	}

	// Events: one admit and one release per admission (I2), for exactly
	// the admissions the callers got; the release carries the hold.
	staleMu.Lock()
	defer staleMu.Unlock()
	if stale != "" {
		t.Fatal(stale)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	per, err := ev.perAdmission()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(per)) != total.admitted || int64(len(ev.releases)) != total.admitted || len(total.ids) != int(total.admitted) {
		t.Fatalf("%d admissions with events, %d release events, %d admissions", len(per), len(ev.releases), total.admitted)
	}
	applied := map[int64]bool{0: true}
	for _, r := range total.applied {
		applied[r] = true
	}
	var held, refunded int64
	for _, id := range total.ids {
		e := per[id]
		if e == nil || e.admit == nil {
			t.Fatalf("admission %s: no admit event", id)
		}
		a, r := e.admit, e.release
		if r.LimitRevision != a.LimitRevision || r.Reserved != a.Reserved || r.Held != a.Reserved || !applied[a.LimitRevision] {
			t.Fatalf("admission %s: admit %+v, release %+v (applied revisions %v)", id, *a, *r, applied)
		}
		held += r.Held
		refunded += r.Refunded
	}
	if held != tb.TotalReserved || refunded != tb.TotalRefunded {
		t.Fatalf("release events hold %d and refund %d; ledger %+v", held, refunded, *tb)
	}
	rejects := map[bulkhead.Reason]int64{}
	for _, e := range ev.rejects {
		rejects[e.Reason]++
	}
	if !maps.Equal(rejects, normalize(st).Calls.RejectedByReason) {
		t.Fatalf("reject events %v, stats %v", rejects, c.RejectedByReason)
	}
	if int64(len(ev.reconfigs)) != int64(len(total.applied)) || st.Events.ListenerPanics != int64(len(total.applied)) {
		t.Fatalf("%d reconfigure events, %d listener panics, %d applies", len(ev.reconfigs), st.Events.ListenerPanics, len(total.applied))
	}
}

// soaker is one worker.
type soaker struct {
	b        *bulkhead.Bulkhead
	rng      *rand.Rand
	t        *tally
	revision *atomic.Int64
	lastRev  int64 // the highest revision this worker has seen
}

var soakReq = &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "soak"}}, MaxTokens: 100}

// step makes one random call and checks what it can about it alone.
func (s *soaker) step() error {
	switch n := s.rng.IntN(100); {
	case n < 45:
		return s.acquire()
	case n < 70:
		return s.run()
	case n < 80:
		return s.wouldAdmit()
	case n < 95:
		return s.stats()
	default:
		return s.apply()
	}
}

// options draws a priority, a reservation and maybe a queue timeout.
func (s *soaker) options() ([]bulkhead.Option, bulkhead.Reservation) {
	res := bulkhead.Reservation{Input: s.rng.Int64N(3000), MaxOutput: s.rng.Int64N(3000)}
	res.Reserved = res.Input + res.MaxOutput
	opts := []bulkhead.Option{bulkhead.WithReservation(res)}
	if s.rng.IntN(4) == 0 {
		opts = append(opts, bulkhead.WithPriority(bulkhead.High))
	}
	if s.rng.IntN(2) == 0 {
		opts = append(opts, bulkhead.WithQueueTimeout(time.Duration(s.rng.IntN(2000)+1)*time.Microsecond))
	}
	return opts, res
}

// context draws the caller's context: plain, already cancelled, expiring
// soon, or cancelled from another goroutine soon.
func (s *soaker) context() (context.Context, context.CancelFunc) {
	switch s.rng.IntN(8) {
	case 0:
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	case 1:
		return context.WithTimeout(context.Background(), time.Duration(s.rng.IntN(1000))*time.Microsecond)
	case 2:
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(time.Duration(s.rng.IntN(500))*time.Microsecond, cancel)
		return ctx, func() { timer.Stop(); cancel() }
	}
	return context.WithCancel(context.Background())
}

// outcome counts a call's outcome; a rejection must be a well-formed
// *RejectedError.
func (s *soaker) outcome(err error) error {
	s.t.calls++
	if err == nil {
		s.t.admitted++
		return nil
	}
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, sentinel[rej.Reason]) {
		return fmt.Errorf("call failed with %v, want a rejection", err)
	}
	if rej.Detail == nil {
		return fmt.Errorf("rejection %v without detail", err)
	}
	s.t.rejected[rej.Reason]++
	return nil
}

// usage draws a final usage; ok is false for an invalid one.
func (s *soaker) usage(res bulkhead.Reservation) (u *bulkhead.Usage, ok bool) {
	switch s.rng.IntN(6) {
	case 0:
		return nil, true
	case 1:
		return &bulkhead.Usage{Input: -1, Output: 5}, false
	}
	total := s.rng.Int64N(res.Reserved*6/5 + 1)
	in := s.rng.Int64N(total + 1)
	return &bulkhead.Usage{Input: in, Output: total - in}, true
}

// settled records the usage a release settled.
func (s *soaker) settled(res bulkhead.Reservation, u *bulkhead.Usage) {
	if u == nil {
		return
	}
	s.t.consumed += u.Total()
	s.t.refunded += max(0, res.Reserved-u.Total())
}

func (s *soaker) admitted(tok *bulkhead.Permit, res bulkhead.Reservation) error {
	s.t.reserved += res.Reserved
	s.t.ids = append(s.t.ids, tok.ID())
	if got := tok.Reservation(); got == nil || *got != res {
		return fmt.Errorf("token reservation %+v, want %+v", got, res)
	}
	return nil
}

func (s *soaker) acquire() error {
	ctx, cancel := s.context()
	defer cancel()
	opts, res := s.options()
	tok, err := s.b.Acquire(ctx, soakReq, opts...)
	if err := s.outcome(err); err != nil || tok == nil {
		return err
	}
	if err := s.admitted(tok, res); err != nil {
		return err
	}
	spin(context.Background(), s.rng.IntN(20))
	u, valid := s.usage(res)
	err = tok.Release(u)
	if valid != (err == nil) {
		return fmt.Errorf("Release(%+v) = %v", u, err)
	}
	if valid {
		s.settled(res, u)
	}
	if s.rng.IntN(5) == 0 {
		s.t.doubleRel++
		if err := tok.Release(&bulkhead.Usage{Input: 1}); err != nil {
			return fmt.Errorf("double release returned %v", err)
		}
	}
	return nil
}

func (s *soaker) run() error {
	ctx, cancel := s.context()
	defer cancel()
	opts, res := s.options()
	u, valid := s.usage(res)
	mode := s.rng.IntN(4) // 0: fn fails, 1: fn panics, else it succeeds
	work := s.rng.IntN(20)
	var (
		id        bulkhead.ID
		err       error
		recovered any
	)
	func() {
		defer func() { recovered = recover() }()
		_, err = bulkhead.Run(ctx, s.b, soakReq, func(_ context.Context, rc *bulkhead.RunContext) (int, error) {
			id = rc.ID()
			if u != nil && (rc.SetUsage(*u) == nil) != valid {
				return 0, fmt.Errorf("SetUsage(%+v) disagrees with validation", *u)
			}
			spin(context.Background(), work)
			switch mode {
			case 0:
				return 0, errSoakFn
			case 1:
				panic(errSoakFn)
			}
			return 1, nil
		}, opts...)
	}()
	if id == (bulkhead.ID{}) { // fn never ran: a rejection
		if recovered != nil || err == nil {
			return fmt.Errorf("Run without calling fn: %v, panic %v", err, recovered)
		}
		return s.outcome(err)
	}
	s.t.calls++
	s.t.admitted++
	s.t.reserved += res.Reserved
	s.t.ids = append(s.t.ids, id)
	switch {
	case mode == 0 && (!errors.Is(err, errSoakFn) || recovered != nil),
		mode == 1 && recovered != errSoakFn,
		mode > 1 && (err != nil || recovered != nil):
		return fmt.Errorf("Run in mode %d returned %v, panic %v", mode, err, recovered)
	}
	if mode > 1 && valid {
		s.settled(res, u) // only a successful fn settles its usage (F6)
	}
	return nil
}

var errSoakFn = errors.New("fn failed")

func (s *soaker) wouldAdmit() error {
	opts := []bulkhead.Option{bulkhead.WithReservation(bulkhead.Reservation{Input: s.rng.Int64N(3000), MaxOutput: s.rng.Int64N(3000)})}
	if s.rng.IntN(4) == 0 {
		opts = append(opts, bulkhead.WithPriority(bulkhead.High))
	}
	if s.rng.IntN(2) == 0 {
		opts = append(opts, bulkhead.WithDetail())
	}
	d, err := s.b.WouldAdmit(soakReq, opts...)
	if err != nil {
		return fmt.Errorf("WouldAdmit: %v", err)
	}
	if d.Admit == (d.Reason != noReason) || (d.Reason == bulkhead.Shutdown) {
		return fmt.Errorf("WouldAdmit = %+v", d)
	}
	return nil
}

// stats checks what holds in any snapshot.
func (s *soaker) stats() error {
	st := s.b.Stats()
	g, tb := st.Gate, st.TokenBudget
	if err := checkCounters(st, nil); err != nil {
		return err
	}
	switch {
	case st.Limits.Revision < s.lastRev:
		return fmt.Errorf("I8: revision fell from %d to %d", s.lastRev, st.Limits.Revision)
	// The limits never rise above the starting ones, so neither may use.
	case g.InFlight < 0 || g.InFlight > soakMaxConcurrent || g.Pending < 0 || g.Pending > soakMaxQueue:
		return fmt.Errorf("I1: gate %+v", g)
	case tb.InFlightTokens < 0 || tb.InFlightTokens > soakBudget || tb.Available != max(0, tb.Budget-tb.InFlightTokens):
		return fmt.Errorf("I1: budget %+v", *tb)
	case tb.TotalOverrun != 0 || tb.TotalReserved < tb.InFlightTokens:
		return fmt.Errorf("I6: budget %+v", *tb)
	}
	s.lastRev = st.Limits.Revision
	return nil
}

// apply installs random limits no larger than the starting ones, at a
// fresh revision that may arrive after a later one (then it is stale).
func (s *soaker) apply() error {
	next := bulkhead.Limits{
		Revision:      s.revision.Add(1),
		MaxConcurrent: 1 + s.rng.IntN(soakMaxConcurrent),
		MaxQueue:      s.rng.IntN(soakMaxQueue + 1),
		TokenBudget: &bulkhead.BudgetLimits{
			Budget:              soakBudget/2 + s.rng.Int64N(soakBudget/2+1),
			HighPriorityReserve: s.rng.Int64N(soakReserve + 1),
		},
	}
	res, err := s.b.ApplyLimits(next)
	switch {
	case err != nil:
		return fmt.Errorf("ApplyLimits: %v", err)
	case res.Applied:
		if res.Current.Revision != next.Revision || res.Previous.Revision >= next.Revision {
			return fmt.Errorf("ApplyLimits applied %+v", res)
		}
		s.t.applied = append(s.t.applied, next.Revision)
	case res.Reason != bulkhead.StaleRevision || res.Current.Revision < next.Revision || res.Current.Revision != res.Previous.Revision:
		return fmt.Errorf("ApplyLimits not applied: %+v", res)
	}
	l := s.b.Limits()
	if l.Revision < max(s.lastRev, next.Revision) {
		return fmt.Errorf("I8: revision %d after applying %d (seen %d)", l.Revision, next.Revision, s.lastRev)
	}
	s.lastRev = l.Revision
	return nil
}
