// Package jsondom is a small, fast JSON reader for the stream adapters: it
// parses a document into a flat tree of spans over the source bytes, with no
// allocation per value, so request bodies and stream events can be read at
// memory speed and navigated by key.
//
// Strings are not decoded until asked for; UTF16Len measures one without
// decoding it. Errors name the JSON path where parsing failed.
package jsondom

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/llmbulkhead/bulkhead/internal/tokens"
)

// MaxDepth is the deepest nesting of arrays and objects Parse accepts.
const MaxDepth = 512

// Kind is the type of a JSON value.
type Kind uint8

// The kinds. Missing is the kind of a value that is not there (a key not in
// an object, an index past the end).
const (
	Missing Kind = iota
	Null
	Bool
	Number
	String
	Array
	Object
)

// String names the kind as a JSON type, for error messages.
func (k Kind) String() string {
	switch k {
	case Null:
		return "null"
	case Bool:
		return "a boolean"
	case Number:
		return "a number"
	case String:
		return "a string"
	case Array:
		return "an array"
	case Object:
		return "an object"
	}
	return "missing"
}

type node struct {
	start, end       int32 // the value's span (a string's includes its quotes)
	keyStart, keyEnd int32 // a member's key span, quotes excluded; 0,0 if none
	first, next      int32 // first child, next sibling; -1 for none
	count            int32 // number of children
	kind             Kind
	esc, keyEsc      bool // the string (the key) has escapes
}

// Doc is a parsed document. Its Values point into the source bytes, which must
// not change while the Doc is in use. A Doc may be reused for the next Parse.
type Doc struct {
	src   []byte
	nodes []node
}

// SyntaxError is a document that is not valid JSON.
type SyntaxError struct {
	// Offset is the byte offset of the problem.
	Offset int
	// Path is the JSON path of the value being read, such as
	// "messages[2].content", or "" at the top level.
	Path string
	// Msg says what is wrong.
	Msg string
}

func (e *SyntaxError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("invalid JSON at offset %d: %s", e.Offset, e.Msg)
	}
	return fmt.Sprintf("invalid JSON at %s (offset %d): %s", e.Path, e.Offset, e.Msg)
}

// Parse parses src into d, replacing what d held. Trailing whitespace is
// allowed, anything else after the value is an error.
func Parse(d *Doc, src []byte) error {
	if len(src) > 1<<31-2 {
		return &SyntaxError{Offset: 0, Msg: "document larger than 2 GiB"}
	}
	d.src = src
	d.nodes = d.nodes[:0]
	p := parser{d: d, src: src}
	p.skipSpace()
	if _, err := p.value(0); err != nil {
		return err
	}
	p.skipSpace()
	if p.i < len(src) {
		return p.errorf("unexpected %s after the top-level value", quoteByte(src[p.i]))
	}
	return nil
}

type parser struct {
	d   *Doc
	src []byte
	i   int
}

func (p *parser) errorf(format string, args ...any) *SyntaxError {
	return &SyntaxError{Offset: p.i, Msg: fmt.Sprintf(format, args...)}
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func (p *parser) skipSpace() {
	for p.i < len(p.src) {
		switch p.src[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) add(k Kind, start int) int32 {
	p.d.nodes = append(p.d.nodes, node{start: int32(start), kind: k, first: -1, next: -1})
	return int32(len(p.d.nodes) - 1)
}

// value parses the value at p.i (after whitespace) and returns its node.
func (p *parser) value(depth int) (int32, error) {
	if p.i >= len(p.src) {
		return -1, p.errorf("unexpected end of input, want a value")
	}
	start := p.i
	switch c := p.src[p.i]; c {
	case '{':
		return p.object(depth)
	case '[':
		return p.array(depth)
	case '"':
		n := p.add(String, start)
		esc, err := p.str()
		if err != nil {
			return -1, err
		}
		nd := &p.d.nodes[n]
		nd.end, nd.esc = int32(p.i), esc
		return n, nil
	case 't':
		return p.literal("true", Bool)
	case 'f':
		return p.literal("false", Bool)
	case 'n':
		return p.literal("null", Null)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			n := p.add(Number, start)
			if err := p.number(); err != nil {
				return -1, err
			}
			p.d.nodes[n].end = int32(p.i)
			return n, nil
		}
		return -1, p.errorf("unexpected %s, want a value", quoteByte(c))
	}
}

func (p *parser) literal(lit string, k Kind) (int32, error) {
	if !bytes.HasPrefix(p.src[p.i:], []byte(lit)) {
		return -1, p.errorf("invalid literal, want %s", lit)
	}
	n := p.add(k, p.i)
	p.i += len(lit)
	p.d.nodes[n].end = int32(p.i)
	return n, nil
}

func (p *parser) number() error {
	s, i := p.src, p.i
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		p.i = i
		return p.errorf("invalid number")
	}
	if i < len(s) && s[i] == '.' {
		i++
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			p.i = i
			return p.errorf("invalid number: no digits after the decimal point")
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			p.i = i
			return p.errorf("invalid number: no digits in the exponent")
		}
	}
	p.i = i
	return nil
}

