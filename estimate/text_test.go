package estimate_test

import (
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/estimate"
)

// utf16Oracle is the definition UTF16Len must match: decode s the way Go
// ranges over strings (one U+FFFD per invalid byte) and encode to UTF-16.
func utf16Oracle(s string) int { return len(utf16.Encode([]rune(s))) }

func TestUTF16Len(t *testing.T) {
	tests := []struct {
		name string
		s    string
		want int
	}{
		{"empty", "", 0},
		{"ascii", "abcd", 4},
		{"ascii 37", strings.Repeat("x", 37), 37},
		{"ascii long", strings.Repeat("hello, world ", 40), 13 * 40},
		{"latin-1", "héllo", 5},                 // é is 2 bytes, 1 unit
		{"cjk", "漢字テスト", 5},                     // 3 bytes each, 1 unit each
		{"emoji", "😀", 2},                       // U+1F600: surrogate pair
		{"emoji in ascii", "ab😀cd", 6},          // 2 + 2 + 2
		{"flag", "🇫🇷", 4},                       // two regional indicators
		{"zwj family", "👨‍👩‍👧", 8},              // 3 emoji (2 each) + 2 ZWJ (1 each)
		{"combining marks", "e\u0301\u0302", 3}, // base + two marks
		{"rare cjk ext b", "𠀀", 2},              // U+20000
		{"max rune", "\U0010FFFF", 2},
		{"bmp top", "\uFFFF", 1},
		{"replacement char itself", "\uFFFD", 1},
		{"invalid byte", "\xff", 1},
		{"invalid bytes in ascii", "a\xffb\xfec", 5},
		{"truncated 3-byte sequence", "\xe6\xbc", 2},     // two invalid bytes
		{"truncated 4-byte sequence", "\xf0\x9f\x98", 3}, // three invalid bytes
		{"encoded surrogate", "\xed\xa0\x80", 3},         // invalid in UTF-8: 3 bytes
		{"overlong", "\xc0\xaf", 2},
		{"non-ascii after 8 ascii", "abcdefghé", 9},
		{"non-ascii at word end", "abcdefgé", 8},
		{"emoji straddling words", "abcdef😀abcdefgh", 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := estimate.UTF16Len(tt.s); got != tt.want {
				t.Errorf("UTF16Len(%q) = %d, want %d", tt.s, got, tt.want)
			}
			if got := utf16Oracle(tt.s); got != tt.want {
				t.Errorf("oracle(%q) = %d, want %d (bad test)", tt.s, got, tt.want)
			}
		})
	}
}

func FuzzUTF16Len(f *testing.F) {
	for _, s := range []string{"", "abcd", "héllo wörld", "😀😀", "\xff\xfe", "\xed\xa0\x80abcdefgh", "漢字abcdefgh😀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := estimate.UTF16Len(s), utf16Oracle(s); got != want {
			t.Fatalf("UTF16Len(%q) = %d, want %d", s, got, want)
		}
	})
}

func TestTextLength(t *testing.T) {
	tests := []struct {
		name string
		req  *bulkhead.Request
		want int
	}{
		{"nil", nil, 0},
		{"empty", &bulkhead.Request{}, 0},
		{"system", &bulkhead.Request{System: "abcd"}, 4},
		{"message content", &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "abcd"}}}, 4},
		{"all text sources", &bulkhead.Request{
			System:       "sys",                                                                     // 3
			SystemBlocks: []bulkhead.Block{{Type: "text", Text: "blk"}, {Type: "image", Text: "x"}}, // 3
			Messages: []bulkhead.Message{
				{Content: "hello", Blocks: []bulkhead.Block{{Type: "text", Text: "😀"}}},                                                  // 5 + 2
				{Blocks: []bulkhead.Block{{Type: "tool_use", Text: "ignored"}, {Type: "", Text: "ignored"}, {Type: "text", Text: "ok"}}}, // 2
			},
		}, 15},
		{"type is case-sensitive", &bulkhead.Request{Messages: []bulkhead.Message{{Blocks: []bulkhead.Block{{Type: "Text", Text: "abcd"}}}}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (tt.req).TextLength(); got != tt.want {
				t.Errorf("TextLength = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestTextLengthDoesNotAllocate(t *testing.T) {
	req := &bulkhead.Request{
		System:   "You are helpful. 😀",
		Messages: []bulkhead.Message{{Role: "user", Content: strings.Repeat("héllo wörld ", 20)}},
	}
	if n := testing.AllocsPerRun(100, func() { req.TextLength() }); n != 0 {
		t.Errorf("TextLength allocates %v times, want 0", n)
	}
}
