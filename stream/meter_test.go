package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/jsondom"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func init() {
	// Every event the fast path reads is checked against a full parse, and
	// every block it reads against the scanner.
	fastPathCheck = func(f Format, block, name, data []byte, got eventInfo) {
		if block != nil {
			r := &sseRecorder{in: string(block)}
			sc := sseScanner{sink: r, max: maxLine, started: true}
			sc.feed(block)
			want := fmt.Sprintf("%q", data)
			if name != nil {
				want = fmt.Sprintf("%s:%q", name, data)
			}
			if len(r.events) != 1 || r.events[0] != want || len(r.ends) != 1 || r.ends[0] != len(block) {
				panic(fmt.Sprintf("fast path read block %q as %s, the scanner as %v ending %v", block, want, r.events, r.ends))
			}
		}
		var d jsondom.Doc
		if err := jsondom.Parse(&d, data); err != nil {
			panic(fmt.Sprintf("fast path read %q, which does not parse: %v", data, err))
		}
		var want eventInfo
		parseEvent(f, name, d.Root(), true, &want)
		if !want.pure() || want.chars != got.chars || want.started != got.started {
			panic(fmt.Sprintf("fast path read %q as %d chars (started %v), a parse as %+v", data, got.chars, got.started, want))
		}
	}
}

// testRequest reserves Input 10 (37 characters at gpt-4o's 3.7 per token)
// and MaxOutput 200.
var testRequest = &bulkhead.Request{
	Messages:  []bulkhead.Message{{Role: "user", Content: strings.Repeat("a", 37)}},
	MaxTokens: 200,
}

const testReserved = 210

// events records a bulkhead's usage and release events.
type events struct {
	mu       sync.Mutex
	usages   []bulkhead.UsageEvent
	releases []bulkhead.ReleaseEvent
}

func (e *events) hooks() bulkhead.Hooks {
	return bulkhead.Hooks{
		Usage: func(u bulkhead.UsageEvent) {
			e.mu.Lock()
			e.usages = append(e.usages, u)
			e.mu.Unlock()
		},
		Release: func(r bulkhead.ReleaseEvent) {
			e.mu.Lock()
			e.releases = append(e.releases, r)
			e.mu.Unlock()
		},
	}
}

// wait waits for n release events and returns copies of what was recorded.
func (e *events) wait(t *testing.T, n int) ([]bulkhead.UsageEvent, []bulkhead.ReleaseEvent) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("%d release events", n), func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.releases) >= n
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]bulkhead.UsageEvent(nil), e.usages...), append([]bulkhead.ReleaseEvent(nil), e.releases...)
}

// newBudgetBulkhead builds a bulkhead with a token budget whose events ev
// records; it is shut down when the test ends.
func newBudgetBulkhead(t testing.TB, ev *events) *bulkhead.Bulkhead {
	t.Helper()
	cfg := bulkhead.Interactive("gpt-4o", 8)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100_000}
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ev != nil {
		b.Subscribe(ev.hooks())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Settle)
		defer cancel()
		if res, err := b.Shutdown(ctx); err != nil || !res.Drained {
			t.Errorf("Shutdown: %+v, %v", res, err)
		}
	})
	return b
}

func acquire(t testutil.Fataler, b *bulkhead.Bulkhead) *bulkhead.Permit {
	t.Helper()
	p, err := b.Acquire(context.Background(), testRequest)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if r := p.Reservation(); r == nil || r.Input != 10 || r.MaxOutput != 200 {
		t.Fatalf("reservation = %+v, want input 10, max output 200", r)
	}
	return p
}

// chunker returns its data in reads of 1 to max bytes, sizes drawn from a
// seeded source.
type chunker struct {
	data []byte
	rng  *rand.Rand
	max  int
}

func (c *chunker) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data), 1+c.rng.Intn(c.max))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// chunkings are the ways the tests cut a body into reads.
var chunkings = []struct {
	name string
	r    func([]byte) io.Reader
}{
	{"whole", func(b []byte) io.Reader { return bytes.NewReader(b) }},
	{"one-byte", func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) }},
	{"chunks-7", func(b []byte) io.Reader { return &chunker{b, rand.New(rand.NewSource(7)), 16} }},
	{"chunks-42", func(b []byte) io.Reader { return &chunker{b, rand.New(rand.NewSource(42)), 200} }},
	{"half", func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) }},
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fixture is a recorded response and what metering it must give, with
// CharsPerToken 4 against testRequest's reservation (input 10).
type fixture struct {
	file   string
	format Format
	sse    bool
	want   bulkhead.Usage
	exact  bool
	counts tokenCounts // the breakdown, for exact usage
	perr   string      // the provider error's type, if any
}

