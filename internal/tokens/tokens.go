// Package tokens holds the arithmetic that every estimator shares: UTF-16
// character counts, the built-in characters-per-token table, overflow-safe
// sums and robust rounding. Both the bulkhead's default estimator and
// package estimate use it.
package tokens

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// UTF16Len returns the length of s in UTF-16 code units, which is what
// JavaScript's String.length reports for the same text.
//
// A code point below U+10000 counts 1 and one at or above U+10000 (most
// emoji, rare CJK ideographs) counts 2. A byte that is not part of a valid
// UTF-8 sequence counts 1, as if it had been decoded to U+FFFD the way
// ranging over a Go string does. So UTF16Len(s) always equals
// len(utf16.Encode([]rune(s))), without allocating.
//
// ASCII runs are scanned eight bytes at a time.
func UTF16Len(s string) int {
	// n starts at one unit per byte; multi-byte sequences take off what
	// they over-count.
	n := len(s)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			// Skip whole 8-byte words of ASCII (each byte one unit).
			for i+8 <= len(s) && load64(s[i:i+8])&0x8080808080808080 == 0 {
				i += 8
			}
			continue
		}
		// A valid 2-byte or 3-byte sequence is one unit, a 4-byte one a
		// surrogate pair (two units). Anything else is an invalid byte:
		// one unit, and decoding resumes at the next byte, as in
		// utf8.DecodeRuneInString. The accepted ranges are those of RFC
		// 3629 (no overlongs, no surrogates, nothing above U+10FFFF).
		switch {
		case c < 0xC2: // continuation byte or overlong 2-byte lead
			i++
		case c < 0xE0:
			if i+1 < len(s) && isCont(s[i+1]) {
				n--
				i += 2
			} else {
				i++
			}
		case c < 0xF0:
			lo, hi := byte(0x80), byte(0xBF)
			if c == 0xE0 {
				lo = 0xA0 // no overlongs
			} else if c == 0xED {
				hi = 0x9F // no surrogates
			}
			if i+2 < len(s) && lo <= s[i+1] && s[i+1] <= hi && isCont(s[i+2]) {
				n -= 2
				i += 3
			} else {
				i++
			}
		case c < 0xF5:
			lo, hi := byte(0x80), byte(0xBF)
			if c == 0xF0 {
				lo = 0x90 // no overlongs
			} else if c == 0xF4 {
				hi = 0x8F // nothing above U+10FFFF
			}
			if i+3 < len(s) && lo <= s[i+1] && s[i+1] <= hi && isCont(s[i+2]) && isCont(s[i+3]) {
				n -= 2
				i += 4
			} else {
				i++
			}
		default: // 0xF5..0xFF never appear in UTF-8
			i++
		}
	}
	return n
}

// load64 returns the first 8 bytes of s as a little-endian word; the
// compiler turns it into one load.
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// isCont reports whether b is a UTF-8 continuation byte.
func isCont(b byte) bool { return b&0xC0 == 0x80 }

// UnknownModelRatio is the characters-per-token ratio of a model that
// neither an override nor the built-in table knows.
const UnknownModelRatio = 4.0

// builtinRatios is the built-in table of SPEC F8: characters per token by
// lower-case model-name prefix.
var builtinRatios = []struct {
	prefix string
	ratio  float64
}{
	{"claude-3-5-haiku", 3.8},
	{"claude-3-5-sonnet", 3.9},
	{"claude-3-opus", 3.9},
	{"claude-3-sonnet", 3.9},
	{"claude-3-haiku", 3.8},
	{"claude-sonnet-4", 3.9},
	{"claude-opus-4", 3.9},
	{"claude-haiku-4", 3.8},
	{"claude-sonnet-4-5", 3.9},
	{"claude-opus-4-5", 3.9},
	{"claude-haiku-4-5", 3.8},
	{"gpt-4o", 3.7},
	{"gpt-4-turbo", 3.7},
	{"gpt-4.1", 3.7},
	{"gpt-4", 3.7},
	{"gpt-3.5", 3.8},
	{"o1", 3.7},
	{"o3", 3.7},
	{"o4-mini", 3.7},
	{"gemini-2.5", 3.8},
	{"gemini-2", 3.8},
	{"gemini-1.5", 3.8},
}

