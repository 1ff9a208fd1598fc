package stream

import (
	"bytes"

	"github.com/llmbulkhead/bulkhead/internal/jsondom"
)

// template is the fast path for the common event: a provider's serialiser
// writes every text delta of a stream the same way, so consecutive
// deltas differ only in their text (and, for OpenAI, in an "obfuscation"
// padding string). The template keeps the bytes around the text string
// of the last event that carried nothing but one text value: pre before
// it, then mid, then (with hole2) another string and post.
//
// An event made of exactly those bytes with other strings in the holes
// parses to the same tree with other string values, since replacing one
// complete string token by another changes no other token: it says what
// the template's event said, with this text. So match needs no parse
// beyond checking that each hole holds exactly one valid string; anything
// else goes the slow way, which learns the new shape.
type template struct {
	on      bool // the format's events may be read this way
	ok      bool // a template has been learnt
	hasName bool
	name    []byte
	pre     []byte
	mid     []byte
	post    []byte
	hole2   bool
	started bool // the template's event showed that generation started
}

// learn makes the template from a pure event (see eventInfo.pure), parsed
// into root.
func (t *template) learn(name, data []byte, root jsondom.Value, e *eventInfo) {
	hs := e.hole.Offset()
	he := hs + len(e.hole.Raw())
	t.ok, t.started = true, e.started
	t.hasName = name != nil
	t.name = append(t.name[:0], name...)
	t.pre = append(t.pre[:0], data[:hs]...)
	t.hole2 = false
	if o := root.Get("obfuscation"); o.Kind() == jsondom.String && o.Offset() >= he {
		os := o.Offset()
		t.hole2 = true
		t.mid = append(t.mid[:0], data[he:os]...)
		t.post = append(t.post[:0], data[os+len(o.Raw()):]...)
	} else {
		t.mid = append(t.mid[:0], data[he:]...)
	}
}

// match reads an event by the template: ok is false when it does not fit,
// else chars is the UTF-16 length of its text. d is scratch.
func (t *template) match(name, data []byte, d *jsondom.Doc) (chars int64, ok bool) {
	if !t.ok || t.hasName != (name != nil) || !bytes.Equal(t.name, name) || !bytes.HasPrefix(data, t.pre) {
		return 0, false
	}
	rest := data[len(t.pre):]
	q := closingQuote(rest)
	if q < 0 {
		return 0, false
	}
	text, rest := rest[:q+1], rest[q+1:]
	if !t.hole2 {
		if !bytes.Equal(rest, t.mid) {
			return 0, false
		}
	} else {
		if len(rest) < len(t.mid)+len(t.post) || !bytes.HasPrefix(rest, t.mid) || !bytes.HasSuffix(rest, t.post) {
			return 0, false
		}
		if !isString(d, rest[len(t.mid):len(rest)-len(t.post)]) {
			return 0, false
		}
	}
	if !isString(d, text) {
		return 0, false
	}
	return int64(d.Root().UTF16Len()), true
}

// closingQuote returns the index of the quote that closes the string b
// starts with, or -1 when b does not start with a quote or the string does
// not end in b.
func closingQuote(b []byte) int {
	if len(b) == 0 || b[0] != '"' {
		return -1
	}
	for i := 1; ; {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		k := i + j
		bs := 0
		for bs < k-1 && b[k-1-bs] == '\\' {
			bs++
		}
		if bs%2 == 0 {
			return k
		}
		i = k + 1
	}
}

// isString reports whether b is exactly one valid JSON string, leaving it
// parsed in d.
func isString(d *jsondom.Doc, b []byte) bool {
	return jsondom.Parse(d, b) == nil && d.Root().Kind() == jsondom.String
}
