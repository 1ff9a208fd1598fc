package estimate_test

import (
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

func mustModelAware(t testing.TB, opts estimate.ModelAwareOptions) *estimate.ModelAware {
	t.Helper()
	m, err := estimate.NewModelAware(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestModelAwareSpecChecks(t *testing.T) {
	m := mustModelAware(t, estimate.ModelAwareOptions{DefaultModel: "gpt-4o"})
	tests := []struct {
		name string
		req  *bulkhead.Request
		want bulkhead.Reservation
	}{
		{"gpt-4o, 37 chars, max 100", userReq("", strings.Repeat("a", 37), 100), bulkhead.Reservation{Input: 10, MaxOutput: 100, Reserved: 110}},
		{"gpt-4o, abcd, no max", userReq("", "abcd", 0), bulkhead.Reservation{Input: 2, MaxOutput: 2048, Reserved: 2050}},
		{"explicit model gpt-4o", userReq("gpt-4o", strings.Repeat("a", 37), 100), res(10, 100)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.Estimate(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Estimate = %+v, want %+v", got, tt.want)
			}
			got, err = reserve(t, m, tt.req, nil)
			if err != nil || got != tt.want {
				t.Errorf("Reserve = %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
}

func TestBuiltinRatio(t *testing.T) {
	tests := []struct {
		model string
		ratio float64
		known bool
	}{
		// Every entry of the SPEC F8 table.
		{"claude-3-5-haiku", 3.8, true},
		{"claude-3-5-sonnet", 3.9, true},
		{"claude-3-opus", 3.9, true},
		{"claude-3-sonnet", 3.9, true},
		{"claude-3-haiku", 3.8, true},
		{"claude-sonnet-4", 3.9, true},
		{"claude-opus-4", 3.9, true},
		{"claude-haiku-4", 3.8, true},
		{"claude-sonnet-4-5", 3.9, true},
		{"claude-opus-4-5", 3.9, true},
		{"claude-haiku-4-5", 3.8, true},
		{"gpt-4o", 3.7, true},
		{"gpt-4-turbo", 3.7, true},
		{"gpt-4.1", 3.7, true},
		{"gpt-4", 3.7, true},
		{"gpt-3.5", 3.8, true},
		{"o1", 3.7, true},
		{"o3", 3.7, true},
		{"o4-mini", 3.7, true},
		{"gemini-2.5", 3.8, true},
		{"gemini-2", 3.8, true},
		{"gemini-1.5", 3.8, true},
		// Prefixes with dated or suffixed names.
		{"claude-sonnet-4-5-20250929", 3.9, true},
		{"claude-haiku-4-5-20251001", 3.8, true},
		{"claude-3-5-haiku-latest", 3.8, true},
		{"gpt-4o-mini", 3.7, true},
		{"gpt-3.5-turbo", 3.8, true},
		{"o1-preview", 3.7, true},
		{"gemini-2.5-pro", 3.8, true},
		{"gemini-2.0-flash", 3.8, true},
		// Case-insensitive.
		{"GPT-4o", 3.7, true},
		{"Claude-Haiku-4-5", 3.8, true},
		{"GEMINI-1.5-PRO", 3.8, true},
		{"claude-3-Haiku", 3.8, true},
		// Unicode lower-casing: the Kelvin sign lowers to 'k'.
		{"claude-3-5-hai\u212Au", 3.8, true},
		// Unknown.
		{"", 4, false},
		{"llama-3", 4, false},
		{"gpt-5", 4, false},
		{"o", 4, false},
		{"gpt", 4, false},
		{"claude-3", 4, false},
		{"my-gpt-4o", 4, false}, // prefix, not substring
		{"gémini-2", 4, false},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			r, known := estimate.BuiltinRatio(tt.model)
			if r != tt.ratio || known != tt.known {
				t.Errorf("BuiltinRatio(%q) = %v, %v; want %v, %v", tt.model, r, known, tt.ratio, tt.known)
			}
		})
	}
}

// TestLongestPrefixWinsThroughRatio checks nested prefixes through the
// public API. The built-in table gives nested prefixes equal ratios, so the
// choice of prefix itself is checked in TestBuiltinMatch (internal).
func TestLongestPrefixWinsThroughRatio(t *testing.T) {
	m := mustModelAware(t, estimate.ModelAwareOptions{})
	for _, model := range []string{"claude-sonnet-4", "claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "CLAUDE-SONNET-4-5"} {
		if r, known := m.Ratio(model); !known || r != 3.9 {
			t.Errorf("Ratio(%q) = %v, %v", model, r, known)
		}
	}
	for _, model := range []string{"gpt-4o-mini", "gpt-4-turbo-preview", "gpt-4-0613", "gpt-4.1-nano"} {
		if r, known := m.Ratio(model); !known || r != 3.7 {
			t.Errorf("Ratio(%q) = %v, %v", model, r, known)
		}
	}
}

func TestOverrides(t *testing.T) {
	m := mustModelAware(t, estimate.ModelAwareOptions{
		DefaultModel: "my-model",
		Overrides: map[string]float64{
			"my-model":              2,   // unknown to the table
			"gpt-4o":                1,   // overrides the table
			"claude-sonnet-4":       5,   // exact only: does not act as a prefix
			"Mixed-Case":            0.5, // matches only exactly
			"lower-case":            8,   // matches any case
			"ünïcode":               10,
			strings.Repeat("x", 80): 16, // long key, lower-cased via strings.ToLower
		},
	})
	tests := []struct {
		model string
		ratio float64
		known bool
	}{
		{"", 2, true},         // default model
		{"my-model", 2, true}, // same as default
		{"MY-MODEL", 2, true}, // lower-cased lookup
		{"gpt-4o", 1, true},
		{"GPT-4O", 1, true},
		{"gpt-4o-mini", 3.7, true}, // override is exact, the table is a prefix
		{"claude-sonnet-4", 5, true},
		{"claude-sonnet-4-5", 3.9, true},
		{"Mixed-Case", 0.5, true},
		{"mixed-case", 4, false}, // key is not lower-cased
		{"MIXED-CASE", 4, false},
		{"LOWER-CASE", 8, true},
		{"Lower-Case", 8, true},
		{"ÜNÏCODE", 10, true},
		{strings.Repeat("X", 80), 16, true},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			r, known := m.Ratio(tt.model)
			if r != tt.ratio || known != tt.known {
				t.Errorf("Ratio(%q) = %v, %v; want %v, %v", tt.model, r, known, tt.ratio, tt.known)
			}
		})
	}
	// And through Estimate: 8 chars at ratio 2 for the default model.
	got, err := m.Estimate(userReq("", "abcdefgh", 1))
	if err != nil || got != res(4, 1) {
		t.Errorf("Estimate = %+v, %v", got, err)
	}
	got, err = m.Estimate(userReq("GPT-4o", "abcdefgh", 1))
	if err != nil || got != res(8, 1) {
		t.Errorf("Estimate(GPT-4o) = %+v, %v", got, err)
	}
}

func TestOverridesAreCopied(t *testing.T) {
	ov := map[string]float64{"a": 2}
	by := map[string]int64{"image": 1}
	m := mustModelAware(t, estimate.ModelAwareOptions{Overrides: ov, OpaqueBlockTokens: estimate.OpaqueSurcharge{ByType: by}})
	ov["a"] = 100
	by["image"] = 100
	if r, _ := m.Ratio("a"); r != 2 {
		t.Errorf("ratio changed with the caller's map: %v", r)
	}
	got, _ := m.Estimate(&bulkhead.Request{Messages: []bulkhead.Message{{Blocks: []bulkhead.Block{{Type: "image"}}}}, MaxTokens: 1})
	if got != res(1, 1) {
		t.Errorf("surcharge changed with the caller's map: %+v", got)
	}
}

func TestModelSelection(t *testing.T) {
	// A request's own model wins over the default.
	m := mustModelAware(t, estimate.ModelAwareOptions{DefaultModel: "claude-sonnet-4", Overrides: map[string]float64{"cheap": 1}})
	req := userReq("cheap", strings.Repeat("a", 39), 1)
	if got, _ := m.Estimate(req); got != res(39, 1) {
		t.Errorf("request model: %+v", got)
	}
	req.Model = ""
	if got, _ := m.Estimate(req); got != res(10, 1) {
		t.Errorf("default model: %+v", got)
	}
	if got := m.Model(req); got != "claude-sonnet-4" {
		t.Errorf("Model = %q", got)
	}
	if got := m.Model(userReq("x", "", 0)); got != "x" {
		t.Errorf("Model = %q", got)
	}
}

func TestOnUnknownModel(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	record := func(model string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, model)
	}
	tests := []struct {
		name         string
		defaultModel string
		reqModel     string
		want         []string
		ratio4       bool
	}{
		{"known default", "gpt-4o", "", nil, false},
		{"known request model", "", "claude-opus-4-5", nil, false},
		{"override counts as known", "", "custom", nil, false},
		{"unknown default", "llama-3", "", []string{"llama-3"}, true},
		{"unknown request model, as given", "gpt-4o", "Llama-3", []string{"Llama-3"}, true},
		{"empty model", "", "", []string{""}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen = nil
			m := mustModelAware(t, estimate.ModelAwareOptions{
				DefaultModel:   tt.defaultModel,
				Overrides:      map[string]float64{"custom": 3},
				OnUnknownModel: record,
			})
			got, err := m.Estimate(userReq(tt.reqModel, strings.Repeat("a", 40), 1))
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) != len(tt.want) || (len(seen) > 0 && seen[0] != tt.want[0]) {
				t.Errorf("callback saw %q, want %q", seen, tt.want)
			}
			if tt.ratio4 && got.Input != 10 {
				t.Errorf("unknown model input = %d, want 10 (ratio 4)", got.Input)
			}
			// Ratio never calls back.
			seen = nil
			m.Ratio(tt.reqModel)
			if len(seen) != 0 {
				t.Errorf("Ratio called OnUnknownModel")
			}
		})
	}
	// Called on every estimate, not only the first.
	seen = nil
	m := mustModelAware(t, estimate.ModelAwareOptions{OnUnknownModel: record})
	for range 3 {
		m.Estimate(&bulkhead.Request{})
	}
	if len(seen) != 3 {
		t.Errorf("callback called %d times, want 3", len(seen))
	}
}

