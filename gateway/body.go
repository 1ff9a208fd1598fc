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
	body := req.Body
	if body == nil {
		body = http.NoBody
	}
	held := &heldBody{src: body, held: &h.held, limit: budget}
	release = held.release
	interrupted, disarm := h.bodyDeadline(w, req)
	defer disarm()
	discard := max(limit, minDiscard)
	tooLarge := func() Rejection {
		return Rejection{Status: http.StatusRequestEntityTooLarge, Type: invalidType(format), Code: "request_too_large",
			Message: fmt.Sprintf("gateway: request body larger than %d bytes", limit)}
	}
	switch {
	case req.ContentLength > limit:
		// Nothing is read: the client said it is too large.
		if req.ContentLength-limit > discard || expectsContinue(req) {
			discard = -1 // not worth reading, or not sent yet
		} else {
			discard = req.ContentLength
		}
		refuseUnread(w, req, format, body, discard, tooLarge(), endRefused)
		return nil, release, false
	case h.held.Load() >= budget:
		if expectsContinue(req) {
			discard = -1
		}
		refuseUnread(w, req, format, body, discard, h.budgetSpent(format, budget), endShed)
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
		refuseUnread(w, req, format, body, discard, tooLarge(), endRefused)
	case errors.Is(err, errBodyBudget):
		held.release()
		refuseUnread(w, req, format, body, discard, h.budgetSpent(format, budget), endShed)
	case errors.Is(err, os.ErrDeadlineExceeded) && !interrupted():
		w.Header().Set("Connection", "close")
		answer(w, req, format, Rejection{Status: http.StatusRequestTimeout, ShouldRetry: true, Type: invalidType(format), Code: "request_timeout",
			Message: fmt.Sprintf("gateway: the request body did not arrive within %v", h.bodyTimeout())}, endRefused)
	case req.Context().Err() != nil:
		w.Header().Set("Connection", "close")
		answer(w, req, format, RejectionOf(format, context.Cause(req.Context())), endOf(context.Cause(req.Context())))
	case errors.Is(err, stream.ErrBodyTooLarge), isBodyError(err):
		answer(w, req, format, RejectionOf(format, err), endRefused)
	default: // the client stopped sending mid-body
		w.Header().Set("Connection", "close")
		answer(w, req, format, RejectionOf(format, context.Canceled), endClientGone)
	}
	return nil, release, false
}

// bodyDeadline bounds the reading of req's body by the body timeout, until
// disarm is called; interrupted then reports whether the read was cut
// short because req's context ended first (its client gone, the gateway
// shutting down), rather than by the timeout.
func (h *Handler) bodyDeadline(w http.ResponseWriter, req *http.Request) (interrupted func() bool, disarm func()) {
	d := h.bodyTimeout()
	if d <= 0 {
		return func() bool { return false }, func() {}
	}
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(d)
	if rc.SetReadDeadline(deadline) != nil {
		return func() bool { return false }, func() {}
	}
	var cut atomic.Bool
	// A call cut short stops waiting for its body at once. When the
	// deadline itself ended the read, the server ends the context too:
	// that is no interruption.
	stop := context.AfterFunc(req.Context(), func() {
		if time.Now().Before(deadline) {
			cut.Store(true)
			_ = rc.SetReadDeadline(time.Now())
		}
	})
	return cut.Load, func() {
		stop()
		_ = rc.SetReadDeadline(time.Time{})
	}
}

// refuseEarly answers r to a call whose body has not been read, for a
// route whose bodies may hold limit bytes: its body is first read and
// discarded, within the body timeout, when it is no longer than
// max(limit, 1 MiB), as readCall does for a body it refuses; a longer one
// is not read, nor the body of a client waiting for 100 Continue before
// it sends it, and the answer closes the connection.
func (h *Handler) refuseEarly(w http.ResponseWriter, req *http.Request, format stream.Format, limit int64, r Rejection, end string) {
	body := req.Body
	if body == nil {
		body = http.NoBody
	}
	discard := max(min(limit, h.bodyBudget()), minDiscard)
	if req.ContentLength > discard || expectsContinue(req) {
		discard = -1
	}
	_, disarm := h.bodyDeadline(w, req)
	defer disarm()
	refuseUnread(w, req, format, body, discard, r, end)
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

// refuseUnread answers r to a call whose body has not been read to its
// end, after reading and discarding up to discard more bytes of it (none
// when discard is negative); when more is left, the answer closes the
// connection.
func refuseUnread(w http.ResponseWriter, req *http.Request, format stream.Format, body io.Reader, discard int64, r Rejection, end string) {
	if !discardRest(body, discard) {
		w.Header().Set("Connection", "close")
	}
	answer(w, req, format, r, end)
}

// discardRest reads and discards body, and reports whether it ended within
// n bytes.
func discardRest(body io.Reader, n int64) bool {
	if n < 0 {
		return false
	}
	if _, err := io.CopyN(io.Discard, body, n); err != nil {
		return err == io.EOF
	}
	var one [1]byte
	_, err := io.ReadFull(body, one[:])
	return err == io.EOF
}
