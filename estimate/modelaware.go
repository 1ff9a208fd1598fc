package estimate

import (
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/tokens"
)

// OpaqueSurcharge is the number of input tokens charged for each opaque
// block: a block of messages or of the system prompt whose Type is not
// "text" (an image, a document, a tool call, or a malformed block with an
// empty Type). Opaque blocks have no text to count, so they are charged a
// flat amount instead.
//
// The zero value charges nothing. For a flat surcharge set only Default.
type OpaqueSurcharge struct {
	// Default is charged for an opaque block whose Type is not in ByType.
	Default int64

	// ByType charges by block type, for example {"image": 1500}. Keys are
	// matched exactly. A "text" key has no effect: text blocks are counted,
	// not charged.
	ByType map[string]int64
}

// ModelAwareOptions configures [NewModelAware]. The zero value is valid: no
// default model, no overrides, an output cap of 2048, no callback and no
// opaque-block surcharge.
type ModelAwareOptions struct {
	// DefaultModel is the model of a request whose Model is empty. The
	// bulkhead sets it to its Config.Model. A request's own non-empty Model
	// wins.
	DefaultModel string

	// Overrides maps a model name to its characters-per-token ratio and
	// takes precedence over the built-in table. A request's model is looked
	// up exactly as given first, then lower-cased, so lower-case keys match
	// the model in any case. Every ratio must be finite and > 0. The map is
	// copied.
	Overrides map[string]float64

	// OutputCap is the output reservation of a request whose MaxTokens is
	// 0 ("not set"). Zero means [bulkhead.DefaultOutputCap] (2048); negative is
	// invalid.
	OutputCap int64

	// OnUnknownModel, if set, is called with the model name (as given, the
	// empty name included) on every estimate whose model neither an
	// override nor the built-in table knows; the ratio is then 4.0. It is
	// called on the caller's goroutine, possibly from many at once, and
	// should be quick: log or count, do not block.
	OnUnknownModel func(model string)

	// OpaqueBlockTokens is the surcharge for opaque blocks. Its numbers
	// must be non-negative. ByType is copied.
	OpaqueBlockTokens OpaqueSurcharge
}

// ModelAware is the default estimator: it divides the request's characters
// by a per-model characters-per-token ratio.
//
// The model is the request's Model, or DefaultModel when that is empty. Its
// ratio is, in order: an exact match in Overrides (the name as given, then
// lower-cased); the longest case-insensitive prefix in the built-in table
// (see [BuiltinRatio]); else 4.0, after calling OnUnknownModel.
//
//	Input     = ceil(req.TextLength() / ratio) + opaque surcharge + req.ExtraInputTokens
//	MaxOutput = req.MaxTokens, or OutputCap when MaxTokens is 0
//
// The division is rounded up robustly: a quotient within floating-point
// noise of an integer is that integer (37 characters at 3.7 is exactly 10
// tokens).
//
// Create one with [NewModelAware]; the zero value is not ready for use. A
// ModelAware is immutable and safe for concurrent use. Estimate does not
// allocate, except to lower-case a model name (other than the default
// model) that has non-ASCII characters, or that is longer than 64 bytes
// and has upper-case letters while overrides are configured.
type ModelAware struct {
	defaultModel string
	defaultRatio float64
	defaultKnown bool

	overrides map[string]float64 // nil when empty
	outputCap int64
	onUnknown func(string)

	opaqueDefault int64
	opaqueByType  map[string]int64 // nil when empty
	chargeOpaque  bool             // some opaque block costs something
}

// NewModelAware validates opts and returns a model-aware estimator. An
// invalid option is an *bulkhead.ConfigError naming it, for example
// "ModelAwareOptions.Overrides[\"my-model\"]".
func NewModelAware(opts ModelAwareOptions) (*ModelAware, error) {
	if err := checkNonNegative("ModelAwareOptions.OutputCap", opts.OutputCap); err != nil {
		return nil, err
	}
	m := &ModelAware{
		defaultModel:  opts.DefaultModel,
		outputCap:     opts.OutputCap,
		onUnknown:     opts.OnUnknownModel,
		opaqueDefault: opts.OpaqueBlockTokens.Default,
	}
	if m.outputCap == 0 {
		m.outputCap = bulkhead.DefaultOutputCap
	}
	if len(opts.Overrides) > 0 {
		m.overrides = make(map[string]float64, len(opts.Overrides))
		for _, k := range slices.Sorted(maps.Keys(opts.Overrides)) { // first bad key, deterministically
			r := opts.Overrides[k]
			if !(r > 0) || math.IsInf(r, 0) {
				return nil, invalidf("ModelAwareOptions.Overrides["+strconv.Quote(k)+"]",
					"ratio must be finite and > 0, got %v", r)
			}
			m.overrides[k] = r
		}
	}
	if err := checkNonNegative("ModelAwareOptions.OpaqueBlockTokens.Default", m.opaqueDefault); err != nil {
		return nil, err
	}
	if len(opts.OpaqueBlockTokens.ByType) > 0 {
		m.opaqueByType = make(map[string]int64, len(opts.OpaqueBlockTokens.ByType))
		for _, k := range slices.Sorted(maps.Keys(opts.OpaqueBlockTokens.ByType)) {
			v := opts.OpaqueBlockTokens.ByType[k]
			if err := checkNonNegative("ModelAwareOptions.OpaqueBlockTokens.ByType["+strconv.Quote(k)+"]", v); err != nil {
				return nil, err
			}
			m.opaqueByType[k] = v
			if v > 0 && k != blockTypeText {
				m.chargeOpaque = true
			}
		}
	}
	if m.opaqueDefault > 0 {
		m.chargeOpaque = true
	}
	m.defaultRatio, m.defaultKnown = m.lookup(m.defaultModel)
	return m, nil
}