var fixtures = []fixture{
	{file: "openai_chat_normal.sse", format: OpenAIChat, sse: true, want: bulkhead.Usage{Input: 1117, Output: 9, CachedInput: 1024}, exact: true,
		counts: tokenCounts{input: 1117, cachedInput: 1024, output: 9}},
	// "Hello there, how can I help you today?": 38 characters.
	{file: "openai_chat_no_usage.sse", format: OpenAIChat, sse: true, want: bulkhead.Usage{Input: 10, Output: 10}},
	// 20 characters before the error.
	{file: "openai_chat_error.sse", format: OpenAIChat, sse: true, want: bulkhead.Usage{Input: 10, Output: 5}, perr: "server_error"},
	// 27 characters in complete events; the cut-off event counts nothing.
	{file: "openai_chat_truncated.sse", format: OpenAIChat, sse: true, want: bulkhead.Usage{Input: 10, Output: 7}},
	// The arguments {"location":"Paris, France","unit":"celsius"}: 45.
	{file: "openai_chat_tool_calls.sse", format: OpenAIChat, sse: true, want: bulkhead.Usage{Input: 10, Output: 12}},
	// こんにちは 世界🌍 " naïve café" " été 😀" (escaped): 5 + 4 + 11 + 7 UTF-16 units.
	{file: "openai_chat_multibyte.sse", format: OpenAIChat, sse: true, want: bulkhead.Usage{Input: 10, Output: 7}},
	{file: "openai_responses_normal.sse", format: OpenAIResponses, sse: true, want: bulkhead.Usage{Input: 1117, Output: 46, CachedInput: 1024, Reasoning: 38}, exact: true,
		counts: tokenCounts{input: 1117, cachedInput: 1024, output: 46, reasoning: 38}},
	// Reasoning summary (24) and function arguments (20).
	{file: "openai_responses_truncated.sse", format: OpenAIResponses, sse: true, want: bulkhead.Usage{Input: 10, Output: 11}},
	// 14 characters before the error event, which settles.
	{file: "openai_responses_error.sse", format: OpenAIResponses, sse: true, want: bulkhead.Usage{Input: 10, Output: 4}, perr: "server_is_overloaded"},
	// The error event as the API sends it, its fields under "error" (the
	// flat shape above is the one documented); the code names it.
	{file: "openai_responses_error_nested.sse", format: OpenAIResponses, sse: true, want: bulkhead.Usage{Input: 10, Output: 4}, perr: "rate_limit_exceeded"},
	// response.failed without an error event: the response's error.
	{file: "openai_responses_failed.sse", format: OpenAIResponses, sse: true, want: bulkhead.Usage{Input: 10, Output: 4}, perr: "server_error"},
	{file: "openai_responses_tool_calls.sse", format: OpenAIResponses, sse: true, want: bulkhead.Usage{Input: 310, Output: 18}, exact: true,
		counts: tokenCounts{input: 310, output: 18}},
	{file: "anthropic_normal.sse", format: AnthropicMessages, sse: true, want: bulkhead.Usage{Input: 25, Output: 15}, exact: true,
		counts: tokenCounts{input: 25, output: 15}},
	// The last message_delta overwrites input (180 + 20 + 10) and output
	// (32, not 10 + 32).
	{file: "anthropic_cache.sse", format: AnthropicMessages, sse: true, want: bulkhead.Usage{Input: 210, Output: 32, CachedInput: 10, CacheCreation: 20}, exact: true,
		counts: tokenCounts{input: 210, cachedInput: 10, cacheCreation: 20, output: 32}},
	// Input from message_start; 16 characters before the error.
	{file: "anthropic_error.sse", format: AnthropicMessages, sse: true, want: bulkhead.Usage{Input: 25, Output: 4}, perr: "overloaded_error"},
	// Thinking (27) and tool input (21); the signature is not text.
	{file: "anthropic_tool_use_truncated.sse", format: AnthropicMessages, sse: true, want: bulkhead.Usage{Input: 412, Output: 12}},
	// The last usageMetadata: prompt 15 + tool prompt 2, candidates 7 + thoughts 21.
	{file: "gemini_normal.sse", format: Gemini, sse: true, want: bulkhead.Usage{Input: 17, Output: 28, CachedInput: 4, Reasoning: 21}, exact: true,
		counts: tokenCounts{input: 17, cachedInput: 4, output: 28, reasoning: 21}},
	{file: "gemini_array.json", format: Gemini, want: bulkhead.Usage{Input: 17, Output: 28, CachedInput: 4, Reasoning: 21}, exact: true,
		counts: tokenCounts{input: 17, cachedInput: 4, output: 28, reasoning: 21}},
	// The error cuts the stream before its finishReason chunk: the running
	// counts are not the final ones.
	{file: "gemini_error.sse", format: Gemini, sse: true, want: bulkhead.Usage{Input: 15, Output: 24, CachedInput: 4, Reasoning: 21}, perr: "UNAVAILABLE"},
	// Cut before the finishReason chunk: the running counts of the second
	// chunk (candidates 5 + thoughts 21), not exact.
	{file: "gemini_cut.sse", format: Gemini, sse: true, want: bulkhead.Usage{Input: 15, Output: 26, CachedInput: 4, Reasoning: 21}},
	{file: "gemini_array_cut.json", format: Gemini, want: bulkhead.Usage{Input: 15, Output: 26, CachedInput: 4, Reasoning: 21}},
	// Prompt 60 known; text (13) and the function call's raw args (37).
	{file: "gemini_function_call_truncated.sse", format: Gemini, sse: true, want: bulkhead.Usage{Input: 60, Output: 13}},
	{file: "openai_chat.json", format: OpenAIChat, want: bulkhead.Usage{Input: 19, Output: 10}, exact: true,
		counts: tokenCounts{input: 19, output: 10}},
	// "Sure, here it is." (17) and the arguments {"id":42} (9).
	{file: "openai_chat_no_usage.json", format: OpenAIChat, want: bulkhead.Usage{Input: 10, Output: 7}},
	{file: "openai_responses.json", format: OpenAIResponses, want: bulkhead.Usage{Input: 36, Output: 87, Reasoning: 64}, exact: true,
		counts: tokenCounts{input: 36, output: 87, reasoning: 64}},
	{file: "anthropic.json", format: AnthropicMessages, want: bulkhead.Usage{Input: 3895, Output: 503, CachedInput: 1800}, exact: true,
		counts: tokenCounts{input: 3895, cachedInput: 1800, output: 503}},
	{file: "anthropic_error.json", format: AnthropicMessages, want: bulkhead.Usage{Input: 10}, perr: "overloaded_error"},
	{file: "gemini.json", format: Gemini, want: bulkhead.Usage{Input: 15, Output: 28, Reasoning: 21}, exact: true,
		counts: tokenCounts{input: 15, output: 28, reasoning: 21}},
}

// fixtureNamed returns the fixture of the file name.
func fixtureNamed(t *testing.T, name string) fixture {
	t.Helper()
	for _, f := range fixtures {
		if f.file == name {
			return f
		}
	}
	t.Fatalf("no fixture %s", name)
	return fixture{}
}

func (f fixture) options() MeterOptions {
	return MeterOptions{Format: f.format, SSE: f.sse, CharsPerToken: 4, ReportEvery: 2}
}

// checkReadErr checks what reading a fixture to its end returned.
func (f fixture) checkReadErr(t testutil.Fataler, err error) {
	t.Helper()
	if f.perr == "" {
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return
	}
	var pe *ProviderError
	if !errors.As(err, &pe) || pe.Type != f.perr || pe.Format != f.format || pe.Message == "" {
		t.Fatalf("read error = %#v, want a provider error %s", err, f.perr)
	}
}

func TestMeterFixtures(t *testing.T) {
	for _, f := range fixtures {
		data := readFixture(t, f.file)
		for _, c := range chunkings {
			t.Run(f.file+"/"+c.name, func(t *testing.T) {
				ev := &events{}
				b := newBudgetBulkhead(t, ev)
				p := acquire(t, b)
				m, err := NewMeter(io.NopCloser(c.r(data)), p, f.options())
				if err != nil {
					t.Fatal(err)
				}
				out, err := io.ReadAll(m)
				f.checkReadErr(t, err)
				if !bytes.Equal(out, data) {
					t.Fatalf("read %d bytes, want the %d of the body unchanged", len(out), len(data))
				}
				if !m.Settled() {
					t.Fatal("not settled at the end of the body")
				}
				if u, exact := m.Usage(); u != f.want || exact != f.exact {
					t.Fatalf("Usage() = %+v, %v; want %+v, %v", u, exact, f.want, f.exact)
				}
				if f.exact && m.counts != f.counts {
					t.Fatalf("breakdown = %+v, want %+v", m.counts, f.counts)
				}
				if (m.Err() != nil) != (f.perr != "") {
					t.Fatalf("Err() = %v", m.Err())
				}
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
				usages, releases := ev.wait(t, 1)
				checkSettled(t, b, releases, f.want)
				if f.sse && c.name != "whole" { // a small body read whole ends in the read that reports
					checkProgressive(t, usages)
				}
			})
		}
	}
}

// checkSettled checks that the one admission was released once with want,
// and the budget is whole again.
func checkSettled(t *testing.T, b *bulkhead.Bulkhead, releases []bulkhead.ReleaseEvent, want bulkhead.Usage) {
	t.Helper()
	if len(releases) != 1 {
		t.Fatalf("%d releases, want 1", len(releases))
	}
	if r := releases[0]; r.Usage == nil || *r.Usage != want {
		t.Fatalf("released with %v, want %+v", r.Usage, want)
	}
	st := b.Stats()
	if st.TokenBudget.InFlightTokens != 0 || st.Gate.DoubleReleases != 0 || st.Calls.InFlight != 0 {
		t.Fatalf("after release: in flight %d tokens, %d calls, %d double releases",
			st.TokenBudget.InFlightTokens, st.Calls.InFlight, st.Gate.DoubleReleases)
	}
}

