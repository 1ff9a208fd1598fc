package pacer

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// wantInvalid checks that err is a *ConfigError for field.
func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if !errors.Is(err, admission.ErrInvalid) {
		t.Fatalf("error %v does not match ErrInvalid", err)
	}
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != field {
		t.Fatalf("error %v: want a ConfigError for field %q", err, field)
	}
}

func TestNewValidation(t *testing.T) {
	store := NewLocal(LocalOptions{})
	nan, inf := math.NaN(), math.Inf(1)
	for _, c := range []struct {
		name  string
		opts  Options
		field string
	}{
		{"no name", Options{QPS: 1}, "Options.Name"},
		{"brace in name", Options{Name: "a{b}", QPS: 1}, "Options.Name"},
		{"qps 0", Options{Name: "p", QPS: 0}, "Options.QPS"},
		{"qps < 0", Options{Name: "p", QPS: -1}, "Options.QPS"},
		{"qps NaN", Options{Name: "p", QPS: nan}, "Options.QPS"},
		{"qps Inf", Options{Name: "p", QPS: inf}, "Options.QPS"},
		{"qps above MaxQPS", Options{Name: "p", QPS: 2e6}, "Options.QPS"},
		{"burst < 0", Options{Name: "p", QPS: 1, MaxBurst: -1}, "Options.MaxBurst"},
		{"burst NaN", Options{Name: "p", QPS: 1, MaxBurst: nan}, "Options.MaxBurst"},
		{"burst Inf", Options{Name: "p", QPS: 1, MaxBurst: inf}, "Options.MaxBurst"},
		{"factor < 0", Options{Name: "p", QPS: 1, MaxBurst: 1, BurstFactor: -0.5}, "Options.BurstFactor"},
		{"factor NaN", Options{Name: "p", QPS: 1, MaxBurst: 1, BurstFactor: nan}, "Options.BurstFactor"},
		{"factor Inf", Options{Name: "p", QPS: 1, MaxBurst: 1, BurstFactor: inf}, "Options.BurstFactor"},
		{"factor > 1", Options{Name: "p", QPS: 1, MaxBurst: 1, BurstFactor: 1.5}, "Options.BurstFactor"},
		{"max delay < 0", Options{Name: "p", QPS: 1, MaxDelay: -time.Second}, "Options.MaxDelay"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := New(store, c.opts)
			if p != nil {
				t.Fatal("New returned a pacer with an error")
			}
			wantInvalid(t, err, c.field)
		})
	}
	_, err := New(nil, Options{Name: "p", QPS: 1})
	wantInvalid(t, err, "store")
}

func TestNewRedisValidation(t *testing.T) {
	_, err := NewRedis(nil, RedisOptions{})
	wantInvalid(t, err, "client")
	client := newClient(t, "127.0.0.1:1") // never dialled
	_, err = NewRedis(client, RedisOptions{Prefix: "a{"})
	wantInvalid(t, err, "RedisOptions.Prefix")
	_, err = NewRedis(client, RedisOptions{OnFailure: FailClosed + 1})
	wantInvalid(t, err, "RedisOptions.OnFailure")
	_, err = NewRedis(client, RedisOptions{FailureDelay: -1})
	wantInvalid(t, err, "RedisOptions.FailureDelay")
	_, err = NewRedis(client, RedisOptions{Timeout: -1})
	wantInvalid(t, err, "RedisOptions.Timeout")
	if s, err := NewRedis(client, RedisOptions{}); err != nil || s.timeout != DefaultTimeout {
		t.Fatalf("default timeout: %v, %v", s.timeout, err)
	}
}

// TestCallValidation checks that bad weights and keys are errors that write
// nothing, on both stores. (Upstream wrote a key it could never use again,
// with an infinite next slot and no TTL, on qps 0; here qps 0 cannot even
// make a pacer.)
func TestCallValidation(t *testing.T) {
	srv, client := startRedis(t)
	local := NewLocal(LocalOptions{})
	remote := newRedisStore(t, client, RedisOptions{})
	for _, store := range []Store{local, remote} {
		p := mustNew(t, store, Options{Name: "p", QPS: 10, MaxBurst: 2})
		q := mustNew(t, store, Options{Name: "q", QPS: 1})
		comp, err := NewComposite(p, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			key    string
			weight float64
			field  string
		}{
			{"k", -1, "weight"},
			{"k", math.NaN(), "weight"},
			{"k", math.Inf(1), "weight"},
			{"k", 1e9 + 1, "weight"}, // books more than the horizon at 10 QPS
			{"k", 1e-7, "weight"},    // books less than half a microsecond
			{"", 1, "key"},
			{"a}", 1, "key"},
			{"{a", 1, "key"},
		} {
			_, err := p.Pace(bg, c.key, c.weight)
			wantInvalid(t, err, c.field)
			_, err = p.PaceWait(bg, c.key, c.weight)
			wantInvalid(t, err, c.field)
			_, err = p.RateLimit(bg, c.key, c.weight)
			wantInvalid(t, err, c.field)
			if c.field == "weight" {
				c.field = "weights"
			}
			_, err = comp.RateLimit(bg, c.key, c.weight)
			wantInvalid(t, err, c.field)
			_, err = comp.Pace(bg, c.key, 1, c.weight)
			wantInvalid(t, err, c.field)
		}
		_, err = comp.Pace(bg, "k", 1, 2, 3)
		wantInvalid(t, err, "weights")
	}
	if local.Len() != 0 {
		t.Errorf("local store holds %d keys after invalid calls", local.Len())
	}
	if n, err := srv.Do("DBSIZE"); err != nil || n != "0" {
		t.Errorf("redis DBSIZE %q, %v after invalid calls; want 0", n, err)
	}
}

func TestCompositeValidation(t *testing.T) {
	a, b := NewLocal(LocalOptions{}), NewLocal(LocalOptions{})
	p1 := mustNew(t, a, Options{Name: "x", QPS: 1})
	p2 := mustNew(t, a, Options{Name: "x", QPS: 2})
	p3 := mustNew(t, b, Options{Name: "y", QPS: 1})
	_, err := NewComposite(p1, p2)
	wantInvalid(t, err, "members")
	_, err = NewComposite(p1, p3)
	wantInvalid(t, err, "members")
	_, err = NewComposite(p1, nil)
	wantInvalid(t, err, "members")
}

// TestCancelledContext checks that a call whose context is already done
// fails with the context's cause and records nothing.
var errBecause = errors.New("because")

func TestCancelledContext(t *testing.T) {
	l := NewLocal(LocalOptions{})
	p := mustNew(t, l, Options{Name: "p", QPS: 1})
	comp, _ := NewComposite(p)
	ctx, cancel := context.WithCancelCause(bg)
	cancel(errBecause)
	if _, err := p.Pace(ctx, "k", 1); !errors.Is(err, errBecause) {
		t.Errorf("Pace: %v", err)
	}
	if _, err := p.PaceWait(ctx, "k", 1); !errors.Is(err, errBecause) {
		t.Errorf("PaceWait: %v", err)
	}
	if _, err := p.RateLimit(ctx, "k", 1); !errors.Is(err, errBecause) {
		t.Errorf("RateLimit: %v", err)
	}
	if _, err := comp.RateLimit(ctx, "k"); !errors.Is(err, errBecause) {
		t.Errorf("Composite.RateLimit: %v", err)
	}
	if l.Len() != 0 {
		t.Error("a cancelled call was recorded")
	}
}
