package stream

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/llmbulkhead/bulkhead"
)

// allocated returns the bytes allocated so far by the whole process.
func allocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// slowBody is a client that declared a large body and sends only sent; at
// the read that asks for more (where a real client would keep the server
// waiting) it notes how much the process had allocated since start, then
// ends the body.
type slowBody struct {
	sent   string
	start  uint64
	during uint64 // bytes allocated between start and the read after sent
	closed bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.sent != "" {
		n := copy(p, b.sent)
		b.sent = b.sent[n:]
		return n, nil
	}
	if b.during == 0 {
		b.during = allocated() - b.start
	}
	return 0, io.ErrUnexpectedEOF
}

func (b *slowBody) Close() error { b.closed = true; return nil }

// TestReadRequestAllocatesAsBytesArrive checks that a client that declares a
// large body and sends one byte costs the reader little memory, whatever
// length it declared and whatever the limit.
func TestReadRequestAllocatesAsBytesArrive(t *testing.T) {
	const most = 256 << 10 // a 64 KiB buffer and small change
	for _, limit := range []int64{0, 64 << 20, math.MaxInt64} {
		for _, declared := range []int64{32 << 20, 64 << 20, -1} {
			if limit == 0 && declared > DefaultMaxBodyBytes {
				continue // refused unread
			}
			t.Run(fmt.Sprintf("limit %d declared %d", limit, declared), func(t *testing.T) {
				body := &slowBody{sent: "{"}
				r := newPost(t, "/v1/chat/completions", "")
				r.Body, r.ContentLength = body, declared
				runtime.GC()
				body.start = allocated()
				_, err := ReadRequest(r, limit)
				total := allocated() - body.start
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("err = %v, want the body's read error", err)
				}
				if body.during == 0 || body.during > most || total > most {
					t.Errorf("allocated %d bytes while the client sent one byte and %d in all, want at most %d", body.during, total, most)
				}
				if !body.closed {
					t.Error("the body was not closed")
				}
			})
		}
	}
}

// TestReadRequestLimitBoundaries checks that a body of exactly the limit is
// read and one byte more is a *TooLargeError, at limits on either side of
// the reader's buffer sizes, however the body arrives and whatever length
// it declared.
func TestReadRequestLimitBoundaries(t *testing.T) {
	const doc = `{"model":"gpt-4o","messages":[]}`
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one byte", iotest.OneByteReader},
		{"half", iotest.HalfReader},
	}
	for _, limit := range []int64{int64(len(doc)), 511, 512, 513, 64<<10 - 1, 64 << 10, 64<<10 + 1, 200 << 10} {
		for _, size := range []int64{limit, limit + 1} {
			for _, rd := range readers {
				if rd.name == "one byte" && limit > 1<<10 {
					continue // slow, and nothing new
				}
				for _, declared := range []string{"exact", "unknown", "short", "long"} {
					t.Run(fmt.Sprintf("limit %d size %d %s declared %s", limit, size, rd.name, declared), func(t *testing.T) {
						body := doc + strings.Repeat(" ", int(size)-len(doc))
						orig := &trackingBody{r: rd.wrap(strings.NewReader(body))}
						r := newPost(t, "/v1/chat/completions", "")
						r.Body = orig
						switch declared {
						case "exact":
							r.ContentLength = size
						case "unknown":
							r.ContentLength = -1
						case "short": // a client that says less than it sends
							r.ContentLength = size / 2
						case "long": // more than it sends, within the limit
							r.ContentLength = limit
						}
						call, err := ReadRequest(r, limit)
						if !orig.closed {
							t.Error("the body was not closed")
						}
						if size <= limit {
							if err != nil {
								t.Fatalf("a body of %d bytes under a limit of %d: %v", size, limit, err)
							}
							if call.Request.Model != "gpt-4o" || r.ContentLength != size || readString(t, r.Body) != body {
								t.Fatalf("call %+v, ContentLength %d", call, r.ContentLength)
							}
							return
						}
						var tl *TooLargeError
						if !errors.As(err, &tl) || tl.Limit != limit || !errors.Is(err, ErrBodyTooLarge) || !errors.Is(err, bulkhead.ErrInvalid) {
							t.Fatalf("a body of %d bytes under a limit of %d: err = %v, want a *TooLargeError with the limit", size, limit, err)
						}
						if mostRead := map[bool]int64{true: 0, false: limit + 1}[declared == "exact"]; orig.n > mostRead {
							t.Errorf("read %d bytes, want at most %d", orig.n, mostRead)
						}
					})
				}
			}
		}
	}
}

