package fleet

import (
	"slices"
	"strconv"
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
	ttl, tomb, relearn int64
	batch              int
	holds              map[ID]mhold
	gone               map[ID]int64
	slots, tokens      int64
	gen                string
	born               int64
	reclaimed          int
}

func newModel(ttl, tomb, relearn int64, batch int) *model {
	return &model{ttl: ttl, tomb: tomb, relearn: relearn, batch: batch, holds: map[ID]mhold{}, gone: map[ID]int64{}}
}

// lose is Redis losing the pool's state (FLUSHALL, a restart).
func (m *model) lose() {
	m.holds, m.gone, m.gen = map[ID]mhold{}, map[ID]int64{}, ""
}

func (m *model) prelude(now int64) {
	if m.gen == "" {
		m.slots, m.tokens = 0, 0
		for _, h := range m.holds {
			m.slots += h.slots
			m.tokens += h.tokens
		}
		m.gen, m.born = strconv.FormatInt(now, 10), now
	}
	var expired []ID
	for id, h := range m.holds {
		if h.exp <= now {
			expired = append(expired, id)
		}
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
	for id, exp := range m.gone {
		if exp <= now {
			delete(m.gone, id)
		}
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

func (m *model) reserve(now int64, id ID, h Hold, slotLimit, tokenLimit int64, seen string) int64 {
	m.prelude(now)
	switch {
	case m.holds[id] != (mhold{}):
		return codeDuplicate
	case m.gone[id] != 0:
		return codeReleased
	case seen != "" && seen != m.gen && now < m.born+m.relearn:
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
}

func (m *model) release(now int64, ids []ID) (freed, unknown int64) {
	m.prelude(now)
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

func (m *model) adjust(now int64, e entry) int64 {
	m.prelude(now)
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

func (m *model) renew(now int64, reinstate bool, es []entry) []int64 {
	m.prelude(now)
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

// replica is one simulated replica: its live holds and the generation it
// knows, adopted as the Pool does.
type replica struct {
	live map[ID]entry
	gen  string
}

func (r *replica) observe(rep reply, relearn int64) {
	if r.gen == "" || rep.now >= rep.born+relearn {
		r.gen = rep.gen
	}
}

// TestModel runs random sequences of reserves, releases, adjustments,
// renewals, replica crashes, time steps and Redis state losses from several
// simulated replicas against the scripts and the model, and checks that
// every reply agrees and the ledger stays consistent.
func TestModel(t *testing.T) {
	_, client := startRedis(t)
	const (
		ttl, tomb, relearn = 1000, 500, 300
		batch              = 2
		slotLimit          = 3
		budget, reserve    = 100, 20
	)
	rapid.Check(t, func(rt *rapid.T) {
		st := testStore(t, client, ttl, tomb, relearn, batch)
		m := newModel(ttl, tomb, relearn, batch)
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
			if rep.slots != m.slots || rep.tokens != m.tokens || rep.gen != m.gen || rep.reclaimed != m.reclaimed {
				rt.Fatalf("%s: Redis %d/%d gen %s reclaimed %d, model %d/%d gen %s reclaimed %d",
					what, rep.slots, rep.tokens, rep.gen, rep.reclaimed, m.slots, m.tokens, m.gen, m.reclaimed)
			}
			if msg := readLedger(t, client, st.keys).consistent(); msg != "" {
				rt.Fatalf("%s: ledger: %s", what, msg)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"reserve": func(rt *rapid.T) {
				r := pickRep(rt)
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				// Round amounts, so that exact fits are common.
				h := Hold{rapid.Int64Range(0, 1).Draw(rt, "slots"), 10 * rapid.Int64Range(0, 6).Draw(rt, "tokens")}
				tokenLimit := int64(budget - reserve)
				if rapid.Bool().Draw(rt, "high") {
					tokenLimit = budget
				}
				want := m.reserve(now, id, h, slotLimit, tokenLimit, r.gen)
				rep, err := st.reserve(bg, now, id, h, slotLimit, tokenLimit, r.gen, nil)
				same(rt, "reserve", rep, err)
				if rep.extra[0] != want {
					rt.Fatalf("reserve code %d, model %d", rep.extra[0], want)
				}
				r.observe(rep, relearn)
				if want == codeAdmitted {
					r.live[id] = entry{id: id, h: h}
				}
			},
			"release": func(rt *rapid.T) {
				r := pickRep(rt)
				var batch []ID
				if e, ok := pickLive(rt, r); ok {
					batch = append(batch, e.id)
					delete(r.live, e.id)
				}
				batch = append(batch, rapid.SliceOfN(rapid.SampledFrom(ids), 0, 3).Draw(rt, "more")...)
				freed, unknown := m.release(now, batch)
				rep, err := st.release(bg, now, batch)
				same(rt, "release", rep, err)
				if rep.extra[0] != freed || rep.extra[1] != unknown {
					rt.Fatalf("release %v, model %d/%d", rep.extra, freed, unknown)
				}
				r.observe(rep, relearn)
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
				want := m.adjust(now, e)
				rep, err := st.adjust(bg, now, []entry{e})
				same(rt, "adjust", rep, err)
				if rep.extra[0] != want {
					rt.Fatalf("adjust code %d, model %d", rep.extra[0], want)
				}
				r.observe(rep, relearn)
			},
			"renew": func(rt *rapid.T) {
				r := pickRep(rt)
				es := make([]entry, 0, len(r.live))
				for _, e := range r.live {
					es = append(es, e)
				}
				slices.SortFunc(es, func(a, b entry) int { return compareStrings(a.id.String(), b.id.String()) })
				reinstate := rapid.Bool().Draw(rt, "reinstate")
				want := m.renew(now, reinstate, es)
				rep, err := st.renew(bg, now, reinstate, es)
				same(rt, "renew", rep, err)
				if !slices.Equal(rep.extra, want) {
					rt.Fatalf("renew codes %v, model %v", rep.extra, want)
				}
				for i, c := range want {
					if c == codeTombstoned {
						delete(r.live, es[i].id)
					}
				}
				r.observe(rep, relearn)
			},
			"crash": func(rt *rapid.T) {
				r := pickRep(rt)
				r.live, r.gen = map[ID]entry{}, ""
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
			"": func(rt *rapid.T) {
				if m.slots < 0 || m.tokens < 0 {
					rt.Fatalf("negative sums %d/%d", m.slots, m.tokens)
				}
			},
		})
	})
}
