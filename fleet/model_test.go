package fleet

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// mhold is a hold in the model.
type mhold struct {
	exp, slots, tokens int64
	seq                uint64
}

// model is a pure Go model of one pool's Redis state and scripts.
type model struct {
	ttl, tomb, relearn, quiet int64
	batch                     int
	holds                     map[ID]mhold
	gone                      map[ID]int64
	slots, tokens             int64
	gen, seq                  int64  // gen 0: no aggregate
	srv                       string // the server the state recorded: "here", "other" or "" (none)
	chk                       int64  // when a script last found the state on its server
	reclaimed                 int
	dirty                     bool
	starts                    map[string]int // generations started, by cause (shared by clones)
}

func newModel(ttl, tomb, relearn, quiet int64, batch int, starts map[string]int) *model {
	return &model{ttl: ttl, tomb: tomb, relearn: relearn, quiet: quiet, batch: batch,
		holds: map[ID]mhold{}, gone: map[ID]int64{}, starts: starts}
}

// lose is Redis losing the pool's state (FLUSHALL, a restart).
func (m *model) lose() {
	m.holds, m.gone, m.gen, m.srv, m.chk = map[ID]mhold{}, map[ID]int64{}, 0, "", 0
}

// clone returns a copy of the model's state, as a snapshot of Redis keeps
// it.
func (m *model) clone() *model {
	c := *m
	c.holds, c.gone = maps.Clone(m.holds), maps.Clone(m.gone)
	return &c
}

// start begins a new generation.
func (m *model) start(now int64, sn seen, cause string) {
	m.starts[cause]++
	m.gen = max(now+m.relearn, m.gen+1, sn.gen+1)
	m.srv = "here"
	m.dirty = true
}

func (m *model) prelude(now int64, sn seen) {
	m.dirty, m.reclaimed = false, 0
	switch {
	case m.gen == 0:
		m.slots, m.tokens = 0, 0
		for _, h := range m.holds {
			m.slots += h.slots
			m.tokens += h.tokens
		}
		m.seq, m.gen = now, 0
		m.start(now, sn, "new or lost")
	case sn.newer(seen{m.gen, m.seq}):
		m.start(now, sn, "rewound")
	case now < max(m.seq, m.chk) || now-max(m.seq, m.chk) >= serverCheckGap:
		if m.srv == "other" {
			m.start(now, sn, "another server")
		} else {
			m.srv, m.chk = "here", now
		}
	}
	for id, exp := range m.gone {
		if exp <= now {
			delete(m.gone, id)
		}
	}
	if now < m.gen {
		return
	}
	var expired []ID
	unrenewed := false // a lease ran out after the last window
	for id, h := range m.holds {
		if h.exp <= now {
			expired = append(expired, id)
			unrenewed = unrenewed || h.exp > m.gen
		}
	}
	if len(expired) == 0 {
		return
	}
	if m.quiet > 0 && now-m.seq >= m.quiet && unrenewed {
		m.start(now, sn, "unrenewed")
		return
	}
	// ZRANGEBYSCORE order: by score, then by member.
	slices.SortFunc(expired, func(a, b ID) int {
		if d := m.holds[a].exp - m.holds[b].exp; d != 0 {
			return int(d / max(d, -d))
		}
		return compareStrings(a.String(), b.String())
	})
	m.reclaimed = min(len(expired), m.batch)
	for _, id := range expired[:m.reclaimed] {
		m.slots -= m.holds[id].slots
		m.tokens -= m.holds[id].tokens
		delete(m.holds, id)
	}
	m.dirty = true
}