// checkProgressive checks that a stream's reports held less than the
// reservation, and less as the output grew.
func checkProgressive(t *testing.T, usages []bulkhead.UsageEvent) {
	t.Helper()
	if len(usages) == 0 {
		t.Fatal("no usage reported during the stream")
	}
	first, last := usages[0], usages[len(usages)-1]
	if first.Progressive == nil || first.Held >= testReserved {
		t.Fatalf("first report %+v did not free the hold", first)
	}
	if len(usages) > 1 && last.Held >= first.Held {
		t.Fatalf("hold went from %d to %d", first.Held, last.Held)
	}
}

func TestMeterRatio(t *testing.T) {
	// 38 characters of text, no usage.
	data := readFixture(t, "openai_chat_no_usage.sse")
	for _, c := range []struct {
		opts MeterOptions
		want int64
	}{
		{MeterOptions{Model: "gpt-4o"}, 11},                   // 38 / 3.7
		{MeterOptions{Model: "GPT-4O-mini"}, 11},              // the table's prefixes, any case
		{MeterOptions{Model: "claude-sonnet-4-5"}, 10},        // 38 / 3.9
		{MeterOptions{Model: "some-local-model"}, 10},         // 38 / 4
		{MeterOptions{Model: "gpt-4o", CharsPerToken: 2}, 19}, // the option wins
	} {
		c.opts.Format, c.opts.SSE = OpenAIChat, true
		m, err := NewMeter(io.NopCloser(bytes.NewReader(data)), nil, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, m); err != nil {
			t.Fatal(err)
		}
		if u, _ := m.Usage(); u.Output != c.want || u.Input != 0 {
			t.Errorf("%+v: usage %+v, want output %d (no input known without a budget)", c.opts, u, c.want)
		}
	}
}

func TestMeterCloseEarly(t *testing.T) {
	data := readFixture(t, "anthropic_normal.sse")
	// Up to the end of the second text delta: input 25 from message_start,
	// "Hello! How can I" (16 characters) so far.
	cut := bytes.Index(data, []byte(`" help you today?"`))
	cut = bytes.LastIndex(data[:cut], []byte("event:"))
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	p := acquire(t, b)
	body := &closeCounter{Reader: bytes.NewReader(data)}
	m, err := NewMeter(body, p, MeterOptions{Format: AnthropicMessages, SSE: true, CharsPerToken: 4, ReportEvery: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(m, make([]byte, cut)); err != nil {
		t.Fatal(err)
	}
	if m.Settled() {
		t.Fatal("settled before the end")
	}
	want := bulkhead.Usage{Input: 25, Output: 4}
	if u, exact := m.Usage(); u != want || exact {
		t.Fatalf("Usage() mid-stream = %+v, %v; want %+v, not exact", u, exact, want)
	}
	for range 2 {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if body.closes != 1 {
		t.Fatalf("body closed %d times", body.closes)
	}
	usages, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, want)
	checkProgressive(t, usages)
}

type closeCounter struct {
	io.Reader
	closes int
}

func (c *closeCounter) Close() error { c.closes++; return nil }

func TestMeterReadError(t *testing.T) {
	data := readFixture(t, "openai_chat_no_usage.sse")
	// The first four events: the role chunk, "Hello", " there", ", how".
	cut := 0
	for range 4 {
		cut += bytes.Index(data[cut:], []byte("\n\n")) + 2
	}
	boom := errors.New("connection reset")
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	p := acquire(t, b)
	r := io.MultiReader(iotest.OneByteReader(bytes.NewReader(data[:cut])), iotest.ErrReader(boom))
	m, err := NewMeter(io.NopCloser(r), p, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4})
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(m)
	if err != boom || !bytes.Equal(out, data[:cut]) {
		t.Fatalf("read %d bytes and %v, want %d and the body's error", len(out), err, cut)
	}
	if !m.Settled() {
		t.Fatal("not settled at the read error")
	}
	_, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, bulkhead.Usage{Input: 10, Output: 4}) // 16 characters
	if m.Err() != nil {
		t.Fatalf("Err() = %v for a body error", m.Err())
	}
}

// TestMeterStripUsageChunk: exactly the bytes of the usage event go, the
// meter still settles with the usage it carried.
func TestMeterStripUsageChunk(t *testing.T) {
	normal := readFixture(t, "openai_chat_normal.sse")
	usage := bytes.Index(normal, []byte(`data: {"id":"chatcmpl-C9tYqX2vZ","object":"chat.completion.chunk","created":1755137933,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_07871e2ad8","choices":[]`))
	end := usage + bytes.Index(normal[usage:], []byte("\n\n")) + 2
	crlf := bytes.ReplaceAll(normal, []byte("\n"), []byte("\r\n"))
	cr := bytes.ReplaceAll(normal, []byte("\n"), []byte("\r"))
	withComment := append(append(append([]byte(nil), normal[:usage]...), ": keep-alive\n\n"...), normal[usage:]...)
	cases := []struct {
		name       string
		in, want   []byte
		wantExact  bool
		wantOutput int64
	}{
		{"lf", normal, append(append([]byte(nil), normal[:usage]...), normal[end:]...), true, 9},
		{"crlf", crlf, bytes.ReplaceAll(append(append([]byte(nil), normal[:usage]...), normal[end:]...), []byte("\n"), []byte("\r\n")), true, 9},
		{"cr", cr, bytes.ReplaceAll(append(append([]byte(nil), normal[:usage]...), normal[end:]...), []byte("\n"), []byte("\r")), true, 9},
		{"comment-before", withComment, append(append(append([]byte(nil), normal[:usage]...), ": keep-alive\n\n"...), normal[end:]...), true, 9},
		{"no-usage-chunk", readFixture(t, "openai_chat_no_usage.sse"), readFixture(t, "openai_chat_no_usage.sse"), false, 10},
	}
	for _, tc := range cases {
		for _, c := range chunkings {
			t.Run(tc.name+"/"+c.name, func(t *testing.T) {
				ev := &events{}
				b := newBudgetBulkhead(t, ev)
				p := acquire(t, b)
				m, err := NewMeter(io.NopCloser(c.r(tc.in)), p, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4, StripUsageChunk: true})
				if err != nil {
					t.Fatal(err)
				}
				out, err := io.ReadAll(m)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(out, tc.want) {
					t.Fatalf("read\n%q\nwant\n%q", out, tc.want)
				}
				want := bulkhead.Usage{Input: 10, Output: tc.wantOutput}
				if tc.wantExact {
					want = bulkhead.Usage{Input: 1117, Output: 9, CachedInput: 1024}
				}
				if u, exact := m.Usage(); u != want || exact != tc.wantExact {
					t.Fatalf("Usage() = %+v, %v", u, exact)
				}
				_, releases := ev.wait(t, 1)
				checkSettled(t, b, releases, want)
			})
		}
	}
}

