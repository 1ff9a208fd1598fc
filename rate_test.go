package bulkhead_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/redistest"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// rateConfig is a config with a fixed estimator (1 input token plus the
// request's MaxTokens) and the given rate limits on a mock clock.
func rateConfig(clk *clock.Mock, rl *bulkhead.RateLimits) bulkhead.Config {
	return bulkhead.Config{
		Model: "gpt-4o", MaxConcurrent: 8, MaxQueue: 8, Clock: clk,
		TokenBudget: &bulkhead.TokenBudget{Budget: 1 << 40, Estimator: estimatorFunc(nil)},
		RateLimits:  rl,
	}
}

// forRateStores runs f on a mock clock with each rate store: the
// in-process one (nil), whose checks the engine makes itself, and, when
// redis-server is installed, a Redis store on the same mock clock, whose
// checks run on the caller's goroutine against a provisional admission.
func forRateStores(t *testing.T, f func(t *testing.T, clk *clock.Mock, store pacer.Store)) {
	t.Run("local", func(t *testing.T) { f(t, clock.NewMock(), nil) })
	srv := redistest.TryStart(t)
	if srv == nil {
		return
	}
	t.Run("redis", func(t *testing.T) {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = client.Close() })
		clk := clock.NewMock()
		store, err := pacer.NewRedis(client, pacer.RedisOptions{Clock: clk, Prefix: t.Name() + ":", Timeout: 10 * time.Second}) // generous: the race detector on a loaded machine
		if err != nil {
			t.Fatal(err)
		}
		f(t, clk, store)
	})
}

// wantRate checks a RateLimit rejection's retry-after and rate detail.
func wantRate(t *testing.T, err error, retry time.Duration, scope, key, limit string) *bulkhead.RejectedError {
	t.Helper()
	re := wantReason(t, err, bulkhead.RateLimit)
	got, ok := re.RetryAfter()
	if !ok || got != retry {
		t.Fatalf("RetryAfter = %v, %v; want %v (%v)", got, ok, retry, err)
	}
	r := re.Detail.Rate
	if r == nil || r.Scope != scope || r.Key != key || r.Limit != limit || r.RetryAfter != retry {
		t.Fatalf("rate detail %+v; want %s %q %s", r, scope, key, limit)
	}
	// A call waits its turn only once the bucket is full, and a full bucket
	// does not drain while calls wait: the store found no room.
	if r.Remaining != 0 || r.Remaining >= r.Weight {
		t.Fatalf("remaining %v of weight %v; want 0", r.Remaining, r.Weight)
	}
	return re
}

func TestRateLimitRequests(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
		a := mustAcquire(t, b, req("a", 10))
		_, err := b.Acquire(context.Background(), req("b", 10), bulkhead.WithTag("t-b"))
		re := wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
		if re.Tag != "t-b" || !strings.Contains(err.Error(), `model "gpt-4o": requests: 60 per minute (burst 0), this call weighs 1, retry after 1s`) {
			t.Fatalf("message %q, tag %q", err, re.Tag)
		}
		if re.NeverFits() {
			t.Fatal("a rate rejection never fits")
		}
		st := b.Stats()
		if st.Gate.InFlight != 1 || st.Calls.InFlight != 1 || st.Calls.Admitted != 1 || st.Calls.RejectedByReason[bulkhead.RateLimit] != 1 ||
			st.TokenBudget.InFlightTokens != 11 || st.Rate == nil || st.Rate.Checked != 2 {
			t.Fatalf("stats after the rejection: %v", st)
		}
		// The rejection holds nothing and booked nothing: a second later the
		// next call goes.
		clk.Add(999 * time.Millisecond)
		_, err = b.Acquire(context.Background(), req("c", 10))
		wantRate(t, err, time.Millisecond, "model", "gpt-4o", "requests")
		clk.Add(time.Millisecond)
		c := mustAcquire(t, b, req("c", 10))
		_ = a.Release(nil)
		_ = c.Release(nil)
		// A request naming its own model is counted on its own.
		other := req("d", 10)
		other.Model = "gpt-4o-mini"
		_ = mustAcquire(t, b, other).Release(nil)
		if st := b.Stats(); st.Gate.InFlight != 0 || st.TokenBudget.InFlightTokens != 0 || st.Calls.Rejected != 2 {
			t.Fatalf("stats at the end: %v", st)
		}
	})
}

// TestRateLimitAfterCapacity checks that a call turned away for capacity
// spends no rate, and that a queued call is counted when it leaves the
// queue.
func TestRateLimitAfterCapacity(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: 1}})
		cfg.MaxConcurrent, cfg.MaxQueue = 1, 0
		b := newBulkhead(t, cfg)
		a := mustAcquire(t, b, req("a", 10))
		for i := 0; i < 5; i++ {
			_, err := b.Acquire(context.Background(), req("b", 10))
			wantReason(t, err, bulkhead.ConcurrencyLimit)
		}
		_ = a.Release(nil)
		c := mustAcquire(t, b, req("c", 10)) // the second call of the burst
		_ = c.Release(nil)
		_, err := b.Acquire(context.Background(), req("d", 10))
		wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
		if st := b.Stats(); st.Rate.Checked != 3 {
			t.Fatalf("checked %d; want 3 (capacity rejections are not checked)", st.Rate.Checked)
		}
	})
}

