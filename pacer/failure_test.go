package pacer

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"
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
