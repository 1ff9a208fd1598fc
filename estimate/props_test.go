package estimate_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// anyText draws text that is often ASCII and sometimes any Unicode or
// arbitrary (possibly invalid UTF-8) bytes.
func anyText() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.StringMatching(`[a-z ]{0,300}`),
		rapid.String(),
		rapid.Map(rapid.SliceOf(rapid.Byte()), func(b []byte) string { return string(b) }),
	)
}

func anyCount() *rapid.Generator[int64] {
	return rapid.OneOf(
		rapid.Int64Range(0, 5000),
		rapid.Int64Range(-3, 3),
		rapid.Int64Range(math.MaxInt64-10, math.MaxInt64),
		rapid.Int64(),
	)
}

func anyBlocks() *rapid.Generator[[]bulkhead.Block] {
	return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) bulkhead.Block {
		return bulkhead.Block{
			Type: rapid.SampledFrom([]string{"text", "text", "image", "document", "", "Text"}).Draw(t, "type"),
			Text: anyText().Draw(t, "text"),
		}
	}), 0, 3)
}

func anyRequest() *rapid.Generator[*bulkhead.Request] {
	return rapid.Custom(func(t *rapid.T) *bulkhead.Request {
		if rapid.IntRange(0, 30).Draw(t, "nil") == 0 {
			return nil
		}
		req := &bulkhead.Request{
			Model:            rapid.SampledFrom([]string{"", "gpt-4o", "GPT-4O", "claude-sonnet-4-5-20250929", "llama-3", "custom", "CUSTOM", "ünknown"}).Draw(t, "model"),
			System:           anyText().Draw(t, "system"),
			SystemBlocks:     anyBlocks().Draw(t, "systemBlocks"),
			MaxTokens:        anyCount().Draw(t, "maxTokens"),
			ExtraInputTokens: anyCount().Draw(t, "extra"),
		}
		for range rapid.IntRange(0, 3).Draw(t, "messages") {
			req.Messages = append(req.Messages, bulkhead.Message{
				Role:    "user",
				Content: anyText().Draw(t, "content"),
				Blocks:  anyBlocks().Draw(t, "blocks"),
			})
		}
		return req
	})
}

func anyReservation() *rapid.Generator[bulkhead.Reservation] {
	return rapid.Custom(func(t *rapid.T) bulkhead.Reservation {
		r := bulkhead.Reservation{Input: anyCount().Draw(t, "input"), MaxOutput: anyCount().Draw(t, "maxOutput")}
		switch rapid.IntRange(0, 2).Draw(t, "reservedKind") {
		case 1:
			r.Reserved = r.Input + r.MaxOutput // may have wrapped
		case 2:
			r.Reserved = anyCount().Draw(t, "reserved")
		}
		return r
	})
}

// anyEstimator draws one of the built-in estimators or a custom one that
// may return anything, fail or panic.
func anyEstimator(t *rapid.T) bulkhead.Estimator {
	base := estimate.ModelAwareOptions{
		DefaultModel: rapid.SampledFrom([]string{"", "gpt-4o", "llama-3"}).Draw(t, "defaultModel"),
		Overrides:    map[string]float64{"custom": rapid.Float64Range(0.01, 100).Draw(t, "ratio")},
		OutputCap:    rapid.Int64Range(0, 10000).Draw(t, "outputCap"),
		OpaqueBlockTokens: estimate.OpaqueSurcharge{
			Default: rapid.SampledFrom([]int64{0, 1, 85, math.MaxInt64 / 2}).Draw(t, "opaqueDefault"),
			ByType:  map[string]int64{"image": rapid.Int64Range(0, 2000).Draw(t, "opaqueImage")},
		},
	}
	switch rapid.IntRange(0, 3).Draw(t, "estimator") {
	case 0:
		return estimate.Naive{}
	case 1:
		m, err := estimate.NewModelAware(base)
		if err != nil {
			t.Fatal(err)
		}
		return m
	case 2:
		a, err := estimate.NewAdaptive(estimate.AdaptiveOptions{Base: base, MinSamples: rapid.IntRange(0, 3).Draw(t, "minSamples")})
		if err != nil {
			t.Fatal(err)
		}
		for range rapid.IntRange(0, 5).Draw(t, "observations") {
			req := anyRequest().Draw(t, "observed")
			usage := bulkhead.Usage{Input: anyCount().Draw(t, "usageIn"), Output: anyCount().Draw(t, "usageOut")}
			if err := a.Observe(req, usage); err != nil && !errors.Is(err, bulkhead.ErrInvalid) {
				t.Fatalf("Observe error does not match ErrInvalid: %v", err)
			}
		}
		return a
	default:
		r := anyReservation().Draw(t, "custom")
		mode := rapid.IntRange(0, 5).Draw(t, "customMode")
		return estimate.Func(func(*bulkhead.Request) (bulkhead.Reservation, error) {
			switch mode {
			case 0:
				return bulkhead.Reservation{}, errors.New("custom failure")
			case 1:
				panic("custom panic")
			}
			return r, nil
		})
	}
}

