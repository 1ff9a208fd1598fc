package stream

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// sseRecorder records what a scanner finds, with block ends as offsets in
// the whole stream.
type sseRecorder struct {
	in     string
	events []string
	ends   []int
	base   int // the offset of the chunk being fed
}

func (r *sseRecorder) event(name, data []byte) bool {
	if name == nil {
		r.events = append(r.events, fmt.Sprintf("%q", data))
	} else {
		r.events = append(r.events, fmt.Sprintf("%s:%q", name, data))
	}
	return false
}

func (r *sseRecorder) wholeBlock([]byte) int { return 0 }

// blockEnd records where a block ends. The LF of a CRLF that a chunk
// boundary split is reported apart, and extends the block the CR ended.
func (r *sseRecorder) blockEnd(pos int, _ bool) {
	end := r.base + pos
	if n := len(r.ends); n > 0 && end == r.ends[n-1]+1 && r.in[end-2:end] == "\r\n" {
		r.ends[n-1] = end
		return
	}
	r.ends = append(r.ends, end)
}

// scanAll scans s in chunks of size n (0: whole) and finishes.
func scanAll(s string, n int) *sseRecorder {
	r := &sseRecorder{in: s}
	sc := sseScanner{sink: r, max: maxLine}
	if n == 0 {
		n = len(s) + 1
	}
	for i := 0; i < len(s); i += n {
		r.base = i
		sc.feed([]byte(s[i:min(i+n, len(s))]))
	}
	r.base = len(s)
	sc.finish()
	return r
}

func TestSSEScanner(t *testing.T) {
	for _, c := range []struct {
		in     string
		events []string
		ends   []int
	}{
		{"data: a\n\n", []string{`"a"`}, []int{9}},
		{"data:a\n\n", []string{`"a"`}, []int{8}},
		{"data:  a\n\n", []string{`" a"`}, []int{10}}, // one space goes
		{"data: a\ndata: b\n\n", []string{`"a\nb"`}, []int{17}},
		{"data: a\ndata:\ndata: b\n\n", []string{`"a\n\nb"`}, nil},
		{"event: x\ndata: y\n\ndata: z\n\n", []string{`x:"y"`, `"z"`}, []int{18, 27}},
		{"event: x\n\ndata: z\n\n", []string{`"z"`}, []int{10, 19}}, // a blank line resets the type
		{": keep-alive\n\n", nil, []int{14}},
		{"id: 7\nretry: 100\nfoo: bar\ndata: z\n\n", []string{`"z"`}, nil},
		{"data\n\n", []string{`""`}, nil}, // a field with no colon has an empty value
		{"data:\n\n", []string{`""`}, nil},
		{"\n\n\n", nil, []int{1, 2, 3}},
		{"data: a\r\n\r\ndata: b\r\n\r\n", []string{`"a"`, `"b"`}, []int{11, 22}},
		{"data: a\r\rdata: b\r\r", []string{`"a"`, `"b"`}, []int{9, 18}},
		{"data: a\n\r\ndata: b\r\n\n", []string{`"a"`, `"b"`}, []int{10, 20}},
		{"\xef\xbb\xbfdata: a\n\n", []string{`"a"`}, nil}, // a BOM starts the stream
		{"data: \xef\xbb\xbfa\n\n", []string{`"\ufeffa"`}, nil},
		{"data: a\n\ndata: b", []string{`"a"`, `"b"`}, []int{9, 16}}, // a last line without its end
		{"data: a\n\ndata: b\n", []string{`"a"`, `"b"`}, []int{9, 17}},
		{"data: a\n\nevent: x\n", []string{`"a"`}, []int{9}},
		{"data: [DONE]\n\n", []string{`"[DONE]"`}, nil},
	} {
		for _, n := range []int{0, 1, 2, 3, 5} {
			r := scanAll(c.in, n)
			if !reflect.DeepEqual(r.events, c.events) {
				t.Errorf("%q in chunks of %d: events %v, want %v", c.in, n, r.events, c.events)
			}
			if c.ends != nil && !reflect.DeepEqual(r.ends, c.ends) {
				t.Errorf("%q in chunks of %d: blocks end at %v, want %v", c.in, n, r.ends, c.ends)
			}
		}
	}
}

func TestSSEScannerLimit(t *testing.T) {
	r := &sseRecorder{}
	sc := sseScanner{sink: r, max: 16}
	sc.feed([]byte("data: 1234\n\ndata: 12345678"))
	if sc.dead || len(r.events) != 1 {
		t.Fatalf("dead %v, events %v", sc.dead, r.events)
	}
	sc.feed([]byte("901\n\n"))
	if !sc.dead {
		t.Fatal("a line over the limit was kept")
	}
	// Data lines each under the limit that add up beyond it.
	r = &sseRecorder{}
	sc = sseScanner{sink: r, max: 16}
	sc.feed([]byte(strings.Repeat("data: 1234\n", 4) + "\n"))
	if !sc.dead || len(r.events) != 0 {
		t.Fatalf("event data over the limit: dead %v, events %v", sc.dead, r.events)
	}
}