// TestMeterConcurrentClose: Close while a Read is blocked on the body
// settles once and unblocks the Read.
func TestMeterConcurrentClose(t *testing.T) {
	data := readFixture(t, "openai_chat_no_usage.sse")
	cut := bytes.Index(data, []byte(`" can"`)) // up to ", how": 16 characters
	cut = bytes.LastIndex(data[:cut], []byte("data:"))
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	p := acquire(t, b)
	pr, pw := io.Pipe()
	m, err := NewMeter(pr, p, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, m)
		done <- err
	}()
	if _, err := pw.Write(data[:cut]); err != nil { // returns once the meter read it all
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the first reports", func() bool { u, _ := m.Usage(); return u.Output == 4 })
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = m.Close()
		}()
	}
	wg.Wait()
	select {
	case err := <-done:
		if !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("blocked Read returned %v", err)
		}
	case <-time.After(testutil.Settle):
		t.Fatal("Close did not unblock the Read")
	}
	_ = pw.Close()
	_, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, bulkhead.Usage{Input: 10, Output: 4})
}

// TestMeterRunContext: inside Run, the meter records the final usage with
// SetUsage and Run releases with it.
func TestMeterRunContext(t *testing.T) {
	f := fixtureNamed(t, "openai_chat_normal.sse")
	data := readFixture(t, f.file)
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	n, err := bulkhead.Run(context.Background(), b, testRequest, func(_ context.Context, rc *bulkhead.RunContext) (int64, error) {
		m, err := NewMeter(io.NopCloser(iotest.HalfReader(bytes.NewReader(data))), rc, f.options())
		if err != nil {
			return 0, err
		}
		defer m.Close()
		return io.Copy(io.Discard, m)
	})
	if err != nil || n != int64(len(data)) {
		t.Fatalf("Run = %d, %v", n, err)
	}
	usages, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, f.want)
	checkProgressive(t, usages)
	if last := usages[len(usages)-1]; last.Progressive == nil || *last.Progressive != (bulkhead.Progressive{}) {
		t.Fatalf("last report %+v: want the final one, holding nothing for output", last)
	}
}

func TestMeterWithoutBudget(t *testing.T) {
	f := fixtureNamed(t, "anthropic_normal.sse")
	data := readFixture(t, f.file)
	b, err := bulkhead.New(bulkhead.Interactive("claude-sonnet-4-5", 2))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = b.Shutdown(context.Background()) }()
	ev := &events{}
	b.Subscribe(ev.hooks())
	p, err := b.Acquire(context.Background(), testRequest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMeter(io.NopCloser(iotest.OneByteReader(bytes.NewReader(data))), p, f.options())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	usages, releases := ev.wait(t, 1)
	if len(releases) != 1 || releases[0].Usage == nil || *releases[0].Usage != f.want {
		t.Fatalf("releases = %+v", releases)
	}
	if len(usages) == 0 {
		t.Fatal("no usage reported")
	}
	for _, u := range usages {
		if u.Progressive != nil || u.Held != 0 {
			t.Fatalf("report without a budget: %+v", u)
		}
	}
}

// fakeAdmission records reports; fail makes them fail.
type fakeAdmission struct {
	res     *bulkhead.Reservation
	fail    bool
	reports []bulkhead.Usage
	progs   []*bulkhead.Progressive
}

func (f *fakeAdmission) ReportUsage(u bulkhead.Usage, p *bulkhead.Progressive) (bulkhead.UsageReport, error) {
	f.reports = append(f.reports, u)
	if p != nil {
		c := *p
		p = &c
	}
	f.progs = append(f.progs, p)
	if f.fail {
		return bulkhead.UsageReport{}, errors.New("no")
	}
	return bulkhead.UsageReport{}, nil
}

func (f *fakeAdmission) Reservation() *bulkhead.Reservation { return f.res }

func TestMeterOtherAdmission(t *testing.T) {
	data := readFixture(t, "openai_chat_no_usage.sse") // 38 characters
	a := &fakeAdmission{res: &bulkhead.Reservation{Input: 7, MaxOutput: 8, Reserved: 15}}
	m, err := NewMeter(io.NopCloser(iotest.OneByteReader(bytes.NewReader(data))), a, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4, ReportEvery: 3, SafetyMargin: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	// Reports at the first chunk, then each 3 tokens, then the final one.
	want := []int64{0, 3, 6, 10, 10}
	if len(a.reports) != len(want) {
		t.Fatalf("reports %+v, want outputs %v", a.reports, want)
	}
	for i, u := range a.reports {
		p := a.progs[i]
		wantProg := bulkhead.Progressive{RemainingOutput: max(0, 8-want[i]), SafetyMargin: 5}
		if i == len(want)-1 {
			wantProg = bulkhead.Progressive{}
		}
		if u.Input != 7 || u.Output != want[i] || p == nil || *p != wantProg {
			t.Fatalf("report %d = %+v, %+v; want output %d, %+v", i, u, p, want[i], wantProg)
		}
	}

	// One Read makes one report, as of its end; a Read that ends the
	// response makes none: the meter settles.
	a = &fakeAdmission{res: &bulkhead.Reservation{Input: 7, MaxOutput: 80, Reserved: 87}}
	m, err = NewMeter(io.NopCloser(bytes.NewReader(data)), a, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4, ReportEvery: 1})
	if err != nil {
		t.Fatal(err)
	}
	done := bytes.Index(data, []byte("data: [DONE]"))
	if n, err := m.Read(make([]byte, done)); n != done || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	if len(a.reports) != 2 || a.reports[0].Output != 10 || *a.progs[0] != (bulkhead.Progressive{RemainingOutput: 70, SafetyMargin: 3}) || *a.progs[1] != (bulkhead.Progressive{}) {
		t.Fatalf("reading in one go: reports %+v", a.reports)
	}

	// A failing admission gets one report, and the meter still settles.
	a = &fakeAdmission{fail: true}
	m, err = NewMeter(io.NopCloser(iotest.OneByteReader(bytes.NewReader(data))), a, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4, ReportEvery: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	if len(a.reports) != 1 || a.progs[0] != nil || !m.Settled() {
		t.Fatalf("after a failed report: %d reports (%+v), settled %v", len(a.reports), a.progs, m.Settled())
	}
	if u, _ := m.Usage(); u != (bulkhead.Usage{Output: 10}) {
		t.Fatalf("usage = %+v", u)
	}
}

func TestMeterDefaultMargin(t *testing.T) {
	data := readFixture(t, "openai_chat_no_usage.sse")
	a := &fakeAdmission{res: &bulkhead.Reservation{Input: 7, MaxOutput: 100, Reserved: 107}}
	m, err := NewMeter(io.NopCloser(iotest.OneByteReader(bytes.NewReader(data))), a, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4, ReportEvery: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	// Outputs 0, 5 ("Hello there, how can I help you" is 31 characters: 8
	// tokens; 5 at "Hello there, how can" = 20), 10 (38): margins a quarter,
	// rounded up.
	for i, want := range []bulkhead.Progressive{{RemainingOutput: 100}, {RemainingOutput: 95, SafetyMargin: 2}, {RemainingOutput: 90, SafetyMargin: 3}, {}} {
		if i >= len(a.progs) || a.progs[i] == nil || *a.progs[i] != want {
			t.Fatalf("reports %+v %+v, want %d: %+v", a.reports, a.progs, i, want)
		}
	}
}

func TestMeterResponse(t *testing.T) {
	data := readFixture(t, "anthropic_normal.sse")
	for _, c := range []struct {
		status int
		ct     string
		want   bulkhead.Usage
		exact  bool
	}{
		{200, "text/event-stream; charset=utf-8", bulkhead.Usage{Input: 25, Output: 15}, true},
		{200, "Text/Event-Stream", bulkhead.Usage{Input: 25, Output: 15}, true},
		{200, "application/json", bulkhead.Usage{Input: 10}, false}, // not JSON: nothing to read
		{529, "text/event-stream", bulkhead.Usage{}, false},         // the provider did no work
		{429, "application/json", bulkhead.Usage{}, false},
	} {
		t.Run(fmt.Sprint(c.status, c.ct), func(t *testing.T) {
			ev := &events{}
			b := newBudgetBulkhead(t, ev)
			p := acquire(t, b)
			resp := &http.Response{StatusCode: c.status, Header: http.Header{"Content-Type": {c.ct}}, Body: io.NopCloser(bytes.NewReader(data))}
			m, err := MeterResponse(resp, p, MeterOptions{Format: AnthropicMessages, CharsPerToken: 4})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Body != m {
				t.Fatal("resp.Body is not the meter")
			}
			out, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(out, data) {
				t.Fatalf("read %d bytes, %v", len(out), err)
			}
			if u, exact := m.Usage(); u != c.want || exact != c.exact {
				t.Fatalf("Usage() = %+v, %v", u, exact)
			}
			_, releases := ev.wait(t, 1)
			checkSettled(t, b, releases, c.want)
		})
	}
	// A non-2xx response settles at Close too.
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	p := acquire(t, b)
	resp := &http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(data))}
	if _, err := MeterResponse(resp, p, MeterOptions{Format: AnthropicMessages}); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	_, releases := ev.wait(t, 1)
	checkSettled(t, b, releases, bulkhead.Usage{})
}

