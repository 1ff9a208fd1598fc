package fleet

import (
	"context"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// renewer renews the live holds' leases every RenewEvery, at once when
// asked (a generation change, unaccounted holds to register), and checks
// the pool's generation every GenCheckEvery while holds are live.
func (p *Pool) renewer() {
	defer p.wg.Done()
	renew := p.clk.NewTimer(p.s.renewEvery)
	gen := p.clk.NewTimer(p.s.GenCheckEvery)
	defer func() {
		renew.Stop()
		gen.Stop()
	}()
	// A failed renewal is tried again within BreakerCooldown: until it
	// succeeds, leases may run out, and then reserves wait for it.
	retry := min(p.s.renewEvery, p.s.BreakerCooldown)
	for {
		select {
		case <-p.stop:
			return
		case <-renew.C():
			next := p.s.renewEvery
			if !p.renewAll() {
				next = retry
			}
			renew = p.clk.NewTimer(next)
			continue
		case <-p.kickRenew:
			if p.renewAll() {
				continue
			}
		case <-gen.C():
			gen = p.clk.NewTimer(p.s.GenCheckEvery)
			if !p.stateChanged() || p.renewAll() {
				continue
			}
		}
		renew.Stop()
		renew = p.clk.NewTimer(retry)
	}
}

// stateChanged reports whether this replica holds live holds and the
// pool's state in Redis is not one it knows: another generation (or none),
// or an older write than one it has seen. While the breaker is open it
// does not ask: the renewals probe Redis.
func (p *Pool) stateChanged() bool {
	p.mu.Lock()
	known, n, open := p.seen, len(p.live), p.fails >= breakerErrors
	p.mu.Unlock()
	if n == 0 || open {
		return false
	}
	cur, err := p.st.state(context.Background())
	if err != nil {
		p.failed(opGen, err)
		return false
	}
	if cur.blind {
		p.blindOnce.Do(func() {
			p.log.Warn("fleet: the pool's scripts may not call INFO (see the Redis user's ACL): a Redis restarted from a snapshot, or a failover to a replica that lagged, is noticed only by replicas that saw a newer state")
		})
	}
	return cur.gen != known.gen || cur.seq < known.seq
}

// snapshot returns the live holds' current values, in chunks of RenewBatch,
// and what this replica has seen of the pool.
func (p *Pool) snapshot() ([][]entry, seen) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var chunks [][]entry
	var cur []entry
	for id, hd := range p.live {
		if cur == nil {
			cur = make([]entry, 0, min(len(p.live), p.s.RenewBatch))
		}
		cur = append(cur, entry{id: id, h: hd.h, seq: hd.seq})
		if len(cur) == p.s.RenewBatch {
			chunks, cur = append(chunks, cur), nil
		}
	}
	if cur != nil {
		chunks = append(chunks, cur)
	}
	return chunks, p.seen
}

// renewAll renews every live hold, registering again (reinstating) those
// Redis does not have. It stops at the first failure, and reports whether
// none failed.
func (p *Pool) renewAll() bool {
	chunks, sn := p.snapshot()
	defer p.relapse()
	for _, chunk := range chunks {
		start := p.clk.Now()
		r, err := p.st.renew(context.Background(), p.scriptNow(), sn, true, chunk)
		if err != nil {
			p.failed(opRenew, err)
			return false
		}
		p.mu.Lock()
		p.observeLocked(r, p.viewLocked(r))
		rs := &p.stats.Renews
		for i, e := range chunk {
			code := r.extra[i]
			hd := p.live[e.id]
			if hd == nil {
				continue // released meanwhile
			}
			switch code {
			case codeRenewed, codeReinstated:
				if code == codeRenewed {
					rs.Renewed++
				} else {
					rs.Reinstated++
					if !hd.unaccounted {
						p.log.Warn("fleet: a live hold had gone from Redis; registered again", "id", e.id.String())
						p.notify(HoldReinstated)
					}
				}
				hd.leaseEnd = start.Add(p.s.LeaseTTL)
				if hd.unaccounted {
					hd.unaccounted = false
					p.unaccounted--
				}
				p.sentLocked(e, hd)
			case codeTombstoned:
				rs.Released++
				p.removeLocked(e.id)
			default:
				rs.Lost++
			}
		}
		sn = p.seen
		p.mu.Unlock()
	}
	return true
}

// relapse finds when the first live hold's lease runs out, after a
// renewal.
func (p *Pool) relapse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := true
	for _, hd := range p.live {
		if first || hd.leaseEnd.Before(p.lapseAt) {
			p.lapseAt, first = hd.leaseEnd, false
		}
	}
	p.lapsedLocked(p.clk.Now())
}