// TestRateLimitQueued checks that a waiter is rate-checked when it is
// granted its slot, and that its rate rejection gives the slot to the next
// waiter.
func TestRateLimitQueued(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerClass: map[string]bulkhead.Rate{"batch": {RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}})
		cfg.MaxConcurrent, cfg.MaxQueue = 1, 4
		cfg.Classes = &bulkhead.Classes{Default: "web", Limits: map[string]bulkhead.ClassLimits{"web": {}, "batch": {}}}
		b := newBulkhead(t, cfg)
		var mu sync.Mutex
		var events []bulkhead.RejectEvent
		var admits []string
		unsub := b.Subscribe(bulkhead.Hooks{
			Reject: func(e bulkhead.RejectEvent) { mu.Lock(); events = append(events, e); mu.Unlock() },
			Admit:  func(e bulkhead.AdmitEvent) { mu.Lock(); admits = append(admits, e.Tag); mu.Unlock() },
		})
		defer unsub()
		batch := bulkhead.WithClass("batch")
		first := mustAcquire(t, b, req("a", 10), batch, bulkhead.WithTag("first"))
		_ = first.Release(nil) // the batch class's one call this second
		web := mustAcquire(t, b, req("w", 10), bulkhead.WithTag("web1"))
		queued := acquireAsync(context.Background(), b, req("b", 10), batch, bulkhead.WithTag("batch2"))
		testutil.WaitFor(t, "the batch call to queue", pending(b))
		next := acquireAsync(context.Background(), b, req("w2", 10), bulkhead.WithTag("web2"))
		testutil.WaitFor(t, "two waiters", func() bool { return b.Stats().Gate.Pending == 2 })
		_ = web.Release(nil)
		res := <-queued
		wantRate(t, res.err, time.Second, "class", "batch", "requests")
		w2 := <-next
		if w2.err != nil {
			t.Fatalf("the next waiter: %v", w2.err)
		}
		_ = w2.tok.Release(nil)
		if _, err := b.Shutdown(context.Background()); err != nil { // every event delivered
			t.Fatal(err)
		}
		st := b.Stats()
		if st.Calls.Admitted != 3 || st.Calls.Rejected != 1 || st.Classes.Classes["batch"].RejectedByReason[bulkhead.RateLimit] != 1 ||
			st.Gate.Admitted != 4 || st.Gate.Released != 4 {
			t.Fatalf("stats: %v", st)
		}
		if tb := st.TokenBudget; tb.TotalReserved != 3*11 || tb.TotalRefunded != 0 || tb.InFlightTokens != 0 {
			t.Fatalf("ledger: %+v; a rejection changes no token counter", tb)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(events) != 1 || events[0].Reason != bulkhead.RateLimit || events[0].Tag != "batch2" || events[0].Detail.Rate == nil {
			t.Fatalf("reject events %+v", events)
		}
		if strings.Join(admits, ",") != "first,web1,web2" {
			t.Fatalf("admit events %v: a rolled-back call is never announced as admitted", admits)
		}
	})
}

func TestRateLimitTokens(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 6000, TokenBurst: bulkhead.NoBurst}}))
		a := mustAcquire(t, b, req("a", 999)) // 1000 tokens: 10 s of a 100 tokens/s rate
		_, err := b.Acquire(context.Background(), req("b", 99))
		re := wantRate(t, err, 10*time.Second, "model", "gpt-4o", "tokens")
		if re.Detail.Rate.Weight != 100 {
			t.Fatalf("weight %v; want the reservation, 100", re.Detail.Rate.Weight)
		}
		// The call used 3000 tokens: the 2000 beyond its reservation are
		// booked at release, 20 s more.
		_ = a.Release(&bulkhead.Usage{Input: 1000, Output: 2000})
		_, err = b.Acquire(context.Background(), req("b", 99))
		wantRate(t, err, 30*time.Second, "model", "gpt-4o", "tokens")
		if st := b.Stats().Rate; st.Overruns != 1 || st.OverrunTokens != 2000 || st.OverrunErrors != 0 {
			t.Fatalf("rate stats %+v", st)
		}
		// A call that reserves nothing is never held back.
		zero := req("z", 0)
		p, err := b.Acquire(context.Background(), zero, bulkhead.WithReservation(bulkhead.Reservation{}))
		if err != nil {
			t.Fatalf("zero-token call: %v", err)
		}
		_ = p.Release(nil)
		// Usage reported during the call counts too.
		clk.Add(30 * time.Second)
		c := mustAcquire(t, b, req("c", 99))
		if _, err := c.ReportUsage(bulkhead.Usage{Input: 100, Output: 500}, nil); err != nil {
			t.Fatal(err)
		}
		_ = c.Release(nil)
		_, err = b.Acquire(context.Background(), req("d", 99))
		wantRate(t, err, 6*time.Second, "model", "gpt-4o", "tokens")
	})
}

func TestRateLimitRun(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
		cfg.Dedup = &bulkhead.DedupConfig{}
		b := newBulkhead(t, cfg)
		calls := 0
		fn := func(ctx context.Context, rc *bulkhead.RunContext) (int, error) { calls++; return 7, nil }
		if v, err := bulkhead.Run(context.Background(), b, req("a", 10), fn); err != nil || v != 7 {
			t.Fatalf("first Run: %v, %v", v, err)
		}
		_, err := bulkhead.Run(context.Background(), b, req("b", 10), fn)
		wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
		_, err = bulkhead.Run(context.Background(), b, req("c", 10), fn, bulkhead.NoDedup())
		wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
		if calls != 1 {
			t.Fatalf("fn ran %d times; want 1", calls)
		}
		f := b.AcquireAsync(context.Background(), req("d", 10))
		<-f.Done()
		if _, err := f.Result(); err == nil {
			t.Fatal("AcquireAsync over the rate admitted")
		} else {
			wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
		}
		clk.Add(time.Second)
		f = b.AcquireAsync(context.Background(), req("d", 10))
		p, err := f.Result()
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Release(nil)
	})
}

func TestRateLimitWouldAdmit(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
		for i := 0; i < 3; i++ {
			d, err := b.WouldAdmit(req("a", 10))
			if err != nil || !d.Admit {
				t.Fatalf("WouldAdmit %d: %+v, %v", i, d, err)
			}
		}
		p := mustAcquire(t, b, req("a", 10)) // WouldAdmit booked nothing
		defer func() { _ = p.Release(nil) }()
		d, err := b.WouldAdmit(req("b", 10), bulkhead.WithDetail())
		if err != nil || d.Admit || d.Reason != bulkhead.RateLimit || d.Detail == nil || d.Detail.Rate == nil || d.Detail.Rate.RetryAfter != time.Second {
			t.Fatalf("WouldAdmit over the rate: %+v, %v", d, err)
		}
		d, err = b.WouldAdmit(req("b", 10))
		if err != nil || d.Admit || d.Reason != bulkhead.RateLimit || d.Detail != nil {
			t.Fatalf("WouldAdmit over the rate, no detail: %+v, %v", d, err)
		}
	})
}