func TestOpaqueSurcharge(t *testing.T) {
	blocks := func(types ...string) []bulkhead.Block {
		var bs []bulkhead.Block
		for _, ty := range types {
			bs = append(bs, bulkhead.Block{Type: ty, Text: "abcdefgh"})
		}
		return bs
	}
	// Ratio 4 (model unknown) and MaxTokens 1 throughout; each "text" block
	// has 8 characters = 2 tokens.
	tests := []struct {
		name      string
		surcharge estimate.OpaqueSurcharge
		req       *bulkhead.Request
		input     int64
	}{
		{"none configured", estimate.OpaqueSurcharge{}, &bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("image", "text")}}}, 2},
		{"flat in messages", estimate.OpaqueSurcharge{Default: 100}, &bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("image", "text", "document")}}}, 202},
		{"flat in system blocks", estimate.OpaqueSurcharge{Default: 100}, &bulkhead.Request{SystemBlocks: blocks("image", "text")}, 102},
		{"flat in both", estimate.OpaqueSurcharge{Default: 7}, &bulkhead.Request{
			SystemBlocks: blocks("image"),
			Messages:     []bulkhead.Message{{Content: "abcd", Blocks: blocks("tool_use")}, {Blocks: blocks("image", "text")}},
		}, 7 + 7 + 7 + 1 + 2},
		{"empty type is opaque", estimate.OpaqueSurcharge{Default: 50}, &bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("")}}}, 50},
		{"Text (capitalised) is opaque", estimate.OpaqueSurcharge{Default: 50}, &bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("Text")}}}, 50},
		{"by type with default", estimate.OpaqueSurcharge{Default: 10, ByType: map[string]int64{"image": 1500, "document": 0}},
			&bulkhead.Request{
				SystemBlocks: blocks("image"),
				Messages:     []bulkhead.Message{{Blocks: blocks("image", "document", "tool_use", "", "text")}},
			}, 1500 + 1500 + 0 + 10 + 10 + 2},
		{"by type without default", estimate.OpaqueSurcharge{ByType: map[string]int64{"image": 3}},
			&bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("image", "tool_use")}}}, 3},
		{"by type for the empty type", estimate.OpaqueSurcharge{Default: 1, ByType: map[string]int64{"": 9}},
			&bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("", "x")}}}, 10},
		{"text key has no effect", estimate.OpaqueSurcharge{ByType: map[string]int64{"text": 1000}},
			&bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("text")}}}, 2},
		{"extra input added", estimate.OpaqueSurcharge{Default: 5},
			&bulkhead.Request{ExtraInputTokens: 11, Messages: []bulkhead.Message{{Blocks: blocks("image")}}}, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustModelAware(t, estimate.ModelAwareOptions{OpaqueBlockTokens: tt.surcharge})
			tt.req.MaxTokens = 1
			got, err := m.Estimate(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got != res(tt.input, 1) {
				t.Errorf("got %+v, want input %d", got, tt.input)
			}
		})
	}
	// A surcharge that overflows is an estimator error, not a wrap-around.
	m := mustModelAware(t, estimate.ModelAwareOptions{OpaqueBlockTokens: estimate.OpaqueSurcharge{Default: math.MaxInt64}})
	_, err := m.Estimate(&bulkhead.Request{Messages: []bulkhead.Message{{Blocks: blocks("image", "image")}}})
	wantEstimatorError(t, err, "overflows")
}

