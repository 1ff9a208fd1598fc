// Package estimate turns an LLM request into a token reservation: how many
// input tokens the call will likely consume plus the most output it may
// produce (SPEC F8, F9, F10).
//
// Three estimators are provided:
//
//   - [Naive]: one token per four characters, plus the request's
//     ExtraInputTokens; output is the request's MaxTokens or 2048.
//   - [ModelAware] (the bulkhead's default): a characters-per-token ratio
//     looked up per model (explicit overrides first, then the longest
//     matching prefix of a built-in table, else 4.0), a surcharge for opaque
//     blocks such as images, and a configurable output cap.
//   - [Adaptive]: a ModelAware estimator that learns a per-model correction
//     of the input estimate from the usage providers actually report.
//
// Characters are counted in UTF-16 code units, like JavaScript's
// String.length, so the ratios give the same token counts as the reference
// library on any text (see [UTF16Len] and [TextLength]).
//
// [Reserve] is the one function the admission path calls: it validates the
// request, applies a per-call reservation override or runs the estimator
// once, and validates the result, so a bad request, override or estimate is
// an error (matching [bulkhead.ErrInvalid]) and never an bulkhead.
//
// Estimators built here are safe for concurrent use and do not allocate on
// the common path.
package estimate
