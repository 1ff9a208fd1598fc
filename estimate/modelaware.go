package estimate

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/llmbulkhead/bulkhead/admission"
)

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
	// 0 ("not set"). Zero means [DefaultOutputCap] (2048); negative is
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
//	Input     = ceil(TextLength(req) / ratio) + opaque surcharge + req.ExtraInputTokens
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
// invalid option is an *admission.ConfigError naming it, for example
// "ModelAwareOptions.Overrides[\"my-model\"]".
func NewModelAware(opts ModelAwareOptions) (*ModelAware, error) {
	if err := admission.CheckNonNegative("ModelAwareOptions.OutputCap", opts.OutputCap); err != nil {
		return nil, err
	}
	m := &ModelAware{
		defaultModel:  opts.DefaultModel,
		outputCap:     opts.OutputCap,
		onUnknown:     opts.OnUnknownModel,
		opaqueDefault: opts.OpaqueBlockTokens.Default,
	}
	if m.outputCap == 0 {
		m.outputCap = DefaultOutputCap
	}
	if len(opts.Overrides) > 0 {
		m.overrides = make(map[string]float64, len(opts.Overrides))
		for _, k := range slices.Sorted(maps.Keys(opts.Overrides)) { // first bad key, deterministically
			r := opts.Overrides[k]
			if !(r > 0) || math.IsInf(r, 0) {
				return nil, admission.Invalidf("ModelAwareOptions.Overrides["+strconv.Quote(k)+"]",
					"ratio must be finite and > 0, got %v", r)
			}
			m.overrides[k] = r
		}
	}
	if err := admission.CheckNonNegative("ModelAwareOptions.OpaqueBlockTokens.Default", m.opaqueDefault); err != nil {
		return nil, err
	}
	if len(opts.OpaqueBlockTokens.ByType) > 0 {
		m.opaqueByType = make(map[string]int64, len(opts.OpaqueBlockTokens.ByType))
		for _, k := range slices.Sorted(maps.Keys(opts.OpaqueBlockTokens.ByType)) {
			v := opts.OpaqueBlockTokens.ByType[k]
			if err := admission.CheckNonNegative("ModelAwareOptions.OpaqueBlockTokens.ByType["+strconv.Quote(k)+"]", v); err != nil {
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
func (m *ModelAware) Model(req *admission.Request) string {
	if req == nil || req.Model == "" {
		return m.defaultModel
	}
	return req.Model
}

// Estimate validates req (see [ValidateRequest]) and returns its
// model-aware reservation, Reserved included. See [ModelAware] for the
// rules.
func (m *ModelAware) Estimate(req *admission.Request) (admission.Reservation, error) {
	if err := ValidateRequest(req); err != nil {
		return admission.Reservation{}, err
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
			return admission.Reservation{}, errInputOverflow()
		}
	} else {
		chars = TextLength(req)
	}
	textInput, ok := ceilTokens(float64(chars) / ratio)
	if !ok {
		return admission.Reservation{}, errInputOverflow()
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
		if r, ok := lookupLower(m.overrides, model); ok {
			return r, true
		}
	}
	return BuiltinRatio(model)
}

// scan returns the text length of req and the surcharge of its opaque
// blocks, and false if the surcharge overflows.
func (m *ModelAware) scan(req *admission.Request) (int, int64, bool) {
	chars, surcharge, ok := m.scanBlocks(req.SystemBlocks, UTF16Len(req.System), 0, true)
	for i := range req.Messages {
		msg := &req.Messages[i]
		chars, surcharge, ok = m.scanBlocks(msg.Blocks, chars+UTF16Len(msg.Content), surcharge, ok)
	}
	return chars, surcharge, ok
}

// scanBlocks adds the text length and the opaque surcharge of bs to chars
// and surcharge; ok turns false when the surcharge overflows.
func (m *ModelAware) scanBlocks(bs []admission.Block, chars int, surcharge int64, ok bool) (int, int64, bool) {
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
		if surcharge, fits = addInt64(surcharge, cost); !fits {
			ok = false
		}
	}
	return chars, surcharge, ok
}

// maxStackKey is the longest model name lower-cased without allocating.
const maxStackKey = 64

// lookupLower looks the lower-cased model up in m, when lower-casing changes
// it (the name as given has already been looked up). It allocates only for
// a non-ASCII name or an ASCII name longer than maxStackKey bytes.
func lookupLower[V any](m map[string]V, model string) (V, bool) {
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