func TestMeterOptionsInvalid(t *testing.T) {
	ok := MeterOptions{Format: OpenAIChat, SSE: true}
	for _, c := range []struct {
		field string
		edit  func(*MeterOptions)
	}{
		{"MeterOptions.Format", func(o *MeterOptions) { o.Format = 0 }},
		{"MeterOptions.Format", func(o *MeterOptions) { o.Format = Gemini + 1 }},
		{"MeterOptions.CharsPerToken", func(o *MeterOptions) { o.CharsPerToken = -1 }},
		{"MeterOptions.CharsPerToken", func(o *MeterOptions) { o.CharsPerToken = math.NaN() }},
		{"MeterOptions.CharsPerToken", func(o *MeterOptions) { o.CharsPerToken = math.Inf(1) }},
		{"MeterOptions.ReportEvery", func(o *MeterOptions) { o.ReportEvery = -1 }},
		{"MeterOptions.SafetyMargin", func(o *MeterOptions) { o.SafetyMargin = -1 }},
		{"MeterOptions.MaxJSONBytes", func(o *MeterOptions) { o.MaxJSONBytes = -1 }},
		{"MeterOptions.StripUsageChunk", func(o *MeterOptions) { o.StripUsageChunk, o.Format = true, AnthropicMessages }},
		{"MeterOptions.StripUsageChunk", func(o *MeterOptions) { o.StripUsageChunk, o.SSE = true, false }},
	} {
		o := ok
		c.edit(&o)
		body := &closeCounter{Reader: strings.NewReader("")}
		a := &fakeAdmission{}
		_, err := NewMeter(body, a, o)
		var ce *bulkhead.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("%+v: error %v, want one naming %s", o, err, c.field)
		}
		if body.closes != 0 || len(a.reports) != 0 {
			t.Errorf("%+v: a bad option closed the body or reported", o)
		}
	}
	if _, err := NewMeter(nil, nil, ok); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Errorf("nil body: %v", err)
	}
	if _, err := MeterResponse(nil, nil, ok); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Errorf("nil response: %v", err)
	}
	// MeterResponse takes StripUsageChunk for a response that turns out not
	// to be SSE, but not for a format it does not apply to.
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody}
	if _, err := MeterResponse(resp, nil, MeterOptions{Format: OpenAIChat, StripUsageChunk: true}); err != nil {
		t.Errorf("strip on a JSON response: %v", err)
	}
	body := resp.Body
	if _, err := MeterResponse(resp, nil, MeterOptions{Format: Gemini, StripUsageChunk: true}); err == nil || resp.Body != body {
		t.Errorf("strip on gemini: %v", err)
	}
	// A stripped stream is shorter than the provider's: its length is
	// unknown. Without stripping, the length stands.
	for _, strip := range []bool{true, false} {
		resp = &http.Response{StatusCode: 200, ContentLength: 42, Body: http.NoBody,
			Header: http.Header{"Content-Type": {"text/event-stream"}, "Content-Length": {"42"}}}
		if _, err := MeterResponse(resp, nil, MeterOptions{Format: OpenAIChat, StripUsageChunk: strip}); err != nil {
			t.Fatal(err)
		}
		if kept := resp.ContentLength == 42 && resp.Header.Get("Content-Length") == "42"; kept == strip ||
			strip && (resp.ContentLength != -1 || resp.Header.Get("Content-Length") != "") {
			t.Errorf("strip %v: length %d, header %q", strip, resp.ContentLength, resp.Header.Get("Content-Length"))
		}
	}
}

