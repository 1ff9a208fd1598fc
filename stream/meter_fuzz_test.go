package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// sizesReader returns its data in reads of the given sizes, cycled.
type sizesReader struct {
	data  []byte
	sizes []int
	i     int
}

func (r *sizesReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.data), r.sizes[r.i%len(r.sizes)])
	r.i++
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// releaseCounter counts each admission's release events.
type releaseCounter struct {
	mu    sync.Mutex
	count map[bulkhead.ID]int
	usage map[bulkhead.ID]*bulkhead.Usage
	ch    chan bulkhead.ID
}

func newReleaseCounter(b *bulkhead.Bulkhead) *releaseCounter {
	c := &releaseCounter{count: map[bulkhead.ID]int{}, usage: map[bulkhead.ID]*bulkhead.Usage{}, ch: make(chan bulkhead.ID, 1)}
	b.Subscribe(bulkhead.Hooks{Release: func(e bulkhead.ReleaseEvent) {
		c.mu.Lock()
		c.count[e.ID]++
		c.usage[e.ID] = e.Usage
		c.mu.Unlock()
		select { // wake a waiter; one that is not waiting checks the count
		case c.ch <- e.ID:
		default:
		}
	}})
	return c
}

// wait waits for id's release and returns its usage, failing when it does
// not come, or comes twice.
func (c *releaseCounter) wait(t testutil.Fataler, b *bulkhead.Bulkhead, id bulkhead.ID) *bulkhead.Usage {
	t.Helper()
	deadline := time.After(testutil.Settle)
	for {
		c.mu.Lock()
		n, u := c.count[id], c.usage[id]
		c.mu.Unlock()
		if n > 1 || b.Stats().Gate.DoubleReleases != 0 {
			t.Fatalf("admission released %d times, %d double releases", n, b.Stats().Gate.DoubleReleases)
		}
		if n == 1 {
			return u
		}
		select {
		case <-c.ch:
		case <-deadline:
			t.Fatalf("admission not released within %v", testutil.Settle)
		}
	}
}

// TestMeterChunkingProperty: however the body is cut into reads, the caller
// reads it unchanged and the meter settles once with the same usage; closed
// early, it settles once with the usage seen so far.
func TestMeterChunkingProperty(t *testing.T) {
	b := newBudgetBulkhead(t, nil)
	rc := newReleaseCounter(b)
	data := map[string][]byte{}
	for _, f := range fixtures {
		data[f.file] = readFixture(t, f.file)
	}
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.SampledFrom(fixtures).Draw(t, "fixture")
		in := data[f.file]
		sizes := rapid.SliceOfN(rapid.IntRange(1, 96), 1, 32).Draw(t, "sizes")
		closeAt := -1
		if rapid.Bool().Draw(t, "close early") {
			closeAt = rapid.IntRange(0, len(in)).Draw(t, "close at")
		}
		p := acquire(t, b)
		m, err := NewMeter(io.NopCloser(&sizesReader{data: in, sizes: sizes}), p, f.options())
		if err != nil {
			t.Fatalf("NewMeter: %v", err)
		}
		if closeAt >= 0 {
			out := make([]byte, closeAt)
			if _, err := io.ReadFull(m, out); err != nil || !bytes.Equal(out, in[:closeAt]) {
				t.Fatalf("read %d bytes: %v", closeAt, err)
			}
			seen, _ := m.Usage()
			settled := m.Settled()
			_ = m.Close()
			u := rc.wait(t, b, p.ID())
			switch {
			case settled:
			case f.sse && (u == nil || *u != seen):
				t.Fatalf("closed with %+v seen, released with %v", seen, u)
			case !f.sse && (u == nil || u.Input != seen.Input || u.Output < seen.Output || u.Output > seen.Output+int64(closeAt+3)/4):
				// The part of a JSON document that arrived counts by its size.
				t.Fatalf("closed after %d bytes with %+v seen, released with %v", closeAt, seen, u)
			}
			return
		}
		out, err := io.ReadAll(m)
		f.checkReadErr(t, err)
		if !bytes.Equal(out, in) {
			t.Fatalf("read %d bytes, want the %d of the body unchanged", len(out), len(in))
		}
		if u := rc.wait(t, b, p.ID()); u == nil || *u != f.want {
			t.Fatalf("released with %v, want %+v", u, f.want)
		}
	})
}

