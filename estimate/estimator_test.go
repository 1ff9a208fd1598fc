package estimate_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/admission"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// userReq returns a request with one user message.
func userReq(model, content string, maxTokens int64) *admission.Request {
	return &admission.Request{
		Model:     model,
		Messages:  []admission.Message{{Role: "user", Content: content}},
		MaxTokens: maxTokens,
	}
}

func res(input, maxOutput int64) admission.Reservation {
	return admission.Reservation{Input: input, MaxOutput: maxOutput, Reserved: input + maxOutput}
}

// wantConfigError checks that err is an *admission.ConfigError for field.
func wantConfigError(t *testing.T, err error, field string) {
	t.Helper()
	var ce *admission.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v (%T), want *admission.ConfigError for %s", err, err, field)
	}
	if ce.Field != field {
		t.Errorf("ConfigError.Field = %q, want %q (%v)", ce.Field, field, err)
	}
	if !errors.Is(err, admission.ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
}

// wantEstimatorError checks that err is an *estimate.EstimatorError whose
// problem mentions substr.
func wantEstimatorError(t *testing.T, err error, substr string) *estimate.EstimatorError {
	t.Helper()
	var ee *estimate.EstimatorError
	if !errors.As(err, &ee) {
		t.Fatalf("err = %v (%T), want *estimate.EstimatorError", err, err)
	}
	if !strings.Contains(ee.Problem, substr) {
		t.Errorf("Problem = %q, want it to mention %q", ee.Problem, substr)
	}
	if !errors.Is(err, admission.ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
	return ee
}

func TestNaive(t *testing.T) {
	tests := []struct {
		name string
		req  *admission.Request
		want admission.Reservation
	}{
		{"spec check: abcd", userReq("", "abcd", 0), res(1, 2048)},
		{"empty", &admission.Request{}, res(0, 2048)},
		{"rounds up", userReq("", "abcde", 0), res(2, 2048)},
		{"max tokens", userReq("", "abcd", 100), res(1, 100)},
		{"extra input", &admission.Request{System: "abcdefgh", ExtraInputTokens: 10}, res(12, 2048)},
		{"ignores model", userReq("gpt-4o", strings.Repeat("x", 37), 0), res(10, 2048)},
		{"utf-16 units", userReq("", "😀😀", 0), res(1, 2048)},
		{"opaque blocks free", &admission.Request{Messages: []admission.Message{{Blocks: []admission.Block{{Type: "image"}}}}}, res(0, 2048)},
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
		req   *admission.Request
		field string // "" = valid
	}{
		{"valid", &admission.Request{}, ""},
		{"valid with values", &admission.Request{MaxTokens: 5, ExtraInputTokens: 7}, ""},
		{"nil", nil, "Request"},
		{"negative max tokens", &admission.Request{MaxTokens: -1}, "Request.MaxTokens"},
		{"negative extra input", &admission.Request{ExtraInputTokens: -1}, "Request.ExtraInputTokens"},
		{"both negative: max tokens first", &admission.Request{MaxTokens: -1, ExtraInputTokens: -1}, "Request.MaxTokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := estimate.ValidateRequest(tt.req)
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
			for _, est := range []estimate.Estimator{estimate.Naive{}, ma, ad} {
				_, err := est.Estimate(tt.req)
				wantConfigError(t, err, tt.field)
				_, err = estimate.Reserve(est, tt.req, nil)
				wantConfigError(t, err, tt.field)
				_, err = estimate.Reserve(est, tt.req, &admission.Reservation{})
				wantConfigError(t, err, tt.field)
			}
		})
	}
}

