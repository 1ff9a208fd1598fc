package props_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
)

// TestClassesSoak races what the state machine (TestModel/classes) only
// sequences: on the real clock, workers Acquire and Run in random classes,
// abandon borrowed slots from one goroutine while another releases the same
// token, let short borrowed-slot deadlines race the callbacks' return and
// their own manual abandons, and apply new class tables meanwhile. No
// assertion depends on timing. At the end, after Close and Drain: nothing
// held anywhere (I3), per class too; every admission has exactly one admit
// and one release event and at most one abandon event, in that order (I2,
// F30); every effective abandon the callers saw is counted once, by cause
// (F19, F20); the class counters add up to the global ones (I5).
func TestClassesSoak(t *testing.T) {
	const (
		workers  = 8
		duration = 700 * time.Millisecond
	)
	names := []string{"batch", "bg", "fg"}
	cfg := bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 6, MaxQueue: 4, TokenBudget: &bulkhead.TokenBudget{Budget: 400, HighPriorityReserve: 50}}
	cfg.Classes = &bulkhead.Classes{Default: "fg", Limits: map[string]bulkhead.ClassLimits{
		"fg":    {ProtectedConcurrent: 1, ProtectedInFlightTokens: 60},
		"bg":    {MaxConcurrent: bulkhead.Ceiling(4), MaxInFlightTokens: bulkhead.Ceiling(int64(250))},
		"batch": {},
	}}
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	type seq struct {
		admit, abandon, release int // positions in the event stream, 1-based
		cause                   bulkhead.AbandonCause
		resources               bulkhead.Resources
		dupes                   int
	}
	var (
		evMu   sync.Mutex
		evPos  int
		events = map[bulkhead.ID]*seq{}
	)
	at := func(id bulkhead.ID) *seq {
		s := events[id]
		if s == nil {
			s = &seq{}
			events[id] = s
		}
		evPos++
		return s
	}
	b.Subscribe(bulkhead.Hooks{
		Admit: func(e bulkhead.AdmitEvent) {
			evMu.Lock()
			defer evMu.Unlock()
			s := at(e.AdmissionID)
			if s.admit != 0 {
				s.dupes++
			}
			s.admit, s.resources = evPos, e.Resources
		},
		Abandon: func(e bulkhead.AbandonEvent) {
			evMu.Lock()
			defer evMu.Unlock()
			s := at(e.AdmissionID)
			if s.abandon != 0 {
				s.dupes++
			}
			s.abandon, s.cause = evPos, e.Cause
		},
		Release: func(e bulkhead.ReleaseEvent) {
			evMu.Lock()
			defer evMu.Unlock()
			s := at(e.AdmissionID)
			if s.release != 0 {
				s.dupes++
			}
			s.release = evPos
		},
	})

	var (
		manualTrue   atomic.Int64 // effective manual abandons the callers saw
		deadlineErrs sync.Map     // admission ID -> true, for Runs that returned the deadline error
		revision     atomic.Int64
		failures     = make(chan string, workers)
		wg           sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		select {
		case failures <- fmt.Sprintf(format, args...):
		default:
		}
	}
	// spin yields n times, or until ctx ends: work of some length, without
	// sleeping.
	spin := func(ctx context.Context, n int) {
		for range n {
			if ctx.Err() != nil {
				return
			}
			runtime.Gosched()
		}
	}
	stop := time.Now().Add(duration)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Now().Before(stop) {
				class := names[rng.IntN(len(names))]
				opts := []bulkhead.Option{
					bulkhead.WithClass(class),
					bulkhead.WithReservation(bulkhead.Reservation{Input: rng.Int64N(40), MaxOutput: rng.Int64N(40)}),
				}
				if rng.IntN(3) == 0 {
					opts = append(opts, bulkhead.WithPriority(bulkhead.High))
				}
				req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "hi"}}}
				switch rng.IntN(10) {
				case 0: // new class table
					floor := rng.IntN(3)
					next := bulkhead.Limits{
						Revision: revision.Add(1), MaxConcurrent: 3 + rng.IntN(5), MaxQueue: rng.IntN(5),
						TokenBudget: &bulkhead.BudgetLimits{Budget: 200 + rng.Int64N(300), HighPriorityReserve: rng.Int64N(80)},
						Classes: &bulkhead.Classes{Limits: map[string]bulkhead.ClassLimits{
							"fg":    {ProtectedConcurrent: floor, ProtectedInFlightTokens: rng.Int64N(100)},
							"bg":    {MaxConcurrent: bulkhead.Ceiling(rng.IntN(5)), MaxInFlightTokens: bulkhead.Ceiling(100 + rng.Int64N(200))},
							"batch": {ProtectedConcurrent: rng.IntN(2)},
						}},
					}
					if _, err := b.ApplyLimits(next); err != nil {
						fail("ApplyLimits(%s): %v", fmtLimits(next), err)
						return
					}
				case 1, 2, 3, 4: // Acquire; abandon races release
					tok, err := b.Acquire(context.Background(), req, opts...)
					if err != nil {
						if !errors.Is(err, bulkhead.ErrRejected) {
							fail("Acquire: %v", err)
							return
						}
						continue
					}
					var inner sync.WaitGroup
					for range 1 + rng.IntN(2) {
						inner.Go(func() {
							if tok.AbandonBorrowedConcurrency() {
								manualTrue.Add(1)
							}
						})
					}
					spin(context.Background(), rng.IntN(300))
					if err := tok.Release(&bulkhead.Usage{Input: 1, Output: 1}); err != nil {
						fail("Release: %v", err)
					}
					inner.Wait()
					if tok.AbandonBorrowedConcurrency() {
						fail("abandon after release was effective")
					}
				default: // Run with a short deadline; the callback may abandon too
					deadline := time.Duration(1+rng.IntN(3)) * time.Millisecond
					abandon := rng.IntN(3) == 0
					work := rng.IntN(300) // drawn here: the callback may outlive Run
					_, err := bulkhead.Run(context.Background(), b, req, func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
						if abandon && rc.AbandonBorrowedConcurrency() {
							manualTrue.Add(1)
						}
						spin(ctx, work)
						return 1, rc.SetUsage(bulkhead.Usage{Input: 1})
					}, append(opts, bulkhead.WithBorrowedDeadline(deadline))...)
					var de *bulkhead.BorrowedDeadlineError
					switch {
					case errors.As(err, &de):
						if _, dup := deadlineErrs.LoadOrStore(de.AdmissionID, true); dup || !de.Resources.BorrowedConcurrency {
							fail("deadline error %v: duplicate or not borrowed", de)
							return
						}
					case err != nil && !errors.Is(err, bulkhead.ErrRejected):
						fail("Run: %v", err)
						return
					}
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(duration + 30*time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("the workers did not finish\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := b.Drain(ctx); err != nil || !res.Drained {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
	if t.Failed() {
		t.FailNow()
	}

	st := b.Stats()
	g, c, tb := st.Gate, st.Calls, st.TokenBudget
	if g.InFlight != 0 || g.Pending != 0 || c.InFlight != 0 || tb.InFlightTokens != 0 || c.Admitted != c.Released || g.Admitted != g.Released ||
		st.Classes.Shared.InFlight != 0 || st.Classes.Shared.TokenBudget.InFlightTokens != 0 {
		t.Fatalf("I3: leak after drain: %s", fmtStats(st))
	}
	var sumAdm, sumRel, sumAband, sumRej int64
	for name, cs := range st.Classes.Classes {
		if cs.InFlight != 0 || cs.InFlightTokens != 0 || cs.Admitted != cs.Released {
			t.Fatalf("I3: class %s not idle: %s", name, fmtStats(st))
		}
		sumAdm += cs.Admitted
		sumRel += cs.Released
		sumAband += cs.Abandoned
		sumRej += cs.Rejected
	}
	if sumAdm != c.Admitted || sumRel != c.Released || sumAband != c.Abandoned || sumRej != c.Rejected {
		t.Fatalf("I5: the classes sum to %d/%d/%d/%d, globally %d/%d/%d/%d", sumAdm, sumRel, sumAband, sumRej, c.Admitted, c.Released, c.Abandoned, c.Rejected)
	}
	var deadlineCount int64
	deadlineErrs.Range(func(any, any) bool { deadlineCount++; return true })
	manual, byDeadline := c.AbandonedByCause[bulkhead.AbandonManual], c.AbandonedByCause[bulkhead.AbandonDeadline]
	// F19: each true return is one effective abandon. F20: a Run returns
	// the deadline error exactly when its slot was abandoned by the
	// deadline, even when the work settled at the same moment.
	if manual != manualTrue.Load() || deadlineCount != byDeadline || manual+byDeadline != c.Abandoned {
		t.Fatalf("abandons: stats %v (total %d); callers saw %d manual, %d deadline errors", c.AbandonedByCause, c.Abandoned, manualTrue.Load(), deadlineCount)
	}

	evMu.Lock()
	defer evMu.Unlock()
	var admits, releases, abandons int64
	causes := map[bulkhead.AbandonCause]int64{}
	for id, s := range events {
		if s.dupes != 0 || s.admit == 0 || s.release <= s.admit || (s.abandon != 0 && (s.abandon < s.admit || s.abandon > s.release)) {
			t.Fatalf("I2/F30: events of %s: %+v", id, *s)
		}
		admits++
		releases++
		if s.abandon != 0 {
			abandons++
			causes[s.cause]++
			if !s.resources.BorrowedConcurrency {
				t.Fatalf("F19: %s abandoned a slot it did not borrow: %+v", id, *s)
			}
		}
		if _, ok := deadlineErrs.Load(id); ok && (s.abandon == 0 || s.cause != bulkhead.AbandonDeadline) {
			t.Fatalf("F20: Run of %s returned the deadline error, events %+v", id, *s)
		}
	}
	if admits != c.Admitted || releases != c.Released || abandons != c.Abandoned || causes[bulkhead.AbandonManual] != manual ||
		causes[bulkhead.AbandonDeadline] != byDeadline {
		t.Fatalf("I2: %d admit, %d release, %d abandon events %v; stats %+v", admits, releases, abandons, causes, c)
	}
	t.Logf("%d admitted, %d rejected %v; abandoned %v (%d deadline errors)", c.Admitted, c.Rejected, c.RejectedByReason, c.AbandonedByCause, deadlineCount)
}
