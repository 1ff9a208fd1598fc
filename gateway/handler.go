package gateway

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// Route sends the calls of one provider API to an upstream, through a
// bulkhead.
type Route struct {
	// Format is the API: a request whose path the stream package
	// recognises as this format (stream.FormatOf) takes this route.
	Format stream.Format

	// Models, when not empty, narrows the route to the calls of these
	// models (the body's model, or the model in a Gemini URL); the route of
	// a format without Models takes its other calls. A format may have
	// several routes with Models and one without.
	Models []string

	// Upstream is the provider's base URL, such as
	// "https://api.openai.com": a request for /v1/chat/completions is sent
	// to its /v1/chat/completions (joined to the base URL's own path).
	Upstream *url.URL

	// APIKey, when not empty, replaces the client's credentials on the way
	// upstream, in the header the API expects (Authorization: Bearer for
	// OpenAI, x-api-key for Anthropic, x-goog-api-key for Gemini). Empty
	// passes the client's own.
	APIKey string

	// Bulkhead admits the route's calls. It is required.
	Bulkhead *bulkhead.Bulkhead

	// Options returns a call's admission options (class, priority, tag)
	// from its request, such as a tenant header. Nil means none.
	Options func(req *http.Request, call *stream.Call) []bulkhead.Option

	// Transport sends the admitted requests. Nil means a clone of
	// http.DefaultTransport that keeps DefaultMaxIdleConnsPerHost idle
	// connections to each upstream (the default's 2 would make most calls
	// at a few hundred a second open a new one), and whose connections
	// tell a streamed answer when to flush (see Handler). Set its timeouts
	// (ResponseHeaderTimeout) for an upstream that may hang, and its
	// MaxIdleConnsPerHost to about the calls in flight at once.
	Transport http.RoundTripper

	// MaxBodyBytes bounds request bodies; zero means
	// stream.DefaultMaxBodyBytes.
	MaxBodyBytes int64

	// AttemptHeader names the request header that says which attempt of
	// a call a request is (see stream.Transport.AttemptHeader); empty
	// means stream.DefaultAttemptHeader, which the official SDKs send.
	AttemptHeader string

	// admission, set by Build, gives a call's class and priority from its
	// request alone, what Options gives the bulkhead: with it (or without
	// Options) the Handler can turn a call away before reading its body.
	admission func(*http.Request) (class string, high bool)
	// acquire, set by Build with traces on, admits each call in place of
	// Bulkhead.Acquire (an otelbulkhead.Tracer's), and recordResponse
	// makes the meter note what the answer says of itself.
	acquire        func(context.Context, *bulkhead.Request, ...bulkhead.Option) (*bulkhead.Permit, error)
	recordResponse bool
}

// Handler is an HTTP reverse proxy in front of LLM providers: each call is
// admitted by its route's bulkhead before the first byte goes upstream,
// its response (streamed or not) is metered to settle its tokens, and a call
// the bulkhead turns away is answered in the dialect of the API the client
// called (see WriteError). A client that goes away mid-stream ends the
// upstream request and releases its admission at once. A request to a path
// that is not a route's API endpoint is answered 404; a request to one that
// is not a POST is passed upstream without admission.
//
// A streamed answer goes to the client as the upstream sends it, flushed
// when the next read of the upstream would wait: events that arrive
// together leave in one write, and an event the upstream follows with a
// pause leaves at once. With a Route.Transport of its own, an upstream
// answering over HTTP/2, or on a system other than Unix, every write is
// flushed.
//
// The Handler reads a call's body itself, before admission, and bounds
// the memory that takes whatever clients declare: the body grows as its
// bytes arrive, up to its route's MaxBodyBytes, all bodies together are
// charged to one budget (BodyBudget) until their calls end, and each body
// must arrive within BodyTimeout. A body over its limit is answered 413,
// one that finds the budget spent 503 with x-should-retry: true (529 in
// the Anthropic dialect), one too slow 408, and a body without a model
// 400. A body refused before its end is read and discarded up to as many
// bytes again as its limit (at least 1 MiB), so that a client that sends
// its whole body before it reads, as the SDKs do, reads the answer; a
// longer one is answered at once and its connection closed. A request the
// Handler answers without using its body (a path no route serves, a 404)
// is answered the same way.
//
// Whatever the answer, a body not read to its end does not hold its
// connection: the connection keeps a read deadline at the body timeout,
// so the server, which would wait for the rest of the body to use the
// connection again, closes it by then (at once for a client waiting for
// 100 Continue that was not asked for its body).
//
// Under overload a call is turned away before its body is read or parsed:
// once a route's bulkhead has refused a call for want of a slot or a queue
// position, and while the Handler's own calls fill it, each new call is
// first checked with the bulkhead's advisory answer (Bulkhead.WouldAdmit,
// for the call's class and priority), and one it would refuse for its
// capacity gets that answer at once, its body read and discarded
// unparsed. The bulkhead's Stats and events do not count these calls (a
// Build gateway's /metrics does, as bulkhead_gateway_rejected_early_total).
// This applies to a format with one route whose admission options come
// from the request's headers (a Build route, or a route without Options);
// other calls take the full path.
//
// Set the fields before the Handler serves; they must not change after.
type Handler struct {
	// BodyBudget bounds the request-body bytes the Handler holds, all
	// calls together, from their first byte to the end of their call.
	// Zero or less means DefaultBodyBudget. A route's body limit is at
	// most the budget.
	BodyBudget int64

	// BodyTimeout bounds the reading of one request body, counted from
	// the moment the Handler starts serving the request, and the time the
	// server may wait for the rest of a body the Handler did not read to
	// its end. Zero means DefaultBodyTimeout. A negative value sets none:
	// a body is then read for as long as it takes, and a refused one is
	// not read at all (its connection closes at once). It needs a
	// ResponseWriter that supports read deadlines (see
	// http.ResponseController), as net/http's server's does; without
	// them the Handler acts as with none.
	BodyTimeout time.Duration

	routes  atomic.Pointer[table] // the routes ServeHTTP serves
	gatesMu sync.Mutex
	gates   map[*bulkhead.Bulkhead]*gate // by bulkhead; guarded by gatesMu
	held    atomic.Int64                 // the bytes of the bodies held, against BodyBudget
}