// strStop marks the bytes a string scan must stop at.
var strStop = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// str scans the string starting at the quote at p.i and leaves p.i after
// its closing quote. It reports whether the string has escapes.
func (p *parser) str() (bool, error) {
	s := p.src
	i := p.i + 1
	esc := false
	for {
		// Skip eight plain bytes at a time: none below 0x20, no quote,
		// no backslash.
		for i+8 <= len(s) && plain8(binary.LittleEndian.Uint64(s[i:])) {
			i += 8
		}
		for i < len(s) && !strStop[s[i]] {
			i++
		}
		if i >= len(s) {
			p.i = i
			return esc, p.errorf("unterminated string")
		}
		switch c := s[i]; {
		case c == '"':
			p.i = i + 1
			return esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(s) {
				p.i = i
				return esc, p.errorf("unterminated string")
			}
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(s) || !isHex4(s[i+2:i+6]) {
					p.i = i
					return esc, p.errorf(`invalid \u escape`)
				}
				i += 6
			default:
				p.i = i
				return esc, p.errorf("invalid escape %s", quoteByte(s[i+1]))
			}
		default:
			p.i = i
			return esc, p.errorf("control character %s in string", quoteByte(c))
		}
	}
}

// open starts the container of kind k at p.i, after its opening byte and
// whitespace; empty says it closed at once (its closing byte read).
func (p *parser) open(k Kind, closing byte, depth int) (n int32, empty bool, err error) {
	if depth >= MaxDepth {
		return -1, false, p.errorf("nested deeper than %d", MaxDepth)
	}
	n = p.add(k, p.i)
	p.i++
	p.skipSpace()
	if p.i < len(p.src) && p.src[p.i] == closing {
		p.i++
		p.d.nodes[n].end = int32(p.i)
		return n, true, nil
	}
	return n, false, nil
}

// link makes c the child of container n that follows last (-1 for none).
func (p *parser) link(n, last, c int32) {
	if last < 0 {
		p.d.nodes[n].first = c
	} else {
		p.d.nodes[last].next = c
	}
}

// next reads what follows a member of container n (an array or object,
// named what), after whitespace: a comma, or the closing byte, which ends n
// with count members and returns done.
func (p *parser) next(n, count int32, closing byte, what string) (done bool, err error) {
	p.skipSpace()
	if p.i >= len(p.src) {
		return false, p.errorf("unexpected end of input in %s", what)
	}
	switch p.src[p.i] {
	case ',':
		p.i++
		return false, nil
	case closing:
		p.i++
		nd := &p.d.nodes[n]
		nd.end, nd.count = int32(p.i), count
		return true, nil
	}
	return false, p.errorf("unexpected %s in %s, want ',' or '%c'", quoteByte(p.src[p.i]), what, closing)
}

// plain8 reports whether none of the eight bytes of x is a control
// character, a quote or a backslash (the classic SWAR byte tests).
func plain8(x uint64) bool { return stop8(x) == 0 }

