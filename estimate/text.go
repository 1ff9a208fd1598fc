package estimate

import "github.com/llmbulkhead/bulkhead/internal/tokens"

// blockTypeText is the Block.Type whose Text is counted. Every other type,
// the empty one included, is opaque.
const blockTypeText = "text"

// UTF16Len returns the length of s in UTF-16 code units, the unit
// tokenizer ratios are measured in: a code point below
// U+10000 counts 1, one at or above it (most emoji, rare CJK ideographs)
// counts 2, and a byte that is not part of a valid UTF-8 sequence counts 1.
// So UTF16Len(s) equals len(utf16.Encode([]rune(s))), without allocating.
func UTF16Len(s string) int { return tokens.UTF16Len(s) }