func TestRateLimitPace(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	cfg.QueueTimeout = 1500 * time.Millisecond
	b := newBulkhead(t, cfg)
	armed := make(chan time.Duration, 4)
	bulkhead.SetRateWaitHook(func(d time.Duration) { armed <- d })
	defer bulkhead.SetRateWaitHook(nil)
	var mu sync.Mutex
	var admits []bulkhead.AdmitEvent
	unsub := b.Subscribe(bulkhead.Hooks{Admit: func(e bulkhead.AdmitEvent) { mu.Lock(); admits = append(admits, e); mu.Unlock() }})
	defer unsub()

	a := mustAcquire(t, b, req("a", 10))
	_ = a.Release(nil)
	second := acquireAsync(context.Background(), b, req("b", 10))
	if d := <-armed; d != time.Second {
		t.Fatalf("paced for %v; want 1s", d)
	}
	// Its turn is at 1 s, the next one's at 2 s: beyond a 1.5 s queue
	// timeout, so that one is rejected at once, booking nothing.
	_, err := b.Acquire(context.Background(), req("c", 10))
	wantRate(t, err, 2*time.Second, "model", "gpt-4o", "requests")
	clk.Add(time.Second)
	res := <-second
	if res.err != nil {
		t.Fatalf("paced call: %v", res.err)
	}
	_ = res.tok.Release(nil)
	testutil.WaitFor(t, "the admit events", func() bool { mu.Lock(); defer mu.Unlock(); return len(admits) == 2 })
	mu.Lock()
	if len(admits) != 2 || admits[1].Timing.RateWait != time.Second {
		t.Fatalf("admit events %+v; want the second to have waited 1s for its turn", admits)
	}
	mu.Unlock()
	if st := b.Stats().Rate; st.Paced != 1 || st.PacedTime != time.Second || st.Checked != 3 {
		t.Fatalf("rate stats %+v", st)
	}

	// A paced call whose context ends while it waits is Aborted; one
	// waiting when the bulkhead closes is rejected Shutdown.
	ctx, cancel := context.WithCancel(context.Background())
	aborted := acquireAsync(ctx, b, req("d", 10))
	<-armed
	cancel()
	wantReason(t, (<-aborted).err, bulkhead.Aborted)
	clk.Add(time.Second) // the aborted call's turn is spent: the next is 1 s away
	closing := acquireAsync(context.Background(), b, req("e", 10))
	<-armed
	b.Close()
	wantReason(t, (<-closing).err, bulkhead.Shutdown)
}

// TestRateLimitPaceCapacity checks that in Pace mode a call that capacity
// turns away books no turn.
func TestRateLimitPaceCapacity(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	cfg.MaxConcurrent, cfg.MaxQueue = 1, 0
	b := newBulkhead(t, cfg)
	a := mustAcquire(t, b, req("a", 10))
	for i := 0; i < 3; i++ {
		_, err := b.Acquire(context.Background(), req("b", 10))
		wantReason(t, err, bulkhead.ConcurrencyLimit)
	}
	_ = a.Release(nil)
	clk.Add(time.Second)
	_ = mustAcquire(t, b, req("c", 10)).Release(nil) // its turn is free: no wait
	if st := b.Stats().Rate; st.Paced != 0 || st.Checked != 2 {
		t.Fatalf("rate stats %+v", st)
	}
}

// TestRateLimitStoreFailure checks each failure policy of a Redis store
// that cannot be reached.
func TestRateLimitStoreFailure(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	for _, tc := range []struct {
		policy pacer.FailurePolicy
		pace   bool
		want   bulkhead.Reason
	}{
		{pacer.FailError, false, bulkhead.RateUnavailable},
		{pacer.FailClosed, false, bulkhead.RateLimit},
		{pacer.FailOpen, false, 0},
		{pacer.FailError, true, bulkhead.RateUnavailable},
		{pacer.FailClosed, true, bulkhead.RateUnavailable},
		{pacer.FailOpen, true, 0},
	} {
		t.Run(tc.policy.String()+map[bool]string{true: "/pace", false: "/reject"}[tc.pace], func(t *testing.T) {
			store, err := pacer.NewRedis(client, pacer.RedisOptions{OnFailure: tc.policy, FailureDelay: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			b := newBulkhead(t, rateConfig(clock.NewMock(), &bulkhead.RateLimits{Store: store, Pace: tc.pace, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
			p, err := b.Acquire(context.Background(), req("a", 10))
			st := b.Stats()
			if tc.want == 0 {
				if err != nil {
					t.Fatalf("FailOpen: %v", err)
				}
				_ = p.Release(nil)
				if st.Rate.Fallbacks != 1 {
					t.Fatalf("fallbacks %d; want 1", st.Rate.Fallbacks)
				}
				return
			}
			re := wantReason(t, err, tc.want)
			if re.Detail == nil || re.Detail.Rate == nil || !errors.Is(re.Detail.Rate.Fallback, pacer.ErrUnavailable) {
				t.Fatalf("detail %+v", re.Detail)
			}
			retry, ok := re.RetryAfter()
			if tc.want == bulkhead.RateLimit && (!ok || retry != 3*time.Second) {
				t.Fatalf("RetryAfter %v, %v; want the policy's 3s", retry, ok)
			}
			if tc.want == bulkhead.RateUnavailable && (ok || !errors.Is(err, pacer.ErrUnavailable)) {
				t.Fatalf("%v: want no retry-after and the store's error", err)
			}
			if st.Gate.InFlight != 0 || st.TokenBudget.InFlightTokens != 0 {
				t.Fatalf("the rejection holds something: %v", st)
			}
		})
	}
}

// TestRateLimitRedisShared checks that two bulkheads on one Redis with the
// same name, two replicas of a service, share their rate.
func TestRateLimitRedisShared(t *testing.T) {
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	var replicas []*bulkhead.Bulkhead
	for i := 0; i < 2; i++ {
		store, err := pacer.NewRedis(client, pacer.RedisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cfg := rateConfig(nil, &bulkhead.RateLimits{Store: store, Name: "svc", PerModel: bulkhead.Rate{RequestsPerMinute: 1, RequestBurst: bulkhead.NoBurst}})
		cfg.Clock = nil
		replicas = append(replicas, newBulkhead(t, cfg))
	}
	_ = mustAcquire(t, replicas[0], req("a", 10)).Release(nil)
	_, err := replicas[1].Acquire(context.Background(), req("b", 10))
	re := wantReason(t, err, bulkhead.RateLimit)
	if retry, ok := re.RetryAfter(); !ok || retry <= 50*time.Second || retry > time.Minute {
		t.Fatalf("RetryAfter %v, %v; want about a minute", retry, ok)
	}
}

func TestRateLimitsConfig(t *testing.T) {
	budget := &bulkhead.TokenBudget{Budget: 100}
	classes := &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}}
	for _, tc := range []struct {
		name  string
		cfg   bulkhead.Config
		field string
	}{
		{"no rate", bulkhead.Config{RateLimits: &bulkhead.RateLimits{}}, "Config.RateLimits"},
		{"tokens without budget", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{TokensPerMinute: 10}}}, "Config.RateLimits.PerModel.TokensPerMinute"},
		{"negative", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: -1}}}, "Config.RateLimits.PerModel.RequestsPerMinute"},
		{"NaN", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: math.NaN()}}}, "Config.RateLimits.PerModel.RequestsPerMinute"},
		{"too fast", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 2 * bulkhead.MaxPerMinute}}}, "Config.RateLimits.PerModel.RequestsPerMinute"},
		{"infinite burst", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 1, RequestBurst: math.Inf(1)}}}, "Config.RateLimits.PerModel.RequestBurst"},
		{"burst alone", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 1, TokenBurst: 5}}}, "Config.RateLimits.PerModel.TokenBurst"},
		{"braces", bulkhead.Config{RateLimits: &bulkhead.RateLimits{Name: "a{b}", PerModel: bulkhead.Rate{RequestsPerMinute: 1}}}, "Config.RateLimits.Name"},
		{"class without classes", bulkhead.Config{RateLimits: &bulkhead.RateLimits{PerClass: map[string]bulkhead.Rate{"a": {RequestsPerMinute: 1}}}}, "Config.RateLimits.PerClass"},
		{"unknown class", bulkhead.Config{Classes: classes, RateLimits: &bulkhead.RateLimits{PerClass: map[string]bulkhead.Rate{"b": {RequestsPerMinute: 1}}}}, `Config.RateLimits.PerClass["b"]`},
		{"class tokens without budget", bulkhead.Config{Classes: classes, RateLimits: &bulkhead.RateLimits{PerClass: map[string]bulkhead.Rate{"a": {TokensPerMinute: 1}}}}, `Config.RateLimits.PerClass["a"].TokensPerMinute`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.MaxConcurrent = 1
			_, err := bulkhead.New(tc.cfg)
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, bulkhead.ErrInvalid) {
				t.Fatalf("New: %v; want a ConfigError on %s", err, tc.field)
			}
		})
	}
	// A valid one, with a budget.
	b := newBulkhead(t, bulkhead.Config{Model: "m", MaxConcurrent: 1, TokenBudget: budget,
		RateLimits: &bulkhead.RateLimits{PerModel: bulkhead.Rate{TokensPerMinute: bulkhead.MaxPerMinute, TokenBurst: bulkhead.NoBurst}}})
	_ = mustAcquire(t, b, req("a", 10)).Release(nil)
}

