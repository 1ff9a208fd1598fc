package benchmarks

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/stream"
)

// chatBody400KB is an OpenAI chat body of about 400 KB: a system prompt,
// then user and assistant turns with escapes (newlines, quotes, \u
// escapes) and multi-byte text, some of them as text parts.
var chatBody400KB = func() []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"gpt-4o","temperature":0.2,"max_tokens":1024,"stream":true,"stream_options":{"include_usage":true},"messages":[`)
	sb.WriteString(`{"role":"system","content":"You are a careful assistant.\nAnswer in \"plain\" words."}`)
	line := strings.Repeat("lorem ipsum dolor sit amet ", 16)
	for i := 0; sb.Len() < 400<<10; i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&sb, `,{"role":"user","content":"%s turn %d\nwith an escape \u00e9 and \"quotes\""}`, line, i)
		case 1:
			fmt.Fprintf(&sb, `,{"role":"assistant","content":"%s réponse %d: café, naïve, 日本語のテキスト 🙂"}`, line, i)
		case 2:
			fmt.Fprintf(&sb, `,{"role":"user","content":[{"type":"text","text":"%s part %d"},{"type":"text","text":"tab\tand slash \/"}]}`, line, i)
		case 3:
			fmt.Fprintf(&sb, `,{"role":"assistant","content":"%s plain %d"}`, line, i)
		}
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}()

var (
	sinkCall *stream.Call
	sinkKey  string
)

// BenchmarkParseRequest400KB reads a 400 KB chat body into a Call: the
// request with every message. Its "key" case also builds the canonical
// deduplication key, which only a deduplicating caller asks for.
func BenchmarkParseRequest400KB(b *testing.B) {
	body := chatBody400KB
	for _, key := range []bool{false, true} {
		name := "request"
		if key {
			name = "key"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				c, err := stream.ParseRequest(stream.OpenAIChat, body)
				if err != nil {
					b.Fatal(err)
				}
				if key {
					sinkKey = c.Key()
				}
				sinkCall = c
			}
		})
	}
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type chatBody struct {
	Model     string        `json:"model"`
	Messages  []chatMessage `json:"messages"`
	MaxTokens int64         `json:"max_tokens"`
	Stream    bool          `json:"stream"`
}

var sinkChat chatBody

// BenchmarkParseRequest400KB_EncodingJSON is the baseline: encoding/json
// decoding the same body into a small struct (content left raw, since it is
// a string or an array), with no key.
func BenchmarkParseRequest400KB_EncodingJSON(b *testing.B) {
	body := chatBody400KB
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var c chatBody
		if err := json.Unmarshal(body, &c); err != nil {
			b.Fatal(err)
		}
		sinkChat = c
	}
}