// TestReadRequestAnyLimit checks every kind of limit: zero and negative
// mean DefaultMaxBodyBytes, and math.MaxInt64 reads any body, its length
// declared or not.
func TestReadRequestAnyLimit(t *testing.T) {
	const doc = `{"model":"gpt-4o","messages":[]}`
	for _, limit := range []int64{math.MaxInt64, math.MaxInt64 - 1, 1 << 62} {
		for _, declared := range []int64{int64(len(doc)), -1, math.MaxInt64} {
			r := newPost(t, "/v1/chat/completions", doc)
			r.ContentLength = declared
			call, err := ReadRequest(r, limit)
			if declared > limit {
				if !errors.Is(err, ErrBodyTooLarge) {
					t.Errorf("limit %d, declared %d: err = %v, want ErrBodyTooLarge", limit, declared, err)
				}
				continue
			}
			if err != nil || call.Request.Model != "gpt-4o" {
				t.Errorf("limit %d, declared %d: %v", limit, declared, err)
			}
		}
	}
	for _, limit := range []int64{0, -1, math.MinInt64} {
		r := newPost(t, "/v1/chat/completions", "")
		r.Body = &trackingBody{r: strings.NewReader(strings.Repeat(" ", DefaultMaxBodyBytes+1))}
		r.ContentLength = -1
		_, err := ReadRequest(r, limit)
		var tl *TooLargeError
		if !errors.As(err, &tl) || tl.Limit != DefaultMaxBodyBytes {
			t.Errorf("limit %d: err = %v, want a *TooLargeError at the default limit", limit, err)
		}
	}
}

// TestTransportMaxBodyBytesMaxInt64 checks that a Transport without a body
// limit sends calls.
func TestTransportMaxBodyBytesMaxInt64(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	up := &fakeUpstream{answer: respond(200, "application/json", `{"choices":[]}`)}
	tr := &Transport{Bulkhead: b, Base: up, MaxBodyBytes: math.MaxInt64}
	resp, err := post(t, tr, "/v1/chat/completions", chatBody)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if up.count() != 1 {
		t.Errorf("%d requests sent, want 1", up.count())
	}
}

// wrappedBody is what a caller that charges the bytes of bodies as they
// arrive puts in place of a request's body: it sees each read.
type wrappedBody struct {
	r        io.Reader
	largest  int // the largest buffer a read was given
	arrived  int
	closes   int
	readLate bool // a read after Close
}

func (b *wrappedBody) Read(p []byte) (int, error) {
	b.largest = max(b.largest, len(p))
	if b.closes > 0 {
		b.readLate = true
	}
	n, err := b.r.Read(p)
	b.arrived += n
	return n, err
}

func (b *wrappedBody) Close() error { b.closes++; return nil }

// TestReadRequestWrappedBody checks what ReadRequest promises a caller that
// wraps the body: reads of at most 64 KiB, and one Close once the reading
// is over, whatever the outcome.
func TestReadRequestWrappedBody(t *testing.T) {
	const doc = `{"model":"gpt-4o","messages":[]}`
	big := doc + strings.Repeat(" ", 1<<20)
	cases := []struct {
		name  string
		body  io.Reader
		limit int64
		want  func(error) bool
	}{
		{"read", strings.NewReader(big), 0, func(err error) bool { return err == nil }},
		{"too large", strings.NewReader(big), 100 << 10, func(err error) bool { return errors.Is(err, ErrBodyTooLarge) }},
		{"read error", io.MultiReader(strings.NewReader(doc), iotest.ErrReader(os.ErrDeadlineExceeded)), 0,
			func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }},
		{"bad body", strings.NewReader(`{"messages":1}`), 0, func(err error) bool { return errors.Is(err, bulkhead.ErrInvalid) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &wrappedBody{r: c.body}
			r := newPost(t, "/v1/chat/completions", "")
			r.Body, r.ContentLength = w, -1
			if _, err := ReadRequest(r, c.limit); !c.want(err) {
				t.Fatalf("err = %v", err)
			}
			if w.largest > 64<<10 || w.closes != 1 || w.readLate {
				t.Errorf("largest read %d bytes, closed %d times, read after close %v", w.largest, w.closes, w.readLate)
			}
			if c.name == "read" && w.arrived != len(big) {
				t.Errorf("read %d bytes through the wrapper, want %d", w.arrived, len(big))
			}
		})
	}
}

// BenchmarkReadRequest is the cost of reading and parsing a 4 KiB and a
// 1 MiB chat body, its length declared or not; ParseRequest of the same
// body is the baseline without reading.
func BenchmarkReadRequest(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		doc := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", size-60) + `"}]}`
		if len(doc) != size {
			b.Fatalf("body of %d bytes", len(doc))
		}
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run(name+"/parse", func(b *testing.B) {
			b.SetBytes(int64(size))
			body := []byte(doc)
			for b.Loop() {
				if _, err := ParseRequest(OpenAIChat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, declared := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/read/declared=%v", name, declared), func(b *testing.B) {
				b.SetBytes(int64(size))
				src := strings.NewReader(doc)
				r, err := http.NewRequest(http.MethodPost, "http://api.test/v1/chat/completions", nil)
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					src.Reset(doc)
					r.Body, r.ContentLength = io.NopCloser(src), -1
					if declared {
						r.ContentLength = int64(size)
					}
					if _, err := ReadRequest(r, 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// liar is a body whose Read claims more bytes than the buffer holds.
type liar struct{}

func (liar) Read(p []byte) (int, error) { return len(p) + 1, nil }

// TestReadRequestReaderOverclaims checks that a body reader breaking the
// io.Reader contract is an error, not a panic.
func TestReadRequestReaderOverclaims(t *testing.T) {
	r := newPost(t, "/v1/chat/completions", "")
	r.Body = io.NopCloser(liar{})
	if _, err := ReadRequest(r, 0); err == nil || !strings.Contains(err.Error(), "Read returned") {
		t.Errorf("err = %v, want the reader's count refused", err)
	}
}