// Ratio returns the characters-per-token ratio m uses for model, where an
// empty model means the default model, and whether an override or the
// built-in table knows it. It does not call OnUnknownModel.
func (m *ModelAware) Ratio(model string) (float64, bool) {
	if model == "" || model == m.defaultModel {
		return m.defaultRatio, m.defaultKnown
	}
	return m.lookup(model)
}

// Model returns the model an estimate of req is for: req.Model, or the
// default model when that is empty.
func (m *ModelAware) Model(req *bulkhead.Request) string {
	if req == nil || req.Model == "" {
		return m.defaultModel
	}
	return req.Model
}

// Estimate validates req (see [ValidateRequest]) and returns its
// model-aware reservation, Reserved included. See [ModelAware] for the
// rules.
func (m *ModelAware) Estimate(req *bulkhead.Request) (bulkhead.Reservation, error) {
	if err := req.Validate(); err != nil {
		return bulkhead.Reservation{}, err
	}
	model := req.Model
	ratio, known := m.defaultRatio, m.defaultKnown
	if model == "" {
		model = m.defaultModel
	} else if model != m.defaultModel {
		ratio, known = m.lookup(model)
	}
	if !known && m.onUnknown != nil {
		m.onUnknown(model)
	}

	var chars int
	var surcharge int64
	if m.chargeOpaque {
		var ok bool
		if chars, surcharge, ok = m.scan(req); !ok {
			return bulkhead.Reservation{}, errInputOverflow()
		}
	} else {
		chars = req.TextLength()
	}
	textInput, ok := tokens.CeilTokens(float64(chars) / ratio)
	if !ok {
		return bulkhead.Reservation{}, errInputOverflow()
	}
	return finish(textInput, surcharge, req, m.outputCap)
}

// lookup resolves the ratio of a non-default model: override as given,
// override lower-cased, built-in table, else 4.0.
func (m *ModelAware) lookup(model string) (float64, bool) {
	if m.overrides != nil {
		if r, ok := m.overrides[model]; ok {
			return r, true
		}
		if r, ok := tokens.LookupLower(m.overrides, model); ok {
			return r, true
		}
	}
	return tokens.BuiltinRatio(model)
}

// scan returns the text length of req and the surcharge of its opaque
// blocks, and false if the surcharge overflows.
func (m *ModelAware) scan(req *bulkhead.Request) (int, int64, bool) {
	chars, surcharge, ok := m.scanBlocks(req.SystemBlocks, UTF16Len(req.System), 0, true)
	for i := range req.Messages {
		msg := &req.Messages[i]
		chars, surcharge, ok = m.scanBlocks(msg.Blocks, chars+UTF16Len(msg.Content), surcharge, ok)
	}
	return chars, surcharge, ok
}

// scanBlocks adds the text length and the opaque surcharge of bs to chars
// and surcharge; ok turns false when the surcharge overflows.
func (m *ModelAware) scanBlocks(bs []bulkhead.Block, chars int, surcharge int64, ok bool) (int, int64, bool) {
	for i := range bs {
		b := &bs[i]
		if b.Type == blockTypeText {
			chars += UTF16Len(b.Text)
			continue
		}
		cost := m.opaqueDefault
		if m.opaqueByType != nil {
			if v, found := m.opaqueByType[b.Type]; found {
				cost = v
			}
		}
		var fits bool
		if surcharge, fits = tokens.AddInt64(surcharge, cost); !fits {
			ok = false
		}
	}
	return chars, surcharge, ok
}

// UnknownModelRatio is the characters-per-token ratio of a model that
// neither an override nor the built-in table knows.
const UnknownModelRatio = tokens.UnknownModelRatio

// BuiltinRatio returns the characters-per-token ratio that the built-in
// table gives model: that of the longest table prefix that model starts
// with, compared case-insensitively, and true; or UnknownModelRatio and
// false when no prefix matches. "claude-sonnet-4-5-20250929" matches
// "claude-sonnet-4-5" rather than "claude-sonnet-4".
func BuiltinRatio(model string) (float64, bool) { return tokens.BuiltinRatio(model) }