func TestOutputCap(t *testing.T) {
	tests := []struct {
		cap, maxTokens, want int64
	}{
		{0, 0, 2048},
		{0, 5, 5},
		{100, 0, 100},
		{100, 5000, 5000}, // MaxTokens is not clamped by the cap
		{1, 0, 1},
	}
	for _, tt := range tests {
		m := mustModelAware(t, estimate.ModelAwareOptions{OutputCap: tt.cap})
		got, err := m.Estimate(userReq("gpt-4o", "", tt.maxTokens))
		if err != nil || got.MaxOutput != tt.want || got.Reserved != got.Input+got.MaxOutput {
			t.Errorf("cap %d, MaxTokens %d: %+v, %v; want MaxOutput %d", tt.cap, tt.maxTokens, got, err, tt.want)
		}
	}
}

func TestModelAwareOptionsValidation(t *testing.T) {
	tests := []struct {
		name  string
		opts  estimate.ModelAwareOptions
		field string
	}{
		{"negative output cap", estimate.ModelAwareOptions{OutputCap: -1}, "ModelAwareOptions.OutputCap"},
		{"zero ratio", estimate.ModelAwareOptions{Overrides: map[string]float64{"m": 0}}, `ModelAwareOptions.Overrides["m"]`},
		{"negative ratio", estimate.ModelAwareOptions{Overrides: map[string]float64{"m": -3.7}}, `ModelAwareOptions.Overrides["m"]`},
		{"NaN ratio", estimate.ModelAwareOptions{Overrides: map[string]float64{"m": math.NaN()}}, `ModelAwareOptions.Overrides["m"]`},
		{"infinite ratio", estimate.ModelAwareOptions{Overrides: map[string]float64{"m": math.Inf(1)}}, `ModelAwareOptions.Overrides["m"]`},
		{"negative opaque default", estimate.ModelAwareOptions{OpaqueBlockTokens: estimate.OpaqueSurcharge{Default: -1}}, "ModelAwareOptions.OpaqueBlockTokens.Default"},
		{"negative opaque by type", estimate.ModelAwareOptions{OpaqueBlockTokens: estimate.OpaqueSurcharge{ByType: map[string]int64{"image": -1}}}, `ModelAwareOptions.OpaqueBlockTokens.ByType["image"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := estimate.NewModelAware(tt.opts)
			if m != nil {
				t.Error("estimator returned with an error")
			}
			wantConfigError(t, err, tt.field)
			_, err = estimate.NewAdaptive(estimate.AdaptiveOptions{Base: tt.opts})
			wantConfigError(t, err, tt.field)
		})
	}
	// Tiny and huge ratios are valid.
	if _, err := estimate.NewModelAware(estimate.ModelAwareOptions{Overrides: map[string]float64{"a": math.SmallestNonzeroFloat64, "b": math.MaxFloat64}}); err != nil {
		t.Fatal(err)
	}
}

func TestRobustCeil(t *testing.T) {
	tests := []struct {
		name  string
		ratio float64
		chars int
		want  int64
	}{
		{"37 / 3.7", 3.7, 37, 10},
		{"38 / 3.7", 3.7, 38, 11},
		{"21 / 0.7 (float gives 30.000000000000004)", 0.7, 21, 30},
		{"42 / 0.7", 0.7, 42, 60},
		{"22 / 0.7", 0.7, 22, 32}, // 31.43 -> 32
		{"20 / 0.7", 0.7, 20, 29}, // 28.57 -> 29
		{"1 / 4", 4, 1, 1},
		{"0 chars", 3.7, 0, 0},
		{"tiny quotient still one token", 1e15, 1, 1},
		{"huge ratio", math.MaxFloat64, 100, 1},
		{"3 / 0.1", 0.1, 3, 30},
		{"39 / 3.9", 3.9, 39, 10},
		{"380 / 3.8", 3.8, 380, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustModelAware(t, estimate.ModelAwareOptions{Overrides: map[string]float64{"m": tt.ratio}})
			got, err := m.Estimate(userReq("m", strings.Repeat("a", tt.chars), 1))
			if err != nil {
				t.Fatal(err)
			}
			if got.Input != tt.want {
				t.Errorf("input = %d, want %d", got.Input, tt.want)
			}
		})
	}
	// Exhaustive against exact integer arithmetic for one-decimal ratios.
	for num := int64(1); num <= 60; num++ {
		ratio := float64(num) / 10
		m := mustModelAware(t, estimate.ModelAwareOptions{Overrides: map[string]float64{"m": ratio}})
		for chars := int64(0); chars <= 400; chars++ {
			want := (chars*10 + num - 1) / num
			got, err := m.Estimate(userReq("m", strings.Repeat("a", int(chars)), 1))
			if err != nil || got.Input != want {
				t.Fatalf("ratio %v, %d chars: %+v, %v; want input %d", ratio, chars, got, err, want)
			}
		}
	}
}

func TestTinyRatioOverflows(t *testing.T) {
	m := mustModelAware(t, estimate.ModelAwareOptions{Overrides: map[string]float64{"m": math.SmallestNonzeroFloat64}})
	_, err := m.Estimate(userReq("m", "a", 1))
	wantEstimatorError(t, err, "overflows")
	// No text, no overflow.
	if got, err := m.Estimate(userReq("m", "", 1)); err != nil || got != res(0, 1) {
		t.Errorf("empty = %+v, %v", got, err)
	}
}

func TestModelAwareDoesNotAllocate(t *testing.T) {
	m := mustModelAware(t, estimate.ModelAwareOptions{
		DefaultModel:      "gpt-4o",
		Overrides:         map[string]float64{"custom": 3},
		OpaqueBlockTokens: estimate.OpaqueSurcharge{Default: 1, ByType: map[string]int64{"image": 1000}},
	})
	content := strings.Repeat("abcdefgh", 28)
	reqs := map[string]*bulkhead.Request{
		"default model":        userReq("", content, 256),
		"same as default":      userReq("gpt-4o", content, 256),
		"table model":          userReq("claude-sonnet-4-5-20250929", content, 256),
		"upper-case table":     userReq("Claude-Sonnet-4-5", content, 256),
		"override, upper-case": userReq("CUSTOM", content, 256),
		"unknown, upper-case":  userReq("Llama-3-70B-Instruct", content, 256),
		"with opaque blocks":   {Messages: []bulkhead.Message{{Content: content, Blocks: []bulkhead.Block{{Type: "image"}, {Type: "text", Text: "x"}}}}},
		"non-ascii text":       userReq("", "héllo 😀 漢字", 0),
	}
	for name, req := range reqs {
		if n := testing.AllocsPerRun(100, func() { m.Estimate(req) }); n != 0 {
			t.Errorf("%s: Estimate allocates %v times, want 0", name, n)
		}
		if n := testing.AllocsPerRun(100, func() { m.Estimate(req) }); n != 0 {
			t.Errorf("%s: Reserve allocates %v times, want 0", name, n)
		}
	}
}
