package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"
	"github.com/llmbulkhead/bulkhead/stream"
)

// orderedJSON decodes a JSON object's members in their order.
func orderedJSON(t *testing.T, line []byte) [][2]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(line))
	d.UseNumber()
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%s: not an object: %v %v", line, tok, err)
	}
	var out [][2]any
	for d.More() {
		k, err := d.Token()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		out = append(out, [2]any{k, v})
	}
	return out
}

// TestRequestLineIsSlogs: the request line NewLogger's handler writes
// itself reads, member by member and in the same order, as the line slog's
// JSON handler writes for the same request.
func TestRequestLineIsSlogs(t *testing.T) {
	f := &front{}
	st := &served{bulkhead: []string{"main"}}
	start := time.Date(2026, 12, 3, 14, 0, 0, 123456789, time.UTC)
	now := start.Add(12345678 * time.Nanosecond)
	for _, c := range []struct {
		name   string
		note   callNote
		tag    string
		retry  string
		status int
		level  slog.Level
	}{
		{"done", callNote{route: 0, model: "gpt-4o", end: endDone, header: start.Add(1500 * time.Microsecond)}, "0123456789abcdef", "", 200, slog.LevelInfo},
		{"shed", callNote{client: &client{name: "web"}, class: "tenant <&>", route: 0, high: true, end: endShed}, "tag \"q\" \x01 \u2028 é \xff", "2", 503, slog.LevelInfo},
		{"refused", callNote{route: -1, end: endRefused}, "t", "x1", 404, slog.LevelInfo},
		{"upstream", callNote{route: 3, model: "m", end: endUpstream}, "t", "", 502, slog.LevelWarn},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			req.Header.Set(RequestIDHeader, c.tag)
			note := c.note
			rec := &recorder{ResponseWriter: httptest.NewRecorder(), note: &note, status: c.status, bytes: 321}
			if c.status == 503 {
				rec.Header().Set(stream.AdmissionIDHeader, "adm-1")
				rec.Header().Set("X-Bulkhead-Reason", "concurrency_limit")
			}
			w := &jsonWriter{}
			f.appendLine(w, now, c.level, req, rec, start, c.status, c.retry, st)

			var want bytes.Buffer
			var attrs attrList
			f.fields(&attrs, req, rec, start, now, c.status, c.retry, st)
			r := slog.NewRecord(now, c.level, "request", 0)
			r.AddAttrs(attrs...)
			if err := slog.NewJSONHandler(&want, nil).Handle(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if got, exp := orderedJSON(t, w.b), orderedJSON(t, want.Bytes()); !reflect.DeepEqual(got, exp) {
				t.Errorf("line\n got %s\nwant %s", w.b, want.Bytes())
			}
			if !bytes.HasSuffix(w.b, []byte("}\n")) || bytes.Count(w.b, []byte("\n")) != 1 {
				t.Errorf("not one line: %q", w.b)
			}
		})
	}
}

// TestNewLoggerLevels: NewLogger's logger writes other records as slog's
// JSON handler does, and text lines for format "text".
func TestNewLoggerLevels(t *testing.T) {
	var b bytes.Buffer
	logger := NewLogger(&b, "json")
	logger.Info("hello", "n", 1)
	flushLogs(logger)
	if m := orderedJSON(t, b.Bytes()); len(m) != 4 || m[2][1] != "hello" || m[3][0] != "n" {
		t.Errorf("json: %s", b.Bytes())
	}
	b.Reset()
	logger = NewLogger(&b, "text")
	logger.Info("hello", "n", 1)
	flushLogs(logger)
	if !bytes.Contains(b.Bytes(), []byte("msg=hello n=1")) {
		t.Errorf("text: %s", b.Bytes())
	}
	if lh, ok := NewLogger(io.Discard, "").Handler().(*lineHandler); !ok || !lh.json {
		t.Error("json is the default")
	}
}

// countingWriter counts its writes.
type countingWriter struct {
	mu     sync.Mutex
	writes int
	b      bytes.Buffer
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	return c.b.Write(p)
}

func (c *countingWriter) lines() (lines, writes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Count(c.b.Bytes(), []byte("\n")), c.writes
}

// TestNewLoggerGathersLines: lines logged together reach the writer
// together, within the delay, not in one write each; flushLogs (which
// Gateway.Shutdown calls) writes what waits at once.
func TestNewLoggerGathersLines(t *testing.T) {
	var w countingWriter
	logger := NewLogger(&w, "json")
	for i := range 50 {
		logger.Info("line", "i", i)
	}
	testutil.WaitFor(t, "the lines", func() bool { n, _ := w.lines(); return n == 50 })
	if _, writes := w.lines(); writes > 3 {
		t.Errorf("50 lines in %d writes", writes)
	}
	logger.Info("last")
	flushLogs(logger)
	if n, _ := w.lines(); n != 51 {
		t.Errorf("after the flush: %d lines", n)
	}
}

// TestFlushLogsDerived: the lines of a logger derived from NewLogger's
// (With, WithGroup), as a Build gateway's may be, are written by flushLogs
// (Gateway.Shutdown) too, not left to the timer; a derived logger's
// request lines keep its attributes.
func TestFlushLogsDerived(t *testing.T) {
	for _, c := range []struct {
		name   string
		derive func(*slog.Logger) *slog.Logger
		want   string
	}{
		{"with", func(l *slog.Logger) *slog.Logger { return l.With("service", "gw") }, `"service":"gw"`},
		{"group", func(l *slog.Logger) *slog.Logger { return l.WithGroup("g").With("service", "gw") }, `"g":{"service":"gw"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var w countingWriter
			logger := c.derive(NewLogger(&w, "json"))
			logger.Info("last")
			flushLogs(logger)
			if n, _ := w.lines(); n != 1 {
				t.Fatalf("after the flush: %d lines", n)
			}

			f := &front{logger: logger}
			req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			rec := &recorder{ResponseWriter: httptest.NewRecorder(), note: &callNote{route: -1}}
			f.log(req, rec, time.Now(), rec.outcome(), "", &served{mode: logAll})
			flushLogs(logger)
			w.mu.Lock()
			defer w.mu.Unlock()
			if lines := bytes.Split(bytes.TrimSpace(w.b.Bytes()), []byte("\n")); len(lines) != 2 || !bytes.Contains(lines[1], []byte(c.want)) {
				t.Errorf("the request line: %s", w.b.Bytes())
			}
		})
	}
}