// readInPieces reads r to its end into buffers of sizes drawn from rng,
// as callers with buffers of any size read a body.
func readInPieces(r io.Reader, rng *rand.Rand) ([]byte, error) {
	var out []byte
	for {
		buf := make([]byte, 1+rng.Intn(96))
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// FuzzMeter: on any body, cut anyhow and read into buffers of any size,
// metering does not panic or hang, the bytes pass unchanged (or, when
// stripping, only lose some, the same as when the body is read whole) and the
// admission settles exactly once. The bulkhead admits one call at a time:
// an input whose permit was not released fails the next Acquire, and a
// second release shows as a double release at once.
func FuzzMeter(f *testing.F) {
	cfg := bulkhead.Interactive("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1 << 40}
	b, err := bulkhead.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Settle)
		defer cancel()
		_, _ = b.Shutdown(ctx)
	})
	f.Fuzz(func(t *testing.T, format byte, sse bool, body []byte, seed int64) {
		fm := Format(format%4 + 1)
		strip := sse && fm == OpenAIChat && format&0x80 != 0
		var p *bulkhead.Permit
		err := testutil.Poll("a free slot", func() (bool, error) { // the last input's release is on its way
			var err error
			p, err = b.Acquire(context.Background(), testRequest)
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("the last input's permit was not released: %v", err)
		}
		rng := rand.New(rand.NewSource(seed))
		opts := MeterOptions{Format: fm, SSE: sse, ReportEvery: int64(format>>4) & 7, StripUsageChunk: strip, MaxJSONBytes: 1 << 12,
			RecordResponse: format&0x08 != 0}
		m, err := NewMeter(io.NopCloser(&chunker{body, rng, 1 + rng.Intn(64)}), p, opts)
		if err != nil {
			t.Fatal(err)
		}
		m.sc.max = 1 << 12
		out, err := readInPieces(m, rng)
		if err != nil && m.Err() == nil {
			t.Fatalf("read error %v without a provider error", err)
		}
		if !m.Settled() {
			t.Fatal("not settled at the end of the body")
		}
		if strip {
			if len(out) > len(body) {
				t.Fatalf("stripping grew the body from %d to %d bytes", len(body), len(out))
			}
			// A body no longer than what the meter keeps of a block is
			// stripped alike however it is cut and read: as when it is
			// read whole, in one read.
			if len(body) <= m.sc.max {
				whole, err := NewMeter(io.NopCloser(bytes.NewReader(body)), nil, opts)
				if err != nil {
					t.Fatal(err)
				}
				whole.sc.max = m.sc.max
				want := make([]byte, len(body)+1)
				n, _ := whole.Read(want)
				rest, _ := io.ReadAll(whole)
				if want = append(want[:n], rest...); !bytes.Equal(out, want) {
					t.Fatalf("read in pieces %q, whole %q", out, want)
				}
			}
		} else if !bytes.Equal(out, body) {
			t.Fatalf("read %q, want %q", out, body)
		}
		if r := m.Response(); len(r.FinishReasons) > maxFinishReasons || !opts.RecordResponse && (r.ID != "" || r.Model != "" || r.FinishReasons != nil) {
			t.Fatalf("Response() = %+v", r)
		}
		_ = m.Close()
		if n := b.Stats().Gate.DoubleReleases; n != 0 {
			t.Fatalf("%d double releases", n)
		}
	})
}

// sseBlock is one block of lines of a generated OpenAI chat stream: its
// bytes, whether a stripping meter drops them (the usage chunk), and where
// in them the block is dispatched (just past the first byte of the line
// end that ends it).
type sseBlock struct {
	b        []byte
	drop     bool
	dispatch int
}

// genStrippedStream draws an OpenAI chat stream from rng: text deltas of
// any length (some longer than a caller's buffer), comments, events of two
// data lines or with an event or id field, usage chunks (which a stripping
// meter drops), line ends of every kind; it may end with [DONE] (after
// which nothing is dropped) and its last block may lack its blank line.
func genStrippedStream(rng *rand.Rand) []sseBlock {
	var blocks []sseBlock
	done := false
	n := rng.Intn(12)
	for i := 0; i <= n; i++ {
		end := [...]string{"\n", "\r\n", "\r"}[rng.Intn(3)]
		var lines []string
		drop := false
		switch k := rng.Intn(10); {
		case k < 4:
			text := strings.Repeat("wörd ", rng.Intn(4))
			if rng.Intn(6) == 0 {
				text = strings.Repeat("ab", rng.Intn(3000))
			}
			lines = []string{fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`, text)}
		case k == 4:
			lines = []string{": keep-alive"}
		case k == 5:
			lines = []string{`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,`, `data: "delta":{"content":"two lines"},"finish_reason":null}]}`}
		case k == 6:
			lines = []string{"event: message", "id: 7", `data:{"id":"c","choices":[{"index":0,"delta":{"content":"named"}}]}`}
		case k == 7 && !done:
			lines = []string{"data: [DONE]"}
			done = true
		default:
			lines = []string{`data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":` +
				strings.Repeat("9", 1+rng.Intn(3)) + `,"total_tokens":1}}`}
			drop = !done
		}
		var b []byte
		for _, l := range lines {
			b = append(append(b, l...), end...)
		}
		dispatch := len(b) + 1
		b = append(b, end...)
		if i == n && rng.Intn(4) == 0 { // no blank line: the body's end dispatches it
			b = b[:len(b)-len(end)]
			if rng.Intn(2) == 0 {
				b = b[:len(b)-len(end)]
			}
			dispatch = len(b) + 1 // only the body's end dispatches it
		}
		blocks = append(blocks, sseBlock{b, drop, dispatch})
	}
	return blocks
}