// byLength is builtinRatios with the longest prefixes first, so the first
// match is the longest.
var byLength = func() []int {
	idx := make([]int, len(builtinRatios))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Compare(len(builtinRatios[b].prefix), len(builtinRatios[a].prefix))
	})
	return idx
}()

// BuiltinRatio returns the characters-per-token ratio that the built-in
// table gives model: that of the longest table prefix that model starts
// with, compared case-insensitively, and true; or [UnknownModelRatio] and
// false when no prefix matches. "claude-sonnet-4-5-20250929" matches
// "claude-sonnet-4-5" rather than "claude-sonnet-4".
func BuiltinRatio(model string) (float64, bool) {
	if i := builtinMatch(model); i >= 0 {
		return builtinRatios[i].ratio, true
	}
	return UnknownModelRatio, false
}

// builtinMatch returns the index in builtinRatios of the longest prefix of
// model, compared case-insensitively, or -1.
func builtinMatch(model string) int {
	if !isASCII(model) {
		// Rare: Unicode case mapping can change lengths (the Kelvin sign
		// lowers to 'k'), so lower the whole name first.
		model = strings.ToLower(model)
	}
	for _, i := range byLength {
		if hasPrefixFold(model, builtinRatios[i].prefix) {
			return i
		}
	}
	return -1
}

// maxStackKey is the longest model name lower-cased without allocating.
const maxStackKey = 64

// LookupLower looks the lower-cased model up in m, when lower-casing changes
// it (the name as given has already been looked up). It allocates only for
// a non-ASCII name or an ASCII name longer than maxStackKey bytes.
func LookupLower[V any](m map[string]V, model string) (V, bool) {
	var zero V
	if !isASCII(model) {
		lower := strings.ToLower(model)
		if lower == model {
			return zero, false
		}
		v, ok := m[lower]
		return v, ok
	}
	if !hasUpperASCII(model) {
		return zero, false
	}
	if len(model) > maxStackKey {
		v, ok := m[strings.ToLower(model)]
		return v, ok
	}
	var buf [maxStackKey]byte
	k := buf[:len(model)]
	for i := 0; i < len(model); i++ {
		c := model[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		k[i] = c
	}
	v, ok := m[string(k)] // the compiler does not allocate for this lookup
	return v, ok
}

// isASCII reports whether s has only ASCII bytes.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// hasUpperASCII reports whether s has an ASCII upper-case letter.
func hasUpperASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
// prefix must be lower-case.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// AddInt64 returns a + b for non-negative a and b, and false on overflow.
func AddInt64(a, b int64) (int64, bool) {
	s := a + b
	return s, s >= a
}

// ceilTolerance is the relative distance to an integer under which a
// floating-point result is taken to be that integer.
const ceilTolerance = 1e-12

// CeilTokens rounds a non-negative token count up to an integer, robustly:
// a value within a relative 1e-12 of an integer is that integer, so that
// floating-point noise such as 21/0.7 = 30.000000000000004 or 30*1.1 =
// 33.00000000000001 does not reserve an extra token. It reports false when
// the result does not fit an int64.
//
// One division or multiplication of float64 values is off by a few parts
// in 1e16, far below the tolerance; a genuinely fractional count is only
// mistaken for an integer when it is above about 1e10 tokens.
func CeilTokens(x float64) (int64, bool) {
	if !(x >= 0) { // NaN or negative: cannot happen with validated inputs
		return 0, false
	}
	c := math.Round(x)
	if math.Abs(x-c) > c*ceilTolerance {
		c = math.Ceil(x)
	}
	if c >= 0x1p63 {
		return 0, false
	}
	return int64(c), true
}
