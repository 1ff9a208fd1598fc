package fleet

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts' settings in these tests, in µs.
const (
	tTTL     = 10_000_000
	tTomb    = 5_000_000
	tRelearn = 2_000_000
	tBatch   = 3
	t0       = 1_700_000_000_000_000 // the first script's time
)

// fixture runs the scripts on one fresh pool at times the test sets, and
// checks the ledger after every script.
type fixture struct {
	t      *testing.T
	client *redis.Client
	st     *store
	now    int64
}

// newFixture returns a fixture whose pool was created at t0 with no relearn
// window, and whose scripts give the pool quiet µs (0: the rule is off).
func newFixture(t *testing.T, client *redis.Client, quiet int64) *fixture {
	f := newFreshFixture(t, client, quiet)
	if _, err := testStore(t, client, f.st.keys, tTTL, tTomb, 0, 0, tBatch).renew(bg, t0, seen{}, false, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// newFreshFixture returns a fixture on a pool that does not exist yet.
func newFreshFixture(t *testing.T, client *redis.Client, quiet int64) *fixture {
	return &fixture{t: t, client: client, st: testStore(t, client, nil, tTTL, tTomb, tRelearn, quiet, tBatch), now: t0}
}

// testStore returns a store with these settings, in µs, of the pool whose
// keys are keys, or of a fresh pool when keys is nil.
func testStore(t testing.TB, client *redis.Client, keys []string, ttl, tomb, relearn, quiet int64, batch int) *store {
	t.Helper()
	cfg := testConfig(client)
	cfg.LeaseTTL = time.Duration(ttl) * time.Microsecond
	cfg.RenewEvery = cfg.LeaseTTL / 3
	cfg.Tombstone = time.Duration(tomb) * time.Microsecond
	cfg.RelearnWindow = time.Duration(relearn) * time.Microsecond
	if relearn == 0 {
		cfg.RelearnWindow = -1
	}
	cfg.ReclaimBatch = batch
	s, err := cfg.settings()
	if err != nil {
		t.Fatal(err)
	}
	s.quiet = time.Duration(quiet) * time.Microsecond
	st := newStore(&s)
	if keys != nil {
		st.keys = keys
	}
	return st
}

func (f *fixture) check(r reply, err error) reply {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
	checkLedger(f.t, f.client, f.st.keys)
	return r
}

// reserve reserves n with tokens under limits 2 slots / 100 tokens, from a
// replica that has seen sn, and returns the code and the reply.
func (f *fixture) reserve(n int, tokens int64, sn seen) (int64, reply) {
	f.t.Helper()
	return f.reserveL(n, Hold{1, tokens}, 2, 100, sn)
}

func (f *fixture) reserveL(n int, h Hold, slotLimit, tokenLimit int64, sn seen) (int64, reply) {
	f.t.Helper()
	r := f.check(f.st.reserve(bg, f.now, sn, idn(n), h, slotLimit, tokenLimit, nil))
	return r.extra[0], r
}

func (f *fixture) release(ns ...int) reply {
	f.t.Helper()
	ids := make([]ID, len(ns))
	for i, n := range ns {
		ids[i] = idn(n)
	}
	return f.check(f.st.release(bg, f.now, seen{}, ids))
}

func (f *fixture) adjust(n int, h Hold, seq uint64) int64 {
	f.t.Helper()
	return f.check(f.st.adjust(bg, f.now, seen{}, []entry{{idn(n), h, seq}})).extra[0]
}

func (f *fixture) renew(reinstate bool, es ...entry) reply {
	f.t.Helper()
	return f.renewSeen(seen{}, reinstate, es...)
}

func (f *fixture) renewSeen(sn seen, reinstate bool, es ...entry) reply {
	f.t.Helper()
	return f.check(f.st.renew(bg, f.now, sn, reinstate, es))
}

// save returns a copy of the pool's keys, as a snapshot of Redis would
// keep them.
func (f *fixture) save() map[string]string {
	f.t.Helper()
	dumps, err := dumpKeys(f.client, f.st.keys)
	if err != nil {
		f.t.Fatal(err)
	}
	return dumps
}

// restore brings the pool's keys back to what save returned, as a Redis
// restarted from that snapshot would.
func (f *fixture) restore(dumps map[string]string) {
	f.t.Helper()
	if err := restoreKeys(f.client, dumps); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) sums(r reply, slots, tokens int64) {
	f.t.Helper()
	if r.slots != slots || r.tokens != tokens {
		f.t.Fatalf("pool holds %d slots / %d tokens, want %d / %d", r.slots, r.tokens, slots, tokens)
	}
}

// serverCheckGap is the prelude's SERVER_CHECK_GAP, µs.
const serverCheckGap = 1000

// otherServer is the run_id of a server the tests do not run.
const otherServer = "0123456789abcdef0123456789abcdef01234567"

// server returns the server the pool's state recorded.
func (f *fixture) server() string {
	f.t.Helper()
	return f.client.HGet(bg, f.st.keys[2], "srv").Val()
}

// infoCalls returns how many INFO commands the server ran since its
// statistics were reset.
func (f *fixture) infoCalls() int {
	f.t.Helper()
	n := f.info("commandstats", "cmdstat_info:calls=", ",")
	if n == "" {
		return 0
	}
	calls, err := strconv.Atoi(n)
	if err != nil {
		f.t.Fatal(err)
	}
	return calls
}

// runID returns the run_id of the fixture's server.
func (f *fixture) runID() string {
	f.t.Helper()
	return f.info("server", "run_id:", "\r\n")
}

// info returns what follows key up to end in the server's INFO section
// ("" when key is not there).
func (f *fixture) info(section, key, end string) string {
	f.t.Helper()
	text, err := f.client.Info(bg, section).Result()
	if err != nil {
		f.t.Fatal(err)
	}
	_, after, _ := strings.Cut(text, key)
	v, _, _ := strings.Cut(after, end)
	return v
}

func (f *fixture) want(what string, got, want int64) {
	f.t.Helper()
	if got != want {
		f.t.Fatalf("%s: code %d, want %d", what, got, want)
	}
}

// TestScripts checks the scripts' decisions, one case a fresh pool, at
// times the test sets.
func TestScripts(t *testing.T) {
	_, client := startRedis(t)
	cases := []struct {
		name string
		run  func(f *fixture)
	}{
		{"admit", func(f *fixture) {
			code, r := f.reserve(1, 40, seen{})
			f.want("reserve", code, codeAdmitted)
			f.sums(r, 1, 40)
			// The pool was created at t0, with a window that ended then. Its
			// creation and this reserve wrote at t0: the sequence is at
			// least the time, and grows by one at least.
			if r.seen != (seen{t0, t0 + 2}) || r.now != t0 || r.extra[1] != t0+tTTL {
				f.t.Fatalf("reply %+v", r)
			}
		}},
		{"exact fit admits, one more token does not", func(f *fixture) {
			f.reserve(1, 60, seen{})
			code, r := f.reserve(2, 40, seen{})
			f.want("exact fit", code, codeAdmitted)
			f.sums(r, 2, 100)
			f.release(2)
			code, r = f.reserve(3, 41, seen{})
			f.want("one over", code, codeTokens)
			f.sums(r, 1, 60)
		}},
		{"reject by slots", func(f *fixture) {
			f.reserve(1, 1, seen{})
			f.reserve(2, 1, seen{})
			code, r := f.reserve(3, 1, seen{})
			f.want("third slot", code, codeSlots)
			f.sums(r, 2, 2)
			code, _ = f.reserveL(4, Hold{0, 1}, 2, 100, seen{})
			f.want("a hold without a slot", code, codeAdmitted)
			code, _ = f.reserveL(5, Hold{1, 0}, 0, -1, seen{})
			f.want("MaxConcurrent 0", code, codeSlots)
		}},
		{"reject by tokens", func(f *fixture) {
			code, r := f.reserve(1, 101, seen{})
			f.want("over the budget", code, codeTokens)
			f.sums(r, 0, 0)
			code, _ = f.reserveL(2, Hold{1, 1 << 40}, -1, -1, seen{})
			f.want("no limits", code, codeAdmitted)
		}},
		{"high-priority reserve", func(f *fixture) {
			// Budget 100 with 30 reserved: normal reserves see 70.
			f.reserveL(1, Hold{1, 60}, 10, 70, seen{})
			code, _ := f.reserveL(2, Hold{1, 20}, 10, 70, seen{})
			f.want("normal beyond its share", code, codeTokens)
			code, r := f.reserveL(3, Hold{1, 40}, 10, 100, seen{})
			f.want("high within the reserve", code, codeAdmitted)
			f.sums(r, 2, 100)
		}},
		{"duplicate reserve", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.now += 1000
			code, r := f.reserve(1, 50, seen{})
			f.want("duplicate", code, codeDuplicate)
			f.sums(r, 1, 50)
			if r.extra[1] != t0+tTTL {
				f.t.Fatalf("duplicate expiry %d, want the first hold's %d", r.extra[1], t0+tTTL)
			}
			code, _ = f.reserve(1, 99, seen{})
			f.want("duplicate that would not fit", code, codeDuplicate)
		}},
		{"late reserve after release", func(f *fixture) {
			f.reserve(1, 50, seen{})
			r := f.release(1)
			f.sums(r, 0, 0)
			if r.extra[0] != 1 || r.extra[1] != 0 {
				f.t.Fatalf("release freed %v", r.extra)
			}
			code, r := f.reserve(1, 50, seen{})
			f.want("late reserve", code, codeReleased)
			f.sums(r, 0, 0)
			// A release before the reserve (the reserve's reply was lost
			// and the caller gave up) refuses it too.
			f.release(2)
			code, _ = f.reserve(2, 50, seen{})
			f.want("reserve after its release", code, codeReleased)
		}},
		{"double and unknown release", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.reserve(2, 20, seen{})
			r := f.release(1, 1, 3)
			if r.extra[0] != 1 || r.extra[1] != 2 {
				f.t.Fatalf("release freed/unknown %v, want [1 2]", r.extra)
			}
			f.sums(r, 1, 20)
			r = f.release(1)
			if r.extra[0] != 0 || r.extra[1] != 1 {
				f.t.Fatalf("second release %v", r.extra)
			}
			f.sums(r, 1, 20)
		}},
		{"stale and reordered adjust", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.want("seq 2 first", f.adjust(1, Hold{1, 30}, 2), codeApplied)
			f.want("seq 1 late", f.adjust(1, Hold{1, 90}, 1), codeStale)
			f.want("seq 2 again", f.adjust(1, Hold{1, 90}, 2), codeStale)
			_, r := f.reserve(2, 0, seen{})
			f.sums(r, 2, 30)
			f.want("unknown id", f.adjust(9, Hold{1, 1}, 1), codeLost)
		}},
		{"adjust renews the lease", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.now += tTTL - 1
			f.adjust(1, Hold{1, 40}, 1)
			f.now += tTTL - 1
			_, r := f.reserve(2, 0, seen{})
			f.sums(r, 2, 40)
		}},
		{"overrun above the limit blocks admissions", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.want("overrun", f.adjust(1, Hold{1, 150}, 1), codeApplied)
			code, r := f.reserve(2, 0, seen{})
			f.want("reserve of 0 tokens over the budget", code, codeTokens)
			f.sums(r, 1, 150)
			f.adjust(1, Hold{1, 100}, 2)
			code, _ = f.reserve(3, 0, seen{})
			f.want("at the budget again", code, codeAdmitted)
		}},
		{"abandon gives the slot back and keeps the tokens", func(f *fixture) {
			f.reserve(1, 30, seen{})
			f.reserve(2, 30, seen{})
			f.want("abandon", f.adjust(1, Hold{0, 30}, 1), codeApplied)
			code, r := f.reserve(3, 40, seen{})
			f.want("slot freed", code, codeAdmitted)
			f.sums(r, 2, 100)
			code, _ = f.reserveL(4, Hold{0, 1}, 5, 100, seen{})
			f.want("tokens still held", code, codeTokens)
		}},
		{"renew extends leases and carries newer values", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.now += tTTL - 1
			r := f.renew(true, entry{idn(1), Hold{1, 20}, 3})
			f.want("renew", r.extra[0], codeRenewed)
			f.sums(r, 1, 20)
			r = f.renew(true, entry{idn(1), Hold{1, 70}, 2})
			f.sums(r, 1, 20) // older values: lease only
			f.now += tTTL - 1
			_, r = f.reserve(2, 0, seen{})
			f.sums(r, 2, 20)
		}},
		{"renew of a released id never resurrects it", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.release(1)
			r := f.renew(true, entry{idn(1), Hold{1, 50}, 0})
			f.want("renew after release", r.extra[0], codeTombstoned)
			f.sums(r, 0, 0)
		}},
		{"reinstate above the limit", func(f *fixture) {
			f.reserve(1, 80, seen{})
			f.now += tTTL // 1's lease ran out: reclaimed by the next script
			_, r := f.reserve(2, 100, seen{})
			f.sums(r, 1, 100)
			r = f.renew(false, entry{idn(1), Hold{1, 80}, 0})
			f.want("renew without reinstate", r.extra[0], codeLost)
			r = f.renew(true, entry{idn(1), Hold{1, 80}, 0})
			f.want("reinstate", r.extra[0], codeReinstated)
			f.sums(r, 2, 180)
			code, _ := f.reserve(3, 0, seen{})
			f.want("reserve while over", code, codeSlots)
		}},
		{"expiry reclaim at exactly expiry <= now", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.now += tTTL - 1
			_, r := f.reserve(2, 0, seen{})
			f.sums(r, 2, 50)
			f.now++
			_, r = f.reserve(3, 0, seen{})
			if r.reclaimed != 1 {
				f.t.Fatalf("reclaimed %d at expiry", r.reclaimed)
			}
			f.sums(r, 2, 0)
			code, _ := f.reserveL(1, Hold{1, 10}, 5, 100, seen{})
			f.want("an expired, reclaimed id may reserve again", code, codeAdmitted)
		}},
		{"reclaim cap and the second pass", func(f *fixture) {
			for n := 1; n <= 5; n++ {
				f.reserveL(n, Hold{1, 10}, 5, 100, seen{})
			}
			f.now += tTTL
			code, r := f.reserveL(6, Hold{1, 10}, 1, 100, seen{})
			if r.reclaimed != tBatch || code != codeSlots {
				f.t.Fatalf("reclaimed %d (cap %d), code %d", r.reclaimed, tBatch, code)
			}
			f.sums(r, 2, 20)
			code, r = f.reserveL(6, Hold{1, 10}, 1, 100, seen{})
			f.want("second pass", code, codeAdmitted)
			if r.reclaimed != 2 {
				f.t.Fatalf("second pass reclaimed %d", r.reclaimed)
			}
		}},
		{"tombstone expiry", func(f *fixture) {
			f.reserve(1, 50, seen{})
			f.release(1)
			f.now += tTomb - 1
			code, _ := f.reserve(1, 50, seen{})
			f.want("inside the tombstone", code, codeReleased)
			f.now++
			code, _ = f.reserve(1, 50, seen{})
			f.want("tombstone over", code, codeAdmitted)
			f.release(2) // drops the expired tombstones
			if n := f.client.ZCard(bg, f.st.keys[3]).Val(); n != 1 {
				f.t.Fatalf("%d tombstones, want 2's alone", n)
			}
			if ttl := f.client.PTTL(bg, f.st.keys[3]).Val(); ttl != -2*time.Nanosecond && ttl > (tTomb/1000+1000)*time.Millisecond {
				f.t.Fatalf("gone key TTL %v", ttl)
			}
		}},
		{"agg rebuilt after DEL agg", func(f *fixture) {
			f.reserve(1, 50, seen{})
			_, r := f.reserve(2, 20, seen{})
			f.client.Del(bg, f.st.keys[2])
			f.now += 1000
			code, r := f.reserve(3, 30, r.seen)
			f.want("reserve right after the loss", code, codeRelearning)
			f.sums(r, 2, 70)
			if r.seen != (seen{t0 + 1000 + tRelearn, t0 + 1001}) {
				f.t.Fatalf("new state %+v", r.seen)
			}
		}},
		{"relearn window start and end", func(f *fixture) {
			_, r := f.reserve(1, 10, seen{})
			old := r.seen
			f.client.Del(bg, f.st.keys[0], f.st.keys[1], f.st.keys[2])
			f.now += 1000
			code, r := f.reserve(2, 10, old)
			f.want("window start", code, codeRelearning)
			until := r.gen // the generation's number is the window's end
			f.now = until - 1
			code, _ = f.reserve(2, 10, old)
			f.want("window end - 1µs", code, codeRelearning)
			f.want("holder re-registers", f.renew(true, entry{idn(1), Hold{1, 10}, 0}).extra[0], codeReinstated)
			code, _ = f.reserve(2, 10, r.seen)
			f.want("a replica that knows the new generation", code, codeRelearning)
			f.now = until
			code, r = f.reserveL(3, Hold{1, 10}, 5, 100, old)
			f.want("window over", code, codeAdmitted)
			f.sums(r, 2, 20)
		}},
		{"a replica that never saw the pool is held back too", func(f *fixture) {
			f.reserve(1, 10, seen{})
			f.client.Del(bg, f.st.keys[0], f.st.keys[1], f.st.keys[2])
			f.now += 1000
			code, _ := f.reserve(2, 10, seen{})
			f.want("no generation seen", code, codeRelearning)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(newFixture(t, client, 0)) })
	}
}