// stop8 sets the high bit of the bytes of x that are control characters,
// quotes or backslashes. A borrow may also mark a byte above a marked one,
// so only the lowest mark is sure.
func stop8(x uint64) uint64 {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	less20 := (x - lo*0x20) &^ x & hi
	q := x ^ (lo * '"')
	quote := (q - lo) &^ q & hi
	b := x ^ (lo * '\\')
	bslash := (b - lo) &^ b & hi
	return less20 | quote | bslash
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func (p *parser) array(depth int) (int32, error) {
	n, empty, err := p.open(Array, ']', depth)
	if err != nil || empty {
		return n, err
	}
	last := int32(-1)
	count := int32(0)
	for {
		p.skipSpace()
		c, err := p.value(depth + 1)
		if err != nil {
			return -1, inPath(err, "["+strconv.Itoa(int(count))+"]")
		}
		p.link(n, last, c)
		last = c
		count++
		if done, err := p.next(n, count, ']', "array"); err != nil {
			return -1, err
		} else if done {
			return n, nil
		}
	}
}

func (p *parser) object(depth int) (int32, error) {
	n, empty, err := p.open(Object, '}', depth)
	if err != nil || empty {
		return n, err
	}
	last := int32(-1)
	count := int32(0)
	for {
		p.skipSpace()
		if p.i >= len(p.src) || p.src[p.i] != '"' {
			if p.i >= len(p.src) {
				return -1, p.errorf("unexpected end of input in object, want a key")
			}
			return -1, p.errorf("unexpected %s in object, want a key", quoteByte(p.src[p.i]))
		}
		ks := p.i
		kesc, err := p.str()
		if err != nil {
			return -1, err
		}
		ke := p.i
		p.skipSpace()
		if p.i >= len(p.src) || p.src[p.i] != ':' {
			return -1, inPath(p.errorf("want ':' after the key"), keySegment(p.src[ks+1:ke-1], kesc))
		}
		p.i++
		p.skipSpace()
		c, err := p.value(depth + 1)
		if err != nil {
			return -1, inPath(err, keySegment(p.src[ks+1:ke-1], kesc))
		}
		nd := &p.d.nodes[c]
		nd.keyStart, nd.keyEnd, nd.keyEsc = int32(ks+1), int32(ke-1), kesc
		p.link(n, last, c)
		last = c
		count++
		if done, err := p.next(n, count, '}', "object"); err != nil {
			return -1, err
		} else if done {
			return n, nil
		}
	}
}

func keySegment(raw []byte, esc bool) string {
	k := string(raw)
	if esc {
		k = unescape(raw)
	}
	return "." + k
}

// inPath prefixes err's path with seg.
func inPath(err error, seg string) error {
	se, ok := err.(*SyntaxError)
	if !ok {
		return err
	}
	if se.Path == "" || se.Path[0] == '[' {
		se.Path = seg + se.Path
	} else {
		se.Path = seg + "." + se.Path
	}
	if se.Path[0] == '.' {
		se.Path = se.Path[1:]
	}
	return se
}

// Value is one value of a Doc, or a missing one (the zero Value).
type Value struct {
	d *Doc
	i int32
}

// maxKeptNodes is the most node storage Reset keeps: 64Ki nodes, 2 MiB.
const maxKeptNodes = 1 << 16

// Reset empties d: it drops the source, so that a Doc kept for reuse (in a
// sync.Pool, say) does not keep the source alive, and drops the values'
// storage when it is over 2 MiB, so that one huge document does not stay
// pooled. Values of d must not be used after Reset.
func (d *Doc) Reset() {
	d.src = nil
	if cap(d.nodes) > maxKeptNodes {
		d.nodes = nil
	}
	d.nodes = d.nodes[:0]
}

// Root returns the document's top-level value.
func (d *Doc) Root() Value {
	if len(d.nodes) == 0 {
		return Value{}
	}
	return Value{d: d, i: 0}
}

func (v Value) n() *node { return &v.d.nodes[v.i] }

// Kind returns v's kind, Missing for a missing value.
func (v Value) Kind() Kind {
	if v.d == nil {
		return Missing
	}
	return v.n().kind
}

// Exists reports whether v is there (null counts as there).
func (v Value) Exists() bool { return v.d != nil }

// IsNull reports whether v is missing or null.
func (v Value) IsNull() bool { k := v.Kind(); return k == Missing || k == Null }

// Raw returns v's bytes in the source, nil for a missing value.
func (v Value) Raw() []byte {
	if v.d == nil {
		return nil
	}
	nd := v.n()
	return v.d.src[nd.start:nd.end]
}

// Offset returns the byte offset of v in the source, -1 for a missing value.
func (v Value) Offset() int {
	if v.d == nil {
		return -1
	}
	return int(v.n().start)
}

// Len returns the number of elements or members of an array or object, 0
// for anything else.
func (v Value) Len() int {
	if v.d == nil {
		return 0
	}
	return int(v.n().count)
}

// First returns the first element or member of an array or object.
func (v Value) First() Value {
	if v.d == nil || v.n().first < 0 {
		return Value{}
	}
	return Value{d: v.d, i: v.n().first}
}

// Next returns the next element or member after v in its parent.
func (v Value) Next() Value {
	if v.d == nil || v.n().next < 0 {
		return Value{}
	}
	return Value{d: v.d, i: v.n().next}
}

// Key returns the key of an object member, "" otherwise.
func (v Value) Key() string {
	if v.d == nil {
		return ""
	}
	nd := v.n()
	raw := v.d.src[nd.keyStart:nd.keyEnd]
	if nd.keyEsc {
		return unescape(raw)
	}
	return string(raw)
}

func (v Value) keyIs(key string) bool {
	nd := v.n()
	raw := v.d.src[nd.keyStart:nd.keyEnd]
	if nd.keyEsc {
		return unescape(raw) == key
	}
	return string(raw) == key // no allocation: the compiler compares in place
}

// Get returns the member key of an object: the last one when the key
// repeats, as most JSON decoders do. It is missing when v is not an object or
// has no such member.
func (v Value) Get(key string) Value {
	if v.Kind() != Object {
		return Value{}
	}
	nodes := v.d.nodes
	found := int32(-1)
	for c := nodes[v.i].first; c >= 0; c = nodes[c].next {
		nd := &nodes[c]
		// A key without escapes is as long as it is in the source: most
		// members are told apart by length alone.
		if (nd.keyEsc || int(nd.keyEnd-nd.keyStart) == len(key)) && (Value{v.d, c}).keyIs(key) {
			found = c
		}
	}
	if found < 0 {
		return Value{}
	}
	return Value{d: v.d, i: found}
}

// Index returns element i of an array, missing when out of range.
func (v Value) Index(i int) Value {
	if v.Kind() != Array || i < 0 {
		return Value{}
	}
	e := v.First()
	for ; i > 0 && e.Exists(); i-- {
		e = e.Next()
	}
	return e
}

// Str returns a string value, decoded; ok is false when v is not a string.
func (v Value) Str() (s string, ok bool) {
	if v.Kind() != String {
		return "", false
	}
	nd := v.n()
	raw := v.d.src[nd.start+1 : nd.end-1]
	if nd.esc {
		return unescape(raw), true
	}
	return string(raw), true
}

// StrShared is Str without the copy: a string with no escapes is returned
// as a view of the source bytes, so it is valid only as long as the source
// is never written again. A string with escapes is decoded into new memory.
// Use it only on a source nobody will change.
func (v Value) StrShared() (s string, ok bool) {
	if v.Kind() != String {
		return "", false
	}
	nd := v.n()
	if nd.esc {
		return unescape(v.d.src[nd.start+1 : nd.end-1]), true
	}
	if nd.end-nd.start == 2 {
		return "", true
	}
	return unsafe.String(&v.d.src[nd.start+1], nd.end-nd.start-2), true
}

// Arena is storage for decoded strings: StrIn decodes strings with escapes
// into it, so that many of them share a few allocations. The zero Arena is
// ready to use. Strings from an Arena stay valid as long as they are used;
// an Arena is not safe for concurrent use.
type Arena struct {
	buf []byte // the current block; bytes below len are taken
}

// minArenaBlock and maxArenaBlock bound the size of an Arena's blocks,
// which double from the one to the other.
const minArenaBlock, maxArenaBlock = 512, 64 << 10

// StrIn is StrShared, except that a string with escapes is decoded into a
// rather than into memory of its own.
func (v Value) StrIn(a *Arena) (s string, ok bool) {
	if v.Kind() != String || !v.n().esc {
		return v.StrShared()
	}
	nd := v.n()
	raw := v.d.src[nd.start+1 : nd.end-1] // decoding never makes a string longer
	if cap(a.buf)-len(a.buf) < len(raw) {
		size := min(max(2*cap(a.buf), minArenaBlock), maxArenaBlock)
		a.buf = make([]byte, 0, max(size, len(raw)))
	}
	start := len(a.buf)
	a.buf = appendUnescaped(a.buf, raw)
	b := a.buf[start:]
	return unsafe.String(unsafe.SliceData(b), len(b)), true
}

// StrIs reports whether v is the string s, without allocating for a string
// with no escapes.
func (v Value) StrIs(s string) bool {
	if v.Kind() != String {
		return false
	}
	nd := v.n()
	raw := v.d.src[nd.start+1 : nd.end-1]
	if nd.esc {
		return unescape(raw) == s
	}
	return string(raw) == s
}

// UTF16Len returns the length of a string value, decoded, in UTF-16 code
// units, without decoding it; 0 when v is not a string.
func (v Value) UTF16Len() int {
	if v.Kind() != String {
		return 0
	}
	nd := v.n()
	raw := v.d.src[nd.start+1 : nd.end-1]
	if !nd.esc {
		return tokens.UTF16Len(view(raw))
	}
	return escapedUTF16Len(raw)
}

// view returns b as a string without copying it, for functions that read
// the string and do not keep it.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func escapedUTF16Len(raw []byte) int {
	n := 0
	for len(raw) > 0 {
		j := bytes.IndexByte(raw, '\\')
		if j < 0 {
			return n + tokens.UTF16Len(view(raw))
		}
		n += tokens.UTF16Len(view(raw[:j]))
		if j+1 < len(raw) && raw[j+1] == 'u' {
			raw = raw[min(j+6, len(raw)):] // each \u escape is one unit
		} else {
			raw = raw[min(j+2, len(raw)):]
		}
		n++
	}
	return n
}

