package gateway

import (
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

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

// logged logs one line per request h serves: method, path, status, bytes,
// duration, the request ID (the client's or the one the Handler gave it:
// the call's tag), the admission ID of an admitted call, the reason of a
// shed one, and the SDK's retry count (x-stainless-retry-count, which the
// OpenAI and Anthropic SDKs send) when the client sent one.
func logged(h http.Handler, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		retry := r.Header.Get("X-Stainless-Retry-Count")
		h.ServeHTTP(rec, r)
		level := slog.LevelInfo
		if rec.status >= 500 && rec.status != 503 && rec.status != 529 {
			level = slog.LevelWarn
		}
		attrs := [...]slog.Attr{
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", rec.status), slog.Int64("bytes", rec.bytes),
			slog.Duration("duration", time.Since(start)),
			slog.String("tag", r.Header.Get(RequestIDHeader)),
			slog.String("admission_id", rec.Header().Get(stream.AdmissionIDHeader)),
			slog.String("shed", rec.Header().Get("X-Bulkhead-Reason")),
			{},
		}
		n := len(attrs) - 1
		if retry != "" {
			if count, err := strconv.Atoi(retry); err == nil {
				attrs[n] = slog.Int("retry", count)
			} else {
				attrs[n] = slog.String("retry", retry)
			}
			n++
		}
		logger.LogAttrs(r.Context(), level, "request", attrs[:n]...)
	})
}

// recorder notes the status and size of a response, and passes flushes on
// (streams go to the client event by event).
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(p []byte) (int, error) {
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
