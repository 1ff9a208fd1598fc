package fleet

import (
	"strconv"
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

func newFixture(t *testing.T, client *redis.Client) *fixture {
	return &fixture{t: t, client: client, st: testStore(t, client, tTTL, tTomb, tRelearn, tBatch), now: t0}
}

// testStore returns a store of a fresh pool with these settings, in µs.
func testStore(t testing.TB, client *redis.Client, ttl, tomb, relearn int64, batch int) *store {
	t.Helper()
	cfg := testConfig(client)
	cfg.LeaseTTL = time.Duration(ttl) * time.Microsecond
	cfg.RenewEvery = cfg.LeaseTTL / 3
	cfg.Tombstone = time.Duration(tomb) * time.Microsecond
	cfg.RelearnWindow = time.Duration(relearn) * time.Microsecond
	cfg.ReclaimBatch = batch
	s, err := cfg.settings()
	if err != nil {
		t.Fatal(err)
	}
	return newStore(&s)
}

func (f *fixture) check(r reply, err error) reply {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
	checkLedger(f.t, f.client, f.st.keys)
	return r
}

// reserve reserves n with tokens under limits 2 slots / 100 tokens and
// returns the code and the reply.
func (f *fixture) reserve(n int, tokens int64, gen string) (int64, reply) {
	f.t.Helper()
	return f.reserveL(n, Hold{1, tokens}, 2, 100, gen)
}

func (f *fixture) reserveL(n int, h Hold, slotLimit, tokenLimit int64, gen string) (int64, reply) {
	f.t.Helper()
	r := f.check(f.st.reserve(bg, f.now, idn(n), h, slotLimit, tokenLimit, gen, nil))
	return r.extra[0], r
}

func (f *fixture) release(ns ...int) reply {
	f.t.Helper()
	ids := make([]ID, len(ns))
	for i, n := range ns {
		ids[i] = idn(n)
	}
	return f.check(f.st.release(bg, f.now, ids))
}

func (f *fixture) adjust(n int, h Hold, seq uint64) int64 {
	f.t.Helper()
	return f.check(f.st.adjust(bg, f.now, []entry{{idn(n), h, seq}})).extra[0]
}

func (f *fixture) renew(reinstate bool, es ...entry) reply {
	f.t.Helper()
	return f.check(f.st.renew(bg, f.now, reinstate, es))
}

func (f *fixture) sums(r reply, slots, tokens int64) {
	f.t.Helper()
	if r.slots != slots || r.tokens != tokens {
		f.t.Fatalf("pool holds %d slots / %d tokens, want %d / %d", r.slots, r.tokens, slots, tokens)
	}
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
			code, r := f.reserve(1, 40, "")
			f.want("reserve", code, codeAdmitted)
			f.sums(r, 1, 40)
			if r.gen != strconv.FormatInt(t0, 10) || r.born != t0 || r.now != t0 || r.extra[1] != t0+tTTL {
				f.t.Fatalf("reply %+v", r)
			}
		}},
		{"exact fit admits, one more token does not", func(f *fixture) {
			f.reserve(1, 60, "")
			code, r := f.reserve(2, 40, "")
			f.want("exact fit", code, codeAdmitted)
			f.sums(r, 2, 100)
			f.release(2)
			code, r = f.reserve(3, 41, "")
			f.want("one over", code, codeTokens)
			f.sums(r, 1, 60)
		}},
		{"reject by slots", func(f *fixture) {
			f.reserve(1, 1, "")
			f.reserve(2, 1, "")
			code, r := f.reserve(3, 1, "")
			f.want("third slot", code, codeSlots)
			f.sums(r, 2, 2)
			code, _ = f.reserveL(4, Hold{0, 1}, 2, 100, "")
			f.want("a hold without a slot", code, codeAdmitted)
			code, _ = f.reserveL(5, Hold{1, 0}, 0, -1, "")
			f.want("MaxConcurrent 0", code, codeSlots)
		}},
		{"reject by tokens", func(f *fixture) {
			code, r := f.reserve(1, 101, "")
			f.want("over the budget", code, codeTokens)
			f.sums(r, 0, 0)
			code, _ = f.reserveL(2, Hold{1, 1 << 40}, -1, -1, "")
			f.want("no limits", code, codeAdmitted)
		}},
		{"high-priority reserve", func(f *fixture) {
			// Budget 100 with 30 reserved: normal reserves see 70.
			f.reserveL(1, Hold{1, 60}, 10, 70, "")
			code, _ := f.reserveL(2, Hold{1, 20}, 10, 70, "")
			f.want("normal beyond its share", code, codeTokens)
			code, r := f.reserveL(3, Hold{1, 40}, 10, 100, "")
			f.want("high within the reserve", code, codeAdmitted)
			f.sums(r, 2, 100)
		}},
		{"duplicate reserve", func(f *fixture) {
			f.reserve(1, 50, "")
			f.now += 1000
			code, r := f.reserve(1, 50, "")
			f.want("duplicate", code, codeDuplicate)
			f.sums(r, 1, 50)
			if r.extra[1] != t0+tTTL {
				f.t.Fatalf("duplicate expiry %d, want the first hold's %d", r.extra[1], t0+tTTL)
			}
			code, _ = f.reserve(1, 99, "")
			f.want("duplicate that would not fit", code, codeDuplicate)
		}},
		{"late reserve after release", func(f *fixture) {
			f.reserve(1, 50, "")
			r := f.release(1)
			f.sums(r, 0, 0)
			if r.extra[0] != 1 || r.extra[1] != 0 {
				f.t.Fatalf("release freed %v", r.extra)
			}
			code, r := f.reserve(1, 50, "")
			f.want("late reserve", code, codeReleased)
			f.sums(r, 0, 0)
			// A release before the reserve (the reserve's reply was lost
			// and the caller gave up) refuses it too.
			f.release(2)
			code, _ = f.reserve(2, 50, "")
			f.want("reserve after its release", code, codeReleased)
		}},
		{"double and unknown release", func(f *fixture) {
			f.reserve(1, 50, "")
			f.reserve(2, 20, "")
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
			f.reserve(1, 50, "")
			f.want("seq 2 first", f.adjust(1, Hold{1, 30}, 2), codeApplied)
			f.want("seq 1 late", f.adjust(1, Hold{1, 90}, 1), codeStale)
			f.want("seq 2 again", f.adjust(1, Hold{1, 90}, 2), codeStale)
			_, r := f.reserve(2, 0, "")
			f.sums(r, 2, 30)
			f.want("unknown id", f.adjust(9, Hold{1, 1}, 1), codeLost)
		}},
		{"adjust renews the lease", func(f *fixture) {
			f.reserve(1, 50, "")
			f.now += tTTL - 1
			f.adjust(1, Hold{1, 40}, 1)
			f.now += tTTL - 1
			_, r := f.reserve(2, 0, "")
			f.sums(r, 2, 40)
		}},
		{"overrun above the limit blocks admissions", func(f *fixture) {
			f.reserve(1, 50, "")
			f.want("overrun", f.adjust(1, Hold{1, 150}, 1), codeApplied)
			code, r := f.reserve(2, 0, "")
			f.want("reserve of 0 tokens over the budget", code, codeTokens)
			f.sums(r, 1, 150)
			f.adjust(1, Hold{1, 100}, 2)
			code, _ = f.reserve(3, 0, "")
			f.want("at the budget again", code, codeAdmitted)
		}},
		{"abandon gives the slot back and keeps the tokens", func(f *fixture) {
			f.reserve(1, 30, "")
			f.reserve(2, 30, "")
			f.want("abandon", f.adjust(1, Hold{0, 30}, 1), codeApplied)
			code, r := f.reserve(3, 40, "")
			f.want("slot freed", code, codeAdmitted)
			f.sums(r, 2, 100)
			code, _ = f.reserveL(4, Hold{0, 1}, 5, 100, "")
			f.want("tokens still held", code, codeTokens)
		}},
		{"renew extends leases and carries newer values", func(f *fixture) {
			f.reserve(1, 50, "")
			f.now += tTTL - 1
			r := f.renew(true, entry{idn(1), Hold{1, 20}, 3})
			f.want("renew", r.extra[0], codeRenewed)
			f.sums(r, 1, 20)
			r = f.renew(true, entry{idn(1), Hold{1, 70}, 2})
			f.sums(r, 1, 20) // older values: lease only
			f.now += tTTL - 1
			_, r = f.reserve(2, 0, "")
			f.sums(r, 2, 20)
		}},
		{"renew of a released id never resurrects it", func(f *fixture) {
			f.reserve(1, 50, "")
			f.release(1)
			r := f.renew(true, entry{idn(1), Hold{1, 50}, 0})
			f.want("renew after release", r.extra[0], codeTombstoned)
			f.sums(r, 0, 0)
		}},
		{"reinstate above the limit", func(f *fixture) {
			f.reserve(1, 80, "")
			f.now += tTTL // 1's lease ran out: reclaimed by the next script
			_, r := f.reserve(2, 100, "")
			f.sums(r, 1, 100)
			r = f.renew(false, entry{idn(1), Hold{1, 80}, 0})
			f.want("renew without reinstate", r.extra[0], codeLost)
			r = f.renew(true, entry{idn(1), Hold{1, 80}, 0})
			f.want("reinstate", r.extra[0], codeReinstated)
			f.sums(r, 2, 180)
			code, _ := f.reserve(3, 0, "")
			f.want("reserve while over", code, codeSlots)
		}},
		{"expiry reclaim at exactly expiry <= now", func(f *fixture) {
			f.reserve(1, 50, "")
			f.now += tTTL - 1
			_, r := f.reserve(2, 0, "")
			f.sums(r, 2, 50)
			f.now++
			_, r = f.reserve(3, 0, "")
			if r.reclaimed != 1 {
				f.t.Fatalf("reclaimed %d at expiry", r.reclaimed)
			}
			f.sums(r, 2, 0)
			code, _ := f.reserveL(1, Hold{1, 10}, 5, 100, "")
			f.want("an expired, reclaimed id may reserve again", code, codeAdmitted)
		}},
		{"reclaim cap and the second pass", func(f *fixture) {
			for n := 1; n <= 5; n++ {
				f.reserveL(n, Hold{1, 10}, 5, 100, "")
			}
			f.now += tTTL
			code, r := f.reserveL(6, Hold{1, 10}, 1, 100, "")
			if r.reclaimed != tBatch || code != codeSlots {
				f.t.Fatalf("reclaimed %d (cap %d), code %d", r.reclaimed, tBatch, code)
			}
			f.sums(r, 2, 20)
			code, r = f.reserveL(6, Hold{1, 10}, 1, 100, "")
			f.want("second pass", code, codeAdmitted)
			if r.reclaimed != 2 {
				f.t.Fatalf("second pass reclaimed %d", r.reclaimed)
			}
		}},
		{"tombstone expiry", func(f *fixture) {
			f.reserve(1, 50, "")
			f.release(1)
			f.now += tTomb - 1
			code, _ := f.reserve(1, 50, "")
			f.want("inside the tombstone", code, codeReleased)
			f.now++
			code, _ = f.reserve(1, 50, "")
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
			f.reserve(1, 50, "")
			f.reserve(2, 20, "")
			f.client.Del(bg, f.st.keys[2])
			f.now += 1000
			code, r := f.reserve(3, 30, strconv.FormatInt(t0, 10))
			f.want("reserve right after the loss", code, codeRelearning)
			f.sums(r, 2, 70)
			if r.gen != strconv.FormatInt(t0+1000, 10) || r.born != t0+1000 {
				f.t.Fatalf("new gen %q born %d", r.gen, r.born)
			}
		}},
		{"relearn window start and end", func(f *fixture) {
			_, r := f.reserve(1, 10, "")
			old := r.gen
			f.client.Del(bg, f.st.keys[0], f.st.keys[1], f.st.keys[2])
			f.now += 1000
			code, r := f.reserve(2, 10, old)
			f.want("window start", code, codeRelearning)
			born := r.born
			f.now = born + tRelearn - 1
			code, _ = f.reserve(2, 10, old)
			f.want("window end - 1µs", code, codeRelearning)
			f.want("holder re-registers", f.renew(true, entry{idn(1), Hold{1, 10}, 0}).extra[0], codeReinstated)
			code, _ = f.reserve(2, 10, r.gen)
			f.want("replica that knows the new gen", code, codeAdmitted)
			f.now = born + tRelearn
			code, r = f.reserveL(3, Hold{1, 10}, 5, 100, old)
			f.want("window over", code, codeAdmitted)
			f.sums(r, 3, 30)
		}},
		{"a replica with no gen is not held back", func(f *fixture) {
			f.reserve(1, 10, "")
			f.client.Del(bg, f.st.keys[0], f.st.keys[1], f.st.keys[2])
			f.now += 1000
			code, _ := f.reserve(2, 10, "")
			f.want("no gen", code, codeAdmitted)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(newFixture(t, client)) })
	}
}