// Bool returns a boolean value; ok is false when v is not a boolean.
func (v Value) Bool() (b, ok bool) {
	if v.Kind() != Bool {
		return false, false
	}
	return v.d.src[v.n().start] == 't', true
}

// Int returns a number that is an integer in int64 range (1e3 and 100.0
// count as integers); ok is false otherwise.
func (v Value) Int() (int64, bool) {
	if v.Kind() != Number {
		return 0, false
	}
	raw := v.Raw()
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, true
	}
	return exactInt(string(raw))
}

// exactInt returns the JSON number s when it is exactly an integer in int64
// range, written with a fraction or an exponent (1e3, 100.0): decided on
// its digits, not through a float64, so 1e-400 and 1.0000000000000000001
// are not integers.
func exactInt(s string) (int64, bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(s[i+1:])
		if err != nil || e > 1000 || e < -1000 {
			return 0, false
		}
		mant, exp = s[:i], e
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	exp -= len(frac)
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		exp++
	}
	if digits == "" {
		return 0, true
	}
	if exp < 0 || len(digits)+exp > 19 {
		return 0, false
	}
	digits += strings.Repeat("0", exp)
	if neg {
		digits = "-" + digits
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, err == nil
}

// unescape decodes the body of a JSON string that has escapes. Invalid
// surrogates decode to U+FFFD.
func unescape(raw []byte) string {
	b := appendUnescaped(make([]byte, 0, len(raw)), raw)
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is never written again
}

