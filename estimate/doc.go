// Package estimate turns an LLM request into a token reservation: how many
// input tokens the call will likely consume plus the most output it may
// produce.
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
// Characters are counted in UTF-16 code units (see [UTF16Len] and
// bulkhead.Request.TextLength), the unit the built-in ratios are measured
// in.
//
// Every estimator here implements bulkhead.Estimator: set one as
// bulkhead.TokenBudget.Estimator. The bulkhead validates what an estimator
// returns, so a bad request or estimate is an error (matching
// bulkhead.ErrInvalid) and never an admission.
//
// Estimators built here are safe for concurrent use and do not allocate on
// the common path.
package estimate
