package benchmarks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// streamSize is the size of the benchmark streams.
const streamSize = 1 << 20

var meterWords = strings.Fields(`the of and to in is that it for as with was on be by this are
	from at or an have not which but all they their can more one has were there been if would when
	will what so up out about into than them its only other new some could these time two may then
	do first any my now such like our over man me even most made after also did many before must
	through back years where much your way well down should because each just those people how too
	little state good very make world still own see men work long get here between both life being
	under never day same another know while last might us great old year off come since against go
	came right used take three Paris résumé naïve 東京 😀`)

// openAIChatStream is a chat completions stream of about size bytes as the
// API sends it with include_usage: about one token per chunk, with the
// obfuscation padding, then the finish chunk, the usage chunk and [DONE].
func openAIChatStream(size int) []byte {
	rng := rand.New(rand.NewSource(1))
	head := `{"id":"chatcmpl-C9tYqX2vZ7kLmN3oPqR","object":"chat.completion.chunk","created":1755137933,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_07871e2ad8","choices":[{"index":0,"delta":`
	var b bytes.Buffer
	b.WriteString("data: " + head + `{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Qz7"}` + "\n\n")
	for b.Len() < size-1024 {
		word := meterWords[rng.Intn(len(meterWords))]
		if rng.Intn(3) > 0 {
			word = " " + word
		}
		text, _ := json.Marshal(word)
		fmt.Fprintf(&b, "data: %s{\"content\":%s},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"%s\"}\n\n",
			head, text, strings.Repeat("x", 1+rng.Intn(15)))
	}
	b.WriteString("data: " + head + `{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n")
	b.WriteString(`data: {"id":"chatcmpl-C9tYqX2vZ7kLmN3oPqR","object":"chat.completion.chunk","created":1755137933,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_07871e2ad8","choices":[],"usage":{"prompt_tokens":1117,"completion_tokens":4000,"total_tokens":5117,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// anthropicStream is a Messages stream of about size bytes: text deltas of
// a few words each, a ping now and then, cumulative usage at the end.
func anthropicStream(size int) []byte {
	rng := rand.New(rand.NewSource(2))
	var b bytes.Buffer
	b.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5-20250929\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":2095,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":1800,\"output_tokens\":1}}}\n\n")
	b.WriteString("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
	for i := 0; b.Len() < size-512; i++ {
		if i%200 == 199 {
			b.WriteString("event: ping\ndata: {\"type\": \"ping\"}\n\n")
		}
		var text strings.Builder
		for range 2 + rng.Intn(6) {
			text.WriteString(meterWords[rng.Intn(len(meterWords))] + " ")
		}
		t, _ := json.Marshal(text.String())
		fmt.Fprintf(&b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%s}}\n\n", t)
	}
	b.WriteString("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
	b.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":60000}}\n\n")
	b.WriteString("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	return b.Bytes()
}

var meterStreams = []struct {
	format stream.Format
	data   []byte
}{
	{stream.OpenAIChat, openAIChatStream(streamSize)},
	{stream.AnthropicMessages, anthropicStream(streamSize)},
}

// BenchmarkMeter reads a 1 MB stream through a Meter reporting to a permit
// on a bulkhead with a token budget, in 32 KiB reads as io.Copy makes them.
// Each iteration acquires its permit (about a microsecond against the
// stream's hundreds) and settles it. The "-strip" runs remove the usage
// chunk (StripUsageChunk, as the gateway does for a client that did not ask
// for usage), in 32 KiB reads and in the 2 KiB reads of the gateway's
// streamed answers.
func BenchmarkMeter(b *testing.B) {
	type run struct {
		name   string
		format stream.Format
		data   []byte
		strip  bool
		read   int
	}
	var runs []run
	for _, s := range meterStreams {
		runs = append(runs, run{s.format.String(), s.format, s.data, false, 32 << 10})
	}
	runs = append(runs, run{"openai_chat-strip", stream.OpenAIChat, meterStreams[0].data, true, 32 << 10},
		run{"openai_chat-strip-2k", stream.OpenAIChat, meterStreams[0].data, true, 2 << 10})
	for _, s := range runs {
		b.Run(s.name, func(b *testing.B) {
			cfg := bulkhead.Interactive("gpt-4o", 4)
			cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1 << 40}
			bh := newBench(b, cfg)
			req := &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: "Write a long story."}}, MaxTokens: 1 << 20}
			buf := make([]byte, s.read)
			ctx := context.Background()
			b.SetBytes(int64(len(s.data)))
			b.ReportAllocs()
			for b.Loop() {
				p, err := bh.Acquire(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				m, err := stream.NewMeter(io.NopCloser(bytes.NewReader(s.data)), p, stream.MeterOptions{Format: s.format, SSE: true, Model: "gpt-4o", StripUsageChunk: s.strip})
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := m.Read(buf); err == io.EOF {
						break
					} else if err != nil {
						b.Fatal(err)
					}
				}
				if !m.Settled() {
					b.Fatal("not settled")
				}
			}
		})
	}
}

// BenchmarkMeterBaseline is the floor BenchmarkMeter compares with: a plain
// bufio.Reader finding the lines of the same streams with ReadSlice.
func BenchmarkMeterBaseline(b *testing.B) {
	for _, s := range meterStreams {
		b.Run(s.format.String(), func(b *testing.B) {
			b.SetBytes(int64(len(s.data)))
			b.ReportAllocs()
			for b.Loop() {
				r := bufio.NewReader(bytes.NewReader(s.data))
				for {
					if _, err := r.ReadSlice('\n'); err == io.EOF {
						break
					} else if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
