package stream

import "bytes"

// maxLine bounds what the SSE scanner keeps of one line, and of one event's
// data: a stream that sends more stops being metered (its bytes still pass
// through), so a hostile stream cannot grow memory without bound.
const maxLine = 16 << 20

// sseSink receives what an sseScanner finds.
type sseSink interface {
	// event is a dispatched event: its type (the event field, nil when
	// none) and its data lines joined with "\n". It returns true to drop
	// the event's bytes from what the caller reads. Neither slice may be
	// kept.
	event(name, data []byte) (drop bool)
	// blockEnd says that the bytes of the chunk being fed, up to pos, end
	// a block of lines (an event and its blank line, or lines that
	// dispatched nothing): drop tells whether to drop the block's bytes.
	blockEnd(pos int, drop bool)
	// wholeBlock may read a whole block of lines at the start of b, which
	// starts a line of the stream's first event after a blank line, and
	// return its length in bytes, blank line included; 0 when it does not.
	// It must do just what the scanner's event (and the block's end)
	// would.
	wholeBlock(b []byte) int
}

// sseScanner parses server-sent events as they pass, in chunks of any
// size: it keeps only a line split between chunks and the data of the
// event being read. Lines end with CRLF, LF or CR.
type sseScanner struct {
	sink sseSink
	max  int // the longest line, and the most data of one event, kept

	line    []byte // the start of a line split between chunks
	inLine  bool   // line holds a partial line (possibly empty so far)
	data    []byte // the event's data lines, joined with "\n"
	ndata   int    // the number of data lines in the event
	name    []byte // the event's type
	hasName bool

	skipLF    bool // the last chunk ended in CR: a leading LF ends that line
	lfInBlock bool // ... and that CR ended a block: the LF belongs to it
	lastDrop  bool // the last block was dropped
	started   bool // past the stream's first line (where a BOM is skipped)

	// stop is set by the sink to end the scan (the meter settled); dead
	// by the scanner when a line or an event grew beyond max.
	stop, dead bool
}

// feed scans the next chunk of the stream.
func (s *sseScanner) feed(b []byte) {
	pos := 0
	if s.skipLF && len(b) > 0 {
		s.skipLF = false
		if b[0] == '\n' {
			pos = 1
			if s.lfInBlock {
				s.sink.blockEnd(1, s.lastDrop)
			}
		}
	}
	cr := -1 // the next CR in b at or after pos, len(b) for none; -1: not looked for
	for pos < len(b) && !s.stop && !s.dead {
		rest := b[pos:]
		if !s.inLine && s.ndata == 0 && !s.hasName && s.started {
			if n := s.sink.wholeBlock(rest[:min(len(rest), s.max)]); n > 0 {
				pos += n
				s.lastDrop, s.lfInBlock = false, false
				s.sink.blockEnd(pos, false)
				continue
			}
		}
		lf := bytes.IndexByte(rest, '\n')
		if cr < pos {
			if j := bytes.IndexByte(rest, '\r'); j >= 0 {
				cr = pos + j
			} else {
				cr = len(b)
			}
		}
		i := lf // the line end
		if i < 0 || cr-pos < i {
			i = min(cr-pos, len(rest))
		}
		if i == len(rest) { // no line end in this chunk
			if len(s.line)+len(rest) > s.max {
				s.dead = true
				return
			}
			s.line = append(s.line, rest...)
			s.inLine = true
			return
		}
		if !s.inLine && s.ndata == 0 && s.started && i == lf && i+1 < len(rest) && rest[i+1] == '\n' &&
			bytes.HasPrefix(rest, []byte("data:")) {
			// A whole one-line event in the chunk: read in place.
			if !s.wholeEvent(rest[:i]) {
				return
			}
			pos += i + 2
			s.sink.blockEnd(pos, s.lastDrop)
			continue
		}
		ln := rest[:i]
		if s.inLine {
			ln = append(s.line, ln...)
			s.line = ln
		}
		if len(ln) > s.max {
			s.dead = true
			return
		}
		end := pos + i + 1 // just past the line end
		if rest[i] == '\r' {
			if i+1 < len(rest) {
				if rest[i+1] == '\n' {
					end++
				}
			} else {
				s.skipLF = true
			}
		}
		blank := len(ln) == 0
		s.lfInBlock = s.skipLF && blank
		drop := s.lineDone(ln)
		s.line, s.inLine = s.line[:0], false
		if blank {
			s.lastDrop = drop
			s.sink.blockEnd(end, drop)
		}
		pos = end
	}
}

// wholeEvent dispatches an event that is one data line followed by a
// blank line, both in the chunk, without copying it: what lineDone and
// dispatch would do with the two lines. It returns false when the scan
// ends there.
func (s *sseScanner) wholeEvent(ln []byte) bool {
	if len(ln) > s.max {
		s.dead = true
		return false
	}
	value := ln[len("data:"):]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	if len(value)+1 > s.max {
		s.dead = true
		return false
	}
	var name []byte
	if s.hasName {
		name = s.name
	}
	s.lastDrop = s.sink.event(name, value)
	s.hasName, s.lfInBlock = false, false
	return true
}

