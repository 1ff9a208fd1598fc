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
// beyond checking that each hole holds exactly one valid string (with no
// whitespace around it); anything else goes the slow way, which learns the
// new shape.
//
// The template also has the event's bytes on the wire, when the event was
// one "event:" line (if it had a type), one "data: " line and a blank line,
// all ending in LF: matchBlock reads a whole block of lines with the same
// bytes around the holes, without looking for its line ends first. A
// string token holds no raw line end, so such a block has the same lines.
type template struct {
	on      bool // the format's events may be read this way
	ok      bool // a template has been learnt
	hasName bool
	name    []byte
	hole2   bool  // there is a second hole, for the obfuscation string
	data    shape // the event's data
	started bool  // the template's event showed that generation started
	block   bool  // the event had a block of its own: wire is set
	wire    shape // the block: "event: <name>\n" (with a name), "data: ", the data and "\n\n"
	head    int   // the length of the block's bytes before the data
}

// shape is a template's fixed bytes: pre before the text string, then mid,
// then (with a second hole) a string and post.
type shape struct{ pre, mid, post []byte }

// learn makes the template from a pure event (see eventInfo.pure), parsed
// into root.
func (t *template) learn(name, data []byte, root jsondom.Value, e *eventInfo) {
	hs := e.hole.Offset()
	he := hs + len(e.hole.Raw())
	t.ok, t.started = true, e.started
	t.hasName = name != nil
	t.name = append(t.name[:0], name...)
	d, w := &t.data, &t.wire
	d.pre = append(d.pre[:0], data[:hs]...)
	t.hole2 = false
	if o := root.Get("obfuscation"); o.Kind() == jsondom.String && o.Offset() >= he {
		os := o.Offset()
		t.hole2 = true
		d.mid = append(d.mid[:0], data[he:os]...)
		d.post = append(d.post[:0], data[os+len(o.Raw()):]...)
	} else {
		d.mid = append(d.mid[:0], data[he:]...)
	}
	// A name or data with line ends of its own has no such block.
	t.block = !bytes.ContainsAny(data, "\r\n") && !bytes.ContainsAny(name, "\r\n")
	w.pre = w.pre[:0]
	if t.hasName {
		w.pre = append(append(append(w.pre, "event: "...), name...), '\n')
	}
	w.pre = append(w.pre, "data: "...)
	t.head = len(w.pre)
	w.pre = append(w.pre, d.pre...)
	w.mid = append(w.mid[:0], d.mid...)
	w.post = append(w.post[:0], d.post...)
	if t.hole2 {
		w.post = append(w.post, "\n\n"...)
	} else {
		w.mid = append(w.mid, "\n\n"...)
	}
}

// scan matches the shape's bytes at the start of d: end is where they
// end, chars the UTF-16 length of the text.
func (s *shape) scan(d []byte, hole2 bool) (end int, chars int64, ok bool) {
	if !bytes.HasPrefix(d, s.pre) {
		return 0, 0, false
	}
	i := len(s.pre)
	size, n, ok := jsondom.ScanString(d[i:])
	if !ok || !bytes.HasPrefix(d[i+size:], s.mid) {
		return 0, 0, false
	}
	i += size + len(s.mid)
	if hole2 {
		if size, _, ok = jsondom.ScanString(d[i:]); !ok || !bytes.HasPrefix(d[i+size:], s.post) {
			return 0, 0, false
		}
		i += size + len(s.post)
	}
	return i, int64(n), true
}

// match reads an event by the template: ok is false when it does not fit,
// else chars is the UTF-16 length of its text.
func (t *template) match(name, data []byte) (chars int64, ok bool) {
	if !t.ok || t.hasName != (name != nil) || !bytes.Equal(t.name, name) {
		return 0, false
	}
	end, chars, ok := t.data.scan(data, t.hole2)
	return chars, ok && end == len(data)
}

// matchBlock reads a block of lines at the start of b by the template's
// wire form: size is the block's length, blank line included, data its
// data, and chars the UTF-16 length of its text; ok is false when it does
// not fit.
func (t *template) matchBlock(b []byte) (size int, data []byte, chars int64, ok bool) {
	if !t.ok || !t.block {
		return 0, nil, 0, false
	}
	end, chars, ok := t.wire.scan(b, t.hole2)
	if !ok {
		return 0, nil, 0, false
	}
	return end, b[t.head : end-2], chars, true
}