func TestMeterTypedNilAdmission(t *testing.T) {
	data := readFixture(t, "gemini_normal.sse")
	for _, a := range []Admission{(*bulkhead.Permit)(nil), (*bulkhead.RunContext)(nil), nil} {
		m, err := NewMeter(io.NopCloser(bytes.NewReader(data)), a, MeterOptions{Format: Gemini, SSE: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, m); err != nil {
			t.Fatal(err)
		}
		if u, exact := m.Usage(); u != (bulkhead.Usage{Input: 17, Output: 28, CachedInput: 4, Reasoning: 21}) || !exact {
			t.Fatalf("%T: usage %+v, %v", a, u, exact)
		}
	}
}

func TestProviderErrorMessage(t *testing.T) {
	e := &ProviderError{Format: OpenAIChat, Type: "server_error", Message: "The server had an error"}
	if got, want := e.Error(), "stream: openai_chat response: provider error server_error: The server had an error"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e.Type = ""
	if got, want := e.Error(), "stream: openai_chat response: provider error: The server had an error"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// TestMeterGeminiRunningCounts checks that a Gemini stream's counts are
// exact only from its chunk with a finishReason: before it they are the
// provider's running totals.
func TestMeterGeminiRunningCounts(t *testing.T) {
	data := readFixture(t, "gemini_normal.sse")
	last := bytes.LastIndex(data, []byte("data: ")) // the finishReason chunk
	m, err := NewMeter(io.NopCloser(bytes.NewReader(data)), nil, MeterOptions{Format: Gemini, SSE: true, CharsPerToken: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(m, make([]byte, last)); err != nil {
		t.Fatal(err)
	}
	if u, exact := m.Usage(); exact || u.Output != 26 {
		t.Errorf("before the finishReason chunk: Usage() = %+v, %v; want the running output 26, not exact", u, exact)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	if u, exact := m.Usage(); !exact || u.Output != 28 || !m.Settled() {
		t.Errorf("after it: Usage() = %+v, %v; want output 28, exact", u, exact)
	}
}

// TestResponsesErrorEvent checks the error of a Responses stream's error
// event in each shape: its fields on the event (as documented), under
// "error" (as sent), or both; the name is the code, else the error's type,
// never the event's type.
func TestResponsesErrorEvent(t *testing.T) {
	cases := []struct{ data, typ, msg string }{
		{`{"type":"error","code":"server_error","message":"m","param":null}`, "server_error", "m"},
		{`{"type":"error","error":{"type":"insufficient_quota","code":"quota_exceeded","message":"m","param":null}}`, "quota_exceeded", "m"},
		{`{"type":"error","error":{"type":"too_many_requests","code":null,"message":"m"}}`, "too_many_requests", "m"},
		{`{"type":"error","code":null,"message":"m"}`, "", "m"},
		{`{"type":"error","message":"flat","error":{"code":"c","message":"nested"}}`, "c", "flat"},
		{`{"type":"error","error":"oops"}`, "", ""},
	}
	for _, c := range cases {
		var d jsondom.Doc
		if err := jsondom.Parse(&d, []byte(c.data)); err != nil {
			t.Fatal(err)
		}
		var e eventInfo
		parseEvent(OpenAIResponses, []byte("error"), d.Root(), true, &e)
		if e.perr == nil || !e.terminal || e.perr.Type != c.typ || e.perr.Message != c.msg || e.perr.Format != OpenAIResponses {
			t.Errorf("%s: error %+v (terminal %v), want type %q message %q", c.data, e.perr, e.terminal, c.typ, c.msg)
		}
	}
}

func TestToUsage(t *testing.T) {
	for _, c := range []struct{ in, want tokenCounts }{
		{tokenCounts{input: 10, cachedInput: 4, cacheCreation: 3, output: 5, reasoning: 2}, tokenCounts{input: 10, cachedInput: 4, cacheCreation: 3, output: 5, reasoning: 2}},
		// Parts larger than their totals are cut to fit.
		{tokenCounts{input: 10, cachedInput: 8, cacheCreation: 8, output: 5, reasoning: 9}, tokenCounts{input: 10, cachedInput: 8, cacheCreation: 2, output: 5, reasoning: 5}},
		{tokenCounts{input: 10, cachedInput: 12, output: 5}, tokenCounts{input: 10, cachedInput: 10, output: 5}},
		// A sum that would overflow.
		{tokenCounts{input: math.MaxInt64 - 3, output: 10, reasoning: 10}, tokenCounts{input: math.MaxInt64 - 3, output: 3, reasoning: 3}},
	} {
		got := c.in.valid()
		if got != c.want {
			t.Errorf("valid(%+v) = %+v, want %+v", c.in, got, c.want)
		}
		w := c.want
		if u := toUsage(c.in); u != (bulkhead.Usage{Input: w.input, Output: w.output, CachedInput: w.cachedInput, CacheCreation: w.cacheCreation, Reasoning: w.reasoning}) {
			t.Errorf("toUsage(%+v) = %+v", c.in, u)
		}
	}
}

// TestMeterUsageOverwrite: cumulative counts overwrite, they never add up,
// and text after a count adds its estimate to it.
func TestMeterUsageOverwrite(t *testing.T) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	start := ev("message_start", `{"type":"message_start","message":{"usage":{"input_tokens":0,"output_tokens":1}}}`)
	delta := ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"12345678"}}`)
	md := func(u string) string { return ev("message_delta", `{"type":"message_delta","delta":{},"usage":`+u+`}`) }
	for _, c := range []struct {
		name  string
		body  string
		want  bulkhead.Usage
		exact bool
	}{
		{"placeholder output ignored", start, bulkhead.Usage{}, false},
		{"text estimated", start + delta, bulkhead.Usage{Output: 2}, false},
		{"count replaces estimate", start + delta + md(`{"output_tokens":5}`), bulkhead.Usage{Output: 5}, true},
		{"text after a count", start + delta + md(`{"output_tokens":5}`) + delta, bulkhead.Usage{Output: 7}, false},
		{"second count overwrites", start + delta + md(`{"output_tokens":5}`) + delta + md(`{"output_tokens":9}`), bulkhead.Usage{Output: 9}, true},
		{"relay input in message_delta", start + md(`{"input_tokens":40,"cache_read_input_tokens":2,"output_tokens":3}`), bulkhead.Usage{Input: 42, Output: 3, CachedInput: 2}, true},
		{"null input keeps the last", start + md(`{"input_tokens":40,"output_tokens":3}`) + md(`{"input_tokens":null,"output_tokens":4}`), bulkhead.Usage{Input: 40, Output: 4}, true},
		{"negative and fractional counts ignored", start + md(`{"input_tokens":-4,"output_tokens":2.5}`), bulkhead.Usage{}, false},
	} {
		m, err := NewMeter(io.NopCloser(strings.NewReader(c.body)), nil, MeterOptions{Format: AnthropicMessages, SSE: true, CharsPerToken: 4})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, m); err != nil {
			t.Fatal(err)
		}
		if u, exact := m.Usage(); u != c.want || exact != c.exact {
			t.Errorf("%s: usage %+v, %v; want %+v, %v", c.name, u, exact, c.want, c.exact)
		}
	}
}

// TestMeterLongLine: a line beyond the limit stops metering; the bytes
// still pass and the estimate so far settles.
func TestMeterLongLine(t *testing.T) {
	var body strings.Builder
	body.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}]}\n\n") // 2 tokens
	body.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 400) + "\"}}]}\n\n")
	body.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}]}\n\n")
	for _, c := range chunkings {
		m, err := NewMeter(io.NopCloser(c.r([]byte(body.String()))), nil, MeterOptions{Format: OpenAIChat, SSE: true, CharsPerToken: 4})
		if err != nil {
			t.Fatal(err)
		}
		m.sc.max = 100
		out, err := io.ReadAll(m)
		if err != nil || string(out) != body.String() {
			t.Fatalf("%s: read %d bytes, %v", c.name, len(out), err)
		}
		if u, _ := m.Usage(); u.Output != 2 || !m.Settled() {
			t.Fatalf("%s: usage %+v, settled %v", c.name, u, m.Settled())
		}
	}
}

// TestMeterOversizedJSON: a document over MaxJSONBytes is estimated from its
// size; an oversized element of an array does not stop the next ones.
func TestMeterOversizedJSON(t *testing.T) {
	doc := `{"choices":[{"message":{"content":"` + strings.Repeat("y", 100) + `"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`
	m, err := NewMeter(io.NopCloser(strings.NewReader(doc)), nil, MeterOptions{Format: OpenAIChat, CharsPerToken: 4, MaxJSONBytes: 50})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	if u, exact := m.Usage(); u.Output != int64(len(doc)+3)/4 || exact {
		t.Fatalf("usage %+v, %v; want the output estimated from %d bytes", u, exact, len(doc))
	}
	big := `{"candidates":[{"content":{"parts":[{"text":"` + strings.Repeat("z", 100) + `"}]}}]}`
	small := `{"candidates":[{"content":{"parts":[{"text":"abcd"}]}}],"usageMetadata":{"promptTokenCount":5}}`
	arr := "[" + big + ",\n" + small + "]"
	m, err = NewMeter(io.NopCloser(iotest.OneByteReader(strings.NewReader(arr))), nil, MeterOptions{Format: Gemini, CharsPerToken: 4, MaxJSONBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, m); err != nil {
		t.Fatal(err)
	}
	if u, _ := m.Usage(); u != (bulkhead.Usage{Input: 5, Output: int64(len(big)+4+3) / 4}) {
		t.Fatalf("usage %+v", u)
	}
}

func TestMeterJSONShapes(t *testing.T) {
	for _, c := range []struct {
		body    string
		format  Format
		want    bulkhead.Usage
		settled bool // before EOF, at the end of the document
	}{
		{`  {"candidates":[{"content":{"parts":[{"text":"abcd}{]["}]}}]}  trailing`, Gemini, bulkhead.Usage{Output: 2}, true},
		{`[{"candidates":[{"content":{"parts":[{"text":"a\"bc"}]}}]}, 7, "x]", [1], {"candidates":[]}]`, Gemini, bulkhead.Usage{Output: 1}, true},
		{`<html>502 Bad Gateway</html>`, Gemini, bulkhead.Usage{}, false},
		{`{"candidates":[{"content":{"parts":[{"text":"abcd"}]}}]`, Gemini, bulkhead.Usage{Output: 14}, false}, // cut off: counted by its 55 bytes
		{`[{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}]`, Gemini, bulkhead.Usage{}, true},
		{`{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"overloaded"},"output":[],"usage":null}`, OpenAIResponses, bulkhead.Usage{}, true},
	} {
		// A reader that does not end: the document's end must settle.
		r := io.MultiReader(strings.NewReader(c.body), iotest.ErrReader(errors.New("never")))
		m, err := NewMeter(io.NopCloser(r), nil, MeterOptions{Format: c.format, CharsPerToken: 4})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadFull(m, make([]byte, len(c.body)))
		if m.Settled() != c.settled {
			t.Errorf("%s: settled %v at the end of the body, want %v", c.body, m.Settled(), c.settled)
		}
		_ = m.Close()
		if u, _ := m.Usage(); u != c.want {
			t.Errorf("%s: usage %+v, want %+v", c.body, u, c.want)
		}
	}
}

// TestMeterProviderErrorAtEOF: a stream that carried an error event ends
// with the *ProviderError, once per read at the end, after all its bytes.
func TestMeterProviderErrorAtEOF(t *testing.T) {
	data := readFixture(t, "anthropic_error.sse")
	m, err := NewMeter(io.NopCloser(bytes.NewReader(data)), nil, MeterOptions{Format: AnthropicMessages, SSE: true})
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(m)
	if !bytes.Equal(out, data) {
		t.Fatal("bytes changed")
	}
	var pe *ProviderError
	if !errors.As(err, &pe) || pe.Message != "Overloaded" || m.Err() != err {
		t.Fatalf("err = %v, Err() = %v", err, m.Err())
	}
	if _, err2 := m.Read(make([]byte, 10)); err2 != err {
		t.Fatalf("read after the end: %v", err2)
	}
}

// TestMeterAllocs: once warmed up, metering an event allocates nothing.
func TestMeterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	check := fastPathCheck // the check parses into a new Doc
	fastPathCheck = nil
	defer func() { fastPathCheck = check }()
	for _, file := range []string{"openai_chat_no_usage.sse", "anthropic_normal.sse", "gemini_normal.sse", "openai_responses_truncated.sse"} {
		data := readFixture(t, file)
		f := formatOfFile(file)
		// The stream's events minus its terminal one, fed over and over.
		body := data
		if i := bytes.Index(data, []byte("data: [DONE]")); i >= 0 {
			body = data[:i]
		}
		if i := bytes.Index(data, []byte("event: message_stop")); i >= 0 {
			body = data[:i]
		}
		if i := bytes.LastIndex(body, []byte("\n\n")); i >= 0 {
			body = body[:i+2]
		}
		m, err := NewMeter(io.NopCloser(strings.NewReader("")), nil, MeterOptions{Format: f, SSE: true})
		if err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		m.feed(body)
		n := testing.AllocsPerRun(50, func() { m.feed(body) })
		m.mu.Unlock()
		if n != 0 {
			t.Errorf("%s: %v allocations per pass", file, n)
		}
	}
}

func formatOfFile(name string) Format {
	switch {
	case strings.HasPrefix(name, "openai_chat"):
		return OpenAIChat
	case strings.HasPrefix(name, "openai_responses"):
		return OpenAIResponses
	case strings.HasPrefix(name, "anthropic"):
		return AnthropicMessages
	}
	return Gemini
}

// TestMeterTruncatedJSON: a plain JSON response cut short settles with an
// estimate of what arrived, not with no output.
func TestMeterTruncatedJSON(t *testing.T) {
	ev := &events{}
	b := newBudgetBulkhead(t, ev)
	p := acquire(t, b)
	body := `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("word ", 400) + `"}}],"usage":{"prompt_tokens":12,"completion_tokens":300}`
	r := io.MultiReader(strings.NewReader(body), iotest.ErrReader(errors.New("connection reset")))
	m, err := NewMeter(io.NopCloser(r), p, MeterOptions{Format: OpenAIChat, CharsPerToken: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(m); err == nil || err.Error() != "connection reset" {
		t.Fatalf("read error = %v", err)
	}
	_, releases := ev.wait(t, 1)
	if u := releases[0].Usage; u == nil || u.Output < 400*5/4 {
		t.Errorf("released with %v, want an output estimate of at least the 2000 characters that arrived", u)
	}
}

// strippedStream is an OpenAI chat stream of n text deltas of varied
// lengths, with comments, a two-line event and line ends of every kind,
// then the usage chunk include_usage adds and [DONE]; want is what a
// caller reads of it with the usage chunk stripped.
func strippedStream(n int) (in, want []byte) {
	var b bytes.Buffer
	for i := range n {
		text := strings.Repeat("wörd ", 1+i%37)
		end := [...]string{"\n", "\r\n", "\r"}[i%3]
		switch {
		case i%50 == 7:
			b.WriteString(": keep-alive" + end + end)
		case i%50 == 23: // one event in two data lines
			fmt.Fprintf(&b, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,`+end+`data: "delta":{"content":%q},"finish_reason":null}]}`+end+end, text)
			continue
		}
		fmt.Fprintf(&b, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}],"obfuscation":"%s"}`+end+end,
			text, strings.Repeat("x", i%11))
	}
	b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n")
	want = append([]byte(nil), b.Bytes()...)
	b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":900,"total_tokens":912}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	want = append(want, "data: [DONE]\n\n"...)
	return b.Bytes(), want
}

// TestStrippedStreamKeepsEveryByteInAnyCallerBuffer: a stream whose usage
// chunk is stripped, read into caller buffers of any size (smaller than an
// event, one byte, larger than the body) and cut anyhow by its body, loses
// no byte, reorders none, and removes only the usage chunk.
func TestStrippedStreamKeepsEveryByteInAnyCallerBuffer(t *testing.T) {
	in, want := strippedStream(600)
	for _, size := range []int{1, 2, 7, 64, 301, 1024, 4096, 1 << 20} {
		for _, c := range chunkings {
			t.Run(fmt.Sprintf("buffer-%d/%s", size, c.name), func(t *testing.T) {
				m, err := NewMeter(io.NopCloser(c.r(in)), nil, MeterOptions{Format: OpenAIChat, SSE: true, StripUsageChunk: true})
				if err != nil {
					t.Fatal(err)
				}
				var out []byte
				buf := make([]byte, size)
				for {
					n, err := m.Read(buf)
					out = append(out, buf[:n]...)
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(out, want) {
					i := 0
					for i < min(len(out), len(want)) && out[i] == want[i] {
						i++
					}
					t.Fatalf("read %d bytes, want %d; first difference at byte %d: %q, want %q", len(out), len(want), i,
						out[i:min(len(out), i+40)], want[i:min(len(want), i+40)])
				}
				if u, exact := m.Usage(); !exact || u.Output != 900 {
					t.Fatalf("Usage() = %+v, %v; want the usage chunk's", u, exact)
				}
			})
		}
	}
}

// pausedBody returns its data, then has nothing more to give for now
// (0, nil), as a stream waiting for its next event.
type pausedBody struct{ data []byte }

func (b *pausedBody) Read(p []byte) (int, error) {
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}

// TestWaitingStrippedStreamHoldsNoReadBuffer: a stream whose usage chunk
// is stripped holds no buffer of its own while it waits for its next
// event: the bytes it read went to the caller's buffer, and only what it
// must keep of the stream (a split event, the scanner's state) stays.
func TestWaitingStrippedStreamHoldsNoReadBuffer(t *testing.T) {
	in, _ := strippedStream(40)
	first := in[:bytes.Index(in, []byte("wörd wörd wörd wörd wörd wörd wörd wörd wörd wörd "))]
	const streams = 256
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // and what sync.Pool kept past the first
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	buf := make([]byte, 32<<10) // the caller's, as a proxy copies with
	meters := make([]*Meter, streams)
	before := heap()
	for i := range meters {
		m, err := NewMeter(io.NopCloser(&pausedBody{data: first}), nil, MeterOptions{Format: OpenAIChat, SSE: true, StripUsageChunk: true})
		if err != nil {
			t.Fatal(err)
		}
		read := 0
		for {
			n, err := m.Read(buf)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if n == 0 {
				break
			}
			read += n
		}
		if read == 0 {
			t.Fatal("no event read")
		}
		meters[i] = m
	}
	per := float64(heap()-before) / streams
	runtime.KeepAlive(meters)
	if per > 8<<10 {
		t.Fatalf("a waiting stream holds %.0f bytes; want at most 8 KiB", per)
	}
	t.Logf("a waiting stream holds %.0f bytes", per)
}

// TestMeterParsesIntoPooledTrees: the tree a meter parses an event or a
// plain response into comes from a pool and goes back to it, so metering
// a response grows no new tree (a growing tree is several allocations per
// response), and a stream keeps none between its events.
func TestMeterParsesIntoPooledTrees(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	check := fastPathCheck // the check parses into a new Doc
	fastPathCheck = nil
	defer func() { fastPathCheck = check }()
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1755137933,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}`)
	buf := make([]byte, 32<<10)
	meter := func() {
		r := bytes.NewReader(body)                                                 // 1 allocation, and 1 for its NopCloser
		m, err := NewMeter(io.NopCloser(r), nil, MeterOptions{Format: OpenAIChat}) // 1
		if err != nil {
			t.Fatal(err)
		}
		for { // 1: the document, kept until it is complete
			if _, err := m.Read(buf); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if u, exact := m.Usage(); !exact || u.Output != 9 {
			t.Fatalf("Usage() = %+v, %v", u, exact)
		}
	}
	meter()
	if n := testing.AllocsPerRun(100, meter); n > 4 {
		t.Errorf("metering a plain response allocates %v times; want at most 4", n)
	}
}

// TestStrippedStreamKeepsAllButTheUsageChunk: streams of text deltas,
// comments, usage chunks and [DONE] with line ends of every kind, their
// blocks split between the body's reads at every boundary (reads of one
// byte to several KiB) and read into buffers smaller and larger than a
// block, pass whole but for the usage chunks; a body that fails midway
// gives the bytes before the failure, then its error.
func TestStrippedStreamKeepsAllButTheUsageChunk(t *testing.T) {
	for _, body := range []int{1, 3, 16, 700, 4096, 9000} {
		for _, caller := range []int{1, 5, 64, 2 << 10, 5000, 40 << 10} {
			for _, fails := range []bool{false, true} {
				t.Run(fmt.Sprintf("body-%d/caller-%d/fails-%v", body, caller, fails), func(t *testing.T) {
					for seed := range int64(15) {
						checkStrippedStream(t, seed, body, caller, fails)
					}
				})
			}
		}
	}
}

// TestConcurrentMetersKeepTheirOwnParses: meters reading at once, each
// parsing its events into trees taken from the shared pool and given back
// after each event, each record their own response's ID, model and
// finish reason and their own usage: no tree is read after it went back.
func TestConcurrentMetersKeepTheirOwnParses(t *testing.T) {
	const meters, events = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, meters)
	for k := range meters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, model := fmt.Sprintf("chatcmpl-%d", k), fmt.Sprintf("model-%d", k)
			var b bytes.Buffer
			for i := range events { // each event of a shape of its own: every one is parsed in full
				fmt.Fprintf(&b, `data: {"id":%q,"model":%q,"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"n%d":%d}`+"\n\n", id, model, i, i)
			}
			fmt.Fprintf(&b, `data: {"id":%q,"model":%q,"choices":[{"index":0,"delta":{},"finish_reason":"stop-%d"}]}`+"\n\n", id, model, k)
			fmt.Fprintf(&b, `data: {"id":%q,"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`+"\n\ndata: [DONE]\n\n", id, 10+k, 100+k)
			m, err := NewMeter(io.NopCloser(&chunker{b.Bytes(), rand.New(rand.NewSource(int64(k))), 300}), nil,
				MeterOptions{Format: OpenAIChat, SSE: true, StripUsageChunk: k%2 == 0, RecordResponse: true})
			if err != nil {
				errs <- err
				return
			}
			if _, err := io.Copy(io.Discard, m); err != nil {
				errs <- err
				return
			}
			r := m.Response()
			u, exact := m.Usage()
			if r.ID != id || r.Model != model || len(r.FinishReasons) != 1 || r.FinishReasons[0] != fmt.Sprintf("stop-%d", k) ||
				!exact || u.Input != int64(10+k) || u.Output != int64(100+k) {
				errs <- fmt.Errorf("meter %d: Response() = %+v, Usage() = %+v, %v", k, r, u, exact)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
