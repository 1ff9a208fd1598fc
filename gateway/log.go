package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// NewLogger returns the request log Build writes when it is given none (on
// standard error): one line per request on w, JSON (format "json" or "")
// or text ("text"), as slog's JSON and text handlers write lines. Its JSON
// request lines are built without reflection. Lines are written to w
// together, at most 100 ms after they are logged (or once 32 KiB wait),
// rather than in one write each, which under load costs a system call per
// request; Gateway.Shutdown writes the lines that wait. Writes to w are
// serialised.
func NewLogger(w io.Writer, format string) *slog.Logger {
	lw := &logWriter{w: w}
	if format == "text" {
		return slog.New(&lineHandler{Handler: slog.NewTextHandler(lw, nil), w: lw})
	}
	return slog.New(&lineHandler{Handler: slog.NewJSONHandler(lw, nil), w: lw, json: true})
}

// lineHandler is NewLogger's handler: slog's JSON or text handler on w,
// except for the JSON request lines, which the front writes to w itself.
type lineHandler struct {
	slog.Handler
	w    *logWriter
	json bool
}

// WithAttrs and WithGroup keep the writer, for flushLogs; the derived
// handler writes the request lines through slog, with its attributes.
func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &lineHandler{Handler: h.Handler.WithAttrs(attrs), w: h.w}
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	return &lineHandler{Handler: h.Handler.WithGroup(name), w: h.w}
}

// flushLogs writes the lines that wait in logger, when it is NewLogger's
// (or derived from it).
func flushLogs(logger *slog.Logger) {
	if lh, ok := logger.Handler().(*lineHandler); ok {
		lh.w.flush()
	}
}

// The request log's buffering: lines wait at most logDelay, and while
// fewer than logBuffer bytes do.
const (
	logDelay  = 100 * time.Millisecond
	logBuffer = 32 << 10
)

// logWriter gathers the lines written to w, and writes them together.
type logWriter struct {
	mu    sync.Mutex
	w     io.Writer
	buf   []byte
	timer *time.Timer // writes buf, logDelay after the first line that waits
	armed bool        // timer is due
}

func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf)+len(p) > logBuffer {
		if err := l.writeLocked(); err != nil {
			return 0, err
		}
		if len(p) > logBuffer {
			return l.w.Write(p)
		}
	}
	l.buf = append(l.buf, p...)
	if !l.armed {
		l.armed = true
		if l.timer == nil {
			l.timer = time.AfterFunc(logDelay, l.due)
		} else {
			l.timer.Reset(logDelay)
		}
	}
	return len(p), nil
}

// due writes the lines that wait, at the timer.
func (l *logWriter) due() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	_ = l.writeLocked()
}

// flush writes the lines that wait, now, and stops the timer.
func (l *logWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
	l.armed = false
	_ = l.writeLocked()
}

func (l *logWriter) writeLocked() error {
	if len(l.buf) == 0 {
		return nil
	}
	_, err := l.w.Write(l.buf)
	l.buf = l.buf[:0]
	return err
}

// lineWriters keep the writers of request lines.
var lineWriters = sync.Pool{New: func() any { return &jsonWriter{b: make([]byte, 0, 512)} }}

// The request log's modes (LogConfig.Requests).
const (
	logAll    = "all"
	logErrors = "errors"
	logNone   = "none"
)

