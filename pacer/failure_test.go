package pacer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

// TestRedisFailurePolicies stops the Redis server in the middle of the test
// and checks what each failure policy returns, then restarts it and checks
// that decisions resume.
func TestRedisFailurePolicies(t *testing.T) {
	srv, client := startRedis(t)
	prefix := uniquePrefix(t)
	type setup struct {
		p    *Pacer
		comp *Composite
	}
	mk := func(policy FailurePolicy) setup {
		s := newRedisStore(t, client, RedisOptions{Prefix: prefix, OnFailure: policy, FailureDelay: 250 * time.Millisecond})
		p := mustNew(t, s, Options{Name: "rpm", QPS: 10})
		q := mustNew(t, s, Options{Name: "tpm", QPS: 1000})
		comp, err := NewComposite(p, q)
		if err != nil {
			t.Fatal(err)
		}
		return setup{p, comp}
	}
	failErr, failOpen, failClosed := mk(FailError), mk(FailOpen), mk(FailClosed)
	for _, s := range []setup{failErr, failOpen, failClosed} {
		if _, err := s.p.RateLimit(bg, "up", 1); err != nil {
			t.Fatalf("Redis up: %v", err)
		}
	}

	srv.Stop()

	unavailableErr := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: error %v, want ErrUnavailable", what, err)
		}
		var opErr *net.OpError
		if !errors.As(err, &opErr) {
			t.Errorf("%s: error %v does not wrap the network error", what, err)
		}
	}
	fallback := func(what string, out Outcome, err error, want time.Duration) {
		t.Helper()
		if err != nil || out.Delay != want || !errors.Is(out.Fallback, ErrUnavailable) {
			t.Fatalf("%s: %+v, %v; want delay %v and a Fallback", what, out, err, want)
		}
		if !strings.HasPrefix(out.Reason(), "store failed") {
			t.Errorf("%s: reason %q", what, out.Reason())
		}
	}

	// FailError: every call returns the error.
	_, err := failErr.p.Pace(bg, "k", 1)
	unavailableErr("FailError Pace", err)
	_, err = failErr.p.PaceWait(bg, "k", 1)
	unavailableErr("FailError PaceWait", err)
	_, err = failErr.p.RateLimit(bg, "k", 1)
	unavailableErr("FailError RateLimit", err)
	cout, err := failErr.comp.RateLimit(bg, "k", 1, 100)
	unavailableErr("FailError composite", err)
	if cout.Fallback != nil {
		t.Error("FailError set a Fallback")
	}

	// FailOpen: every call goes.
	out, err := failOpen.p.Pace(bg, "k", 1)
	fallback("FailOpen Pace", out, err, 0)
	out, err = failOpen.p.PaceWait(bg, "k", 1)
	fallback("FailOpen PaceWait", out, err, 0)
	out, err = failOpen.p.RateLimit(bg, "k", 1)
	fallback("FailOpen RateLimit", out, err, 0)
	cout, err = failOpen.comp.RateLimit(bg, "k", 1, 100)
	fallback("FailOpen composite", cout.Outcome, err, 0)
	if cout.Pacer != nil {
		t.Error("FailOpen composite names a pacer")
	}

	// FailClosed: RateLimit rejects with the failure delay; Pace fails.
	out, err = failClosed.p.RateLimit(bg, "k", 1)
	fallback("FailClosed RateLimit", out, err, 250*time.Millisecond)
	cout, err = failClosed.comp.RateLimit(bg, "k", 1, 100)
	fallback("FailClosed composite", cout.Outcome, err, 250*time.Millisecond)
	if cout.Pacer != nil || !strings.HasPrefix(cout.Reason(), "store failed") {
		t.Errorf("FailClosed composite: %+v %q", cout, cout.Reason())
	}
	_, err = failClosed.p.Pace(bg, "k", 1)
	unavailableErr("FailClosed Pace", err)
	_, err = failClosed.p.PaceWait(bg, "k", 1)
	unavailableErr("FailClosed PaceWait", err)
	_, err = failClosed.comp.Pace(bg, "k", 1, 100)
	unavailableErr("FailClosed composite Pace", err)

	// A cancelled context is the caller's doing, not an outage: no policy.
	ctx, cancel := contextCancelled()
	defer cancel()
	if _, err := failOpen.p.RateLimit(ctx, "k", 1); err == nil || errors.Is(err, ErrUnavailable) {
		t.Fatalf("cancelled call under FailOpen: %v", err)
	}

	srv.Restart()
	for _, s := range []setup{failErr, failOpen, failClosed} {
		out, err := s.p.RateLimit(bg, "k", 1)
		if err != nil || out.Fallback != nil {
			t.Fatalf("after restart: %+v, %v", out, err)
		}
	}
}

