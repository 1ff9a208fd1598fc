package props_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

	ev := &eventLog{}
	b.Subscribe(ev.hooks())

	var (
		manualTrue   atomic.Int64 // effective manual abandons the callers saw
		deadlineErrs sync.Map     // admission ID -> true, for Runs that returned the deadline error
		revision     atomic.Int64
	)
	soak(t, b, workers, duration, func(w int, rng *rand.Rand) func() error {
		return func() error {
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
					return fmt.Errorf("ApplyLimits(%s): %v", fmtLimits(next), err)
				}
			case 1, 2, 3, 4: // Acquire; abandon races release
				tok, err := b.Acquire(context.Background(), req, opts...)
				if err != nil {
					if !errors.Is(err, bulkhead.ErrRejected) {
						return fmt.Errorf("Acquire: %v", err)
					}
					return nil
				}
				var inner sync.WaitGroup
				for range 1 + rng.IntN(2) {
					inner.Add(1)
					go func() {
						defer inner.Done()
						if tok.AbandonBorrowedConcurrency() {
							manualTrue.Add(1)
						}
					}()
				}
				spin(context.Background(), rng.IntN(300))
				err = tok.Release(&bulkhead.Usage{Input: 1, Output: 1})
				inner.Wait()
				if err != nil {
					return fmt.Errorf("Release: %v", err)
				}
				if tok.AbandonBorrowedConcurrency() {
					return errors.New("abandon after release was effective")
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
						return fmt.Errorf("deadline error %v: duplicate or not borrowed", de)
					}
				case err != nil && !errors.Is(err, bulkhead.ErrRejected):
					return fmt.Errorf("Run: %v", err)
				}
			}
			return nil
		}
	})

	st := b.Stats()
	c := st.Calls
	// I3: nothing held anywhere, per class too; I5: the classes add up to
	// the global counts.
	if err := checkIdle(st); err != nil {
		t.Fatal(err)
	}
	if err := checkCounters(st, nil); err != nil {
		t.Fatal(err)
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

	// Every admission has one admit, at most one abandon and one release
	// event, in that order (I2, F30).
	ev.mu.Lock()
	defer ev.mu.Unlock()
	per, err := ev.perAdmission()
	if err != nil {
		t.Fatal(err)
	}
	var abandons int64
	causes := map[bulkhead.AbandonCause]int64{}
	for id, e := range per {
		if e.admit == nil {
			t.Fatalf("I2: %s has no admit event", id)
		}
		if a := e.abandon; a != nil {
			abandons++
			causes[a.Cause]++
			if !e.admit.Resources.BorrowedConcurrency {
				t.Fatalf("F19: %s abandoned a slot it did not borrow: %+v", id, *a)
			}
		}
		if _, ok := deadlineErrs.Load(id); ok && (e.abandon == nil || e.abandon.Cause != bulkhead.AbandonDeadline) {
			t.Fatalf("F20: Run of %s returned the deadline error, abandon event %+v", id, e.abandon)
		}
	}
	if int64(len(per)) != c.Admitted || int64(len(ev.releases)) != c.Released || abandons != c.Abandoned ||
		causes[bulkhead.AbandonManual] != manual || causes[bulkhead.AbandonDeadline] != byDeadline {
		t.Fatalf("I2: %d admitted, %d release, %d abandon events %v; stats %+v", len(per), len(ev.releases), abandons, causes, c)
	}
	t.Logf("%d admitted, %d rejected %v; abandoned %v (%d deadline errors)", c.Admitted, c.Rejected, c.RejectedByReason, c.AbandonedByCause, deadlineCount)
}