// TestRateLimitBorrowedDeadline runs a borrowing Run with a borrowed-slot
// deadline through a rate check: on Redis the admission is provisional
// while the check runs, and its deadline starts once it is confirmed.
func TestRateLimitBorrowedDeadline(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 600, RequestBurst: 10}})
		cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}} // no floors: every call borrows
		b := newBulkhead(t, cfg)
		v, err := bulkhead.Run(context.Background(), b, req("a", 10), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
			return 1, nil
		}, bulkhead.WithBorrowedDeadline(time.Second))
		if err != nil || v != 1 {
			t.Fatalf("Run: %v, %v", v, err)
		}
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := bulkhead.Run(context.Background(), b, req("b", 10), func(ctx context.Context, rc *bulkhead.RunContext) (int, error) {
				close(started)
				<-ctx.Done()
				return 0, ctx.Err()
			}, bulkhead.WithBorrowedDeadline(time.Second))
			done <- err
		}()
		<-started
		testutil.WaitFor(t, "the deadline to run", func() bool {
			clk.Add(100 * time.Millisecond)
			select {
			case err := <-done:
				done <- err
				return true
			default:
				return false
			}
		})
		if err := <-done; !errors.Is(err, bulkhead.ErrBorrowedDeadline) {
			t.Fatalf("Run past its deadline: %v", err)
		}
	})
}

// TestRateLimitTooHeavy: a call that weighs more tokens than its rate can
// ever book is rejected rate_limit, never fits, and says why.
func TestRateLimitTooHeavy(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 1, TokenBurst: bulkhead.NoBurst}}))
		_, err := b.Acquire(context.Background(), req("a", 2_000_000))
		re := wantReason(t, err, bulkhead.RateLimit)
		if !re.NeverFits() || !strings.Contains(err.Error(), "weighs more than a rate limit can ever book") {
			t.Fatalf("%v (never fits %v)", err, re.NeverFits())
		}
		if _, ok := re.RetryAfter(); ok {
			t.Fatal("a call that never fits has no retry-after")
		}
	})
}

// TestRateLimitAcquireAsyncLocalDecidesInline checks that with rate limits
// on the in-process store AcquireAsync decides before it returns, as
// without rate limits (the engine checks the rate as it grants the slot):
// an event loop on a virtual clock relies on it.
func TestRateLimitAcquireAsyncLocalDecidesInline(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
	f := b.AcquireAsync(context.Background(), req("a", 10))
	if !isDone(f) {
		t.Fatal("AcquireAsync under the rate did not decide before it returned")
	}
	p, err := f.Result()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(nil)
	f = b.AcquireAsync(context.Background(), req("b", 10))
	if !isDone(f) {
		t.Fatal("AcquireAsync over the rate did not decide before it returned")
	}
	_, err = f.Result()
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
}

// TestRateHugeOverrun checks that a huge usage figure locks a model out of
// its token rate for one window at most: 60k tokens a minute, and a release
// reporting a billion tokens (which the usage ceiling first clamps to 16
// million, counted) books a minute and drops the rest, counted and logged.
func TestRateHugeOverrun(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		var logs strings.Builder
		cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 60_000, TokenBurst: bulkhead.NoBurst}})
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		b := newBulkhead(t, cfg)
		a := mustAcquire(t, b, req("a", 999)) // 1000 tokens
		if err := a.Release(&bulkhead.Usage{Input: 1e9}); err != nil {
			t.Fatal(err)
		}
		// The schedule moves one window (a minute) ahead of now, the
		// reservation's second included: not 11.6 days.
		_, err := b.Acquire(context.Background(), req("b", 99))
		wantRate(t, err, time.Minute, "model", "gpt-4o", "tokens")
		st := b.Stats()
		over := int64(bulkhead.DefaultUsageCeiling - 1000)
		if r := st.Rate; r.Overruns != 1 || r.OverrunTokens != over || r.OverrunDropped != over-59_000 || r.OverrunErrors != 0 {
			t.Fatalf("rate stats %+v; want %d overrun tokens, all but 59000 dropped", r, over)
		}
		if st.Calls.SuspectUsage != 1 || st.Calls.SuspectTokens != 1e9-bulkhead.DefaultUsageCeiling {
			t.Fatalf("suspect usage %d (%d tokens), want 1 (%d)", st.Calls.SuspectUsage, st.Calls.SuspectTokens, int64(1e9-bulkhead.DefaultUsageCeiling))
		}
		if tb := st.TokenBudget; tb.TotalConsumed != bulkhead.DefaultUsageCeiling {
			t.Fatalf("consumed %d, want the ceiling", tb.TotalConsumed)
		}
		for _, want := range []string{"usage above the ceiling", "overrun larger than a rate window", "dropped="} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, logs.String())
			}
		}
	})
}

