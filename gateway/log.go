package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// newLogger is the request log on standard error, in format ("json" or
// "text").
func newLogger(format string) *slog.Logger {
	if format == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, nil))
}

// The request log's modes (LogConfig.Requests).
const (
	logAll    = "all"
	logErrors = "errors"
	logNone   = "none"
)

// front is what a Build gateway does around its Handler for every request
// but the health and metrics endpoints: it gives the request an ID,
// authenticates its client when the gateway has clients, lets the
// gateway cut it at the shutdown deadline, and logs one line when it ends,
// however it ends (a panic that aborts a stream included).
type front struct {
	next     http.Handler
	g        *Gateway
	clients  *clientSet // nil: no authentication
	logger   *slog.Logger
	mode     string
	bulkhead []string // the bulkhead of each route, by index
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	f.g.requests.add()
	defer f.g.requests.done()
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(f.g.cut, func() { cancel(errShutdownCut) })
	defer stop()
	note := &callNote{route: -1}
	clientCtx := r.Context()
	r = r.WithContext(context.WithValue(ctx, noteKey{}, note))
	requestID(r)
	retry := r.Header.Get("X-Stainless-Retry-Count")
	rec := &recorder{ResponseWriter: w, note: note}
	defer func() {
		p := recover()
		if p != nil { // a stream aborted (http.ErrAbortHandler), or a bug: log it, then go on panicking
			switch {
			case errors.Is(context.Cause(ctx), errShutdownCut):
				note.end = endShutdown
			case clientCtx.Err() != nil:
				note.end = endClientGone
			default:
				note.end = endUpstream
			}
		}
		f.log(r, rec, start, retry)
		if p != nil {
			panic(p)
		}
	}()
	if f.clients != nil {
		format, _ := stream.FormatOf(r.URL.Path)
		key := presentedKey(r)
		c := f.clients.find(key)
		if c == nil {
			answer(rec, r, format, unauthorized(format, key == ""), endUnauthorized)
			return
		}
		note.client = c
		dropKey(r) // the client's key is the gateway's own: it never goes upstream
	}
	f.next.ServeHTTP(rec, r)
}

// log writes the request's line, unless the mode leaves it out.
func (f *front) log(r *http.Request, rec *recorder, start time.Time, retry string) {
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
	if f.mode == logNone || f.mode == logErrors && note.end == endDone && status < 400 {
		return
	}
	level := slog.LevelInfo
	if note.end == endUpstream {
		level = slog.LevelWarn
	}
	attrs := make([]slog.Attr, 0, 20)
	attrs = append(attrs,
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", status), slog.String("end", note.end), slog.Int64("bytes", rec.bytes),
		slog.Float64("duration_ms", ms(time.Since(start))))
	if !note.header.IsZero() {
		attrs = append(attrs, slog.Float64("header_ms", ms(note.header.Sub(start))))
	}
	attrs = append(attrs, slog.String("tag", r.Header.Get(RequestIDHeader)))
	if c := note.client; c != nil {
		attrs = append(attrs, slog.String("key_id", c.name))
	}
	if note.route >= 0 {
		attrs = append(attrs, slog.Int("route", note.route))
		if note.route < len(f.bulkhead) {
			attrs = append(attrs, slog.String("bulkhead", f.bulkhead[note.route]))
		}
	}
	if note.model != "" {
		attrs = append(attrs, slog.String("model", note.model))
	}
	if note.class != "" {
		attrs = append(attrs, slog.String("tenant", note.class))
	}
	if note.high {
		attrs = append(attrs, slog.String("priority", "high"))
	}
	if id := rec.Header().Get(stream.AdmissionIDHeader); id != "" {
		attrs = append(attrs, slog.String("admission_id", id))
	}
	if reason := rec.Header().Get("X-Bulkhead-Reason"); reason != "" {
		attrs = append(attrs, slog.String("shed", reason))
	}
	if retry != "" {
		if count, err := strconv.Atoi(retry); err == nil {
			attrs = append(attrs, slog.Int("retry", count))
		} else {
			attrs = append(attrs, slog.String("retry", retry))
		}
	}
	f.logger.LogAttrs(r.Context(), level, "request", attrs...)
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
	header time.Time // when the response's headers were written
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
