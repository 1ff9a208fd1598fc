package tokens

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBuiltinMatch(t *testing.T) {
	tests := []struct{ model, prefix string }{
		{"claude-sonnet-4", "claude-sonnet-4"},
		{"claude-sonnet-4-20250514", "claude-sonnet-4"},
		{"claude-sonnet-4-5", "claude-sonnet-4-5"},
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5"},
		{"Claude-Sonnet-4-5", "claude-sonnet-4-5"},
		{"claude-opus-4-1", "claude-opus-4"},
		{"claude-opus-4-5-x", "claude-opus-4-5"},
		{"claude-haiku-4-5", "claude-haiku-4-5"},
		{"claude-3-5-sonnet-latest", "claude-3-5-sonnet"},
		{"gpt-4", "gpt-4"},
		{"gpt-4-0613", "gpt-4"},
		{"gpt-4o-mini", "gpt-4o"},
		{"gpt-4-turbo-2024", "gpt-4-turbo"},
		{"gpt-4.1-mini", "gpt-4.1"},
		{"gemini-2.0-flash", "gemini-2"},
		{"gemini-2.5-pro", "gemini-2.5"},
		{"o4-mini-high", "o4-mini"},
		{"o4", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got := ""
		if i := builtinMatch(tt.model); i >= 0 {
			got = builtinRatios[i].prefix
		}
		if got != tt.prefix {
			t.Errorf("builtinMatch(%q) = %q, want %q", tt.model, got, tt.prefix)
		}
	}
}

func TestBuiltinTableSize(t *testing.T) {
	if len(builtinRatios) != 22 {
		t.Errorf("table has %d entries, SPEC F8 lists 22", len(builtinRatios))
	}
	seen := map[string]bool{}
	for _, e := range builtinRatios {
		if seen[e.prefix] {
			t.Errorf("duplicate prefix %q", e.prefix)
		}
		seen[e.prefix] = true
	}
}

func TestCeilTokens(t *testing.T) {
	tests := []struct {
		x    float64
		want int64
		ok   bool
	}{
		{0, 0, true},
		{0.25, 1, true},
		{1e-300, 1, true},
		{1, 1, true},
		{1.0000001, 2, true},
		{30.000000000000004, 30, true},
		{33.00000000000001, 33, true},
		{29.999999999999996, 30, true},
		{9.5, 10, true},
		{0x1p62, 1 << 62, true},
		{0x1p63, 0, false},
		{1e300, 0, false},
		{-1, 0, false},
	}
	for _, tt := range tests {
		got, ok := CeilTokens(tt.x)
		if got != tt.want || ok != tt.ok {
			t.Errorf("CeilTokens(%v) = %d, %v; want %d, %v", tt.x, got, ok, tt.want, tt.ok)
		}
	}
}
