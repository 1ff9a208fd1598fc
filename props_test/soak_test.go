package props_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
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

// soakEvents is what the listeners saw.
type soakEvents struct {
	mu        sync.Mutex
	admits    map[bulkhead.ID]bulkhead.AdmitEvent
	dupAdmits int
	releases  map[bulkhead.ID]bulkhead.ReleaseEvent
	dupRels   int
	rejects   map[bulkhead.Reason]int64
	reconfigs int
	stale     string // a Stats snapshot behind the events, if any
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
	ev := &soakEvents{
		admits:   map[bulkhead.ID]bulkhead.AdmitEvent{},
		releases: map[bulkhead.ID]bulkhead.ReleaseEvent{},
		rejects:  map[bulkhead.Reason]int64{},
	}
	// F30: Stats already reflect a change when its event is seen; the
	// listener checks it now and then (Stats is a round trip).
	stale := func() string {
		st := b.Stats()
		if n := int64(len(ev.admits)); st.Calls.Admitted < n {
			return fmt.Sprintf("F30: %d admit events seen, Stats says %d admitted", n, st.Calls.Admitted)
		}
		if n := int64(len(ev.releases)); st.Calls.Released < n {
			return fmt.Sprintf("F30: %d release events seen, Stats says %d released", n, st.Calls.Released)
		}
		return ""
	}
	b.Subscribe(bulkhead.Hooks{
		Admit: func(e bulkhead.AdmitEvent) {
			ev.mu.Lock()
			defer ev.mu.Unlock()
			if _, dup := ev.admits[e.AdmissionID]; dup {
				ev.dupAdmits++
			}
			ev.admits[e.AdmissionID] = e
			if len(ev.admits)%64 == 0 && ev.stale == "" {
				ev.stale = stale()
			}
		},
		Release: func(e bulkhead.ReleaseEvent) {
			ev.mu.Lock()
			defer ev.mu.Unlock()
			if _, dup := ev.releases[e.AdmissionID]; dup {
				ev.dupRels++
			}
			ev.releases[e.AdmissionID] = e
			if len(ev.releases)%64 == 0 && ev.stale == "" {
				ev.stale = stale()
			}
		},
		Reject: func(e bulkhead.RejectEvent) {
			ev.mu.Lock()
			ev.rejects[e.Reason]++
			ev.mu.Unlock()
		},
		Reconfigure: func(bulkhead.ReconfigureEvent) {
			ev.mu.Lock()
			ev.reconfigs++
			ev.mu.Unlock()
		},
	})
	// A listener that always panics: recovered and counted, and admission
	// goes on (F30).
	b.Subscribe(bulkhead.Hooks{Reconfigure: func(bulkhead.ReconfigureEvent) { panic("listener panic") }})

	var (
		revision atomic.Int64 // the revisions ApplyLimits tries
		failures = make(chan string, soakWorkers)
		wg       sync.WaitGroup
		tallies  = make([]*tally, soakWorkers)
	)
	stop := time.Now().Add(soakDuration)
	for w := range soakWorkers {
		tallies[w] = &tally{rejected: map[bulkhead.Reason]int64{}}
		wg.Go(func() {
			s := &soaker{b: b, rng: rand.New(rand.NewPCG(uint64(w), 42)), t: tallies[w], revision: &revision}
			for time.Now().Before(stop) {
				if err := s.step(); err != nil {
					failures <- fmt.Sprintf("worker %d: %v", w, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(soakDuration + 30*time.Second):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("the workers did not finish: the bulkhead hangs\n%s", buf)
	}
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	if t.Failed() {
		b.Close()
		_, _ = b.Drain(context.Background())
		t.FailNow()
	}

	total := &tally{rejected: map[bulkhead.Reason]int64{}}
	for _, x := range tallies {
		total.add(x)
	}

	// Close and drain: everything was released by its worker, so it drains.
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := b.Drain(ctx); err != nil || !res.Drained {
		t.Fatalf("Drain = %+v, %v", res, err)
	}

	st := b.Stats()
	g, c, tb := st.Gate, st.Calls, st.TokenBudget
	t.Logf("%d calls: %d admitted, rejected %v; %d double releases; %d limits applied",
		total.calls, total.admitted, total.rejected, total.doubleRel, len(total.applied))

	// No slot or token leaks (I3).
	if g.InFlight != 0 || g.Pending != 0 || c.InFlight != 0 || tb.InFlightTokens != 0 ||
		c.Admitted != c.Released || g.Admitted != g.Released {
		t.Fatalf("leak after drain: gate %+v calls %+v budget %+v", g, c, *tb)
	}
	// One outcome per call, as counted by the bulkhead (I5).
	if c.Admitted != total.admitted || c.Rejected != total.calls-total.admitted ||
		!maps.Equal(normalize(st).Calls.RejectedByReason, total.rejected) {
		t.Fatalf("calls counted %d admitted, %d rejected %v; callers saw %d calls, %d admitted, rejected %v",
			c.Admitted, c.Rejected, c.RejectedByReason, total.calls, total.admitted, total.rejected)
	}
	if c.Rejected != sum(c.RejectedByReason) || g.Rejected != sum(g.RejectedByReason) ||
		g.Aborted != g.RejectedByReason[bulkhead.Aborted] || g.TimedOut != g.RejectedByReason[bulkhead.Timeout] {
		t.Fatalf("I5: rejection sums: gate %+v calls %+v", g, c)
	}
	if g.DoubleReleases != total.doubleRel {
		t.Fatalf("double releases %d, callers made %d", g.DoubleReleases, total.doubleRel)
	}
	// The F11 ledger: no ReportUsage, so no overrun and no early refund.
	if tb.TotalReserved != total.reserved || tb.TotalConsumed != total.consumed ||
		tb.TotalRefunded != total.refunded || tb.TotalOverrun != 0 {
		t.Fatalf("ledger %+v; callers reserved %d, settled usage %d, refunds %d",
			*tb, total.reserved, total.consumed, total.refunded)
	}

	// Events: one admit and one release per admission (I2), for exactly
	// the admissions the callers got; the release carries the hold.
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.stale != "" {
		t.Fatal(ev.stale)
	}
	if ev.dupAdmits != 0 || ev.dupRels != 0 {
		t.Fatalf("%d duplicate admit and %d duplicate release events", ev.dupAdmits, ev.dupRels)
	}
	if int64(len(ev.admits)) != total.admitted || int64(len(ev.releases)) != total.admitted || len(total.ids) != int(total.admitted) {
		t.Fatalf("%d admit events, %d release events, %d admissions", len(ev.admits), len(ev.releases), total.admitted)
	}
	applied := map[int64]bool{0: true}
	for _, r := range total.applied {
		applied[r] = true
	}
	var held, refunded int64
	for _, id := range total.ids {
		a, okA := ev.admits[id]
		r, okR := ev.releases[id]
		if !okA || !okR {
			t.Fatalf("admission %s: admit event %v, release event %v", id, okA, okR)
		}
		if r.LimitRevision != a.LimitRevision || r.Reserved != a.Reserved || r.Held != a.Reserved || !applied[a.LimitRevision] {
			t.Fatalf("admission %s: admit %+v, release %+v (applied revisions %v)", id, a, r, applied)
		}
		held += r.Held
		refunded += r.Refunded
	}
	if held != tb.TotalReserved || refunded != tb.TotalRefunded {
		t.Fatalf("release events hold %d and refund %d; ledger %+v", held, refunded, *tb)
	}
	if !maps.Equal(ev.rejects, normalize(st).Calls.RejectedByReason) {
		t.Fatalf("reject events %v, stats %v", ev.rejects, c.RejectedByReason)
	}
	if int64(ev.reconfigs) != int64(len(total.applied)) || st.Events.ListenerPanics != int64(len(total.applied)) {
		t.Fatalf("%d reconfigure events, %d listener panics, %d applies", ev.reconfigs, st.Events.ListenerPanics, len(total.applied))
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
	if !errors.As(err, &rej) || !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, rej.Reason.Sentinel()) {
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
	for range s.rng.IntN(20) {
		runtime.Gosched()
	}
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
	spin := s.rng.IntN(20)
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
			for range spin {
				runtime.Gosched()
			}
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
	g, c, tb := st.Gate, st.Calls, st.TokenBudget
	switch {
	case st.Limits.Revision < s.lastRev:
		return fmt.Errorf("I8: revision fell from %d to %d", s.lastRev, st.Limits.Revision)
	case c.Admitted-c.Released != c.InFlight || c.InFlight != int64(g.InFlight) || g.Admitted-g.Released != int64(g.InFlight):
		return fmt.Errorf("I5: gate %+v calls %+v", g, c)
	case c.Rejected != sum(c.RejectedByReason) || g.Rejected != sum(g.RejectedByReason):
		return fmt.Errorf("I5: rejection sums: gate %+v calls %+v", g, c)
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