func checkReservation(t *rapid.T, r bulkhead.Reservation, err error) {
	if err != nil {
		if !errors.Is(err, bulkhead.ErrInvalid) {
			t.Fatalf("error %v (%T) does not match ErrInvalid", err, err)
		}
		if r != (bulkhead.Reservation{}) {
			t.Fatalf("non-zero reservation %+v with error %v", r, err)
		}
		return
	}
	if r.Input < 0 || r.MaxOutput < 0 || r.Reserved < 0 {
		t.Fatalf("negative field: %+v", r)
	}
	if r.Reserved != r.Input+r.MaxOutput {
		t.Fatalf("Reserved %d != Input %d + MaxOutput %d", r.Reserved, r.Input, r.MaxOutput)
	}
}

func TestPropReserve(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		est := anyEstimator(t)
		req := anyRequest().Draw(t, "req")
		var override *bulkhead.Reservation
		if rapid.Bool().Draw(t, "hasOverride") {
			o := anyReservation().Draw(t, "override")
			override = &o
		}

		r, err := reserve(t, est, req, override)
		checkReservation(t, r, err)

		// Invalid requests fail whatever else is given.
		if reqErr := req.Validate(); reqErr != nil {
			if err == nil || err.Error() != reqErr.Error() {
				t.Fatalf("invalid request: Reserve error %v, want %v", err, reqErr)
			}
			return
		}

		// Deterministic: the same inputs give the same outcome.
		r2, err2 := reserve(t, est, req, override)
		if r2 != r || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("not deterministic: %+v, %v then %+v, %v", r, err, r2, err2)
		}

		if override != nil && err == nil {
			if r.Input != override.Input || r.MaxOutput != override.MaxOutput {
				t.Fatalf("override %+v not used verbatim: %+v", *override, r)
			}
		}
		if err != nil {
			return
		}
		// Round trip as an override.
		r3, err := reserve(t, nil, req, &r)
		if err != nil || r3 != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, r3, err)
		}
	})
}

func TestPropBuiltinEstimates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		req := anyRequest().Draw(t, "req")
		if req.Validate() != nil {
			return
		}
		m, err := estimate.NewModelAware(estimate.ModelAwareOptions{DefaultModel: "gpt-4o"})
		if err != nil {
			t.Fatal(err)
		}
		for _, est := range []bulkhead.Estimator{estimate.Naive{}, m} {
			r, err := est.Estimate(req)
			checkReservation(t, r, err)
			if err != nil {
				continue
			}
			wantOut := req.MaxTokens
			if wantOut == 0 {
				wantOut = bulkhead.DefaultOutputCap
			}
			if r.MaxOutput != wantOut {
				t.Fatalf("%T: MaxOutput %d, want %d", est, r.MaxOutput, wantOut)
			}
			if r.Input < req.ExtraInputTokens {
				t.Fatalf("%T: Input %d below ExtraInputTokens %d", est, r.Input, req.ExtraInputTokens)
			}
			// Text means at least one token; no text and no extras means none.
			chars := req.TextLength()
			if text := r.Input - req.ExtraInputTokens; (chars > 0) != (text > 0) {
				t.Fatalf("%T: %d chars gave %d text tokens", est, chars, text)
			}
			again, err := est.Estimate(req)
			if err != nil || again != r {
				t.Fatalf("%T not deterministic: %+v then %+v, %v", est, r, again, err)
			}
		}
	})
}

func TestPropUTF16Len(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := anyText().Draw(t, "s")
		if got, want := estimate.UTF16Len(s), utf16Oracle(s); got != want {
			t.Fatalf("UTF16Len(%q) = %d, want %d", s, got, want)
		}
	})
}

// TestPropDefaultEstimatorIsModelAware: a bulkhead whose token budget names
// no estimator reserves what NewModelAware with the same model and output
// cap estimates, on any request, errors included.
func TestPropDefaultEstimatorIsModelAware(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		model := rapid.SampledFrom([]string{"gpt-4o", "claude-sonnet-4-5", "GPT-4.1-mini", "mystery", "gemini-2.5-pro"}).Draw(t, "model")
		outputCap := rapid.SampledFrom([]int64{0, 1, 300, math.MaxInt64}).Draw(t, "outputCap")
		b, err := bulkhead.New(bulkhead.Config{Model: model, MaxConcurrent: 1,
			TokenBudget: &bulkhead.TokenBudget{Budget: math.MaxInt64, OutputCap: outputCap}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Shutdown(context.Background())
		ma, err := estimate.NewModelAware(estimate.ModelAwareOptions{DefaultModel: model, OutputCap: outputCap})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			req := anyRequest().Draw(t, fmt.Sprint("req", i))
			got, gotErr := b.Estimate(req)
			want, wantErr := ma.Estimate(req)
			if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
				t.Fatalf("errors differ: default %v, model-aware %v", gotErr, wantErr)
			}
			if gotErr == nil && *got != want {
				t.Fatalf("default %+v, model-aware %+v", *got, want)
			}
		}
	})
}
