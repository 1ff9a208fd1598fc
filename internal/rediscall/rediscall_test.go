package rediscall

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBoundedInline(t *testing.T) {
	v, err, timedOut := Bounded(context.Background(), time.Hour, true, nil, func(ctx context.Context) (int, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("f's context has no deadline")
		}
		return 7, nil
	})
	if v != 7 || err != nil || timedOut {
		t.Fatalf("= %v, %v, %v", v, err, timedOut)
	}
	_, err, timedOut = Bounded(context.Background(), time.Millisecond, true, nil, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || !timedOut {
		t.Fatalf("a call that honours its deadline: %v, %v", err, timedOut)
	}
}

// TestBoundedGoroutine checks that a call that ignores its context is given
// up on at the deadline, with ErrNoAnswer, and counted in wg until it ends.
func TestBoundedGoroutine(t *testing.T) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	_, err, timedOut := Bounded(context.Background(), 5*time.Millisecond, false, &wg, func(context.Context) (int, error) {
		<-release // ignores its context, as a client without ContextTimeoutEnabled does
		return 1, nil
	})
	if err != ErrNoAnswer || !timedOut {
		t.Fatalf("= %v, %v; want ErrNoAnswer", err, timedOut)
	}
	close(release)
	wg.Wait()
	v, err, timedOut := Bounded(context.Background(), time.Hour, false, &wg, func(context.Context) (int, error) { return 2, nil })
	if v != 2 || err != nil || timedOut {
		t.Fatalf("= %v, %v, %v", v, err, timedOut)
	}
	wg.Wait()
}

func TestHonoursDeadline(t *testing.T) {
	for _, tc := range []struct {
		client any
		want   bool
	}{
		{redis.NewClient(&redis.Options{ContextTimeoutEnabled: true}), true},
		{redis.NewClient(&redis.Options{}), false},
		{redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true}), true},
		{redis.NewRing(&redis.RingOptions{ContextTimeoutEnabled: true}), true},
		{struct{}{}, false},
	} {
		if got := HonoursDeadline(tc.client); got != tc.want {
			t.Errorf("HonoursDeadline(%T) = %v", tc.client, got)
		}
		if c, ok := tc.client.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	}
}