// table is a Handler's routes, by format. A Build gateway swaps it whole
// when its configuration is reloaded: a request keeps the table it
// started with.
type table struct {
	formats map[stream.Format]*formatRoutes
}

// formatRoutes is the routes of one format: by model, and the default.
type formatRoutes struct {
	byModel map[string]*routeProxy
	other   *routeProxy
	maxBody int64       // the largest body a route of the format reads
	sole    *routeProxy // the format's route when it has one only: its calls are checked before their body is read
	n       int         // the format's routes
}

// New returns a Handler for routes: for each format at most one route
// without Models, and each model in at most one route.
func New(routes ...Route) (*Handler, error) {
	h := &Handler{gates: map[*bulkhead.Bulkhead]*gate{}}
	t, err := h.newTable(routes)
	if err != nil {
		return nil, err
	}
	h.routes.Store(t)
	return h, nil
}

// gateOf returns the gate of bulkhead b, made the first time.
func (h *Handler) gateOf(b *bulkhead.Bulkhead) *gate {
	h.gatesMu.Lock()
	defer h.gatesMu.Unlock()
	g := h.gates[b]
	if g == nil {
		g = newGate(b)
		h.gates[b] = g
	}
	return g
}

// newTable returns the table of routes (see New), their gates h's.
func (h *Handler) newTable(routes []Route) (*table, error) {
	t := &table{formats: map[stream.Format]*formatRoutes{}}
	for i, r := range routes {
		field := fmt.Sprintf("routes[%d]", i)
		switch r.Format {
		case stream.OpenAIChat, stream.OpenAIResponses, stream.AnthropicMessages, stream.Gemini:
		default:
			return nil, &bulkhead.ConfigError{Field: field + ".Format", Problem: fmt.Sprintf("must be a stream format, got %d", r.Format)}
		}
		fr := t.formats[r.Format]
		if fr == nil {
			fr = &formatRoutes{byModel: map[string]*routeProxy{}}
			t.formats[r.Format] = fr
		}
		switch {
		case len(r.Models) == 0 && fr.other != nil:
			return nil, &bulkhead.ConfigError{Field: field + ".Format", Problem: fmt.Sprintf("%v has a route for its other models already", r.Format)}
		case r.Upstream == nil || r.Upstream.Scheme == "" || r.Upstream.Host == "":
			return nil, &bulkhead.ConfigError{Field: field + ".Upstream", Problem: "must be an absolute URL, such as https://api.openai.com"}
		case r.Bulkhead == nil:
			return nil, &bulkhead.ConfigError{Field: field + ".Bulkhead", Problem: "must not be nil"}
		case r.AttemptHeader != "" && !validHeaderName(r.AttemptHeader):
			return nil, &bulkhead.ConfigError{Field: field + ".AttemptHeader", Problem: fmt.Sprintf("must be a header name, got %q", r.AttemptHeader)}
		}
		rp := proxy(r, i, h.gateOf(r.Bulkhead))
		if fr.n++; fr.n == 1 {
			fr.sole = rp
		} else {
			fr.sole = nil
		}
		for j, m := range r.Models {
			if fr.byModel[m] != nil {
				return nil, &bulkhead.ConfigError{Field: fmt.Sprintf("%s.Models[%d]", field, j), Problem: fmt.Sprintf("%v model %q has a route already", r.Format, m)}
			}
			fr.byModel[m] = rp
		}
		if len(r.Models) == 0 {
			fr.other = rp
		}
		fr.maxBody = max(fr.maxBody, bodyLimit(r.MaxBodyBytes))
	}
	return t, nil
}