// strippedOf returns the bytes a caller reads of blocks, stripped, when
// the body gives its first cut bytes, then ends (eof) or fails: the
// blocks dispatched before the cut, less those dropped, and the bytes of
// the block it cuts short. At the body's end, a last block without its
// blank line is dispatched too.
func strippedOf(blocks []sseBlock, cut int, eof bool) []byte {
	var out []byte
	pos := 0
	for _, bl := range blocks {
		if pos+len(bl.b) <= cut && eof { // all of it, dispatched at the end at the latest
			if !bl.drop {
				out = append(out, bl.b...)
			}
		} else if cut-pos >= bl.dispatch {
			if !bl.drop {
				out = append(out, bl.b[:min(len(bl.b), cut-pos)]...)
			}
		} else if cut > pos {
			out = append(out, bl.b[:cut-pos]...)
		}
		pos += len(bl.b)
	}
	return out
}

// cutReader gives its data in reads of sizes drawn from rng, some empty
// ((0, nil), as a stream waiting for its next event), and then err,
// sometimes with the last bytes.
type cutReader struct {
	data []byte
	rng  *rand.Rand
	max  int
	err  error
}

func (r *cutReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := min(len(p), len(r.data), r.rng.Intn(r.max+1))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	if len(r.data) == 0 && r.rng.Intn(2) == 0 {
		return n, r.err
	}
	return n, nil
}

var errCut = errors.New("connection reset")

// readAllSizes reads r until it fails into buffers of sizes drawn from
// rng up to max, some empty, and returns what it read and the error.
func readAllSizes(r io.Reader, rng *rand.Rand, max int) ([]byte, error) {
	var out []byte
	for {
		buf := make([]byte, rng.Intn(max+1))
		n, err := r.Read(buf)
		if n > len(buf) || n < 0 {
			return out, fmt.Errorf("Read returned %d for a buffer of %d", n, len(buf))
		}
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
	}
}

// checkStrippedStream reads the stream drawn from seed through a stripping
// meter, its body cut in reads of up to bodyMax bytes and read into
// buffers of up to callerMax, and compares what it reads with the blocks
// it is made of.
func checkStrippedStream(t *testing.T, seed int64, bodyMax, callerMax int, fails bool) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	blocks := genStrippedStream(rng)
	var in []byte
	for _, bl := range blocks {
		in = append(in, bl.b...)
	}
	cut, rerr := len(in), error(io.EOF)
	if fails {
		cut, rerr = rng.Intn(len(in)+1), errCut
	}
	m, err := NewMeter(io.NopCloser(&cutReader{in[:cut], rng, bodyMax, rerr}), nil,
		MeterOptions{Format: OpenAIChat, SSE: true, StripUsageChunk: true, RecordResponse: true})
	if err != nil {
		t.Fatal(err)
	}
	out, err := readAllSizes(m, rng, callerMax)
	if err != rerr {
		t.Fatalf("read ended with %v, want %v", err, rerr)
	}
	if want := strippedOf(blocks, cut, !fails); !bytes.Equal(out, want) {
		i := 0
		for i < min(len(out), len(want)) && out[i] == want[i] {
			i++
		}
		t.Fatalf("stream of seed %d (%d bytes) cut at %d: read %d bytes, want %d; first difference at byte %d: %q, want %q", seed, len(in), cut, len(out), len(want), i,
			out[i:min(len(out), i+40)], want[i:min(len(want), i+40)])
	}
	if r := m.Response(); r.ID != "" && r.ID != "c" {
		t.Fatalf("Response().ID = %q", r.ID)
	}
}

// FuzzStrippedStreamKeepsAllButTheUsageChunk: a stripping meter's reader
// gets every byte of the stream but the usage chunks, in order, however
// the body cuts it (empty reads, the last bytes with io.EOF or an error,
// a block split anywhere, blocks longer than the caller's buffer) and
// however large (or empty) the caller's buffers are; a body that fails
// gives the bytes of the block it cut short, then its error.
func FuzzStrippedStreamKeepsAllButTheUsageChunk(f *testing.F) {
	for i := range 20 {
		f.Add(int64(i), uint16(i*37), uint16(i*101), i%3 == 0)
	}
	f.Fuzz(func(t *testing.T, seed int64, bodyMax, callerMax uint16, fails bool) {
		checkStrippedStream(t, seed, 1+int(bodyMax%9000), 1+int(callerMax%9000), fails)
	})
}