// finish ends the stream: a last line without a line end counts as a line,
// and an event without its blank line is dispatched, so that a stream cut
// off after a complete event still yields it.
func (s *sseScanner) finish() {
	if s.stop || s.dead {
		return
	}
	if s.inLine {
		s.lineDone(s.line)
		s.line, s.inLine = s.line[:0], false
	}
	if s.ndata > 0 && !s.stop && !s.dead {
		s.sink.blockEnd(0, s.dispatch())
	}
}

// lineDone interprets one complete line; for a blank line it dispatches the
// event and returns whether to drop it.
func (s *sseScanner) lineDone(ln []byte) (drop bool) {
	if !s.started {
		s.started = true
		ln = bytes.TrimPrefix(ln, []byte("\xef\xbb\xbf"))
	}
	if len(ln) == 0 {
		return s.dispatch()
	}
	if ln[0] == ':' {
		return false // a comment (keep-alive)
	}
	field, value := ln, []byte(nil)
	if c := bytes.IndexByte(ln, ':'); c >= 0 {
		field, value = ln[:c], ln[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if len(s.data)+len(value)+1 > s.max {
			s.dead = true
			return false
		}
		if s.ndata > 0 {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
		s.ndata++
	case "event":
		s.name = append(s.name[:0], value...)
		s.hasName = true
	}
	// id and retry steer reconnection, which a meter has no part in;
	// other fields are ignored, as the format requires.
	return false
}

// dispatch hands the event read so far to the sink and starts the next.
func (s *sseScanner) dispatch() (drop bool) {
	if s.ndata > 0 {
		var name []byte
		if s.hasName {
			name = s.name
		}
		drop = s.sink.event(name, s.data)
	}
	s.data, s.ndata, s.hasName = s.data[:0], 0, false
	return drop
}

// jsonSink receives what a jsonSplitter finds.
type jsonSink interface {
	// value is one complete JSON value: the whole document, or one element
	// of a top-level array. It may not be kept.
	value(doc []byte)
	// oversized counts n more bytes of a value too large to keep.
	oversized(n int)
	// end is the end of the top-level value.
	end()
}

// jsonSplitter finds, in a JSON body passing in chunks, the top-level
// object, or each object or array element of a top-level array (as Gemini
// streams responses without SSE), and hands each to its sink once
// complete. It keeps at most max bytes of one value; a larger one is
// counted by size instead.
type jsonSplitter struct {
	sink jsonSink
	max  int64

	state   uint8 // splitStart, splitValue, splitDone
	base    int   // the depth of the values handed over: 0, or 1 in an array
	depth   int   // nesting depth, a top-level array included
	inStr   bool
	esc     bool
	inValue bool   // inside a value being handed over
	buf     []byte // the value read so far
	over    bool   // the value is too large: counted, not kept
}

const (
	splitStart = iota
	splitValue
	splitDone
)

// feed scans the next chunk of the body.
func (j *jsonSplitter) feed(b []byte) {
	i := 0
	for j.state == splitStart && i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
			continue
		case '{':
			j.state = splitValue
		case '[':
			j.state, j.base, j.depth = splitValue, 1, 1
			i++
		default: // not JSON this meter reads: nothing to meter
			j.state = splitDone
		}
	}
	if j.state != splitValue {
		return
	}
	start := i
	for ; i < len(b); i++ {
		c := b[i]
		if j.inStr {
			switch {
			case j.esc:
				j.esc = false
			case c == '\\':
				j.esc = true
			case c == '"':
				j.inStr = false
			}
			continue
		}
		switch c {
		case '"':
			j.inStr = true
		case '{', '[':
			if j.depth == j.base && !j.inValue {
				j.inValue, start = true, i
			}
			j.depth++
		case '}', ']':
			j.depth--
			switch {
			case j.depth == j.base && j.inValue:
				j.take(b[start : i+1])
				if !j.over {
					j.sink.value(j.buf)
				}
				j.buf, j.inValue, j.over = j.buf[:0], false, false
				if j.base == 0 {
					j.state = splitDone
					j.sink.end()
					return
				}
			case j.depth < j.base: // the top-level array closed
				j.state = splitDone
				j.sink.end()
				return
			}
		}
	}
	if j.inValue {
		j.take(b[start:])
	}
}

// take keeps the bytes of the value being read, or counts them once it is
// too large to keep.
func (j *jsonSplitter) take(b []byte) {
	switch {
	case j.over:
		j.sink.oversized(len(b))
	case int64(len(j.buf))+int64(len(b)) > j.max:
		j.over = true
		j.sink.oversized(len(j.buf) + len(b))
		j.buf = j.buf[:0]
	default:
		j.buf = append(j.buf, b...)
	}
}
