package estimate

import (
	"unicode/utf8"

	"github.com/llmbulkhead/bulkhead/admission"
)

// blockTypeText is the Block.Type whose Text is counted. Every other type,
// the empty one included, is opaque.
const blockTypeText = "text"

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

// TextLength returns the number of characters, in UTF-16 code units (see
// [UTF16Len]), of all the text in req: System, the Text of the "text"
// blocks of SystemBlocks, and of every message its Content and the Text of
// its "text" blocks. Opaque blocks (any other Type, the empty Type
// included) contribute nothing here; [ModelAware] charges them a
// surcharge instead. A nil request has length 0.
//
// TextLength does not allocate.
func TextLength(req *admission.Request) int {
	if req == nil {
		return 0
	}
	n := UTF16Len(req.System) + blocksLength(req.SystemBlocks)
	for i := range req.Messages {
		m := &req.Messages[i]
		n += UTF16Len(m.Content) + blocksLength(m.Blocks)
	}
	return n
}

// blocksLength returns the UTF-16 length of the text blocks of bs.
func blocksLength(bs []admission.Block) int {
	n := 0
	for i := range bs {
		if bs[i].Type == blockTypeText {
			n += UTF16Len(bs[i].Text)
		}
	}
	return n
}
