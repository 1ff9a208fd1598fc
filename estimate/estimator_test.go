package estimate_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// userReq returns a request with one user message.
func userReq(model, content string, maxTokens int64) *bulkhead.Request {
	return &bulkhead.Request{
		Model:     model,
		Messages:  []bulkhead.Message{{Role: "user", Content: content}},
		MaxTokens: maxTokens,
	}
}

// testingT is what reserve needs of a *testing.T or a *rapid.T.
type testingT interface {
	Helper()
	Fatal(args ...any)
	Error(args ...any)
}

// reserve computes a reservation the way admission does: through a
// bulkhead with est (the default estimator when nil) and, when override is
// given, through WithReservation on an Acquire that is released at once.
func reserve(t testingT, est bulkhead.Estimator, req *bulkhead.Request, override *bulkhead.Reservation) (bulkhead.Reservation, error) {
	t.Helper()
	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 1, TokenBudget: &bulkhead.TokenBudget{Budget: math.MaxInt64, Estimator: est}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := b.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if override == nil {
		r, err := b.Estimate(req)
		if err != nil {
			return bulkhead.Reservation{}, err
		}
		return *r, nil
	}
	p, err := b.Acquire(context.Background(), req, bulkhead.WithReservation(*override))
	if err != nil {
		return bulkhead.Reservation{}, err
	}
	defer p.Release(nil)
	return *p.Reservation(), nil
}

func res(input, maxOutput int64) bulkhead.Reservation {
	return bulkhead.Reservation{Input: input, MaxOutput: maxOutput, Reserved: input + maxOutput}
}

// wantConfigError checks that err is an *bulkhead.ConfigError for field.
func wantConfigError(t *testing.T, err error, field string) {
	t.Helper()
	var ce *bulkhead.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v (%T), want *bulkhead.ConfigError for %s", err, err, field)
	}
	if ce.Field != field {
		t.Errorf("ConfigError.Field = %q, want %q (%v)", ce.Field, field, err)
	}
	if !errors.Is(err, bulkhead.ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
}