func bodyLimit(n int64) int64 {
	if n <= 0 {
		return stream.DefaultMaxBodyBytes
	}
	return n
}

// proxy is the reverse proxy of route r, the index-th, whose bulkhead's
// gate is g.
func proxy(r Route, index int, g *gate) *routeProxy {
	format, upstream, key := r.Format, r.Upstream, r.APIKey
	base := r.Transport
	if base == nil {
		base = defaultTransport
	}
	admission := r.admission
	if admission == nil && r.Options == nil {
		admission = func(*http.Request) (string, bool) { return "", false }
	}
	rp := &routeProxy{index: index, maxBody: bodyLimit(r.MaxBodyBytes), gate: g, admission: admission, attempt: r.AttemptHeader, ReverseProxy: httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			// The transport asks for compression itself and decompresses
			// an admitted call's answer, so that the meter reads it; the
			// request it is given then needs no copy to drop the client's
			// choice. A call it passes on unadmitted (any method but POST)
			// keeps the client's, and its answer comes back as encoded.
			if pr.In.Method == http.MethodPost {
				pr.Out.Header.Del("Accept-Encoding")
			}
			if key != "" {
				setKey(pr.Out, format, key)
			}
		},
		Transport: &stream.Transport{
			Bulkhead:      r.Bulkhead,
			Base:          base,
			Options:       r.Options,
			AttemptHeader: r.AttemptHeader,
			Acquire:       r.acquire,
			MaxBodyBytes:  r.MaxBodyBytes,
			Meter:         stream.MeterOptions{RecordResponse: r.recordResponse},
		},
		// No FlushInterval: the proxy flushes every write of an event
		// stream and of a body of unknown length by itself (a streamed
		// call's coalescer defers it to the moment the upstream pauses),
		// and writes a plain response whole.
		BufferPool: copyBuffers,
		ModifyResponse: func(resp *http.Response) error {
			if resp.Header.Get(RequestIDHeader) == "" && resp.Request != nil { // the provider's own ID stands
				resp.Header.Set(RequestIDHeader, resp.Request.Header.Get(RequestIDHeader))
			}
			if m, ok := resp.Body.(*stream.Meter); ok && resp.Request != nil {
				if n := noteOf(resp.Request.Context()); n != nil {
					n.answer = &endWatch{Meter: m, gemini: format == stream.Gemini}
					resp.Body = n.answer
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if ctxErr := req.Context().Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				err = context.Cause(req.Context()) // the client went away, or the gateway cut the call at shutdown
			}
			var rej *bulkhead.RejectedError
			if errors.As(err, &rej) && capacityRefusal(rej.Reason) {
				g.learn(rej.Detail)
			}
			w.Header().Set(RequestIDHeader, req.Header.Get(RequestIDHeader))
			WriteError(w, format, err)
			if n := noteOf(req.Context()); n != nil {
				n.end = endOf(err)
			}
		},
	}}
	rp.streamed = rp.ReverseProxy
	rp.streamed.BufferPool = streamBuffers
	return rp
}

// endWatch is an admitted call's metered answer as the proxy reads it from
// the upstream. It notes whether the answer reached its end, as its format
// marks it, while reading the upstream still succeeded: the terminal event
// of a stream (OpenAI chat's data: [DONE], a Responses
// response.completed, Anthropic's message_stop; for Gemini, which has
// none, the chunk that ends generation with the final counts), or the end
// of a JSON answer. The proxy writes what it reads before it reads again,
// so a call that breaks off after that point (its client closed the
// stream as soon as it had read the last event, as openai-go does) was
// answered whole. An answer that ended with the provider's error event
// does not count.
type endWatch struct {
	*stream.Meter
	gemini bool
	ended  atomic.Bool
}

