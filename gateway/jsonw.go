package gateway

import (
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// jsonWriter appends a JSON document to b member by member, as
// encoding/json writes the same values (strings escaped for HTML, floats
// in the shortest form), without reflection: the shed answers and the
// request log are written with it.
type jsonWriter struct {
	b    []byte
	more bool // a member was written in the object being written: the next needs a comma
}

// open starts the document's top-level object.
func (w *jsonWriter) open() { w.b, w.more = append(w.b, '{'), false }

// key starts a member; k needs no escaping.
func (w *jsonWriter) key(k string) {
	if w.more {
		w.b = append(w.b, ',')
	}
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
	w.more = true
}

// object starts a member whose value is an object; end closes it.
func (w *jsonWriter) object(k string) {
	w.key(k)
	w.b, w.more = append(w.b, '{'), false
}

// end closes the object being written.
func (w *jsonWriter) end() { w.b, w.more = append(w.b, '}'), true }

func (w *jsonWriter) str(k, v string) {
	w.key(k)
	w.b = appendJSONString(w.b, v)
}

func (w *jsonWriter) int(k string, v int64) {
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
}

func (w *jsonWriter) float(k string, v float64) {
	w.key(k)
	w.b = appendJSONFloat(w.b, v)
}

func (w *jsonWriter) boolean(k string, v bool) {
	w.key(k)
	w.b = strconv.AppendBool(w.b, v)
}

func (w *jsonWriter) null(k string) {
	w.key(k)
	w.b = append(w.b, "null"...)
}

// time writes t as encoding/json does (RFC 3339 with nanoseconds).
func (w *jsonWriter) time(k string, t time.Time) {
	w.key(k)
	w.b = append(w.b, '"')
	w.b = t.AppendFormat(w.b, time.RFC3339Nano)
	w.b = append(w.b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it: quotes, backslashes and control characters, <, > and & (so
// that the document is safe in HTML), U+2028 and U+2029; invalid UTF-8
// becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendJSONFloat appends f as encoding/json writes a float64: the
// shortest decimal that reads back as f, in exponent form only below 1e-6
// or from 1e21. JSON has no NaN or infinity: they are written null.
func appendJSONFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 reads e-9, as encoding/json writes it
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// jsonBuffers keep the buffers the shed answers and the log lines are
// written in.
var jsonBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledBuffer bounds the buffers kept: a rare large one is dropped.
const maxPooledBuffer = 64 << 10

func getBuffer() *[]byte { return jsonBuffers.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooledBuffer {
		*b = (*b)[:0]
		jsonBuffers.Put(b)
	}
}
