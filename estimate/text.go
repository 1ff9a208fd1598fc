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
// ASCII text is scanned eight bytes at a time.
func UTF16Len(s string) int {
	n := len(s)
	i := 0
	for i < len(s) {
		// Fast path: skip whole 8-byte words of ASCII. Each ASCII byte is
		// one code unit, which n already counts.
		for i+8 <= len(s) {
			w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
				uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
			if w&0x8080808080808080 != 0 {
				break
			}
			i += 8
		}
		if i >= len(s) {
			break
		}
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		// A multi-byte sequence: n counted one unit per byte so far. A valid
		// 2-byte sequence is 1 unit, a 3-byte one is 1, a 4-byte one is a
		// surrogate pair (2 units). An invalid byte decodes with size 1 and
		// stays 1 unit.
		_, size := utf8.DecodeRuneInString(s[i:])
		switch size {
		case 2:
			n--
		case 3, 4:
			n -= 2
		}
		i += size
	}
	return n
}

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
