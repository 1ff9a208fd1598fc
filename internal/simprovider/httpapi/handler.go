// Package httpapi serves a simulated provider account (package
// simprovider) over HTTP, in the wire formats of the hosted LLM APIs, so
// that the gateway, the SDKs and a newcomer's curl can be tried against it
// without an account. It is the provider of 'bulkhead provider', of the
// demo's gateway mode and of the tests that need a whole provider.
//
// NewHandler serves, under any path prefix:
//
//   - POST .../chat/completions: OpenAI chat completions, streamed with
//     "stream": true (and a usage chunk with stream_options.include_usage);
//   - POST .../responses: OpenAI responses, streamed as response.* events;
//   - POST .../messages: Anthropic messages, streamed as message_start ...
//     message_stop, with usage in message_start and message_delta;
//   - POST .../models/{model}:generateContent and :streamGenerateContent:
//     Gemini, streamed as server-sent events with ?alt=sse, else as one
//     JSON array, with cumulative usageMetadata on every chunk.
//
// Each request is one request to the account: its input counted from its
// text (about a token a word, plus 3 a message), its output cap from the
// request (max_completion_tokens or max_tokens, max_output_tokens,
// generationConfig.MaxOutputTokens) or Options.DefaultMaxTokens. It is
// answered when the account's latency model says, its text one word a
// token. Every answer carries the account's rate-limit headers in the
// API's dialect: x-ratelimit-{limit,remaining,reset}-{requests,tokens} for
// OpenAI, anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
// {limit,remaining,reset} for Anthropic, each for the limits the account
// has. A request over a per-minute limit is answered 429 with
// retry-after, retry-after-ms and x-should-retry, in the API's error shape
// (Gemini's with a RetryInfo detail); one over the concurrency limit is an
// overload: 503 (Anthropic: 529 overloaded_error), with the same headers.
//
// Any API key is accepted, and none is needed. A body that is not JSON, a
// missing model, a missing max_tokens (Anthropic) or a bad value is
// answered 400 in the API's error shape, a body over 32 MiB 413, another
// method than POST 405, a path no API has 404.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// Options are the handler's choices beyond its provider. The zero value is
// ready to use.
type Options struct {
	// DefaultMaxTokens is the output cap of a request that sets none (an
	// Anthropic request must set one): what the account's token limits
	// reserve for it and the most it writes. Zero means 2048.
	DefaultMaxTokens int64

	// Logger, when not nil, gets one line per request answered: its API,
	// model, status and tokens, or the limit it was over.
	Logger *slog.Logger
}

// NewHandler returns a handler that answers the requests of every API it
// serves from the simulated account p. Its requests run on p's clock, so
// with a mock clock a test decides when each answer comes.
func NewHandler(p *simprovider.Provider, opts Options) http.Handler {
	if opts.DefaultMaxTokens <= 0 {
		opts.DefaultMaxTokens = 2048
	}
	return &handler{p: p, opts: opts}
}

type handler struct {
	p       *simprovider.Provider
	opts    Options
	seq     atomic.Uint64 // requests numbered as they come, for their draws
	answers atomic.Uint64 // every request, for its IDs
}

// index is what a GET of / answers.
const index = `bulkhead provider: a simulated LLM provider account; any API key is accepted.

  POST /v1/chat/completions                          OpenAI chat completions
  POST /v1/responses                                 OpenAI responses
  POST /v1/messages                                  Anthropic messages
  POST /v1beta/models/{model}:generateContent        Gemini
  POST /v1beta/models/{model}:streamGenerateContent  Gemini, streamed (?alt=sse for server-sent events)
`

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, model, method := route(r.URL.Path)
	if a == 0 {
		if r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, index)
			return
		}
		x := h.exchange(w, r, chatAPI) // an unknown path is answered in OpenAI's shape
		x.fail(&apiError{kind: notFound, code: "unknown_url", msg: fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)})
		return
	}
	x := h.exchange(w, r, a)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		x.fail(&apiError{kind: methodNotAllowed, msg: fmt.Sprintf("Method %s is not allowed on %s: use POST", r.Method, r.URL.Path)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			x.fail(&apiError{kind: tooLarge, msg: fmt.Sprintf("Request body is larger than %d bytes", maxBodyBytes)})
		} else {
			x.fail(invalid("", "", "The request body could not be read: %v", err))
		}
		return
	}
	c, err := parse(a, model, method, r.URL.Query(), body)
	if err != nil {
		x.fail(err)
		return
	}
	x.call = c
	req := simprovider.Request{InputTokens: c.input, MaxTokens: c.maxTokens}
	if req.MaxTokens == 0 {
		req.MaxTokens = h.opts.DefaultMaxTokens
	}
	req.ID = h.seq.Add(1)
	if err := simHeaders(r.Header, &req); err != nil {
		x.fail(err)
		return
	}
	x.req = req
	if c.stream {
		x.stream()
	} else {
		x.complete()
	}
}

// exchange is one request being answered.
type exchange struct {
	h     *handler
	w     http.ResponseWriter
	r     *http.Request
	d     dialect
	call  *call // nil until parsed
	req   simprovider.Request
	start time.Time // on the provider's clock
	id    string    // the response's ID, in the dialect's form
	reqID string    // the request ID header's value

	begun bool  // the status and headers are written
	sent  int64 // output tokens written so far
	seq   int   // the Responses API's sequence_number of the next event
	werr  error // the first write error
}