// TestUsageCeiling checks that a usage figure above Config.UsageCeiling is
// clamped (the breakdown with it), counted and logged, in a report and at
// release, and that a negative ceiling is invalid.
func TestUsageCeiling(t *testing.T) {
	var logs strings.Builder
	cfg := bulkhead.Interactive("gpt-4o", 2)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 10_000}
	cfg.UsageCeiling = 5000
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := newBulkhead(t, cfg)
	p := mustAcquire(t, b, req("a", 99))
	rep, err := p.ReportUsage(bulkhead.Usage{Input: 4000, Output: 3000, Reasoning: 3000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Held != 5000 {
		t.Fatalf("held %d after a report above the ceiling, want 5000", rep.Held)
	}
	if err := p.Release(&bulkhead.Usage{Input: 1 << 62, CachedInput: 1 << 61}); err != nil {
		t.Fatal(err)
	}
	st := b.Stats()
	if st.Calls.SuspectUsage != 2 || st.Calls.SuspectTokens != 2000+(1<<62)-5000 {
		t.Fatalf("suspect %d (%d tokens), want 2", st.Calls.SuspectUsage, st.Calls.SuspectTokens)
	}
	if st.TokenBudget.TotalConsumed != 5000 || st.TokenBudget.InFlightTokens != 0 {
		t.Fatalf("budget %+v; want 5000 consumed", st.TokenBudget)
	}
	if n := strings.Count(logs.String(), "usage above the ceiling"); n != 2 {
		t.Fatalf("%d log lines, want 2:\n%s", n, logs.String())
	}
	// A figure at the ceiling is not suspect.
	q := mustAcquire(t, b, req("b", 99))
	_ = q.Release(&bulkhead.Usage{Input: 2500, Output: 2500})
	if b.Stats().Calls.SuspectUsage != 2 {
		t.Fatal("a figure at the ceiling counted as suspect")
	}
	bad := bulkhead.Interactive("gpt-4o", 1)
	bad.UsageCeiling = -1
	if _, err := bulkhead.New(bad); !errors.Is(err, bulkhead.ErrInvalid) || !strings.Contains(err.Error(), "UsageCeiling") {
		t.Fatalf("negative ceiling: %v", err)
	}
}

// wideRateConfig is rateConfig with room for a hundred calls in flight.
func wideRateConfig(clk *clock.Mock, rl *bulkhead.RateLimits) bulkhead.Config {
	cfg := rateConfig(clk, rl)
	cfg.MaxConcurrent = 100
	return cfg
}

// TestRateDefaultBurstIsAMinute: a rate given without a burst admits a
// minute of it at once after a quiet spell, as a provider's full bucket
// does (exactly RequestsPerMinute calls; TokensPerMinute tokens, and the
// call that overflows them), then goes at the rate.
func TestRateDefaultBurstIsAMinute(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, wideRateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60}}))
		for i := range 60 {
			p, err := b.Acquire(context.Background(), req("a", 10))
			if err != nil {
				t.Fatalf("call %d of the minute: %v", i+1, err)
			}
			_ = p.Release(nil)
		}
		_, err := b.Acquire(context.Background(), req("a", 10))
		if rd := wantRate(t, err, time.Second, "model", "gpt-4o", "requests").Detail.Rate; rd.Burst != 59 || rd.PerMinute != 60 {
			t.Fatalf("detail %+v; want burst 59 (with the call that overflows it, 60 at once)", rd)
		}
		clk.Add(time.Second)
		_ = mustAcquire(t, b, req("a", 10)).Release(nil)

		// 600 tokens a minute: 54 calls of 11 tokens fill 594 of the
		// bucket, the 55th overflows it and takes the next 1.1 s.
		tb := newBulkhead(t, wideRateConfig(clk, &bulkhead.RateLimits{Store: store, Name: "tokens", PerModel: bulkhead.Rate{TokensPerMinute: 600}}))
		for i := range 55 {
			p, err := tb.Acquire(context.Background(), req("a", 10))
			if err != nil {
				t.Fatalf("token call %d: %v", i+1, err)
			}
			_ = p.Release(nil)
		}
		_, err = tb.Acquire(context.Background(), req("a", 10))
		if rd := wantRate(t, err, 1100*time.Millisecond, "model", "gpt-4o", "tokens").Detail.Rate; rd.Burst != 600 {
			t.Fatalf("detail %+v; want burst 600", rd)
		}
	})
}

// TestRateNoBurstSpacesCalls: NoBurst spaces every call 60/rate seconds
// apart, the first going at once.
func TestRateNoBurstSpacesCalls(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{
			RequestsPerMinute: 120, RequestBurst: bulkhead.NoBurst, OutputTokensPerMinute: 6000, OutputTokenBurst: bulkhead.NoBurst}}))
		_ = mustAcquire(t, b, req("a", 10)).Release(nil)
		_, err := b.Acquire(context.Background(), req("a", 10))
		if rd := wantRate(t, err, 500*time.Millisecond, "model", "gpt-4o", "requests").Detail.Rate; rd.Burst != 0 {
			t.Fatalf("detail %+v; want burst 0", rd)
		}
		clk.Add(500 * time.Millisecond)
		_ = mustAcquire(t, b, req("a", 100)).Release(nil) // 100 output tokens: the next 1 s of the output rate
		clk.Add(500 * time.Millisecond)
		_, err = b.Acquire(context.Background(), req("a", 10))
		wantRate(t, err, 500*time.Millisecond, "model", "gpt-4o", "output_tokens")
	})
}