// finish bumps the write sequence when the script wrote.
func (m *model) finish(now int64) {
	if m.dirty {
		m.seq = max(m.seq+1, now)
	}
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *model) reserve(now int64, sn seen, id ID, h Hold, slotLimit, tokenLimit int64) int64 {
	m.prelude(now, sn)
	defer m.finish(now)
	switch {
	case m.holds[id] != (mhold{}):
		return codeDuplicate
	case m.gone[id] != 0:
		return codeReleased
	case now < m.gen:
		return codeRelearning
	case slotLimit >= 0 && m.slots+h.Slots > slotLimit:
		return codeSlots
	case tokenLimit >= 0 && m.tokens+h.Tokens > tokenLimit:
		return codeTokens
	}
	m.put(id, mhold{now + m.ttl, h.Slots, h.Tokens, 0})
	return codeAdmitted
}

func (m *model) put(id ID, h mhold) {
	old := m.holds[id]
	m.slots += h.slots - old.slots
	m.tokens += h.tokens - old.tokens
	m.holds[id] = h
	m.dirty = true
}

func (m *model) release(now int64, sn seen, ids []ID) (freed, unknown int64) {
	m.prelude(now, sn)
	defer m.finish(now)
	m.dirty = m.dirty || len(ids) > 0
	for _, id := range ids {
		if _, ok := m.holds[id]; ok {
			m.put(id, mhold{})
			delete(m.holds, id)
			freed++
		} else {
			unknown++
		}
		m.gone[id] = now + m.tomb
	}
	return freed, unknown
}

func (m *model) adjust(now int64, sn seen, e entry) int64 {
	m.prelude(now, sn)
	defer m.finish(now)
	old, ok := m.holds[e.id]
	switch {
	case !ok:
		return codeLost
	case e.seq <= old.seq:
		return codeStale
	}
	m.put(e.id, mhold{now + m.ttl, e.h.Slots, e.h.Tokens, e.seq})
	return codeApplied
}

func (m *model) renew(now int64, sn seen, reinstate bool, es []entry) []int64 {
	m.prelude(now, sn)
	defer m.finish(now)
	codes := make([]int64, len(es))
	for i, e := range es {
		old, ok := m.holds[e.id]
		switch {
		case ok:
			if e.seq > old.seq {
				old = mhold{slots: e.h.Slots, tokens: e.h.Tokens, seq: e.seq}
			}
			old.exp = now + m.ttl
			m.put(e.id, old)
			codes[i] = codeRenewed
		case m.gone[e.id] != 0:
			codes[i] = codeTombstoned
		case reinstate:
			m.put(e.id, mhold{now + m.ttl, e.h.Slots, e.h.Tokens, e.seq})
			codes[i] = codeReinstated
		}
	}
	return codes
}

// replica is one simulated replica: its live holds and the newest state
// of the pool it has seen, adopted as the Pool does.
type replica struct {
	live map[ID]entry
	seen seen
}

func (r *replica) observe(rep reply) {
	switch {
	case rep.gen == r.seen.gen:
		r.seen.seq = max(r.seen.seq, rep.seq)
	case rep.gen > r.seen.gen:
		r.seen = rep.seen
	}
}

