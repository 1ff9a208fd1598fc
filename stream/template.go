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
	pre     []byte
	mid     []byte
	post    []byte
	hole2   bool
	started bool   // the template's event showed that generation started
	head    []byte // the block's bytes before pre: "event: <name>\ndata: "
	block   bool   // head is set: matchBlock may be used
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
	t.head = t.head[:0]
	if t.hasName {
		t.head = append(append(append(t.head, "event: "...), name...), '\n')
	}
	t.head = append(t.head, "data: "...)
	// A name or data with line ends of its own has no such block.
	t.block = !bytes.ContainsAny(data, "\r\n") && !bytes.ContainsAny(name, "\r\n")
}

// scan matches the template's bytes at the start of d: end is where they
// end, chars the UTF-16 length of the text.
func (t *template) scan(d []byte) (end int, chars int64, ok bool) {
	if !bytes.HasPrefix(d, t.pre) {
		return 0, 0, false
	}
	i := len(t.pre)
	size, n, ok := jsondom.ScanString(d[i:])
	if !ok || !bytes.HasPrefix(d[i+size:], t.mid) {
		return 0, 0, false
	}
	i += size + len(t.mid)
	if t.hole2 {
		if size, _, ok = jsondom.ScanString(d[i:]); !ok || !bytes.HasPrefix(d[i+size:], t.post) {
			return 0, 0, false
		}
		i += size + len(t.post)
	}
	return i, int64(n), true
}

// match reads an event by the template: ok is false when it does not fit,
// else chars is the UTF-16 length of its text.
func (t *template) match(name, data []byte) (chars int64, ok bool) {
	if !t.ok || t.hasName != (name != nil) || !bytes.Equal(t.name, name) {
		return 0, false
	}
	end, chars, ok := t.scan(data)
	return chars, ok && end == len(data)
}

// matchBlock reads a block of lines at the start of b by the template's
// wire form: size is the block's length, blank line included, data its
// data, and chars the UTF-16 length of its text; ok is false when it does
// not fit.
func (t *template) matchBlock(b []byte) (size int, data []byte, chars int64, ok bool) {
	if !t.ok || !t.block || !bytes.HasPrefix(b, t.head) {
		return 0, nil, 0, false
	}
	d := b[len(t.head):]
	end, chars, ok := t.scan(d)
	if !ok || !bytes.HasPrefix(d[end:], []byte("\n\n")) {
		return 0, nil, 0, false
	}
	return len(t.head) + end + 2, d[:end], chars, true
}