func (h *handler) exchange(w http.ResponseWriter, r *http.Request, a api) *exchange {
	// IDs look random and are the same in every run: a bijective mix of a
	// count (splitmix64's finalizer).
	z := h.answers.Add(1) * 0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	z ^= z >> 31
	x := &exchange{h: h, w: w, r: r, d: dialects[a], start: h.p.Clock().Now()}
	x.id = fmt.Sprintf("%s%016x", x.d.idPrefix(), z)
	x.reqID = fmt.Sprintf("req_sim%016x", z)
	return x
}

// now is the provider's time.
func (x *exchange) now() time.Time { return x.h.p.Clock().Now() }

// begin writes the status and headers of an answer: the account's
// rate-limit headers, as they stand now, with any answer.
func (x *exchange) begin(status int, contentType string) {
	if x.begun {
		return
	}
	x.begun = true
	hd := x.w.Header()
	now := x.now()
	hd.Set("Date", now.UTC().Format(http.TimeFormat)) // the provider's clock, which rate-limit resets count from
	hd.Set("Content-Type", contentType)
	if contentType == "text/event-stream" {
		hd.Set("Cache-Control", "no-cache")
	}
	x.d.headers(x, hd, x.h.p.Headroom(now), now)
	x.w.WriteHeader(status)
}

// write writes p, remembering the first error.
func (x *exchange) write(p []byte) {
	if x.werr == nil {
		_, x.werr = x.w.Write(p)
	}
}

func (x *exchange) flush() {
	if x.werr == nil {
		if err := http.NewResponseController(x.w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			x.werr = err
		}
	}
}

// fail answers err: an *apiError in the dialect's error shape, a 429 or an
// overload from the account, or nothing when the client has gone.
func (x *exchange) fail(err error) {
	var ae *apiError
	var rl *simprovider.RateLimitError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &rl):
		ae = &apiError{kind: rateLimited, limit: rl.Limit, retryAfter: rl.RetryAfter, used: rl.Used, max: rl.Max, requested: rl.Requested}
		if rl.Limit == simprovider.ConcurrencyLimit {
			ae.kind = overloaded
		}
		ae.msg = x.d.limitMessage(x.model(), ae)
	case x.r.Context().Err() != nil:
		x.log(0, "client gone", slog.String("error", err.Error()))
		return
	default:
		ae = &apiError{kind: internal, msg: err.Error()}
	}
	if ae.kind == rateLimited || ae.kind == overloaded {
		hd := x.w.Header()
		hd.Set("Retry-After", itoa(int64((ae.retryAfter+time.Second-1)/time.Second)))
		hd.Set("Retry-After-Ms", itoa(int64((ae.retryAfter+time.Millisecond-1)/time.Millisecond)))
		hd.Set("X-Should-Retry", "true")
	}
	status := ae.status(x.d.api())
	x.begin(status, "application/json")
	x.write(x.d.errorBody(status, ae, x.reqID))
	x.log(status, ae.msg)
}

func (x *exchange) model() string {
	if x.call == nil {
		return ""
	}
	return x.call.model
}

// log writes the request's line to the handler's logger.
func (x *exchange) log(status int, msg string, attrs ...slog.Attr) {
	l := x.h.opts.Logger
	if l == nil {
		return
	}
	attrs = append([]slog.Attr{slog.String("path", x.r.URL.Path), slog.String("model", x.model()), slog.Int("status", status),
		slog.Duration("took", x.now().Sub(x.start))}, attrs...)
	if x.call != nil {
		attrs = append(attrs, slog.Bool("stream", x.call.stream), slog.Int64("input_tokens", x.req.InputTokens))
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, msg, attrs...)
}

// complete answers a request that is not streamed, once the account has
// answered it.
func (x *exchange) complete() {
	resp, err := x.h.p.Complete(x.r.Context(), x.req)
	if err != nil {
		x.fail(err)
		return
	}
	x.begin(http.StatusOK, "application/json")
	x.write(x.d.complete(x, resp))
	x.log(http.StatusOK, "answered", slog.Int64("output_tokens", resp.Usage.Output), slog.String("stop", resp.StopReason))
}

// stream answers a streamed request: the status, headers and opening
// events at the first token, then each chunk as the account writes it, and
// the closing events (usage, stop reason) at the end.
func (x *exchange) stream() {
	resp, err := x.h.p.Stream(x.r.Context(), x.req, func(ch simprovider.Chunk) error {
		x.open()
		text := words(x.sent, ch.Tokens)
		x.sent += ch.Tokens
		x.d.chunk(x, text, ch.Usage)
		x.flush()
		return x.werr
	})
	if err != nil {
		if !x.begun {
			x.fail(err)
		} else {
			x.log(http.StatusOK, "stream cut", slog.String("error", err.Error()))
		}
		return
	}
	x.open()
	x.d.finish(x, resp)
	x.flush()
	x.log(http.StatusOK, "answered", slog.Int64("output_tokens", resp.Usage.Output), slog.String("stop", resp.StopReason))
}

// open begins a stream: the status, the headers and the dialect's opening
// events.
func (x *exchange) open() {
	if x.begun {
		return
	}
	ct := "text/event-stream"
	if x.call.api == geminiAPI && !x.call.sse {
		ct = "application/json"
	}
	x.begin(http.StatusOK, ct)
	x.d.open(x)
}

// vocabulary is the simulated models' text: one word a token, each of at
// most six letters, so the text counts as many tokens as its usage says.
var vocabulary = strings.Fields("the model writes one word for each token it makes so a client can count what it reads")

// words returns output tokens from+1 .. from+n as text.
func words(from, n int64) string {
	var b strings.Builder
	for i := from; i < from+n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[i%int64(len(vocabulary))])
	}
	return b.String()
}
