package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmbulkhead/bulkhead/stream"
)

// DefaultBodyBudget and DefaultBodyTimeout are a Handler's defaults for
// reading request bodies.
const (
	DefaultBodyBudget  = 256 << 20
	DefaultBodyTimeout = 30 * time.Second
)

// minDiscard is the least a Handler reads and discards of a body it refuses
// unread (see readCall).
const minDiscard = 1 << 20

// errBodyBudget is the read error of a body whose bytes do not fit in the
// Handler's body budget.
var errBodyBudget = errors.New("gateway: the body budget is spent")

// heldBody is a request body whose bytes are charged to the Handler's body
// budget as they arrive. It does not close the body it reads: the Handler
// may still read and discard the rest of it.
type heldBody struct {
	src   io.Reader
	held  *atomic.Int64 // the bytes of every heldBody, all calls together
	limit int64         // the budget
	n     int64         // this body's bytes in held
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.src.Read(p)
	if n > 0 {
		if !take(b.held, int64(n), b.limit) {
			return 0, errBodyBudget
		}
		b.n += int64(n)
	}
	return n, err
}

func (b *heldBody) Close() error { return nil }

// release gives the body's bytes back to the budget.
func (b *heldBody) release() {
	b.held.Add(-b.n)
	b.n = 0
}

// take adds n to held if the sum stays within limit.
func take(held *atomic.Int64, n, limit int64) bool {
	for {
		h := held.Load()
		if n > limit-h {
			return false
		}
		if held.CompareAndSwap(h, h+n) {
			return true
		}
	}
}

func (h *Handler) bodyBudget() int64 {
	if h.BodyBudget <= 0 {
		return DefaultBodyBudget
	}
	return h.BodyBudget
}

func (h *Handler) bodyTimeout() time.Duration {
	if h.BodyTimeout == 0 {
		return DefaultBodyTimeout
	}
	return h.BodyTimeout
}

// readCall reads the body of req, a call in format, of at most limit
// bytes (and at most the body budget), as its bytes arrive, within the
// body timeout; the bytes stay charged to the budget until release is
// called. When it cannot, it answers req itself and returns ok false: 413
// for a body over the limit, 503 (529 for Anthropic) when the budget is
// spent, 408 when the body does not arrive in time, 400 when it is not a
// valid call.
//
// A body refused before its end (too large, or no room in the budget) is
// first read and discarded, up to as many bytes again as the limit (at
// least 1 MiB) and within the body timeout, so that a client that sends
// its whole body before it reads the answer, as the SDKs do, gets the
// answer; when more is left, the answer closes the connection. A body
// refused before any of it is read, whose client waits for 100 Continue,
// is not asked for.
func (h *Handler) readCall(w http.ResponseWriter, req *http.Request, format stream.Format, limit int64) (call *stream.Call, release func(), ok bool) {
	budget := h.bodyBudget()
	limit = min(limit, budget) // a body over the budget could never be read
	g := h.guard(w, req)
	var body io.Reader = http.NoBody
	if g != nil {
		body = g
	}
	held := &heldBody{src: body, held: &h.held, limit: budget}
	release = held.release
	interrupted, stop := g.interruptOn(req.Context())
	defer stop()
	discard := max(limit, minDiscard)
	tooLarge := func() Rejection {
		return Rejection{Status: http.StatusRequestEntityTooLarge, Type: invalidType(format), Code: "request_too_large",
			Message: fmt.Sprintf("gateway: request body larger than %d bytes", limit)}
	}
	switch {
	case req.ContentLength > limit:
		// Nothing is read: the client said it is too large.
		n := req.ContentLength
		if n-limit > discard || expectsContinue(req) {
			n = -1 // not worth reading, or not sent yet
		}
		refuseUnread(w, req, format, g, n, tooLarge(), endRefused)
		return nil, release, false
	case h.held.Load() >= budget:
		n := discard
		if expectsContinue(req) {
			n = -1
		}
		refuseUnread(w, req, format, g, n, h.budgetSpent(format, budget), endShed)
		return nil, release, false
	}
	req.Body = held
	call, err := stream.ReadRequest(req, limit)
	var tl *stream.TooLargeError
	switch {
	case err == nil:
		return call, release, true
	case errors.As(err, &tl):
		held.release() // its bytes are dropped
		refuseUnread(w, req, format, g, discard, tooLarge(), endRefused)
	case errors.Is(err, errBodyBudget):
		held.release()
		refuseUnread(w, req, format, g, discard, h.budgetSpent(format, budget), endShed)
	case errors.Is(err, os.ErrDeadlineExceeded) && !interrupted():
		refuseUnread(w, req, format, g, -1, Rejection{Status: http.StatusRequestTimeout, ShouldRetry: true, Type: invalidType(format), Code: "request_timeout",
			Message: fmt.Sprintf("gateway: the request body did not arrive within %v", h.bodyTimeout())}, endRefused)
	case req.Context().Err() != nil:
		refuseUnread(w, req, format, g, -1, RejectionOf(format, context.Cause(req.Context())), endOf(context.Cause(req.Context())))
	case errors.Is(err, stream.ErrBodyTooLarge), isBodyError(err):
		refuseUnread(w, req, format, g, -1, RejectionOf(format, err), endRefused) // read whole: the connection goes on
	default: // the client stopped sending mid-body
		refuseUnread(w, req, format, g, -1, RejectionOf(format, context.Canceled), endClientGone)
	}
	return nil, release, false
}