// TestRateTokenWeight: each token weight weighs a call by its rule (the
// reservation, the larger of input and max output, the input), and
// settles it by the same rule at release: usage beyond the weight is
// booked, usage below it gives nothing back.
func TestRateTokenWeight(t *testing.T) {
	res := bulkhead.Reservation{Input: 300, MaxOutput: 100, Reserved: 400}
	for _, c := range []struct {
		w      bulkhead.TokenWeight
		weight float64
		over   int64 // booked at release for a usage of 350 in, 150 out
	}{
		{bulkhead.WeightReservation, 400, 100},
		{bulkhead.WeightLarger, 300, 50},
		{bulkhead.WeightInput, 300, 50},
	} {
		t.Run(c.w.String(), func(t *testing.T) {
			forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
				// 100 tokens a second, no burst: a call of w tokens books w/100 s.
				b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, TokenWeight: c.w,
					PerModel: bulkhead.Rate{TokensPerMinute: 6000, TokenBurst: bulkhead.NoBurst}}))
				p := mustAcquire(t, b, req("a", 10), bulkhead.WithReservation(res))
				_, err := b.Acquire(context.Background(), req("a", 10), bulkhead.WithReservation(res))
				retry := time.Duration(c.weight*10) * time.Millisecond
				if rd := wantRate(t, err, retry, "model", "gpt-4o", "tokens").Detail.Rate; rd.Weight != c.weight {
					t.Fatalf("weight %v, want %v", rd.Weight, c.weight)
				}
				if err := p.Release(&bulkhead.Usage{Input: 350, Output: 150}); err != nil {
					t.Fatal(err)
				}
				st := b.Stats().Rate
				if st.OverrunTokens != c.over || st.Refunds != 0 {
					t.Fatalf("stats %+v; want %d over, nothing given back", st, c.over)
				}
				_, err = b.Acquire(context.Background(), req("a", 10), bulkhead.WithReservation(res))
				wantRate(t, err, retry+time.Duration(c.over*10)*time.Millisecond, "model", "gpt-4o", "tokens")
			})
		})
	}
}

// TestRateInputOutputSettle: the input and output rates weigh a call's
// input estimate and max output, and at release are given back what it
// did not use (its unused output, its input read from the prompt cache)
// and booked what it used beyond them, so the next calls go sooner or
// later; the detail names the limit, and Stats count both.
func TestRateInputOutputSettle(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) {
		b := newBulkhead(t, wideRateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{
			InputTokensPerMinute: 60000, OutputTokensPerMinute: 3000}})) // buckets of 60000 and 3000
		res := bulkhead.Reservation{Input: 2000, MaxOutput: 1000, Reserved: 3000}
		var held []*bulkhead.Permit
		for range 3 { // 3000 output tokens: the output bucket is full
			held = append(held, mustAcquire(t, b, req("a", 10), bulkhead.WithReservation(res)))
		}
		held = append(held, mustAcquire(t, b, req("a", 10), bulkhead.WithReservation(res))) // overflows it: the next 20 s
		_, err := b.Acquire(context.Background(), req("a", 10), bulkhead.WithReservation(res))
		rd := wantRate(t, err, 20*time.Second, "model", "gpt-4o", "output_tokens").Detail.Rate
		if rd.Weight != 1000 || rd.Burst != 3000 || rd.PerMinute != 3000 {
			t.Fatalf("detail %+v", rd)
		}
		// Each call used 100 output tokens of its 1000, and 1500 input
		// tokens of its 2000, 500 of them read from the cache: each gives
		// 900 output and 1000 input back, as far as the buckets hold them
		// (the output bucket holds 3000).
		for _, p := range held {
			if err := p.Release(&bulkhead.Usage{Input: 1500, CachedInput: 500, Output: 100}); err != nil {
				t.Fatal(err)
			}
		}
		st := b.Stats().Rate
		if st.Refunds != 4 || st.RefundedTokens != 3000+4*1000 || st.Overruns != 0 {
			t.Fatalf("stats %+v; want 4 refunds, 3000 output and 4000 input tokens", st)
		}
		// The room given back is there once the overflowing call's 20 s
		// have passed: the whole output bucket.
		clk.Add(20 * time.Second)
		for i := range 3 {
			p, err := b.Acquire(context.Background(), req("a", 10), bulkhead.WithReservation(res))
			if err != nil {
				t.Fatalf("call %d after the give-back: %v", i+1, err)
			}
			_ = p.Release(nil)
		}
		// A call that used more input than estimated books the excess.
		p := mustAcquire(t, b, req("a", 10), bulkhead.WithReservation(bulkhead.Reservation{Input: 10, MaxOutput: 0, Reserved: 10}))
		if err := p.Release(&bulkhead.Usage{Input: 510}); err != nil {
			t.Fatal(err)
		}
		if st := b.Stats().Rate; st.Overruns != 1 || st.OverrunTokens != 500 {
			t.Fatalf("stats %+v; want 500 input tokens booked", st)
		}
	})
}

// TestRateBurstValidation: a burst that is negative (but NoBurst), not a
// number or infinite, a burst without its rate, an input or output rate
// without a token budget, and an unknown token weight are errors naming
// the field.
func TestRateBurstValidation(t *testing.T) {
	budget := &bulkhead.TokenBudget{Budget: 1000}
	for _, c := range []struct {
		name  string
		rl    bulkhead.RateLimits
		field string
	}{
		{"negative", bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 10, RequestBurst: -2}}, "Config.RateLimits.PerModel.RequestBurst"},
		{"NaN", bulkhead.RateLimits{PerModel: bulkhead.Rate{TokensPerMinute: 10, TokenBurst: math.NaN()}}, "Config.RateLimits.PerModel.TokenBurst"},
		{"infinite", bulkhead.RateLimits{PerModel: bulkhead.Rate{InputTokensPerMinute: 10, InputTokenBurst: math.Inf(1)}}, "Config.RateLimits.PerModel.InputTokenBurst"},
		{"fraction below zero", bulkhead.RateLimits{PerModel: bulkhead.Rate{OutputTokensPerMinute: 10, OutputTokenBurst: -0.5}}, "Config.RateLimits.PerModel.OutputTokenBurst"},
		{"NoBurst without its rate", bulkhead.RateLimits{PerModel: bulkhead.Rate{RequestsPerMinute: 10, TokenBurst: bulkhead.NoBurst}}, "Config.RateLimits.PerModel.TokenBurst"},
		{"output rate negative", bulkhead.RateLimits{PerModel: bulkhead.Rate{OutputTokensPerMinute: -1}}, "Config.RateLimits.PerModel.OutputTokensPerMinute"},
		{"input rate too fast", bulkhead.RateLimits{PerModel: bulkhead.Rate{InputTokensPerMinute: 2 * bulkhead.MaxPerMinute}}, "Config.RateLimits.PerModel.InputTokensPerMinute"},
		{"unknown weight", bulkhead.RateLimits{TokenWeight: 9, PerModel: bulkhead.Rate{TokensPerMinute: 10}}, "Config.RateLimits.TokenWeight"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := bulkhead.New(bulkhead.Config{Model: "m", MaxConcurrent: 1, TokenBudget: budget, RateLimits: &c.rl})
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, bulkhead.ErrInvalid) {
				t.Fatalf("error %v; want a ConfigError for %s", err, c.field)
			}
		})
	}
	for _, rate := range []bulkhead.Rate{{InputTokensPerMinute: 10}, {OutputTokensPerMinute: 10}} {
		_, err := bulkhead.New(bulkhead.Config{Model: "m", MaxConcurrent: 1, RateLimits: &bulkhead.RateLimits{PerModel: rate}})
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(ce.Problem, "Config.TokenBudget") {
			t.Fatalf("%+v without a budget: %v", rate, err)
		}
	}
	if got := bulkhead.TokenWeight(9).String(); got != "TokenWeight(9)" {
		t.Errorf("String of an unknown weight: %q", got)
	}
}

