package stream

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/jsondom"
)

// FuzzParseRequest checks that no body panics ParseRequest, that every
// error about a body is a *BodyError, and that every Request it returns is
// valid. The format byte is taken as is, so unknown formats are covered.
func FuzzParseRequest(f *testing.F) {
	f.Add(byte(OpenAIChat), []byte(`{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`))
	f.Add(byte(AnthropicMessages), []byte(`{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`))
	f.Add(byte(Gemini), []byte(`{"tools":[{"functionDeclarations":[{"name":"f"},{"name":"g"}],"googleSearch":{}},{"function_declarations":null},3]}`))
	f.Fuzz(func(t *testing.T, format byte, body []byte) {
		fm := Format(format)
		call, err := ParseRequest(fm, body)
		if fm.String() == "" {
			var ce *bulkhead.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("format %d: err = %v, want a *bulkhead.ConfigError", format, err)
			}
			return
		}
		if err != nil {
			var be *BodyError
			if !errors.As(err, &be) || be.Format != fm || !errors.Is(err, bulkhead.ErrInvalid) {
				t.Fatalf("err = %#v, want a *BodyError of format %v", err, fm)
			}
			return
		}
		if err := call.Request.Validate(); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		if call.Format != fm || (fm != OpenAIChat && call.IncludeUsage) || (fm == Gemini && (call.Stream || call.Request.Model != "")) {
			t.Fatalf("call = %+v", call)
		}
		_ = call.Request.TextLength()
	})
}

// FuzzReadRequest checks ReadRequest's limit at any limit and declared
// length, with the body arriving step bytes a read: a body within the limit
// is read whole (and parsed, or a *BodyError), and r sends it again; a
// longer one is a *TooLargeError after at most limit+1 bytes, and none when
// the declared length is over the limit. The body is closed once.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte(`{"model":"gpt-4o","messages":[]}`), int64(32), int64(-1), uint16(0))
	f.Add([]byte(`{"model":"gpt-4o","messages":[]}`), int64(31), int64(31), uint16(1))
	f.Add([]byte(`{}`), int64(math.MaxInt64), int64(math.MaxInt64), uint16(3))
	f.Add([]byte(`{}`), int64(-1), int64(2), uint16(7))
	f.Fuzz(func(t *testing.T, body []byte, limit, declared int64, step uint16) {
		eff := limit
		if eff <= 0 {
			eff = DefaultMaxBodyBytes
		}
		var src io.Reader = bytes.NewReader(body)
		if step > 0 {
			src = &stepReader{src, int(step)}
		}
		orig := &trackingBody{r: src}
		r, err := http.NewRequest(http.MethodPost, "http://api.test/v1/chat/completions", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Body, r.ContentLength = orig, max(declared, -1)
		_, err = ReadRequest(r, limit)
		if !orig.closed {
			t.Fatal("the body was not closed")
		}
		if declared > eff || int64(len(body)) > eff {
			var tl *TooLargeError
			if !errors.As(err, &tl) || tl.Limit != eff {
				t.Fatalf("%d bytes (declared %d) under a limit of %d: err = %v, want a *TooLargeError", len(body), declared, eff, err)
			}
			if most := map[bool]int64{true: 0, false: eff + 1}[declared > eff]; orig.n > most {
				t.Fatalf("read %d bytes, want at most %d", orig.n, most)
			}
			return
		}
		if err != nil {
			var be *BodyError
			if !errors.As(err, &be) {
				t.Fatalf("err = %v, want nil or a *BodyError", err)
			}
		}
		again, rerr := io.ReadAll(r.Body)
		if rerr != nil || !bytes.Equal(again, body) || r.ContentLength != int64(len(body)) {
			t.Fatalf("r.Body reads %d bytes (%v), ContentLength %d, want the %d of the body", len(again), rerr, r.ContentLength, len(body))
		}
	})
}

// stepReader returns at most step bytes a read.
type stepReader struct {
	r    io.Reader
	step int
}

func (s *stepReader) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.step)]) }

// FuzzAddIncludeUsage checks that whenever addIncludeUsage succeeds its
// output parses as a chat body with IncludeUsage, with every other
// top-level member as it was.
func FuzzAddIncludeUsage(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","stream":true}`,
		`{"stream_options":{"include_usage":false,"x":[1]},"n":1}`,
		`{"stream_options":null}`,
		`{ }`,
		`{"stream_options":{"include_usage":true}}`,
		`{"stream_options":{},"stream_options":{"include_usage":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := addIncludeUsage(body)
		if err != nil {
			var be *BodyError
			if !errors.As(err, &be) {
				t.Fatalf("err = %v, want a *BodyError", err)
			}
			return
		}
		var in, got jsondom.Doc
		if err := jsondom.Parse(&got, out); err != nil {
			t.Fatalf("output %q does not parse: %v", out, err)
		}
		if iu, ok := got.Root().Get("stream_options").Get("include_usage").Bool(); !iu || !ok {
			t.Fatalf("output %q has no include_usage true", out)
		}
		if err := jsondom.Parse(&in, body); err != nil {
			t.Fatal(err)
		}
		if a, b := others(in.Root()), others(got.Root()); a != b {
			t.Fatalf("other members changed:\n%q\n%q", a, b)
		}
	})
}

// others is the canonical form of the members of obj other than
// stream_options, in order.
func others(obj jsondom.Value) string {
	var b []byte
	for m := obj.First(); m.Exists(); m = m.Next() {
		if m.Key() != "stream_options" {
			b = append(b, m.Key()...)
			b = append(b, 0)
			b = m.AppendCanonical(b)
			b = append(b, 0)
		}
	}
	return string(b)
}