// tQuiet is the quiet gap of the cases that turn the rule on (the Pool's
// would be LeaseTTL - RenewEvery).
const tQuiet = tTTL * 2 / 3

// TestScriptsGenerations checks, at times the test sets, how the scripts
// start a pool's generations (a new pool, a lost state, a rewound state,
// leases that ran out while nobody wrote), the relearn window that follows
// each, and the write sequence that reveals a rewound state.
func TestScriptsGenerations(t *testing.T) {
	_, client := startRedis(t)
	cases := []struct {
		name  string
		fresh bool  // the pool does not exist yet
		quiet int64 // µs, 0: off
		run   func(f *fixture)
	}{
		{"a new pool admits nothing for its relearn window", true, 0, func(f *fixture) {
			code, r := f.reserve(1, 10, seen{})
			f.want("first reserve", code, codeRelearning)
			if r.seen != (seen{t0 + tRelearn, t0 + 1}) {
				f.t.Fatalf("new pool %+v", r.seen)
			}
			f.now = t0 + tRelearn
			code, _ = f.reserve(1, 10, r.seen)
			f.want("after the window", code, codeAdmitted)
		}},
		{"a pool created with no window admits at once", false, 0, func(f *fixture) {
			code, _ := f.reserve(1, 10, seen{})
			f.want("first reserve", code, codeAdmitted)
		}},
		{"only writes bump the sequence", false, 0, func(f *fixture) {
			_, r := f.reserve(1, 60, seen{})
			q := r.seq
			_, r = f.reserve(2, 60, seen{})
			f.want("a rejection", r.seq, q)
			_, r = f.reserve(1, 60, seen{})
			f.want("a duplicate", r.seq, q)
			f.want("a stale adjustment", f.adjust(1, Hold{1, 60}, 0), codeStale)
			f.want("a renewal of nothing", f.renew(false).seq, q)
			f.want("a renewal", f.renew(false, entry{idn(1), Hold{1, 60}, 0}).seq, q+1)
			f.want("a release", f.release(9).seq, q+2)
		}},
		{"a lagging replica is no rewind", false, 0, func(f *fixture) {
			_, r := f.reserve(1, 10, seen{})
			lagging := r.seen
			f.reserve(2, 10, seen{})
			f.release(2)
			code, r := f.reserve(3, 10, lagging)
			f.want("a replica that saw an earlier write", code, codeAdmitted)
			if r.gen != t0 {
				f.t.Fatalf("generation %d, want %d", r.gen, t0)
			}
		}},
		{"a rewound state starts a generation and keeps its holds", false, 0, func(f *fixture) {
			f.reserve(1, 10, seen{})
			snap := f.save()
			f.now += 1000
			_, r := f.reserve(2, 20, seen{}) // lost with the rewind
			f.now += tTTL                    // 1's lease ran out meanwhile
			f.renew(false, entry{idn(2), Hold{1, 20}, 0})
			f.restore(snap)
			code, r := f.reserve(3, 10, r.seen)
			f.want("a replica that saw a later write", code, codeRelearning)
			if r.gen != f.now+tRelearn || r.reclaimed != 0 {
				f.t.Fatalf("after the rewind %+v reclaimed %d", r.seen, r.reclaimed)
			}
			f.sums(r, 1, 10) // 1 kept, though its lease ran out
			f.want("1's holder renews", f.renew(true, entry{idn(1), Hold{1, 10}, 0}).extra[0], codeRenewed)
			f.want("2's holder registers again", f.renew(true, entry{idn(2), Hold{1, 20}, 0}).extra[0], codeReinstated)
			f.now = r.gen
			code, r = f.reserve(3, 10, seen{})
			f.want("after the window, the pool is full", code, codeSlots)
			f.sums(r, 2, 30)
		}},
		{"a state rewound to an older generation starts a newer one", false, 0, func(f *fixture) {
			f.reserve(1, 10, seen{})
			snap := f.save()
			f.client.Del(bg, f.st.keys...)
			f.now += 1000
			_, r := f.reserve(2, 10, seen{})
			newer := r.seen
			if newer.gen != f.now+tRelearn {
				f.t.Fatalf("generation after the loss %d", newer.gen)
			}
			f.restore(snap)
			code, r := f.reserve(3, 10, newer)
			f.want("a replica that saw the newer generation", code, codeRelearning)
			if r.gen != newer.gen+1 {
				f.t.Fatalf("generation %d after the rewind, want %d", r.gen, newer.gen+1)
			}
		}},
		{"no reclaim inside a window", false, 0, func(f *fixture) {
			f.reserve(1, 10, seen{})
			f.reserve(2, 10, seen{})
			f.client.Del(bg, f.st.keys[2])
			f.now += tTTL // both leases ran out
			_, r := f.reserve(3, 10, seen{})
			f.sums(r, 2, 20)
			f.now = r.gen - 1
			r = f.renew(true, entry{idn(1), Hold{1, 10}, 0})
			f.want("1's holder renews", r.extra[0], codeRenewed)
			if r.reclaimed != 0 {
				f.t.Fatalf("reclaimed %d inside the window", r.reclaimed)
			}
			f.now++
			code, r := f.reserve(3, 10, seen{})
			f.want("after the window", code, codeAdmitted)
			if r.reclaimed != 1 {
				f.t.Fatalf("reclaimed %d after the window, want 2's hold", r.reclaimed)
			}
			f.sums(r, 2, 20)
		}},
		{"leases that ran out while nobody wrote start a window", false, tQuiet, func(f *fixture) {
			f.reserve(1, 10, seen{})
			f.now += tQuiet // nobody wrote since; 1 ran out before now
			f.now += tTTL - tQuiet
			code, r := f.reserve(2, 10, seen{})
			f.want("after the gap", code, codeRelearning)
			if r.gen != f.now+tRelearn || r.reclaimed != 0 {
				f.t.Fatalf("after the gap %+v reclaimed %d", r.seen, r.reclaimed)
			}
			f.sums(r, 1, 10)
			f.want("1's holder renews", f.renew(true, entry{idn(1), Hold{1, 10}, 0}).extra[0], codeRenewed)
		}},
		{"a lease that ran out while others wrote is reclaimed", false, tQuiet, func(f *fixture) {
			f.reserve(1, 10, seen{})
			f.now += tTTL - tQuiet + 1
			f.reserve(2, 10, seen{})
			f.release(2)
			f.now = t0 + tTTL
			code, r := f.reserve(3, 10, seen{})
			f.want("after 1 ran out", code, codeAdmitted)
			if r.gen != t0 || r.reclaimed != 1 {
				f.t.Fatalf("%+v reclaimed %d", r.seen, r.reclaimed)
			}
		}},
		{"leases that ran out inside a window start no other", false, tQuiet, func(f *fixture) {
			f.reserve(1, 10, seen{})
			f.now += tTTL - 1000
			f.client.Del(bg, f.st.keys[2])
			_, r := f.reserve(2, 10, seen{}) // a window starts; 1 runs out in it, unrenewed
			gen := r.gen
			f.now += 10 * tTTL // nobody writes
			code, r := f.reserve(2, 10, seen{})
			f.want("long after", code, codeAdmitted)
			if r.gen != gen || r.reclaimed != 1 {
				f.t.Fatalf("generation %d (was %d), reclaimed %d", r.gen, gen, r.reclaimed)
			}
		}},
		{"a state another server recorded starts a generation after a gap", false, 0, func(f *fixture) {
			_, r := f.reserve(1, 10, seen{})
			if srv := f.server(); srv != f.runID() {
				f.t.Fatalf("the state records server %q, this one is %q", srv, f.runID())
			}
			// The state comes to another server: a restart, a failover.
			f.client.HSet(bg, f.st.keys[2], "srv", otherServer)
			f.now = r.seq + serverCheckGap - 1
			code, r := f.reserve(2, 10, seen{})
			f.want("a write less than the gap after the last", code, codeAdmitted)
			f.now = r.seq + serverCheckGap
			code, r = f.reserve(3, 10, seen{})
			f.want("a caller that saw nothing newer, after the gap", code, codeRelearning)
			if r.gen != f.now+tRelearn || f.server() != f.runID() {
				f.t.Fatalf("generation %d, server %q", r.gen, f.server())
			}
			f.sums(r, 2, 20)
			f.now = r.gen
			code, _ = f.reserve(3, 10, seen{})
			f.want("after the window, the pool is full", code, codeSlots)
		}},
		{"a state another server recorded, on a clock behind its last write", false, 0, func(f *fixture) {
			_, r := f.reserve(1, 10, seen{})
			f.client.HSet(bg, f.st.keys[2], "srv", otherServer)
			f.now = r.seq - 1
			code, _ := f.reserve(2, 10, seen{})
			f.want("a caller that saw nothing newer", code, codeRelearning)
		}},
		{"a state that recorded no server is taken as this one's", false, 0, func(f *fixture) {
			_, r := f.reserve(1, 10, seen{})
			f.client.HDel(bg, f.st.keys[2], "srv")
			f.now = r.seq + serverCheckGap
			code, r2 := f.reserve(1, 10, seen{})
			f.want("a duplicate, after the gap", code, codeDuplicate)
			if f.server() != f.runID() || r2.seen != r.seen {
				f.t.Fatalf("server %q, state %+v (was %+v)", f.server(), r2.seen, r.seen)
			}
		}},
		{"a script checks the server once a gap, writing or not", false, 0, func(f *fixture) {
			f.reserve(1, 60, seen{})
			_, r := f.reserve(2, 40, seen{})
			if err := f.client.ConfigResetStat(bg).Err(); err != nil {
				f.t.Fatal(err)
			}
			start := r.seq + serverCheckGap
			for f.now = start; f.now < start+3*serverCheckGap; f.now += serverCheckGap / 4 {
				code, r2 := f.reserve(3, 10, seen{}) // the pool is full: no write
				f.want("a reserve of a full pool", code, codeSlots)
				if r2.seen != r.seen {
					f.t.Fatalf("the state moved from %+v to %+v", r.seen, r2.seen)
				}
			}
			if n := f.infoCalls(); n != 3 {
				f.t.Fatalf("%d checks of the server in 3 gaps", n)
			}
		}},
		{"the state of an earlier version is carried on", false, 0, func(f *fixture) {
			f.reserve(1, 10, seen{})
			// What they wrote: the sums, the generation (then the time it
			// began), and when it began.
			f.client.HDel(bg, f.st.keys[2], "seq")
			f.client.HSet(bg, f.st.keys[2], "born", t0)
			f.now += 1000
			code, r := f.reserve(2, 10, seen{})
			f.want("reserve", code, codeAdmitted)
			if r.seen != (seen{t0, t0 + 1001}) {
				f.t.Fatalf("%+v", r.seen)
			}
			f.sums(r, 2, 20)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFreshFixture(t, client, c.quiet)
			if !c.fresh {
				f = newFixture(t, client, c.quiet)
			}
			c.run(f)
		})
	}
}