// front is what a Build gateway does around its Handler for every request
// but the health and metrics endpoints: it gives the request an ID,
// authenticates its client when the gateway has clients, lets the
// gateway cut it at the shutdown deadline, traces it when the gateway has
// traces, and logs one line when it ends, however it ends (a panic that
// aborts a stream included). It serves each request with the
// configuration in force when the request arrived (see served).
type front struct {
	g      *Gateway
	logger *slog.Logger
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	st := f.g.state.Load()
	f.g.requests.add()
	defer f.g.requests.done()
	var span trace.Span // nil: not traced
	if t := f.g.tel; t != nil && t.tracer != nil {
		var sctx context.Context
		sctx, span = t.startSpan(r)
		r = r.WithContext(sctx)
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(f.g.cut, func() { cancel(errShutdownCut) })
	defer stop()
	note := &callNote{route: -1}
	clientCtx := r.Context()
	r = r.WithContext(context.WithValue(ctx, noteKey{}, note))
	requestID(r)
	retry := r.Header.Get(st.attempt)
	rec := &recorder{ResponseWriter: w, note: note}
	defer func() {
		p := recover()
		if p != nil { // a stream aborted (http.ErrAbortHandler), or a bug: log it, then go on panicking
			switch {
			case note.answered() && !rec.failed:
				// The whole answer went to the client, which may have
				// closed as soon as it read the last event.
				note.end = endDone
			case errors.Is(context.Cause(ctx), errShutdownCut):
				note.end = endShutdown
			case clientCtx.Err() != nil:
				note.end = endClientGone
			default:
				note.end = endUpstream
			}
		}
		status := rec.outcome()
		f.log(r, rec, start, status, retry, st)
		if span != nil {
			f.g.tel.endSpan(span, r, rec, status, st)
		}
		if p != nil {
			panic(p)
		}
	}()
	if st.clients != nil {
		format, known := stream.FormatOf(r.URL.Path)
		key := presentedKey(r)
		c := st.clients.find(key)
		if c == nil {
			// Its body is read and discarded first, as a refused body's is,
			// so that a client uploading it reads the 401.
			limit := int64(0)
			if known {
				limit = st.table.bodyLimitOf(format)
			}
			f.g.proxy.refuseEarly(rec, r, format, limit, unauthorized(format, key == ""), endUnauthorized)
			return
		}
		note.client = c
		dropKey(r) // the client's key is the gateway's own: it never goes upstream
	}
	f.g.proxy.guard(rec, r)
	f.g.proxy.serve(rec, r, st.table)
}

// outcome settles how the request ended, for the log and the trace: its
// end (done unless something said otherwise) and the status it returns
// (499 for a client gone before its answer).
func (rec *recorder) outcome() int {
	note := rec.note
	if note.end == "" {
		note.end = endDone
	}
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if note.end == endClientGone {
		status = StatusClientClosedRequest
	}
	return status
}

// log writes the request's line, unless the mode leaves it out.
func (f *front) log(r *http.Request, rec *recorder, start time.Time, status int, retry string, st *served) {
	note := rec.note
	if st.mode == logNone || st.mode == logErrors && note.end == endDone && status < 400 {
		return
	}
	level := slog.LevelInfo
	if note.end == endUpstream {
		level = slog.LevelWarn
	}
	now := time.Now()
	if lh, ok := f.logger.Handler().(*lineHandler); ok && lh.json {
		if !lh.Enabled(r.Context(), level) {
			return
		}
		w := lineWriters.Get().(*jsonWriter)
		f.appendLine(w, now, level, r, rec, start, status, retry, st)
		_, _ = lh.w.Write(w.b)
		if cap(w.b) <= maxPooledBuffer {
			lineWriters.Put(w)
		}
		return
	}
	attrs := make(attrList, 0, 20)
	f.fields(&attrs, r, rec, start, now, status, retry, st)
	f.logger.LogAttrs(r.Context(), level, "request", attrs...)
}

// appendLine writes the request's line, at now, in w (emptied first): the
// JSON line slog's JSON handler writes for the same record.
func (f *front) appendLine(w *jsonWriter, now time.Time, level slog.Level, r *http.Request, rec *recorder, start time.Time, status int, retry string, st *served) {
	w.b = w.b[:0]
	w.open()
	w.time("time", now)
	w.str("level", level.String())
	w.str("msg", "request")
	f.fields(w, r, rec, start, now, status, retry, st)
	w.end()
	w.b = append(w.b, '\n')
}

// fieldSink receives the fields of a request line: a JSON line being
// written, or slog attributes.
type fieldSink interface {
	str(k, v string)
	int(k string, v int64)
	float(k string, v float64)
}

// attrList collects a request line's fields as slog attributes.
type attrList []slog.Attr

func (a *attrList) str(k, v string)           { *a = append(*a, slog.String(k, v)) }
func (a *attrList) int(k string, v int64)     { *a = append(*a, slog.Int64(k, v)) }
func (a *attrList) float(k string, v float64) { *a = append(*a, slog.Float64(k, v)) }

// fields writes the request's fields to out, in their order on the line;
// the request ended at now.
func (f *front) fields(out fieldSink, r *http.Request, rec *recorder, start, now time.Time, status int, retry string, st *served) {
	note := rec.note
	out.str("method", r.Method)
	out.str("path", r.URL.Path)
	out.int("status", int64(status))
	out.str("end", note.end)
	out.int("bytes", rec.bytes)
	out.float("duration_ms", ms(now.Sub(start)))
	if !note.header.IsZero() {
		out.float("header_ms", ms(note.header.Sub(start)))
	}
	out.str("tag", r.Header.Get(RequestIDHeader))
	if c := note.client; c != nil {
		out.str("key_id", c.name)
	}
	if note.route >= 0 {
		out.int("route", int64(note.route))
		if note.route < len(st.bulkhead) {
			out.str("bulkhead", st.bulkhead[note.route])
		}
	}
	if note.model != "" {
		out.str("model", note.model)
	}
	if note.class != "" {
		out.str("tenant", note.class)
	}
	if note.high {
		out.str("priority", "high")
	}
	if id := rec.Header().Get(stream.AdmissionIDHeader); id != "" {
		out.str("admission_id", id)
	}
	if reason := rec.Header().Get("X-Bulkhead-Reason"); reason != "" {
		out.str("shed", reason)
	}
	if retry != "" {
		if count, err := strconv.Atoi(retry); err == nil {
			out.int("retry", int64(count))
		} else {
			out.str("retry", retry)
		}
	}
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// recorder notes the status and size of a response, and when its headers
// were written, and passes flushes on (streams go to the client event by
// event).
type recorder struct {
	http.ResponseWriter
	note   *callNote
	status int
	bytes  int64
	failed bool // a write failed: what followed did not reach the client
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status, r.note.header = status, time.Now()
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status, r.note.header = http.StatusOK, time.Now()
	}
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	if err != nil {
		r.failed = true
	}
	return n, err
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// inflight counts the requests a gateway is serving, and lets Shutdown
// wait for them to end.
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0
}

func (f *inflight) add() {
	f.mu.Lock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
	f.mu.Unlock()
}

func (f *inflight) done() {
	f.mu.Lock()
	if f.n--; f.n == 0 {
		close(f.idle)
	}
	f.mu.Unlock()
}

// wait waits until no request is being served, or ctx ends, and reports
// which.
func (f *inflight) wait(ctx context.Context) bool {
	for {
		f.mu.Lock()
		n, idle := f.n, f.idle
		f.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return false
		}
	}
}