// sentLocked notes that Redis has e's values of hd.
func (p *Pool) sentLocked(e entry, hd *hold) {
	hd.sent = e.h
	if hd.seq == e.seq {
		delete(p.dirty, e.id)
	}
}

// viewLocked is the View of a reply to an operation other than reserve,
// with the pool's current limits.
func (p *Pool) viewLocked(r reply) View {
	return View{Slots: r.slots, Tokens: r.tokens, MaxConcurrent: p.slotLimit,
		TokenBudget: p.tokenBudget, Gen: p.genLocked(r.gen), Reclaimed: r.reclaimed}
}

// sender sends the queued releases and the due adjustments, retrying
// failed ones.
func (p *Pool) sender() {
	defer p.wg.Done()
	var t clock.Timer
	var tc <-chan time.Time
	for {
		select {
		case <-p.stopSend:
			if t != nil {
				t.Stop()
			}
			return
		case <-p.kickSend:
		case <-tc:
		}
		next := p.flushReleases()
		if n := p.flushAdjusts(); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
		if t != nil {
			t.Stop()
			t, tc = nil, nil
		}
		switch d := next.Sub(p.clk.Now()); {
		case next.IsZero():
		case d <= 0:
			kick(p.kickSend)
		default:
			timer := p.clk.NewTimer(d)
			t, tc = timer, timer.C()
		}
	}
}

// flushReleases sends the queued releases, RenewBatch per script, until
// none is left or one fails. It returns when to try again (zero: nothing
// left). Releases whose holds have expired by then are dropped on a failure.
func (p *Pool) flushReleases() time.Time {
	for {
		p.mu.Lock()
		n := min(len(p.relQ), p.s.RenewBatch)
		batch := append([]pendingRelease(nil), p.relQ[:n]...)
		p.relQ = p.relQ[n:]
		if n == 0 {
			p.mu.Unlock()
			return time.Time{}
		}
		// A reserve made while this batch is on its way waits for it, so
		// that it sees the capacity the batch frees.
		sent := make(chan struct{})
		p.relSent = sent
		sn := p.seen
		p.mu.Unlock()
		ids := make([]ID, n)
		for i := range batch {
			ids[i] = batch[i].id
		}
		r, err := p.st.release(context.Background(), p.scriptNow(), sn, ids)
		now := p.clk.Now()
		p.mu.Lock()
		if err != nil {
			p.mu.Unlock()
			p.failed(opRelease, err)
			p.mu.Lock()
			keep := batch[:0]
			for _, b := range batch {
				if now.Before(b.deadline) {
					keep = append(keep, b)
				}
			}
			p.relQ = append(keep, p.relQ...)
			p.mu.Unlock()
			close(sent)
			return now.Add(min(retryDelay, p.s.renewEvery))
		}
		p.observeLocked(r, p.viewLocked(r))
		p.mu.Unlock()
		close(sent)
	}
}

// flushAdjusts sends the adjustments that are due, RenewBatch per script.
// It returns when the next one is due (zero: none waiting).
func (p *Pool) flushAdjusts() time.Time {
	for {
		now := p.clk.Now()
		var next time.Time
		p.mu.Lock()
		var es []entry
		for id := range p.dirty {
			hd := p.live[id]
			if hd.due.After(now) {
				if next.IsZero() || hd.due.Before(next) {
					next = hd.due
				}
				continue
			}
			if len(es) < p.s.RenewBatch {
				es = append(es, entry{id: id, h: hd.h, seq: hd.seq})
			}
		}
		sn := p.seen
		p.mu.Unlock()
		if len(es) == 0 {
			return next
		}
		r, err := p.st.adjust(context.Background(), p.scriptNow(), sn, es)
		if err != nil {
			p.failed(opAdjust, err)
			p.mu.Lock()
			retry := now.Add(min(retryDelay, p.s.renewEvery))
			for _, e := range es {
				if hd := p.live[e.id]; hd != nil {
					hd.due = retry
				}
			}
			p.mu.Unlock()
			return retry
		}
		p.mu.Lock()
		p.observeLocked(r, p.viewLocked(r))
		as := &p.stats.Adjusts
		for i, e := range es {
			switch r.extra[i] {
			case codeApplied:
				as.Applied++
			case codeStale:
				as.Stale++
			default:
				as.Lost++
			}
			if hd := p.live[e.id]; hd != nil {
				hd.lastAdjust = now
				if r.extra[i] == codeLost {
					// The next renewal registers it again with these values.
					if hd.seq == e.seq {
						delete(p.dirty, e.id)
					}
					continue
				}
				p.sentLocked(e, hd)
			}
		}
		p.mu.Unlock()
	}
}