// appendUnescaped appends the decoded body of a JSON string to b.
func appendUnescaped(b, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			j := bytes.IndexByte(raw[i:], '\\')
			if j < 0 {
				j = len(raw) - i
			}
			b = append(b, raw[i:i+j]...)
			i += j
			continue
		}
		if i+1 >= len(raw) {
			break
		}
		switch raw[i+1] {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			if i+6 > len(raw) {
				i = len(raw)
				continue
			}
			r := rune(hex4(raw[i+2 : i+6]))
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, rune(hex4(raw[i+2:i+6]))); r2 != utf8.RuneError {
						b = utf8.AppendRune(b, r2)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			b = utf8.AppendRune(b, r)
			continue
		default: // '"', '\\', '/'
			b = append(b, raw[i+1])
		}
		i += 2
	}
	return b
}

func hex4(b []byte) int {
	n := 0
	for _, c := range b {
		n <<= 4
		switch {
		case c >= '0' && c <= '9':
			n |= int(c - '0')
		case c >= 'a' && c <= 'f':
			n |= int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			n |= int(c-'A') + 10
		}
	}
	return n
}

// AppendCanonical appends v in a canonical form: no whitespace, the members
// of every object sorted by key (decoded, byte-wise; members with equal keys
// keep their order). Strings and numbers are copied as they are in the
// source.
func (v Value) AppendCanonical(dst []byte) []byte {
	if v.d == nil {
		return dst
	}
	switch v.Kind() {
	case Array:
		dst = append(dst, '[')
		for e := v.First(); e.Exists(); e = e.Next() {
			if e.i != v.n().first {
				dst = append(dst, ',')
			}
			dst = e.AppendCanonical(dst)
		}
		return append(dst, ']')
	case Object:
		type member struct {
			key []byte // decoded, for sorting
			v   Value
		}
		var buf [16]member
		ms := buf[:0]
		sorted := true
		for m := v.First(); m.Exists(); m = m.Next() {
			nd := m.n()
			k := m.d.src[nd.keyStart:nd.keyEnd]
			if nd.keyEsc {
				k = []byte(unescape(k))
			}
			if len(ms) > 0 && bytes.Compare(ms[len(ms)-1].key, k) > 0 {
				sorted = false
			}
			ms = append(ms, member{k, m})
		}
		if !sorted {
			slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
		}
		dst = append(dst, '{')
		for i, m := range ms {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendKey(dst, m.v)
			dst = append(dst, ':')
			dst = m.v.AppendCanonical(dst)
		}
		return append(dst, '}')
	default:
		return append(dst, v.Raw()...)
	}
}