func TestReserveOverride(t *testing.T) {
	calls := 0
	est := estimate.Func(func(*admission.Request) (admission.Reservation, error) {
		calls++
		return res(1, 1), nil
	})
	tests := []struct {
		name     string
		override admission.Reservation
		want     admission.Reservation
		field    string
	}{
		{"reserved filled in", admission.Reservation{Input: 10, MaxOutput: 100}, res(10, 100), ""},
		{"reserved matching", res(10, 100), res(10, 100), ""},
		{"zero", admission.Reservation{}, res(0, 0), ""},
		{"input only", admission.Reservation{Input: 7}, res(7, 0), ""},
		{"reserved mismatch", admission.Reservation{Input: 10, MaxOutput: 100, Reserved: 111}, admission.Reservation{}, "Reservation.Reserved"},
		{"reserved without fields", admission.Reservation{Reserved: 5}, admission.Reservation{}, "Reservation.Reserved"},
		{"negative input", admission.Reservation{Input: -1}, admission.Reservation{}, "Reservation.Input"},
		{"negative output", admission.Reservation{MaxOutput: -1}, admission.Reservation{}, "Reservation.MaxOutput"},
		{"negative reserved", admission.Reservation{Reserved: -1}, admission.Reservation{}, "Reservation.Reserved"},
		{"overflow", admission.Reservation{Input: math.MaxInt64, MaxOutput: 1}, admission.Reservation{}, "Reservation"},
		{"max without overflow", admission.Reservation{Input: math.MaxInt64 - 1, MaxOutput: 1}, res(math.MaxInt64-1, 1), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls = 0
			o := tt.override
			got, err := estimate.Reserve(est, userReq("", "abcd", 0), &o)
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
	if got, err := estimate.Reserve(nil, &admission.Request{}, &admission.Reservation{Input: 1}); err != nil || got != res(1, 0) {
		t.Errorf("Reserve(nil estimator, override) = %+v, %v", got, err)
	}
}

func TestReserveEstimatorOutput(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name    string
		est     estimate.Estimator
		want    admission.Reservation
		problem string // "" = valid; else an *EstimatorError mentioning it
		field   string // an *admission.ConfigError for this field
	}{
		{"reserved filled in", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{Input: 3, MaxOutput: 4}, nil
		}), res(3, 4), "", ""},
		{"reserved kept", estimate.Func(func(*admission.Request) (admission.Reservation, error) { return res(3, 4), nil }), res(3, 4), "", ""},
		{"zero", estimate.Func(func(*admission.Request) (admission.Reservation, error) { return admission.Reservation{}, nil }), res(0, 0), "", ""},
		{"negative input", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{Input: -1}, nil
		}), admission.Reservation{}, "Input must be >= 0", ""},
		{"negative output", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{MaxOutput: -5}, nil
		}), admission.Reservation{}, "MaxOutput must be >= 0", ""},
		{"negative reserved", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{Reserved: -5}, nil
		}), admission.Reservation{}, "Reserved must be >= 0", ""},
		{"wrong reserved", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{Input: 1, MaxOutput: 1, Reserved: 3}, nil
		}), admission.Reservation{}, "Reserved must be 0 or Input + MaxOutput", ""},
		{"overflow", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{Input: math.MaxInt64, MaxOutput: math.MaxInt64}, nil
		}), admission.Reservation{}, "overflows", ""},
		{"plain error wrapped", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{}, errBoom
		}), admission.Reservation{}, "estimator failed: boom", ""},
		{"invalid-input error passed through", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			return admission.Reservation{}, admission.Invalidf("Request.Model", "unsupported")
		}), admission.Reservation{}, "", "Request.Model"},
		{"panic recovered", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			panic("ka-pow")
		}), admission.Reservation{}, "estimator panicked: ka-pow", ""},
		{"panic with error", estimate.Func(func(*admission.Request) (admission.Reservation, error) {
			panic(errBoom)
		}), admission.Reservation{}, "estimator panicked: boom", ""},
		{"nil func panics", estimate.Func(nil), admission.Reservation{}, "estimator panicked", ""},
		{"nil estimator", nil, admission.Reservation{}, "", "Estimator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := estimate.Reserve(tt.est, userReq("", "abcd", 0), nil)
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
				if got != (admission.Reservation{}) {
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
	est := estimate.Func(func(req *admission.Request) (admission.Reservation, error) {
		calls++
		return estimate.Naive{}.Estimate(req)
	})
	if _, err := estimate.Reserve(est, userReq("", "abcd", 0), nil); err != nil {
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
	if err := ad.Observe(req, admission.Usage{Input: 13}); err != nil {
		t.Fatal(err)
	}
	for _, est := range []estimate.Estimator{estimate.Naive{}, ma, ad} {
		r, err := estimate.Reserve(est, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		again, err := estimate.Reserve(est, req, &r)
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
	_, err := estimate.Reserve(estimate.Func(func(*admission.Request) (admission.Reservation, error) {
		return admission.Reservation{Input: -1}, nil
	}), &admission.Request{}, nil)
	if got, want := err.Error(), "bulkhead: invalid estimate: Input must be >= 0, got -1"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestBuiltinOverflow(t *testing.T) {
	ma, _ := estimate.NewModelAware(estimate.ModelAwareOptions{})
	huge := &admission.Request{System: "abcd", ExtraInputTokens: math.MaxInt64}
	for _, est := range []estimate.Estimator{estimate.Naive{}, ma} {
		_, err := est.Estimate(huge)
		wantEstimatorError(t, err, "overflows")
		_, err = estimate.Reserve(est, huge, nil)
		wantEstimatorError(t, err, "overflows")
	}
	// Input fits but Input + MaxOutput does not.
	sum := &admission.Request{ExtraInputTokens: math.MaxInt64, MaxTokens: 1}
	_, err := estimate.Naive{}.Estimate(sum)
	wantEstimatorError(t, err, "overflows")
	// The largest sum that fits is fine.
	edge := &admission.Request{ExtraInputTokens: math.MaxInt64 - 1, MaxTokens: 1}
	if got, err := (estimate.Naive{}).Estimate(edge); err != nil || got != res(math.MaxInt64-1, 1) {
		t.Errorf("edge = %+v, %v", got, err)
	}
}
