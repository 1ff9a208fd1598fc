package gateway

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/stream"
)

// referenceBody is the rejection body as encoding/json writes it from the
// dialects' shapes: what appendBody must write, byte for byte.
func referenceBody(t *testing.T, r Rejection, format stream.Format) []byte {
	t.Helper()
	var v any
	switch format {
	case stream.AnthropicMessages:
		type inner struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		v = struct {
			Type     string  `json:"type"`
			Error    inner   `json:"error"`
			Bulkhead *Detail `json:"bulkhead,omitempty"`
		}{"error", inner{r.Type, r.Message}, r.Detail}
	case stream.Gemini:
		v = struct {
			Error any `json:"error"`
		}{struct {
			Code     int     `json:"code"`
			Message  string  `json:"message"`
			Status   string  `json:"status"`
			Bulkhead *Detail `json:"bulkhead,omitempty"`
		}{r.Status, r.Message, r.Type, r.Detail}}
	default:
		var code *string
		if r.Code != "" {
			code = &r.Code
		}
		v = struct {
			Error any `json:"error"`
		}{struct {
			Message  string  `json:"message"`
			Type     string  `json:"type"`
			Param    *string `json:"param"`
			Code     *string `json:"code"`
			Bulkhead *Detail `json:"bulkhead,omitempty"`
		}{r.Message, r.Type, nil, code, r.Detail}}
	}
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestAppendBodyIsEncodingJSONs(t *testing.T) {
	remaining, zero := 12.5, 0.0
	full := &Detail{Reason: "rate_limit", Tag: "req-<1>", Constraint: "class", NeverFits: true, RetryAfterMs: 1500,
		LimitRevision: 7, InFlight: 3, MaxConcurrent: 4, Pending: 2, MaxQueue: 8,
		Tokens:      &TokenDetail{Budget: 1000, EffectiveBudget: 900, InFlight: 800, Available: 100, Reserved: 120},
		Class:       &ClassDetail{Name: "web & batch", InFlight: 2, InFlightTokens: 300},
		Rate:        &RateDetail{Scope: "model", Key: "gpt-4o", Limit: "tokens", PerMinute: 300000, Burst: 1e-7, Weight: 1234.5678, Remaining: &remaining, Error: "redis: \"down\""},
		Fleet:       &FleetDetail{Pool: "prod", InFlight: 9, InFlightTokens: 99, MaxConcurrent: 64, TokenBudget: 400000, Error: "timeout\n"},
		Cooldown:    &CooldownDetail{Model: "gpt-4o", Until: time.Date(2026, 5, 1, 12, 30, 0, 123456789, time.FixedZone("x", 3600))},
		RetryBudget: &RetryDetail{Class: "web \"a\"", Ratio: 0.125, MinRetries: 3, WindowMs: 10000, FirstAttempts: 80, Retries: 10, Allowed: 10},
	}
	sparse := &Detail{Reason: "concurrency_limit", MaxConcurrent: 64, InFlight: 64,
		Rate: &RateDetail{Remaining: &zero, PerMinute: 1e21}, RetryBudget: &RetryDetail{}}
	for _, r := range []Rejection{
		{Status: 503, Type: "service_unavailable_error", Code: "server_is_overloaded", Message: "bulkhead: rejected", Detail: sparse},
		{Status: 429, Type: "tokens", Code: "rate_limit_exceeded", Message: "a <b> & \u2028 \u2029 \x01 \x7f é \xff \"q\" \\ \t\r\n\b\f", Detail: full},
		{Status: 404, Type: "invalid_request_error", Message: "gateway: no route for model \"x\""},
		{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: ""},
	} {
		for _, f := range []stream.Format{stream.OpenAIChat, stream.OpenAIResponses, stream.AnthropicMessages, stream.Gemini} {
			want := referenceBody(t, r, f)
			if got := r.appendBody(nil, f); !bytes.Equal(got, want) {
				t.Errorf("%v, %q:\ngot  %s\nwant %s", f, r.Message, got, want)
			}
		}
	}
}

func TestAppendJSONFloatIsEncodingJSONs(t *testing.T) {
	fs := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e-6, 9.99e-7, 1e-7, 1.5e-300, 1e20, 1e21, 1.7976931348623157e308,
		5e-324, 123456789.125, -2.5e-10, 300000}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		fs = append(fs, math.Float64frombits(rng.Uint64()))
	}
	for _, f := range fs {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			if got := string(appendJSONFloat(nil, f)); got != "null" {
				t.Errorf("%v: got %s, want null", f, got)
			}
			continue
		}
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONFloat(nil, f); !bytes.Equal(got, want) {
			t.Errorf("%v: got %s, want %s", f, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "<a href=\"x\">&amp;</a>", "\u2028\u2029", "\x00\x1f\x7f", "é東京😀", "\xff\xfe", "a\xc3", "\\\"\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("%q: got %s, want %s", s, got, want)
		}
	})
}