// TestRedisTimeout pauses the Redis server (CLIENT PAUSE), longer than the
// store's timeout and shorter than the client's read timeout, and checks
// that every call gets its policy's answer at about the store's timeout,
// with the client honouring context deadlines or not, and that only the
// caller's own context ending first is an error.
// (Redis blocks the CLIENT UNPAUSE of another connection too, so the pause
// is short and ends by itself.)
func TestRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	const bound = 50 * time.Millisecond
	for _, ctxTimeout := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{
				Addr:                  srv.Addr(),
				ReadTimeout:           5 * time.Second,
				WriteTimeout:          5 * time.Second,
				ContextTimeoutEnabled: ctxTimeout,
			})
			t.Cleanup(func() { client.Close() })
			prefix := uniquePrefix(t)
			mk := func(policy FailurePolicy) *Pacer {
				s := newRedisStore(t, client, RedisOptions{Prefix: prefix, OnFailure: policy, Timeout: bound, FailureDelay: 250 * time.Millisecond})
				if s.inline != ctxTimeout {
					t.Fatalf("inline = %v", s.inline)
				}
				return mustNew(t, s, Options{Name: "rpm", QPS: 10})
			}
			failErr, failOpen, failClosed := mk(FailError), mk(FailOpen), mk(FailClosed)
			if _, err := failOpen.RateLimit(bg, "k", 1); err != nil {
				t.Fatal(err)
			}

			// The pause ends by itself (CLIENT UNPAUSE would wait for it
			// too): the last call below waits for it.
			const pause = time.Second
			if _, err := srv.Do("CLIENT", "PAUSE", strconv.Itoa(int(pause/time.Millisecond)), "ALL"); err != nil {
				t.Fatal(err)
			}

			// timed runs f and checks that it answered no sooner than the
			// store's bound and well before the pause ends.
			timed := func(what string, f func()) {
				t.Helper()
				start := time.Now()
				f()
				if d := time.Since(start); d < bound || d > pause/2 {
					t.Errorf("%s took %v, want about %v", what, d, bound)
				}
			}
			// A caller deadline longer than the bound but shorter than the
			// client's timeouts: the policy decides.
			ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
			defer cancel()
			timed("FailOpen", func() {
				out, err := failOpen.RateLimit(ctx, "k", 1)
				if err != nil || out.Delay != 0 || !errors.Is(out.Fallback, ErrUnavailable) ||
					!strings.Contains(out.Fallback.Error(), "did not answer within 50ms") {
					t.Errorf("FailOpen: %+v, %v", out, err)
				}
			})
			timed("FailClosed", func() {
				out, err := failClosed.RateLimit(ctx, "k", 1)
				if err != nil || out.Delay != 250*time.Millisecond || !errors.Is(out.Fallback, ErrUnavailable) {
					t.Errorf("FailClosed: %+v, %v", out, err)
				}
			})
			timed("FailError", func() {
				_, err := failErr.Pace(ctx, "k", 1)
				if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("FailError: %v", err)
				}
			})
			// A caller whose context ends before the bound: its own error,
			// no policy.
			short, cancelShort := context.WithTimeout(bg, 5*time.Millisecond)
			defer cancelShort()
			out, err := failOpen.RateLimit(short, "k", 1)
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) || out.Fallback != nil {
				t.Errorf("short caller deadline: %+v, %v", out, err)
			}
			// A patient caller, and a store that waits: the call is decided
			// when the pause ends.
			patient := newRedisStore(t, client, RedisOptions{Prefix: prefix, Timeout: 5 * time.Second})
			out, err = mustNew(t, patient, Options{Name: "rpm", QPS: 10}).RateLimit(bg, "k2", 1)
			if err != nil || out.Fallback != nil {
				t.Errorf("after UNPAUSE: %+v, %v", out, err)
			}
		})
	}
}

// TestRedisTimeoutKilled stops the server and checks that with a client at
// go-redis's default dial retries (five attempts 100 ms apart) a call still
// gets its policy's answer within about the store's timeout (50 ms by
// default).
func TestRedisTimeoutKilled(t *testing.T) {
	srv := redistest.Start(t)
	for _, ctxTimeout := range []bool{false, true} {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: ctxTimeout})
		defer client.Close()
		s := newRedisStore(t, client, RedisOptions{OnFailure: FailClosed, Timeout: DefaultTimeout})
		p := mustNew(t, s, Options{Name: "rpm", QPS: 10})
		if _, err := p.RateLimit(bg, "k", 1); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		for i := 0; i < 3; i++ {
			start := time.Now()
			out, err := p.RateLimit(bg, "k", 1)
			// Without the store's bound, the dial retries alone take 400 ms.
			if d := time.Since(start); d > 300*time.Millisecond {
				t.Errorf("ContextTimeoutEnabled=%v: call %d took %v", ctxTimeout, i, d)
			}
			if err != nil || out.Delay != DefaultFailureDelay || !errors.Is(out.Fallback, ErrUnavailable) {
				t.Errorf("ContextTimeoutEnabled=%v: %+v, %v", ctxTimeout, out, err)
			}
		}
		srv.Restart()
	}
}