func (e *endWatch) Read(p []byte) (int, error) {
	n, err := e.Meter.Read(p)
	if err == nil && !e.ended.Load() && e.Err() == nil {
		if e.gemini {
			_, final := e.Usage() // the chunk with a finishReason, and the counts it closes
			e.ended.Store(final)
		} else {
			e.ended.Store(e.Settled())
		}
	}
	return n, err
}

// answered reports whether the call's answer reached its end before it
// broke off (see endWatch); false for a call that was not metered.
func (n *callNote) answered() bool { return n.answer != nil && n.answer.ended.Load() }

// logProxyErrors sends the lines the routes' reverse proxies log of their
// own (a read of an upstream's answer that failed mid-way) to logger, as
// warnings, rather than to the standard logger. Set before serving.
func (t *table) logProxyErrors(logger *slog.Logger) {
	l := slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	for _, fr := range t.formats {
		for _, rp := range fr.byModel {
			rp.ErrorLog, rp.streamed.ErrorLog = l, l
		}
		if fr.other != nil {
			fr.other.ErrorLog, fr.other.streamed.ErrorLog = l, l
		}
	}
}

// defaultTransport sends the calls of a route without a Transport: it is
// http.DefaultTransport's, but keeps up to 256 idle connections to each
// upstream where the default keeps 2, so that calls in flight at once do
// not each open a new connection.
var defaultTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 0, DefaultMaxIdleConnsPerHost
	dial := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return watch(c), nil // streamed answers flush when it would wait (see coalescer)
	}
	return t
}()

// DefaultMaxIdleConnsPerHost is the idle connections to each upstream that
// the transport of a route without a Transport keeps (and a gateway Build
// makes, for an upstream with header_timeout).
const DefaultMaxIdleConnsPerHost = 256

// copyBuffers are the proxies' buffers for copying plain response bodies,
// which come whole: 32 KiB, as io.Copy's. streamBuffers are those of
// streamed answers: a stream waits for its next event in a read of its
// buffer, so it holds one for as long as it lasts, thousands of streams at
// once, and an event is a few hundred bytes.
var (
	copyBuffers   = &bufferPool{pool: sync.Pool{New: func() any { return new([32 << 10]byte) }}}
	streamBuffers = &streamBufferPool{pool: sync.Pool{New: func() any { return new([2 << 10]byte) }}}
)

// bufferPool is an httputil.BufferPool of 32 KiB buffers over a sync.Pool,
// and streamBufferPool one of 2 KiB buffers.
type (
	bufferPool       struct{ pool sync.Pool }
	streamBufferPool struct{ pool sync.Pool }
)

func (p *bufferPool) Get() []byte { return p.pool.Get().(*[32 << 10]byte)[:] }

func (p *bufferPool) Put(b []byte) {
	if len(b) == 32<<10 {
		p.pool.Put((*[32 << 10]byte)(b))
	}
}

func (p *streamBufferPool) Get() []byte { return p.pool.Get().(*[2 << 10]byte)[:] }

func (p *streamBufferPool) Put(b []byte) {
	if len(b) == 2<<10 {
		p.pool.Put((*[2 << 10]byte)(b))
	}
}

// routeProxy is one route's reverse proxy, for plain calls, and streamed,
// the same but for the buffer it copies the answer with (see
// streamBuffers).
type routeProxy struct {
	httputil.ReverseProxy
	streamed  httputil.ReverseProxy
	index     int   // the route's index in New's list
	maxBody   int64 // the route's body limit
	gate      *gate // its bulkhead's
	admission func(*http.Request) (class string, high bool)
	attempt   string // the attempt header (Route.AttemptHeader)
}

// setKey puts the upstream's credentials in out, in the header of
// format's API, in place of the client's (a Gemini client's ?key= too).
func setKey(out *http.Request, format stream.Format, key string) {
	dropKey(out)
	h := out.Header
	switch format {
	case stream.AnthropicMessages:
		h.Set("X-Api-Key", key)
	case stream.Gemini:
		h.Set("X-Goog-Api-Key", key)
	default:
		h.Set("Authorization", "Bearer "+key)
	}
}

// dropKey removes a client's credentials from req: the key headers of
// every API, and a Gemini client's ?key=.
func dropKey(req *http.Request) {
	req.Header.Del("Authorization")
	req.Header.Del("X-Api-Key")
	req.Header.Del("X-Goog-Api-Key")
	if q := req.URL.Query(); q.Has("key") {
		q.Del("key")
		req.URL.RawQuery = q.Encode()
	}
}