// TestRateOutputPaced: in pace mode the output rate weighs a call's max
// output too; a turn that comes after the call's queue timeout is refused
// at once, and what the calls before it give back at release is there
// once their booked turns have passed.
func TestRateOutputPaced(t *testing.T) {
	forRateStores(t, func(t *testing.T, clk *clock.Mock, store pacer.Store) { testRateOutputPaced(t, clk, store) })
}

func testRateOutputPaced(t *testing.T, clk *clock.Mock, store pacer.Store) {
	cfg := wideRateConfig(clk, &bulkhead.RateLimits{Store: store, Pace: true, PerModel: bulkhead.Rate{OutputTokensPerMinute: 6000}}) // 100 a second, a bucket of 6000
	cfg.QueueTimeout = time.Second
	b := newBulkhead(t, cfg)
	full := bulkhead.WithReservation(bulkhead.Reservation{Input: 1, MaxOutput: 6000, Reserved: 6001})
	p1 := mustAcquire(t, b, req("a", 10), full) // fills the bucket
	p2 := mustAcquire(t, b, req("a", 10), full) // overflows it: the next 60 s
	_, err := b.Acquire(context.Background(), req("a", 10), full)
	if rd := wantReason(t, err, bulkhead.RateLimit).Detail.Rate; rd == nil || rd.Limit != "output_tokens" || rd.RetryAfter != time.Minute {
		t.Fatalf("rate detail %+v; want output_tokens, a minute to wait", rd)
	}
	for _, p := range []*bulkhead.Permit{p1, p2} {
		if err := p.Release(&bulkhead.Usage{Input: 1, Output: 0}); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats().Rate; st.Refunds != 1 || st.RefundedTokens != 6000 {
		t.Fatalf("stats %+v; want the bucket's 6000 output tokens given back, once", st)
	}
	clk.Add(time.Minute)
	for i := range 2 {
		p, err := b.Acquire(context.Background(), req("a", 10), full)
		if err != nil {
			t.Fatalf("call %d after the give-back: %v", i+1, err)
		}
		_ = p.Release(nil)
	}
}

// TestDrainWaitsForOverrunBookingOnRedisRates checks that Drain waits for the
// overrun a release books on rates kept in Redis. The booking runs on a
// goroutine of the engine's (the release waits for it), but the engine
// counted the admission settled as soon as it handled the release: a Drain
// (or Shutdown) that ran meanwhile reported drained while that goroutine
// still talked to Redis, though after Close and a Drain that drained, the
// bulkhead's goroutines have ended.
func TestDrainWaitsForOverrunBookingOnRedisRates(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 60_000, TokenBurst: bulkhead.NoBurst}}))
	p := mustAcquire(t, b, req("a", 99)) // 100 tokens
	booking, resume := make(chan struct{}), make(chan struct{})
	hold := func() { close(booking); <-resume }
	once.Store(&hold)
	released := make(chan error, 1)
	go func() { released <- p.Release(&bulkhead.Usage{Input: 5000}) }()
	<-booking // the overrun's booking has its reply, on the engine's goroutine
	b.Close()
	res := drainNow(b)
	select {
	case <-released:
		t.Fatal("the release returned before its overrun was booked")
	default:
	}
	close(resume)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if res.Drained || res.InFlight != 1 {
		t.Fatalf("Drain after Close: %+v while the release's overrun booking still ran on a goroutine of the engine's; want not drained, 1 in flight", res)
	}
	if res := drainNow(b); !res.Drained {
		t.Fatalf("Drain once the booking is done: %+v", res)
	}
}

// TestRedisHookPanicDuringOverrunBookingIsCounted checks that a Redis hook
// that panics while an overrun is booked at release is recovered and counted
// as a failed booking. The booking runs on a goroutine of the engine's,
// which recovered nothing, so the panic ended the process. (Before, the
// booking ran on the releasing caller's goroutine, where the panic reached
// the caller; every other Redis call of a remote stage recovers it into its
// verdict.) The test runs the release in a child process and fails when that
// process dies.
func TestRedisHookPanicDuringOverrunBookingIsCounted(t *testing.T) {
	if os.Getenv("BULKHEAD_OVERRUN_PANIC_CHILD") == "1" {
		overrunBookingHookPanic(t)
		return
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRedisHookPanicDuringOverrunBookingIsCounted$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "BULKHEAD_OVERRUN_PANIC_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a panicking Redis hook during an overrun booking ended the process (%v):\n%s", err, out)
	}
}

func overrunBookingHookPanic(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{TokensPerMinute: 60_000, TokenBurst: bulkhead.NoBurst}}))
	p := mustAcquire(t, b, req("a", 99))
	boom := func() { panic("redis hook") }
	once.Store(&boom)
	func() {
		defer func() { _ = recover() }() // reaching the caller is fine too
		_ = p.Release(&bulkhead.Usage{Input: 5000})
	}()
	if st := b.Stats().Rate; st.OverrunErrors != 1 {
		t.Fatalf("rate stats %+v: want the failed booking counted", st)
	}
}

// TestRateStoreTableRunsOnTheEngineClock checks that a *pacer.Table given as
// RateLimits.Store, which the engine takes for an in-process store and asks
// itself, decides at the engine's time. The engine set the time only of the
// table it makes for a nil Store: the caller's table decided every call at
// the Unix epoch, so its buckets never drained and, once the burst was
// spent, every call was turned away, however long the caller waited.
func TestRateStoreTableRunsOnTheEngineClock(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: pacer.NewTable(), PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
	a := mustAcquire(t, b, req("a", 10))
	_ = a.Release(nil)
	_, err := b.Acquire(context.Background(), req("b", 10))
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
	clk.Add(time.Hour)
	p, err := b.Acquire(context.Background(), req("c", 10))
	if err != nil {
		t.Fatalf("an hour later, at 60 requests a minute: %v", err)
	}
	_ = p.Release(nil)
}

