package stream

import (
	"errors"
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
