package actor

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// TestStagesProperties drives the state machine with random messages
// through every stage at once (cool-downs and headroom from feedback, a
// paced or decided in-process rate, a fake fleet pool whose verdicts come
// back late, in any order, admitting, refusing or panicking; releases,
// usage reports, cancels, timers firing, limits moving, Close) and checks
// the invariants after every step: no more admitted or provisional calls
// than slots, every request answered once, a confirmed admission counted
// once and a rolled-back one not at all, every admission's fleet hold
// ended exactly once, and, once everything has settled, nothing held.
func TestStagesProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		maxC := rapid.IntRange(0, 3).Draw(rt, "maxConcurrent")
		maxQ := rapid.IntRange(0, 3).Draw(rt, "maxQueue")
		sc := stageConfig{model: "m", shed: rapid.Bool().Draw(rt, "shed")}
		if rapid.Bool().Draw(rt, "rates") {
			sc.rates = &Rates{Name: "bh", Model: "m", Pace: rapid.Bool().Draw(rt, "pace"),
				PerModel: Rate{RequestsPerMinute: 60, RequestBurst: float64(rapid.IntRange(0, 2).Draw(rt, "burst"))}}
		}
		s, rec := newStageState(t, budgetLimits(maxC, maxQ, 1000), sc)
		withFleet := rapid.Bool().Draw(rt, "fleet")
		if withFleet {
			s.fleet = &fleetStage{}
		}
		answers := map[string]int{}
		byName := map[string]*AcquireRequest{}
		var live []*AcquireRequest     // admitted and not released
		waiting := map[string]bool{}   // sent, not answered
		confirmed := map[*Lease]bool{} // admissions counted
		ended := map[*Lease]int{}      // fleet holds ended, by lease
		reserved := map[*Lease]bool{}  // admissions a fleet verdict came back for
		n := 0

		// collect moves the answers and fleet releases since the last call
		// into the books.
		collect := func() {
			for _, a := range rec.take() {
				answers[a.name]++
				delete(waiting, a.name)
				r := byName[a.name]
				if a.err == nil && r.Lease.Bypass == nil {
					live = append(live, r)
					confirmed[r.Lease] = true
				}
			}
			for _, l := range rec.releases {
				ended[l]++
			}
			rec.releases = nil
		}
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch rapid.IntRange(0, 9).Draw(rt, "action") {
			case 0, 1: // a call
				n++
				r := modelReq(fmt.Sprint("r", n), rapid.SampledFrom([]string{"m", "n"}).Draw(rt, "model"), int64(rapid.IntRange(0, 400).Draw(rt, "reserved")))
				if rapid.Bool().Draw(rt, "queueTimeout") {
					r.QueueTimeout = time.Duration(rapid.IntRange(1, 3000).Draw(rt, "qtMs")) * time.Millisecond
				}
				byName[r.Request.(string)], waiting[r.Request.(string)] = r, true
				s.acquire(r)
			case 2: // a release
				if len(live) > 0 {
					k := rapid.IntRange(0, len(live)-1).Draw(rt, "live")
					r := live[k]
					live = append(live[:k], live[k+1:]...)
					s.release(&releaseMsg{l: r.Lease, usage: admission.Usage{Input: int64(rapid.IntRange(0, 600).Draw(rt, "used"))}, hasUsage: true})
				}
			case 3: // a usage report
				if len(live) > 0 {
					r := live[rapid.IntRange(0, len(live)-1).Draw(rt, "reporter")]
					_, _ = s.applyUsage(r.Lease, admission.Usage{Output: int64(rapid.IntRange(0, 50).Draw(rt, "out"))}, nil)
				}
			case 4: // a remote verdict, of any job in flight
				if len(rec.remotes) > 0 {
					k := rapid.IntRange(0, len(rec.remotes)-1).Draw(rt, "job")
					j := rec.remotes[k]
					rec.remotes = append(rec.remotes[:k], rec.remotes[k+1:]...)
					if j.kind == remoteAdmit {
						reserved[j.r.Lease] = true
					}
					switch rapid.IntRange(0, 3).Draw(rt, "verdict") {
					case 1:
						j.why, j.ext = admission.ConcurrencyLimit, &admission.External{Constraint: admission.ConstraintFleet}
					case 2:
						j.why, j.ext, j.cause = admission.FleetUnavailable, &admission.External{Fleet: &admission.FleetDetail{}}, errors.New("redis down")
					case 3:
						j.why, j.panic, j.cause = admission.Aborted, "boom", errors.New("panic")
					}
					s.verdict(j)
				}
			case 5: // feedback: a 429 or a headroom report
				if rapid.Bool().Draw(rt, "headroom") {
					s.feedback(&Feedback{Model: "m", Headroom: &admission.Headroom{Tokens: int64(rapid.IntRange(0, 500).Draw(rt, "left")), Requests: -1, TokensLimit: 1000, TokensReset: time.Second}})
				} else {
					s.feedback(&Feedback{Model: "m", RetryAfter: time.Duration(rapid.IntRange(1, 2000).Draw(rt, "retryMs")) * time.Millisecond})
				}
			case 6: // time passes; timers fire
				rec.clock = rec.clock.Add(time.Duration(rapid.IntRange(1, 1500).Draw(rt, "advanceMs")) * time.Millisecond)
				for q, gen := range rec.armed {
					if q.parked {
						s.unpark(&parkMsg{r: q, gen: gen, seq: q.parkSeq})
					} else if q.queued && q.QueueTimeout > 0 && !rec.clock.Before(q.queuedAt.Add(q.QueueTimeout)) {
						s.timeout(&timeoutMsg{r: q, gen: gen})
					}
				}
				s.holdEnded()
			case 7: // a caller gives up
				if len(waiting) > 0 {
					r := byName[fmt.Sprint("r", rapid.IntRange(1, n).Draw(rt, "leaver"))]
					if waiting[r.Request.(string)] {
						s.cancel(&cancelMsg{r: r, cause: errors.New("gone")})
					}
				}
			case 8: // limits move
				next := s.limits.Clone()
				next.Revision++
				next.MaxConcurrent = rapid.IntRange(0, 3).Draw(rt, "newMax")
				_, _ = s.applyLimits(&applyRequest{next: next})
			case 9:
				if rapid.IntRange(0, 5).Draw(rt, "close") == 0 {
					s.close()
				}
			}
			collect()
			for name, c := range answers {
				if c > 1 {
					rt.Fatalf("%s answered %d times", name, c)
				}
			}
			if s.calls+s.provisional != int64(s.inFlight) && s.tab == nil {
				// every slot is an admission, counted or provisional (abandon is not driven here)
				rt.Fatalf("slots %d, calls %d + provisional %d", s.inFlight, s.calls, s.provisional)
			}
			if s.calls != int64(len(live)) {
				rt.Fatalf("calls %d, live %d", s.calls, len(live))
			}
			if !s.cool.armed() && s.pending > 0 && s.inFlight < s.limits.MaxConcurrent {
				rt.Fatalf("%d waiting with %d of %d slots taken", s.pending, s.inFlight, s.limits.MaxConcurrent)
			}
			if s.pending < 0 || s.nparked < 0 || s.checking < 0 || s.provisional < 0 {
				rt.Fatalf("negative count: pending %d, parked %d, checking %d, provisional %d", s.pending, s.nparked, s.checking, s.provisional)
			}
		}
		// Settle: every job gets its verdict, every admission its release.
		s.close()
		collect()
		for len(rec.remotes) > 0 || len(live) > 0 {
			for len(rec.remotes) > 0 {
				j := rec.remotes[0]
				rec.remotes = rec.remotes[1:]
				if j.kind == remoteAdmit {
					reserved[j.r.Lease] = true
				}
				s.verdict(j)
			}
			collect()
			for _, r := range live {
				s.release(&releaseMsg{l: r.Lease})
			}
			live = nil
			collect()
		}
		if len(waiting) > 0 {
			rt.Fatalf("%d requests never answered", len(waiting))
		}
		if !s.idle() || s.tokens != 0 || s.inFlight != 0 {
			rt.Fatalf("not settled: idle %v, tokens %d, in flight %d", s.idle(), s.tokens, s.inFlight)
		}
		if withFleet {
			for l := range reserved {
				if ended[l] != 1 {
					rt.Fatalf("admission %v: its fleet hold ended %d times, want once", l.ID, ended[l])
				}
			}
			for l := range confirmed {
				if ended[l] != 1 {
					rt.Fatalf("admission %v: its fleet hold ended %d times, want once", l.ID, ended[l])
				}
			}
		}
	})
}