// callNote is what the request log learns of a request from the layers
// that serve it: the client, the route and model, the admission class, and
// how the gateway itself ended the request when it did.
type callNote struct {
	client *client // the authenticated client; nil for none
	class  string
	model  string
	route  int // -1 when no route took the request
	high   bool
	end    string
	header time.Time    // when the response's headers were written
	answer *endWatch    // the admitted call's answer, nil before (or without) one
	call   *stream.Call // the call read from the body, nil before (or without) one
}

type noteKey struct{}

// noteOf returns the note of the request whose context is ctx, nil when it
// is not logged.
func noteOf(ctx context.Context) *callNote {
	n, _ := ctx.Value(noteKey{}).(*callNote)
	return n
}

// How a request ended, in the request log.
const (
	endDone         = "done"           // answered by the upstream, to its end
	endShed         = "shed"           // turned away by a bulkhead or the body budget
	endRefused      = "refused"        // refused by the gateway: no route, an invalid or too large body
	endUnauthorized = "unauthorized"   // no client key, or an unknown one
	endClientGone   = "client_gone"    // the client went away first
	endShutdown     = "shutdown"       // cut at the shutdown deadline
	endUpstream     = "upstream_error" // the upstream failed, before or during its answer
)

// errShutdownCut is the cause of a call cut at the shutdown deadline.
var errShutdownCut = errors.New("gateway: shutting down: the call was cut at the shutdown deadline")

// endOf is how a request whose call failed with err ended.
func endOf(err error) string {
	var rej *bulkhead.RejectedError
	switch {
	case errors.As(err, &rej) && rej.Reason == bulkhead.Aborted:
		return endClientGone
	case rej != nil:
		return endShed
	case errors.Is(err, errShutdownCut):
		return endShutdown
	case errors.Is(err, context.Canceled):
		return endClientGone
	case errors.Is(err, bulkhead.ErrInvalid):
		return endRefused
	}
	return endUpstream
}