// afterHook runs after(cmd) once each command's reply is in, on the
// goroutine that sent it.
type afterHook struct{ after func(redis.Cmder) }

func (h afterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(cmd)
		return err
	}
}

func (h afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hookedRedis starts a redis-server (or skips) and returns a client that
// gives up at its context's deadline (so the stores call it on the calling
// goroutine), with once: the function stored there runs once, on the
// goroutine that sent the next command, after its reply is in.
func hookedRedis(t *testing.T) (*redis.Client, *atomic.Pointer[func()]) {
	t.Helper()
	srv := redistest.TryStart(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	once := new(atomic.Pointer[func()])
	client.AddHook(afterHook{func(redis.Cmder) {
		if f := once.Swap(nil); f != nil {
			(*f)()
		}
	}})
	return client, once
}

// hookedRateStore is a Redis rate store on clk over a hookedRedis client.
func hookedRateStore(t *testing.T, clk *clock.Mock) (*pacer.Redis, *atomic.Pointer[func()]) {
	t.Helper()
	client, once := hookedRedis(t)
	store, err := pacer.NewRedis(client, pacer.RedisOptions{Clock: clk, Prefix: t.Name() + ":", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return store, once
}

// callerWaitsAfterCancel reports whether a caller of Acquire has sent its
// cancel message and waits for the engine's answer (the plain receive
// after the select on its context).
func callerWaitsAfterCancel() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[chan receive")) && bytes.Contains(g, []byte("actor.(*Engine).Acquire(")) {
			return true
		}
	}
	return false
}

// TestPacedCallerLeavingWhileRedisBooksItsTurnIsAnswered checks a paced call
// whose turn a Redis store books, and whose caller leaves right after Redis
// booked it, before the worker's verdict reaches the engine: the caller's
// cancel message arrives while the call is checking (the engine leaves it
// to the verdict). The verdict parked the call for its turn; at its turn the
// engine saw the context ended and waited for a cancel message that was
// already spent. The caller's Acquire never returned, and Drain never
// completed.
func TestPacedCallerLeavingWhileRedisBooksItsTurnIsAnswered(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	armed := make(chan time.Duration, 4)
	bulkhead.SetRateWaitHook(func(d time.Duration) { armed <- d })
	defer bulkhead.SetRateWaitHook(nil)
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Store: store, Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}}))
	a := mustAcquire(t, b, req("a", 10))
	_ = a.Release(nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var hookErr error
	leave := func() {
		// Redis has booked b's turn, a second away; its caller leaves.
		cancel()
		hookErr = testutil.Poll("the caller's cancel to reach the engine", func() (bool, error) { return callerWaitsAfterCancel(), nil })
	}
	once.Store(&leave)
	res := acquireAsync(ctx, b, req("b", 10))
	var r result
	select {
	case r = <-res: // answered with its verdict
	case d := <-armed:
		clk.Add(d) // parked for its turn: let it come
		select {
		case r = <-res:
		case <-time.After(testutil.Settle):
			t.Fatalf("the caller who left is never answered (drain: %+v)", drainNow(b))
		}
	}
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	wantReason(t, r.err, bulkhead.Aborted)
}

// TestRemoteCheckGoexitTurnsTheCallAway checks that a Redis hook that calls
// runtime.Goexit (t.FailNow in a test's hook, say) during an admission's
// remote check turns the call away and gives its slot back. The facade used
// to give everything back then (its deferred rollback ran on the way out);
// the engine's worker goroutine recovered panics only: on Goexit it ended
// without sending its verdict, so the admission stayed provisional for good,
// holding its slot, its caller was never answered and Drain never
// completed.
func TestRemoteCheckGoexitTurnsTheCallAway(t *testing.T) {
	clk := clock.NewMock()
	store, once := hookedRateStore(t, clk)
	cfg := rateConfig(clk, &bulkhead.RateLimits{Store: store, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	b := newBulkhead(t, cfg)
	exit := func() { runtime.Goexit() }
	once.Store(&exit)
	res := acquireAsync(t.Context(), b, req("a", 10))
	select {
	case r := <-res:
		if r.err == nil {
			_ = r.tok.Release(nil)
			t.Fatal("admitted though its rate check never answered")
		}
	case <-time.After(testutil.Settle):
		t.Fatalf("never answered (drain: %+v)", drainNow(b))
	}
	if st := b.Stats(); st.Gate.InFlight != 0 {
		t.Fatalf("%d slots held after the call was turned away", st.Gate.InFlight)
	}
}

// Pace mode: a turn that comes exactly at the queue timeout is refused
// (it used to leave a queue timeout of 0, which means none).
func TestRatePaceTurnAtQueueTimeout(t *testing.T) {
	clk := clock.NewMock()
	cfg := rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 60, RequestBurst: bulkhead.NoBurst}})
	cfg.QueueTimeout, cfg.MaxConcurrent = time.Second, 1
	b := newBulkhead(t, cfg)
	a := mustAcquire(t, b, req("a", 10))
	defer a.Release(nil)
	_, err := b.Acquire(context.Background(), req("b", 10)) // its turn is 1 s away: no time left for a slot
	wantRate(t, err, time.Second, "model", "gpt-4o", "requests")
}

// Pace mode counts the time a call really waited for its turn.
func TestRatePacedTimeCutShort(t *testing.T) {
	clk := clock.NewMock()
	b := newBulkhead(t, rateConfig(clk, &bulkhead.RateLimits{Pace: true, PerModel: bulkhead.Rate{RequestsPerMinute: 1, RequestBurst: bulkhead.NoBurst}}))
	armed := make(chan time.Duration, 4)
	bulkhead.SetRateWaitHook(func(d time.Duration) { armed <- d })
	defer bulkhead.SetRateWaitHook(nil)
	_ = mustAcquire(t, b, req("a", 1)).Release(nil)
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, b, req("b", 1))
	<-armed
	clk.Add(time.Second)
	cancel()
	wantReason(t, (<-ch).err, bulkhead.Aborted)
	if st := b.Stats().Rate; st.Paced != 1 || st.PacedTime != time.Second {
		t.Fatalf("paced %d for %v; want 1 for the 1 s it waited", st.Paced, st.PacedTime)
	}
}
