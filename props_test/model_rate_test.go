package props_test

import (
	"context"
	"errors"
	"fmt"
	"math"
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
// WouldAdmit that capacity admits, a release whose usage settles its token
// rates; in pace mode, a call booking its turn, and a cool-down giving
// turns back).
type rateOracle struct {
	cfg     *bulkhead.RateLimits
	table   *pacer.Table
	comp    *pacer.Composite
	members []rateMember
}

// rateMember is one limit of the oracle: its pacer, what it counts, and
// the detail of a rejection it decides.
type rateMember struct {
	p      *pacer.Pacer
	limit  string // "requests", "tokens", "input_tokens" or "output_tokens"
	detail bulkhead.RateDetail
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

// drawBurst draws a burst for a limit: the default (zero: a minute of the
// rate), none (NoBurst), or a few calls' worth.
func drawBurst(t *rapid.T, name string, few int) float64 {
	switch rapid.IntRange(0, 2).Draw(t, name+"Kind") {
	case 0:
		return 0
	case 1:
		return bulkhead.NoBurst
	}
	return float64(rapid.IntRange(1, few).Draw(t, name))
}

// resolvedBurst is the burst the bulkhead applies for a limit given as b
// (SPEC P8): a minute of the rate by default, less the call that
// overflows it for requests.
func resolvedBurst(perMinute, b float64, requests bool) float64 {
	switch {
	case b == bulkhead.NoBurst:
		return 0
	case b != 0:
		return b
	case requests:
		return math.Max(0, perMinute-1)
	}
	return perMinute
}

// newRateOracle draws rate limits and returns their oracle: requests,
// tokens (weighed by a drawn TokenWeight), input and output tokens, each
// with a default, no or a small burst. Default bursts are a minute of the
// rate, so the runs draw the slow end of the rates too, where a minute of
// calls is a handful. With rdb, half the runs keep the bulkhead's rates
// in Redis (on the model's clock), where each check runs on the caller's
// goroutine against a provisional admission, instead of in the engine.
func newRateOracle(t *rapid.T, clk clock.Clock, tokens bool, rdb *redis.Client) *rateOracle {
	perMinute := func(name string, lo, hi int) float64 {
		return float64(rapid.IntRange(lo, hi).Draw(t, name))
	}
	r := bulkhead.Rate{RequestsPerMinute: perMinute("rpm", 1, 6000)}
	r.RequestBurst = drawBurst(t, "RequestBurst", 3)
	if tokens {
		if rapid.Bool().Draw(t, "tpm") {
			r.TokensPerMinute = perMinute("TokensPerMinute", 60, 60000)
			r.TokenBurst = drawBurst(t, "TokenBurst", 100)
		}
		if rapid.IntRange(0, 2).Draw(t, "itpm") == 0 {
			r.InputTokensPerMinute = perMinute("InputTokensPerMinute", 60, 60000)
			r.InputTokenBurst = drawBurst(t, "InputTokenBurst", 100)
		}
		if rapid.IntRange(0, 2).Draw(t, "otpm") == 0 {
			r.OutputTokensPerMinute = perMinute("OutputTokensPerMinute", 60, 60000)
			r.OutputTokenBurst = drawBurst(t, "OutputTokenBurst", 100)
		}
		if rapid.Bool().Draw(t, "tokensOnly") && (r.TokensPerMinute > 0 || r.InputTokensPerMinute > 0 || r.OutputTokensPerMinute > 0) {
			r.RequestsPerMinute, r.RequestBurst = 0, 0
		}
	}
	o := &rateOracle{cfg: &bulkhead.RateLimits{PerModel: r, Pace: rapid.Bool().Draw(t, "pace"),
		TokenWeight: rapid.SampledFrom([]bulkhead.TokenWeight{bulkhead.WeightReservation, bulkhead.WeightLarger, bulkhead.WeightInput}).Draw(t, "TokenWeight")}}
	if rdb != nil && rapid.Bool().Draw(t, "rateOnRedis") {
		store, err := pacer.NewRedis(rdb, pacer.RedisOptions{Clock: clk, Prefix: fmt.Sprintf("model%d:", rateRuns.Add(1)), Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		o.cfg.Store = store
	}
	o.table = pacer.NewTable()
	o.build(t)
	return o
}

// build makes the oracle's pacers for its limits, on its own table. Their
// buckets drain as the bulkhead's: at the rate when calls are
// rate-limited, at the pacer's default when they are paced, in every
// decision and settlement.
func (o *rateOracle) build(t *rapid.T) {
	r := o.cfg.PerModel
	factor := pacer.DefaultRateLimitFactor
	if o.cfg.Pace {
		factor = pacer.DefaultPaceFactor
	}
	o.members = nil
	var ps []*pacer.Pacer
	for _, l := range []struct {
		limit            string
		perMinute, burst float64
	}{
		{"requests", r.RequestsPerMinute, resolvedBurst(r.RequestsPerMinute, r.RequestBurst, true)},
		{"tokens", r.TokensPerMinute, resolvedBurst(r.TokensPerMinute, r.TokenBurst, false)},
		{"input_tokens", r.InputTokensPerMinute, resolvedBurst(r.InputTokensPerMinute, r.InputTokenBurst, false)},
		{"output_tokens", r.OutputTokensPerMinute, resolvedBurst(r.OutputTokensPerMinute, r.OutputTokenBurst, false)},
	} {
		if l.perMinute == 0 {
			continue
		}
		p, err := pacer.New(o.table, pacer.Options{Name: "bulkhead:model:gpt-4o:" + l.limit, QPS: l.perMinute / 60, MaxBurst: l.burst, BurstFactor: factor})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		o.members = append(o.members, rateMember{p: p, limit: l.limit,
			detail: bulkhead.RateDetail{Scope: "model", Key: "gpt-4o", Limit: l.limit, PerMinute: l.perMinute, Burst: l.burst}})
	}
	comp, err := pacer.NewComposite(ps...)
	if err != nil {
		t.Fatal(err)
	}
	o.comp = comp
}

// unpace turns pace mode off before the bulkhead is made (a run whose
// other settings cannot have calls wait for their turns): the calls are
// rate-limited, and the oracle's pacers, rebuilt, drain at the rate as the
// bulkhead's then do.
func (o *rateOracle) unpace(t *rapid.T) {
	if o.cfg.Pace {
		o.cfg.Pace = false
		o.build(t)
	}
}

// weight is what a call reserving res weighs in m (SPEC P8): 1 request;
// for tokens, what the token weight says; its input estimate; its max
// output.
func (o *rateOracle) weight(m *rateMember, res bulkhead.Reservation) int64 {
	switch m.limit {
	case "tokens":
		switch o.cfg.TokenWeight {
		case bulkhead.WeightLarger:
			return max(res.Input, res.MaxOutput)
		case bulkhead.WeightInput:
			return res.Input
		}
		return res.Reserved
	case "input_tokens":
		return res.Input
	case "output_tokens":
		return res.MaxOutput
	}
	return 1
}

// used is what a call that used u counts in m, by the rule of its weight:
// the input limit counts no input read from the prompt cache.
func (o *rateOracle) used(m *rateMember, u bulkhead.Usage) int64 {
	switch m.limit {
	case "tokens":
		switch o.cfg.TokenWeight {
		case bulkhead.WeightLarger:
			return max(u.Input, u.Output)
		case bulkhead.WeightInput:
			return u.Input
		}
		return u.Input + u.Output
	case "input_tokens":
		return max(0, u.Input-u.CachedInput)
	case "output_tokens":
		return u.Output
	}
	return 0
}

// at tells the oracle's store the model's time.
func (o *rateOracle) at(m *machine) { o.table.SetTime(m.clk.Now()) }

func (o *rateOracle) weights(res bulkhead.Reservation) []float64 {
	w := make([]float64, len(o.members))
	for i := range o.members {
		w[i] = float64(o.weight(&o.members[i], res))
	}
	return w
}

// detail is the rate detail the bulkhead reports for out.
func (o *rateOracle) detail(out pacer.CompositeOutcome) *bulkhead.RateDetail {
	for i, m := range o.members {
		if m.p == out.Pacer {
			d := m.detail
			d.Weight, d.RetryAfter = out.Members[i].Weight, out.Delay
			d.Remaining = max(0, out.Members[i].MaxBurst-out.Members[i].Level)
			return &d
		}
	}
	return nil
}

// check decides, and records, the rate check of a call that passed every
// capacity check: nil when it goes, else its rejection's rate detail. It
// counts the check in m's rate statistics. A nil oracle admits everything.
func (o *rateOracle) check(m *machine, res bulkhead.Reservation) *bulkhead.RateDetail {
	if o == nil {
		return nil
	}
	m.rateStats.Checked++
	o.at(m)
	out, err := o.comp.RateLimit(context.Background(), "bulkhead", o.weights(res)...)
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
func (o *rateOracle) peek(m *machine, res bulkhead.Reservation) *bulkhead.RateDetail {
	if o == nil {
		return nil
	}
	o.at(m)
	out, err := o.comp.Peek(context.Background(), "bulkhead", o.weights(res)...)
	if err != nil {
		panic(err)
	}
	if out.Delay == 0 {
		return nil
	}
	return o.detail(out)
}

// window is how far ahead a settlement may book a limit: its burst plus a
// minute of it (capped at the pacer's horizon).
func window(o pacer.Options) time.Duration {
	burst := o.MaxBurst / o.QPS
	if !(burst < (pacer.Horizon - time.Minute).Seconds()) {
		return pacer.Horizon
	}
	return time.Minute + time.Duration(burst*float64(time.Second))
}

// settle settles, as the bulkhead does at release, what each token limit
// counted for a call that reserved res and used u (SPEC P8): the tokens
// used beyond its weight are booked (at most one window ahead), and the
// input and output limits are given back what it did not use.
func (o *rateOracle) settle(m *machine, res bulkhead.Reservation, u bulkhead.Usage) {
	if o == nil {
		return
	}
	o.at(m)
	var over, back float64
	var dropped float64
	for i := range o.members {
		mb := &o.members[i]
		if mb.limit == "requests" {
			continue
		}
		delta := o.used(mb, u) - o.weight(mb, res)
		if delta < 0 && mb.limit == "tokens" {
			delta = 0 // tokens per minute are never given back
		}
		delta = max(delta, -int64(mb.p.Options().MaxBurst)) // a bucket gives back at most its burst
		if delta == 0 {
			continue
		}
		if delta > 0 {
			over += float64(delta)
		}
		out, err := mb.p.Settle(context.Background(), "bulkhead", window(mb.p.Options()), float64(delta))
		if err != nil {
			m.rateStats.OverrunErrors++ // a delta beyond what the pacer can book
			continue
		}
		if delta > 0 {
			dropped = math.Max(dropped, float64(delta)-out.Booked)
			m.seen["rate overrun "+mb.limit]++
		} else {
			back += -out.Booked
			m.seen["rate given back "+mb.limit]++
		}
	}
	if over > 0 {
		m.rateStats.Overruns++
		m.rateStats.OverrunTokens += int64(over)
	}
	if back > 0 {
		m.rateStats.Refunds++
		m.rateStats.RefundedTokens += int64(math.Round(back))
	}
	if dropped > 0 {
		m.rateStats.OverrunDropped += int64(math.Ceil(dropped))
	}
}

// settledIn reports whether the engine's rate statistics got count the
// settlements of want: a release's settlement on a Redis store finishes
// on a goroutine of its own, after the release is counted (a Release
// waits for it; a late Run callback's release, which nobody waits for,
// does not).
func (o *rateOracle) settledIn(got *bulkhead.RateStats, want bulkhead.RateStats) bool {
	if o == nil {
		return true
	}
	return got != nil && got.Overruns == want.Overruns && got.Refunds == want.Refunds && got.OverrunErrors == want.OverrunErrors
}

// turn books, in pace mode, the turn of a call reserving res that may wait
// at most maxWait: its delay, or, when the turn comes later, the rate
// detail of its rejection (it books nothing then). It counts the check in
// m's rate statistics.
func (o *rateOracle) turn(m *machine, res bulkhead.Reservation, maxWait time.Duration) (time.Duration, *bulkhead.RateDetail) {
	m.rateStats.Checked++
	o.at(m)
	out, err := o.comp.PaceWithin(context.Background(), "bulkhead", maxWait, o.weights(res)...)
	switch {
	case errors.Is(err, pacer.ErrTooLong):
		m.seen["paced: turn too late"]++
		return 0, o.detail(out)
	case err != nil:
		panic(err)
	}
	return out.Delay, nil
}

// giveBack gives back, as the bulkhead does on its own store, the turns of
// give (a store in Redis takes none back): each rate that one of them
// booked weight in goes back to the earliest of their turns there, unless
// a turn of kept that booked weight in it comes at or after that.
func (o *rateOracle) giveBack(m *machine, give, kept []*waiter) {
	if o.cfg.Store != nil || len(give) == 0 {
		return
	}
	from := make([]time.Time, len(o.members))
	for _, w := range give {
		for i, wt := range o.weights(w.res) {
			if wt > 0 && (from[i].IsZero() || w.turnAt.Before(from[i])) {
				from[i] = w.turnAt
			}
		}
	}
	for _, w := range kept {
		for i, wt := range o.weights(w.res) {
			if wt > 0 && !from[i].IsZero() && !w.turnAt.Before(from[i]) {
				from[i] = time.Time{} // a turn kept after the ones given back
			}
		}
	}
	o.at(m)
	for i, at := range from {
		if !at.IsZero() {
			m.seen["paced: turns given back"]++
			o.table.Rewind(o.members[i].p.Name(), "bulkhead", at)
		}
	}
}