// TestModel runs random sequences of reserves, releases, adjustments,
// renewals, replica crashes, time steps, Redis state losses, rewinds to
// an earlier snapshot, and that snapshot served by another server, from
// several simulated replicas against the scripts and the model, and checks
// that every reply agrees and the ledger stays consistent.
func TestModel(t *testing.T) {
	_, client := startRedis(t)
	const (
		ttl, tomb, relearn, quiet = 1000, 500, 300, 600
		batch                     = 2
		slotLimit                 = 1
		budget, reserve           = 100, 20
	)
	starts, codes := map[string]int{}, map[int64]int{}
	rapid.Check(t, func(rt *rapid.T) {
		st := testStore(t, client, nil, ttl, tomb, relearn, quiet, batch)
		m := newModel(ttl, tomb, relearn, quiet, batch, starts)
		// The pool was created with no relearn window.
		if _, err := testStore(t, client, st.keys, ttl, tomb, 0, 0, batch).renew(bg, t0, seen{}, false, nil); err != nil {
			rt.Fatal(err)
		}
		m.relearn = 0
		m.renew(t0, seen{}, false, nil)
		m.relearn = relearn
		var snap *model             // the model when the snapshot was taken
		var dumps map[string]string // the keys then
		reps := make([]*replica, 3)
		for i := range reps {
			reps[i] = &replica{live: map[ID]entry{}}
		}
		now := int64(t0)
		ids := make([]ID, 12)
		for i := range ids {
			ids[i] = idn(i)
		}
		pickRep := func(rt *rapid.T) *replica { return reps[rapid.IntRange(0, len(reps)-1).Draw(rt, "replica")] }
		pickLive := func(rt *rapid.T, r *replica) (entry, bool) {
			keys := make([]ID, 0, len(r.live))
			for id := range r.live {
				keys = append(keys, id)
			}
			if len(keys) == 0 {
				return entry{}, false
			}
			slices.SortFunc(keys, func(a, b ID) int { return compareStrings(a.String(), b.String()) })
			return r.live[rapid.SampledFrom(keys).Draw(rt, "live")], true
		}
		same := func(rt *rapid.T, what string, rep reply, err error) {
			if err != nil {
				rt.Fatalf("%s: %v", what, err)
			}
			want := reply{slots: m.slots, tokens: m.tokens, seen: seen{m.gen, m.seq}, now: now, reclaimed: m.reclaimed}
			rep.extra = nil
			if !reflect.DeepEqual(rep, want) {
				rt.Fatalf("%s: Redis %+v, model %+v", what, rep, want)
			}
			if msg := readLedger(t, client, st.keys).consistent(); msg != "" {
				rt.Fatalf("%s: ledger: %s", what, msg)
			}
		}
		reserveAction := func(rt *rapid.T) {
			r := pickRep(rt)
			id := rapid.SampledFrom(ids).Draw(rt, "id")
			// Round amounts, so that exact fits are common.
			h := Hold{rapid.Int64Range(0, 1).Draw(rt, "slots"), 10 * rapid.Int64Range(0, 6).Draw(rt, "tokens")}
			tokenLimit := int64(budget - reserve)
			if rapid.Bool().Draw(rt, "high") {
				tokenLimit = budget
			}
			want := m.reserve(now, r.seen, id, h, slotLimit, tokenLimit)
			rep, err := st.reserve(bg, now, r.seen, id, h, slotLimit, tokenLimit, nil)
			code := rep.extra[0]
			same(rt, "reserve", rep, err)
			if code != want {
				rt.Fatalf("reserve code %d, model %d", code, want)
			}
			codes[code]++
			r.observe(rep)
			if want == codeAdmitted {
				r.live[id] = entry{id: id, h: h}
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			// Reserves are drawn twice as often as the other actions, so
			// that full pools are common.
			"reserve":       reserveAction,
			"reserve again": reserveAction,
			"release": func(rt *rapid.T) {
				r := pickRep(rt)
				var batch []ID
				if e, ok := pickLive(rt, r); ok {
					batch = append(batch, e.id)
					delete(r.live, e.id)
				}
				batch = append(batch, rapid.SliceOfN(rapid.SampledFrom(ids), 0, 3).Draw(rt, "more")...)
				freed, unknown := m.release(now, r.seen, batch)
				rep, err := st.release(bg, now, r.seen, batch)
				extra := rep.extra
				same(rt, "release", rep, err)
				if extra[0] != freed || extra[1] != unknown {
					rt.Fatalf("release %v, model %d/%d", extra, freed, unknown)
				}
				r.observe(rep)
			},
			"adjust": func(rt *rapid.T) {
				r := pickRep(rt)
				e, ok := pickLive(rt, r)
				if !ok {
					rt.Skip("no live hold")
				}
				e.h = Hold{rapid.Int64Range(0, e.h.Slots).Draw(rt, "slots"), 10 * rapid.Int64Range(0, 15).Draw(rt, "tokens")}
				if rapid.Bool().Draw(rt, "stale") && e.seq > 0 {
					e.seq -= uint64(rapid.IntRange(0, 1).Draw(rt, "back"))
				} else {
					e.seq++
					r.live[e.id] = e
				}
				want := m.adjust(now, r.seen, e)
				rep, err := st.adjust(bg, now, r.seen, []entry{e})
				code := rep.extra[0]
				same(rt, "adjust", rep, err)
				if code != want {
					rt.Fatalf("adjust code %d, model %d", code, want)
				}
				r.observe(rep)
			},
			"renew": func(rt *rapid.T) {
				r := pickRep(rt)
				es := make([]entry, 0, len(r.live))
				for _, e := range r.live {
					es = append(es, e)
				}
				slices.SortFunc(es, func(a, b entry) int { return compareStrings(a.id.String(), b.id.String()) })
				reinstate := rapid.Bool().Draw(rt, "reinstate")
				want := m.renew(now, r.seen, reinstate, es)
				rep, err := st.renew(bg, now, r.seen, reinstate, es)
				codes := rep.extra
				same(rt, "renew", rep, err)
				if !slices.Equal(codes, want) {
					rt.Fatalf("renew codes %v, model %v", codes, want)
				}
				for i, c := range want {
					if c == codeTombstoned {
						delete(r.live, es[i].id)
					}
				}
				r.observe(rep)
			},
			"crash": func(rt *rapid.T) {
				r := pickRep(rt)
				r.live, r.seen = map[ID]entry{}, seen{}
			},
			"advance": func(rt *rapid.T) {
				// Whole steps of 100 µs: leases, tombstones and relearn
				// windows often end exactly now.
				now += 100 * rapid.Int64Range(0, 12).Draw(rt, "steps")
			},
			"lose state": func(rt *rapid.T) {
				if rapid.IntRange(0, 4).Draw(rt, "rarely") != 0 {
					rt.Skip("rare")
				}
				if err := client.Del(bg, st.keys...).Err(); err != nil {
					rt.Fatal(err)
				}
				m.lose()
			},
			"snapshot": func(rt *rapid.T) {
				var err error
				if dumps, err = dumpKeys(client, st.keys); err != nil {
					rt.Fatal(err)
				}
				snap = m.clone()
			},
			"restore the snapshot": func(rt *rapid.T) {
				if snap == nil || rapid.IntRange(0, 2).Draw(rt, "rarely") != 0 {
					rt.Skip("rare")
				}
				if err := restoreKeys(client, dumps); err != nil {
					rt.Fatal(err)
				}
				m = snap.clone()
			},
			"restore the snapshot on another server": func(rt *rapid.T) {
				// A restart from the snapshot, or a failover: the state is
				// served by another server than the one it recorded.
				if snap == nil || snap.gen == 0 {
					rt.Skip("no snapshot")
				}
				if err := restoreKeys(client, dumps); err != nil {
					rt.Fatal(err)
				}
				if err := client.HSet(bg, st.keys[2], "srv", otherServer).Err(); err != nil {
					rt.Fatal(err)
				}
				m = snap.clone()
				m.srv = "other"
			},
			"": func(rt *rapid.T) {
				if m.slots < 0 || m.tokens < 0 {
					rt.Fatalf("negative sums %d/%d", m.slots, m.tokens)
				}
			},
		})
	})
	t.Logf("generations started: %v; reserve codes: %v", starts, codes)
	for _, cause := range []string{"new or lost", "rewound", "unrenewed", "another server"} {
		if starts[cause] == 0 {
			t.Errorf("no generation started as %s", cause)
		}
	}
	for _, c := range []int64{codeAdmitted, codeDuplicate, codeSlots, codeTokens, codeReleased, codeRelearning} {
		if codes[c] == 0 {
			t.Errorf("no reserve answered %d", c)
		}
	}
}