// appendKey appends the key of member m as a JSON string: as in the source
// when it has no escapes, else re-encoded from its decoded form.
func appendKey(dst []byte, m Value) []byte {
	nd := m.n()
	if !nd.keyEsc {
		dst = append(dst, '"')
		dst = append(dst, m.d.src[nd.keyStart:nd.keyEnd]...)
		return append(dst, '"')
	}
	// As written: decoding and re-encoding would merge keys that differ
	// (lone surrogates and invalid bytes all decode to U+FFFD).
	dst = append(dst, '"')
	dst = append(dst, m.d.src[nd.keyStart:nd.keyEnd]...)
	return append(dst, '"')
}

// ScanString reads the JSON string b starts with (no whitespace before
// it): size is its length in bytes, quotes included, and n its length,
// decoded, in UTF-16 code units, what Value.UTF16Len gives after a Parse.
// ok is false when b does not start with a valid string. It needs no Doc,
// and one pass for a string of plain ASCII.
func ScanString(b []byte) (size, n int, ok bool) {
	if len(b) < 2 || b[0] != '"' {
		return 0, 0, false
	}
	i := 1
	for i+8 <= len(b) { // eight bytes at a time to the first that is not plain ASCII
		x := binary.LittleEndian.Uint64(b[i:])
		if m := stop8(x) | x&0x8080808080808080; m != 0 {
			i += bits.TrailingZeros64(m) / 8
			break
		}
		i += 8
	}
	for ; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, i - 1, true
		case c < 0x20:
			return 0, 0, false
		case c == '\\' || c >= utf8.RuneSelf:
			p := parser{src: b}
			esc, err := p.str()
			if err != nil {
				return 0, 0, false
			}
			raw := b[1 : p.i-1]
			if esc {
				return p.i, escapedUTF16Len(raw), true
			}
			return p.i, tokens.UTF16Len(view(raw)), true
		}
	}
	return 0, 0, false
}
