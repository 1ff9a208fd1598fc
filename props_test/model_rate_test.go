package props_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/pacer"
	"github.com/redis/go-redis/v9"
)

// rateOracle predicts the bulkhead's rate limits: the same pacers on a
// store of its own, told the model's time, asked at the moments the
// bulkhead asks its own (a call that passes every capacity check, a
// WouldAdmit that capacity admits, a release beyond its reservation; in
// pace mode, a call booking its turn, and a cool-down giving turns back).
type rateOracle struct {
	cfg     *bulkhead.RateLimits
	table   *pacer.Table
	comp    *pacer.Composite
	members []bulkhead.RateDetail // the detail of each member
	tokens  []bool                // members counting tokens
}

// rateRedis returns a client of a redis-server for the rate limits of the
// model's runs, nil when redis-server is not installed (and CI unset).
func rateRedis(t *testing.T) *redis.Client {
	srv := redistest.TryStart(t)
	if srv == nil {
		return nil
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// rateRuns numbers the model's runs on Redis, so each has keys of its own.
var rateRuns atomic.Int64

// newRateOracle draws rate limits and returns their oracle. With rdb, half
// the runs keep the bulkhead's rates in Redis (on the model's clock), where
// each check runs on the caller's goroutine against a provisional
// admission, instead of in the engine.
func newRateOracle(t *rapid.T, clk clock.Clock, tokens bool, rdb *redis.Client) *rateOracle {
	r := bulkhead.Rate{RequestsPerMinute: float64(rapid.IntRange(60, 6000).Draw(t, "rpm"))}
	if rapid.Bool().Draw(t, "requestBurst") {
		r.RequestBurst = float64(rapid.IntRange(1, 3).Draw(t, "RequestBurst"))
	}
	if tokens && rapid.Bool().Draw(t, "tpm") {
		r.TokensPerMinute = float64(rapid.IntRange(600, 60000).Draw(t, "TokensPerMinute"))
		if rapid.Bool().Draw(t, "tokenBurst") {
			r.TokenBurst = float64(rapid.IntRange(1, 100).Draw(t, "TokenBurst"))
		}
		if rapid.Bool().Draw(t, "tokensOnly") {
			r.RequestsPerMinute, r.RequestBurst = 0, 0
		}
	}
	o := &rateOracle{cfg: &bulkhead.RateLimits{PerModel: r, Pace: rapid.Bool().Draw(t, "pace")}}
	if rdb != nil && rapid.Bool().Draw(t, "rateOnRedis") {
		store, err := pacer.NewRedis(rdb, pacer.RedisOptions{Clock: clk, Prefix: fmt.Sprintf("model%d:", rateRuns.Add(1)), Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		o.cfg.Store = store
	}
	o.table = pacer.NewTable()
	store := o.table
	var ps []*pacer.Pacer
	for _, m := range []struct {
		limit            string
		perMinute, burst float64
	}{{"requests", r.RequestsPerMinute, r.RequestBurst}, {"tokens", r.TokensPerMinute, r.TokenBurst}} {
		if m.perMinute == 0 {
			continue
		}
		p, err := pacer.New(store, pacer.Options{Name: "bulkhead:model:gpt-4o:" + m.limit, QPS: m.perMinute / 60, MaxBurst: m.burst})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		o.members = append(o.members, bulkhead.RateDetail{Scope: "model", Key: "gpt-4o", Limit: m.limit, PerMinute: m.perMinute, Burst: m.burst})
		o.tokens = append(o.tokens, m.limit == "tokens")
	}
	comp, err := pacer.NewComposite(ps...)
	if err != nil {
		t.Fatal(err)
	}
	o.comp = comp
	return o
}

// at tells the oracle's store the model's time.
func (o *rateOracle) at(m *machine) { o.table.SetTime(m.clk.Now()) }

func (o *rateOracle) weights(reserved int64) []float64 {
	w := make([]float64, len(o.tokens))
	for i, tok := range o.tokens {
		w[i] = 1
		if tok {
			w[i] = float64(reserved)
		}
	}
	return w
}

// detail is the rate detail the bulkhead reports for out.
func (o *rateOracle) detail(out pacer.CompositeOutcome) *bulkhead.RateDetail {
	for i, p := range o.comp.Members() {
		if p.Name() == out.Pacer.Name() {
			d := o.members[i]
			d.Weight, d.RetryAfter = out.Members[i].Weight, out.Delay
			return &d
		}
	}
	return nil
}

// check decides, and records, the rate check of a call that passed every
// capacity check: nil when it goes, else its rejection's rate detail. It
// counts the check in m's rate statistics. A nil oracle admits everything.
func (o *rateOracle) check(m *machine, reserved int64) *bulkhead.RateDetail {
	if o == nil {
		return nil
	}
	m.rateStats.Checked++
	o.at(m)
	out, err := o.comp.RateLimit(context.Background(), "bulkhead", o.weights(reserved)...)
	if err != nil {
		panic(err)
	}
	if out.Delay == 0 {
		m.seen["rate admitted"]++
		return nil
	}
	m.seen["rate rejected "+out.Pacer.Name()]++
	return o.detail(out)
}

// peek is check for WouldAdmit: it records nothing.
func (o *rateOracle) peek(m *machine, reserved int64) *bulkhead.RateDetail {
	if o == nil {
		return nil
	}
	o.at(m)
	out, err := o.comp.Peek(context.Background(), "bulkhead", o.weights(reserved)...)
	if err != nil {
		panic(err)
	}
	if out.Delay == 0 {
		return nil
	}
	return o.detail(out)
}

// overrun books, as the bulkhead does at release, the tokens a call used
// beyond its reservation, in each tokens-per-minute member, at most one
// window (its burst plus a minute of it) ahead.
func (o *rateOracle) overrun(m *machine, reserved, used int64) {
	over := used - reserved
	if o == nil || over <= 0 || !slices.Contains(o.tokens, true) {
		return
	}
	m.rateStats.Overruns++
	m.rateStats.OverrunTokens += over
	m.seen["rate overrun"]++
	o.at(m)
	for i, p := range o.comp.Members() {
		if !o.tokens[i] {
			continue
		}
		opts := p.Options()
		window := time.Minute + time.Duration(opts.MaxBurst/opts.QPS*float64(time.Second))
		if _, err := p.Book(context.Background(), "bulkhead", window, float64(over)); err != nil {
			panic(err)
		}
	}
}

// turn books, in pace mode, the turn of a call reserving reserved tokens
// that may wait at most maxWait: its delay, or, when the turn comes later,
// the rate detail of its rejection (it books nothing then). It counts the
// check in m's rate statistics.
func (o *rateOracle) turn(m *machine, reserved int64, maxWait time.Duration) (time.Duration, *bulkhead.RateDetail) {
	m.rateStats.Checked++
	o.at(m)
	out, err := o.comp.PaceWithin(context.Background(), "bulkhead", maxWait, o.weights(reserved)...)
	switch {
	case errors.Is(err, pacer.ErrTooLong):
		m.seen["paced: turn too late"]++
		return 0, o.detail(out)
	case err != nil:
		panic(err)
	}
	return out.Delay, nil
}

// giveBack gives back, as the bulkhead does on its own store, the turns
// booked from at on (a store in Redis takes none back).
func (o *rateOracle) giveBack(m *machine, at time.Time) {
	if o.cfg.Store != nil {
		return
	}
	m.seen["paced: turns given back"]++
	o.at(m)
	for _, p := range o.comp.Members() {
		o.table.Rewind(p.Name(), "bulkhead", at)
	}
}