// wantEstimatorError checks that err is an *bulkhead.EstimatorError whose
// problem mentions substr.
func wantEstimatorError(t *testing.T, err error, substr string) *bulkhead.EstimatorError {
	t.Helper()
	var ee *bulkhead.EstimatorError
	if !errors.As(err, &ee) {
		t.Fatalf("err = %v (%T), want *bulkhead.EstimatorError", err, err)
	}
	if !strings.Contains(ee.Problem, substr) {
		t.Errorf("Problem = %q, want it to mention %q", ee.Problem, substr)
	}
	if !errors.Is(err, bulkhead.ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
	return ee
}

func TestNaive(t *testing.T) {
	tests := []struct {
		name string
		req  *bulkhead.Request
		want bulkhead.Reservation
	}{
		{"spec check: abcd", userReq("", "abcd", 0), res(1, 2048)},
		{"empty", &bulkhead.Request{}, res(0, 2048)},
		{"rounds up", userReq("", "abcde", 0), res(2, 2048)},
		{"max tokens", userReq("", "abcd", 100), res(1, 100)},
		{"extra input", &bulkhead.Request{System: "abcdefgh", ExtraInputTokens: 10}, res(12, 2048)},
		{"ignores model", userReq("gpt-4o", strings.Repeat("x", 37), 0), res(10, 2048)},
		{"utf-16 units", userReq("", "😀😀", 0), res(1, 2048)},
		{"opaque blocks free", &bulkhead.Request{Messages: []bulkhead.Message{{Blocks: []bulkhead.Block{{Type: "image"}}}}}, res(0, 2048)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := estimate.Naive{}.Estimate(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestValidateRequest(t *testing.T) {
	tests := []struct {
		name  string
		req   *bulkhead.Request
		field string // "" = valid
	}{
		{"valid", &bulkhead.Request{}, ""},
		{"valid with values", &bulkhead.Request{MaxTokens: 5, ExtraInputTokens: 7}, ""},
		{"nil", nil, "Request"},
		{"negative max tokens", &bulkhead.Request{MaxTokens: -1}, "Request.MaxTokens"},
		{"negative extra input", &bulkhead.Request{ExtraInputTokens: -1}, "Request.ExtraInputTokens"},
		{"both negative: max tokens first", &bulkhead.Request{MaxTokens: -1, ExtraInputTokens: -1}, "Request.MaxTokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			wantConfigError(t, err, tt.field)
			// Every built-in estimator and Reserve validate the same way.
			ma, _ := estimate.NewModelAware(estimate.ModelAwareOptions{})
			ad, _ := estimate.NewAdaptive(estimate.AdaptiveOptions{})
			for _, est := range []bulkhead.Estimator{estimate.Naive{}, ma, ad} {
				_, err := est.Estimate(tt.req)
				wantConfigError(t, err, tt.field)
				_, err = reserve(t, est, tt.req, nil)
				wantConfigError(t, err, tt.field)
				_, err = reserve(t, est, tt.req, &bulkhead.Reservation{})
				wantConfigError(t, err, tt.field)
			}
		})
	}
}

func TestReserveOverride(t *testing.T) {
	calls := 0
	est := estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
		calls++
		return res(1, 1), nil
	})
	tests := []struct {
		name     string
		override bulkhead.Reservation
		want     bulkhead.Reservation
		field    string
	}{
		{"reserved filled in", bulkhead.Reservation{Input: 10, MaxOutput: 100}, res(10, 100), ""},
		{"reserved matching", res(10, 100), res(10, 100), ""},
		{"zero", bulkhead.Reservation{}, res(0, 0), ""},
		{"input only", bulkhead.Reservation{Input: 7}, res(7, 0), ""},
		{"reserved mismatch", bulkhead.Reservation{Input: 10, MaxOutput: 100, Reserved: 111}, bulkhead.Reservation{}, "Reservation.Reserved"},
		{"reserved without fields", bulkhead.Reservation{Reserved: 5}, bulkhead.Reservation{}, "Reservation.Reserved"},
		{"negative input", bulkhead.Reservation{Input: -1}, bulkhead.Reservation{}, "Reservation.Input"},
		{"negative output", bulkhead.Reservation{MaxOutput: -1}, bulkhead.Reservation{}, "Reservation.MaxOutput"},
		{"negative reserved", bulkhead.Reservation{Reserved: -1}, bulkhead.Reservation{}, "Reservation.Reserved"},
		{"overflow", bulkhead.Reservation{Input: math.MaxInt64, MaxOutput: 1}, bulkhead.Reservation{}, "Reservation"},
		{"max without overflow", bulkhead.Reservation{Input: math.MaxInt64 - 1, MaxOutput: 1}, res(math.MaxInt64-1, 1), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls = 0
			o := tt.override
			got, err := reserve(t, est, userReq("", "abcd", 0), &o)
			if calls != 0 {
				t.Errorf("estimator called %d times with an override", calls)
			}
			if o != tt.override {
				t.Errorf("override modified: %+v", o)
			}
			if tt.field != "" {
				wantConfigError(t, err, tt.field)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	// The estimator may even be nil when an override is given.
	if got, err := reserve(t, nil, &bulkhead.Request{}, &bulkhead.Reservation{Input: 1}); err != nil || got != res(1, 0) {
		t.Errorf("Reserve(nil estimator, override) = %+v, %v", got, err)
	}
}

func TestReserveEstimatorOutput(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name    string
		est     bulkhead.Estimator
		want    bulkhead.Reservation
		problem string // "" = valid; else an *bulkhead.EstimatorError mentioning it
		field   string // an *bulkhead.ConfigError for this field
	}{
		{"reserved filled in", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{Input: 3, MaxOutput: 4}, nil
		}), res(3, 4), "", ""},
		{"reserved kept", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) { return res(3, 4), nil }), res(3, 4), "", ""},
		{"zero", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) { return bulkhead.Reservation{}, nil }), res(0, 0), "", ""},
		{"negative input", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{Input: -1}, nil
		}), bulkhead.Reservation{}, "Input must be >= 0", ""},
		{"negative output", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{MaxOutput: -5}, nil
		}), bulkhead.Reservation{}, "MaxOutput must be >= 0", ""},
		{"negative reserved", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{Reserved: -5}, nil
		}), bulkhead.Reservation{}, "Reserved must be >= 0", ""},
		{"wrong reserved", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{Input: 1, MaxOutput: 1, Reserved: 3}, nil
		}), bulkhead.Reservation{}, "Reserved must be 0 or Input + MaxOutput", ""},
		{"overflow", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{Input: math.MaxInt64, MaxOutput: math.MaxInt64}, nil
		}), bulkhead.Reservation{}, "overflows", ""},
		{"plain error wrapped", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{}, errBoom
		}), bulkhead.Reservation{}, "estimator failed: boom", ""},
		{"invalid-input error passed through", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			return bulkhead.Reservation{}, &bulkhead.ConfigError{Field: "Request.Model", Problem: "unsupported"}
		}), bulkhead.Reservation{}, "", "Request.Model"},
		{"panic recovered", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			panic("ka-pow")
		}), bulkhead.Reservation{}, "estimator panicked: ka-pow", ""},
		{"panic with error", estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			panic(errBoom)
		}), bulkhead.Reservation{}, "estimator panicked: boom", ""},
		{"nil func panics", estimate.Func(nil), bulkhead.Reservation{}, "estimator panicked", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := reserve(t, tt.est, userReq("", "abcd", 0), nil)
			switch {
			case tt.field != "":
				wantConfigError(t, err, tt.field)
			case tt.problem != "":
				ee := wantEstimatorError(t, err, tt.problem)
				if strings.Contains(tt.name, "panic") && ee.Panic == nil {
					t.Error("Panic not recorded")
				}
				if strings.Contains(tt.name, "panic") && len(ee.Stack) == 0 {
					t.Error("Stack not recorded")
				}
				if strings.Contains(tt.problem, "boom") {
					if !errors.Is(err, errBoom) {
						t.Errorf("errors.Is(err, errBoom) = false for %v", err)
					}
				}
				if got != (bulkhead.Reservation{}) {
					t.Errorf("got %+v alongside an error", got)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if got != tt.want {
					t.Errorf("got %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

func TestReserveCallsEstimatorOnce(t *testing.T) {
	calls := 0
	est := estimate.Func(func(req *bulkhead.Request) (bulkhead.Reservation, error) {
		calls++
		return estimate.Naive{}.Estimate(req)
	})
	if _, err := reserve(t, est, userReq("", "abcd", 0), nil); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("estimator called %d times, want 1", calls)
	}
}

func TestEstimateRoundTripsAsOverride(t *testing.T) {
	ma, err := estimate.NewModelAware(estimate.ModelAwareOptions{DefaultModel: "gpt-4o"})
	if err != nil {
		t.Fatal(err)
	}
	ad, err := estimate.NewAdaptive(estimate.AdaptiveOptions{Base: estimate.ModelAwareOptions{DefaultModel: "gpt-4o"}, MinSamples: 1})
	if err != nil {
		t.Fatal(err)
	}
	req := userReq("", strings.Repeat("x", 37), 100)
	if err := ad.Observe(req, bulkhead.Usage{Input: 13}); err != nil {
		t.Fatal(err)
	}
	for _, est := range []bulkhead.Estimator{estimate.Naive{}, ma, ad} {
		r, err := reserve(t, est, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		again, err := reserve(t, est, req, &r)
		if err != nil {
			t.Fatal(err)
		}
		if again != r {
			t.Errorf("%T: round trip %+v -> %+v", est, r, again)
		}
		// The estimator's own result round-trips too.
		direct, err := est.Estimate(req)
		if err != nil {
			t.Fatal(err)
		}
		if direct != r {
			t.Errorf("%T: Estimate %+v != Reserve %+v", est, direct, r)
		}
	}
}

func TestEstimatorErrorMessage(t *testing.T) {
	_, err := reserve(t, estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
		return bulkhead.Reservation{Input: -1}, nil
	}), &bulkhead.Request{}, nil)
	if got, want := err.Error(), "bulkhead: invalid estimate: Input must be >= 0, got -1"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestBuiltinOverflow(t *testing.T) {
	ma, _ := estimate.NewModelAware(estimate.ModelAwareOptions{})
	huge := &bulkhead.Request{System: "abcd", ExtraInputTokens: math.MaxInt64}
	for _, est := range []bulkhead.Estimator{estimate.Naive{}, ma} {
		_, err := est.Estimate(huge)
		wantEstimatorError(t, err, "overflows")
		_, err = reserve(t, est, huge, nil)
		wantEstimatorError(t, err, "overflows")
	}
	// Input fits but Input + MaxOutput does not.
	sum := &bulkhead.Request{ExtraInputTokens: math.MaxInt64, MaxTokens: 1}
	_, err := estimate.Naive{}.Estimate(sum)
	wantEstimatorError(t, err, "overflows")
	// The largest sum that fits is fine.
	edge := &bulkhead.Request{ExtraInputTokens: math.MaxInt64 - 1, MaxTokens: 1}
	if got, err := (estimate.Naive{}).Estimate(edge); err != nil || got != res(math.MaxInt64-1, 1) {
		t.Errorf("edge = %+v, %v", got, err)
	}
}