// RequestIDHeader carries a call's request ID. A request without one is
// given one by the Handler (16 random hex digits), in its headers: it is
// sent upstream with the call, is the call's tag where the gateway's Options
// take it from this header (as a Build gateway's do), and is logged. The
// response carries the call's ID, the client's or the generated one, unless
// the upstream's response has one of its own (a provider's request ID, such
// as OpenAI's, which is kept).
const RequestIDHeader = "X-Request-Id"

// newRequestID is a request ID: 16 random hex digits.
func newRequestID() string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// ServeHTTP proxies req to the route of its API and model, or answers it
// (see Handler). It gives a request without an X-Request-Id one (see
// RequestIDHeader).
func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	h.guard(w, req)
	h.serve(w, req, h.routes.Load())
}

// serve is ServeHTTP with the routes of t, once the request's body is
// guarded.
func (h *Handler) serve(w http.ResponseWriter, req *http.Request, t *table) {
	requestID(req)
	format, ok := stream.FormatOf(req.URL.Path)
	fr := t.formats[format]
	switch {
	case !ok || fr == nil:
		h.refuseEarly(w, req, format, 0, notFound(format, "no route for "+req.URL.Path), endRefused)
		return
	case req.Method != http.MethodPost:
		if fr.other == nil {
			h.refuseEarly(w, req, format, fr.maxBody, notFound(format, "no route for "+req.Method+" "+req.URL.Path), endRefused)
			return
		}
		forward(w, req, fr.other, "", false)
		return
	}
	if fr.sole != nil && h.shedEarly(w, req, format, fr.sole) {
		return
	}
	call, release, ok := h.readCall(w, req, format, fr.maxBody)
	defer release()
	if !ok {
		return
	}
	model := call.Request.Model
	rp := fr.byModel[model]
	if rp == nil {
		rp = fr.other
	}
	switch {
	case model == "":
		answer(w, req, format, Rejection{Status: http.StatusBadRequest, Type: invalidType(format), Code: "invalid_request",
			Message: "gateway: the request body has no model"}, endRefused)
	case rp == nil:
		answer(w, req, format, notFound(format, fmt.Sprintf("no route for model %q", model)), endRefused)
	case req.ContentLength > rp.maxBody:
		answer(w, req, format, Rejection{Status: http.StatusRequestEntityTooLarge, Type: invalidType(format), Code: "request_too_large",
			Message: fmt.Sprintf("gateway: request body larger than %d bytes (the limit for model %q)", rp.maxBody, model)}, endRefused)
	default:
		rp.gate.calls.Add(1)
		defer rp.gate.calls.Add(-1)
		if n := noteOf(req.Context()); n != nil {
			n.call = call
		}
		ctx := stream.WithCall(req.Context(), call)
		if call.Stream {
			c := &coalescer{ResponseWriter: w}
			defer func() {
				p := recover()
				c.finish(p != nil)
				if p != nil {
					panic(p) // an aborted stream (http.ErrAbortHandler) goes on aborting
				}
			}()
			w, ctx = c, httptrace.WithClientTrace(ctx, c.trace())
		}
		forward(w, req.WithContext(ctx), rp, model, call.Stream)
	}
}

// forward sends req on through route rp, noting the route and the model
// for the request log; streamed is true for a call that asked for a
// streamed answer.
func forward(w http.ResponseWriter, req *http.Request, rp *routeProxy, model string, streamed bool) {
	if n := noteOf(req.Context()); n != nil {
		n.route, n.model = rp.index, model
	}
	if streamed {
		rp.streamed.ServeHTTP(w, req)
		return
	}
	rp.ServeHTTP(w, req)
}

// answer answers req itself, with r, in format's dialect; end is how the
// request log describes the request's end.
func answer(w http.ResponseWriter, req *http.Request, format stream.Format, r Rejection, end string) {
	w.Header().Set(RequestIDHeader, req.Header.Get(RequestIDHeader))
	write(w, format, r)
	if n := noteOf(req.Context()); n != nil {
		n.end = end
	}
}

// requestID returns req's request ID, after giving it one if it has none.
func requestID(req *http.Request) string {
	id := req.Header.Get(RequestIDHeader)
	if id == "" {
		id = newRequestID()
		req.Header.Set(RequestIDHeader, id)
	}
	return id
}

// notFound is the answer to a request no route covers.
func notFound(format stream.Format, why string) Rejection {
	return Rejection{Status: http.StatusNotFound, Type: invalidType(format), Code: "not_found", Message: "gateway: " + why}
}