// guardedBody is a request body whose wait the Handler bounds. From the
// moment the Handler (or a Build gateway) starts serving the request, the
// connection has a read deadline at the body timeout; it is lifted once
// the body has been read to its end, since the server then watches the
// connection for the client going away, which must not time out. A body
// not read to its end keeps the deadline whatever the answer: the server,
// which would wait for the rest of the body to use the connection again,
// gives up on it, and closes the connection, by then.
type guardedBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time   // zero: none (no body timeout, or a ResponseWriter without read deadlines)
	ended    atomic.Bool // read to its end
}

func (b *guardedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.ended.Swap(true) && !b.deadline.IsZero() {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// guard bounds the wait for req's body (see guardedBody), once per
// request: it returns the guard in place already, and nil for a request
// without a body.
func (h *Handler) guard(w http.ResponseWriter, req *http.Request) *guardedBody {
	switch b := req.Body.(type) {
	case *guardedBody:
		return b
	case nil:
		return nil
	}
	if req.Body == http.NoBody {
		return nil
	}
	g := &guardedBody{ReadCloser: req.Body, rc: http.NewResponseController(w)}
	if d := h.bodyTimeout(); d > 0 {
		deadline := time.Now().Add(d)
		if g.rc.SetReadDeadline(deadline) == nil {
			g.deadline = deadline
		}
	}
	req.Body = g
	return g
}

// interruptOn cuts the reading of the body short when ctx ends before the
// deadline (its client gone, the gateway shutting down), until stop is
// called; interrupted then reports whether it did. When the deadline
// itself ended the read, the server ends the context too: that is no
// interruption.
func (g *guardedBody) interruptOn(ctx context.Context) (interrupted func() bool, stop func() bool) {
	if g == nil || g.deadline.IsZero() {
		return func() bool { return false }, func() bool { return false }
	}
	var cut atomic.Bool
	stop = context.AfterFunc(ctx, func() {
		if time.Now().Before(g.deadline) {
			cut.Store(true)
			_ = g.rc.SetReadDeadline(time.Now())
		}
	})
	return cut.Load, stop
}

// drop reads and discards up to n more bytes of the body, within its
// deadline, and reports whether the body ended. With n negative, or
// without a deadline, it reads nothing, and the server is not to wait for
// the rest at all: the read deadline becomes now. A nil g (no body) has
// ended.
func (g *guardedBody) drop(n int64) bool {
	if g == nil || g.ended.Load() {
		return true
	}
	if n < 0 || g.deadline.IsZero() {
		_ = g.rc.SetReadDeadline(time.Now())
		return false
	}
	if _, err := io.CopyN(io.Discard, g, n); err != nil {
		return err == io.EOF
	}
	var one [1]byte
	_, err := io.ReadFull(g, one[:])
	return err == io.EOF
}

// dropBody reads and discards req's body ahead of an answer that does not
// use it, for a route whose bodies may hold limit bytes, as readCall does
// for a body it refuses: up to max(limit, 1 MiB) bytes, within the body
// timeout. A longer one is not read, nor the body of a client waiting for
// 100 Continue before it sends it; when the body did not end, the answer
// closes the connection.
func (h *Handler) dropBody(w http.ResponseWriter, req *http.Request, limit int64) {
	g := h.guard(w, req)
	n := max(min(limit, h.bodyBudget()), minDiscard)
	if req.ContentLength > n || expectsContinue(req) {
		n = -1
	}
	if !g.drop(n) {
		w.Header().Set("Connection", "close")
	}
}

// refuseEarly answers r to a call whose body has not been read, for a
// route whose bodies may hold limit bytes, its body first dropped (see
// dropBody).
func (h *Handler) refuseEarly(w http.ResponseWriter, req *http.Request, format stream.Format, limit int64, r Rejection, end string) {
	h.dropBody(w, req, limit)
	answer(w, req, format, r, end)
}

// bodyLimitOf is the largest body a route of format reads; 0 when no
// route serves it.
func (t *table) bodyLimitOf(format stream.Format) int64 {
	if fr := t.formats[format]; fr != nil {
		return fr.maxBody
	}
	return 0
}

// expectsContinue reports whether req's client waits for 100 Continue
// before it sends its body: a call refused before its body is read is
// then answered without asking for it.
func expectsContinue(req *http.Request) bool {
	return strings.EqualFold(req.Header.Get("Expect"), "100-continue")
}

func isBodyError(err error) bool {
	var be *stream.BodyError
	return errors.As(err, &be)
}

// budgetSpent is the answer to a call whose body finds the body budget
// spent: the gateway is overloaded for now, and another try may find room.
func (h *Handler) budgetSpent(format stream.Format, budget int64) Rejection {
	r := Rejection{Status: http.StatusServiceUnavailable, ShouldRetry: true, Type: overloadType(format), Code: "server_is_overloaded",
		Message: fmt.Sprintf("gateway: request bodies hold %d bytes of the body budget of %d; retry shortly", h.held.Load(), budget)}
	if format == stream.AnthropicMessages {
		r.Status = 529
	}
	return r
}

// refuseUnread answers r to a call whose body g has not been read to its
// end, after reading and discarding up to n more bytes of it (none when n
// is negative); when more is left, the answer closes the connection.
func refuseUnread(w http.ResponseWriter, req *http.Request, format stream.Format, g *guardedBody, n int64, r Rejection, end string) {
	if !g.drop(n) {
		w.Header().Set("Connection", "close")
	}
	answer(w, req, format, r, end)
}
