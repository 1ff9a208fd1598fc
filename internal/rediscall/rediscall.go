// Package rediscall bounds the time a Redis command may take, whatever the
// client's own options: the part the pacer's and the fleet's Redis stores
// share.
package rediscall

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoAnswer is the error when the caller stops waiting for a client that
// does not give up at its context's deadline.
var ErrNoAnswer = errors.New("redis did not answer")

// Bounded runs f with a context that ends after timeout. When inline is
// true, f honours its context's deadline itself (see HonoursDeadline) and
// runs on the caller's goroutine; otherwise it runs on a goroutine of its
// own, counted in wg when wg is not nil, and Bounded stops waiting for it at
// the deadline, returning ErrNoAnswer. It also reports whether the bounded
// context had ended, or its deadline passed, by the time f returned (a
// client that sets its socket deadlines from the context can fail a moment
// before the context itself reports the deadline).
func Bounded[T any](ctx context.Context, timeout time.Duration, inline bool, wg *sync.WaitGroup, f func(context.Context) (T, error)) (v T, err error, timedOut bool) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ended := func() bool {
		if rctx.Err() != nil {
			return true
		}
		dl, _ := rctx.Deadline()
		return !time.Now().Before(dl)
	}
	if inline {
		v, err = f(rctx)
		return v, err, ended()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		if wg != nil {
			defer wg.Done()
		}
		v, err := f(rctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err, ended()
	case <-rctx.Done():
		return v, ErrNoAnswer, true
	}
}

// HonoursDeadline reports whether client gives up a command at its
// context's deadline, on the socket as well as when dialing: go-redis does
// only with ContextTimeoutEnabled.
func HonoursDeadline(client any) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}
