package stream

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/llmbulkhead/bulkhead"
)

// Transport is an http.RoundTripper that puts the LLM calls of any HTTP
// client (an SDK's included) behind a Bulkhead. For each request to an
// endpoint FormatOf recognises it reads the body (ReadRequest), admits the
// call, sends it on, and meters the response (MeterResponse); the
// admission is released when the response body has been read to its end
// or closed, or when sending fails. Other requests (listing models,
// embeddings, any method but POST) pass through unadmitted.
//
// As with any http.Client, the caller must read the response body to its
// end or close it: an admission is held until then. A body left open holds
// its slot and tokens until the bulkhead is shut down, so always
// `defer resp.Body.Close()` (the official SDKs do this for you, and close a
// stream when it ends or its context is cancelled).
//
// A call that is not admitted fails with the bulkhead's *RejectedError,
// which errors.As finds through http.Client's *url.Error and through the
// official SDKs' errors; nothing is sent upstream. The official SDKs treat
// any transport error as retryable: they try again up to their MaxRetries
// (2 by default) after a backoff of about half a second, then a second. Each
// retry is a fresh admission decision taken in microseconds, and nothing
// reaches the provider unless it is admitted, so retries cannot pile onto a
// saturated provider; the SDKs mark each retry (see AttemptHeader), so a
// bulkhead with a retry budget admits them only up to a share of the first
// attempts. Set the SDK's MaxRetries to 0 to get the rejection at once. A body the transport cannot read (malformed JSON, over MaxBodyBytes)
// fails the same way with a *BodyError or a *TooLargeError.
//
// The transport removes an admitted request's Accept-Encoding header, so that
// the base transport (an *http.Transport) negotiates compression itself and
// hands back a decompressed body, which the meter can read. Invalid Meter
// options fail every admitted call before anything is sent.
//
// Every call it sends is reported to the bulkhead (Permit.Feedback, see
// OutcomeOf) as soon as the response headers arrive or sending fails: a
// 429's Retry-After starts its model's cool-down, the rate-limit headers
// of every answer tell the bulkhead how much of the provider's limits is
// left (see HeadroomOf and bulkhead.Headroom), so that calls stop before
// the provider's window is exhausted, and with Config.Adaptive the answers
// move the limits, without code of the caller's.
//
// A Transport is safe for concurrent use. Its fields must not change once it
// is in use.
type Transport struct {
	// Bulkhead admits the calls. It is required.
	Bulkhead *bulkhead.Bulkhead

	// Base sends admitted requests. Nil means http.DefaultTransport.
	Base http.RoundTripper

	// Options returns the admission options of one call, such as its
	// class, priority and tag (bulkhead.WithClass, WithPriority, WithTag),
	// chosen from the request's headers or the parsed call. Nil means none.
	Options func(req *http.Request, call *Call) []bulkhead.Option

	// AttemptHeader names the request header that says which attempt of
	// a call a request is, passed to the bulkhead as bulkhead.WithAttempt
	// (before Options' options, which may override it): a retry counts
	// against the bulkhead's retry budget and waits behind first attempts
	// in its queue. Empty means DefaultAttemptHeader, which the official
	// SDKs set on every request they send, retries included. A request
	// without the header is a first attempt; one whose value is not a
	// whole number fails with a *bulkhead.ConfigError, and nothing is sent.
	AttemptHeader string

	// Acquire, when set, admits each call in place of Bulkhead.Acquire,
	// with the request's context, the call's request and its Options:
	// a function of the same shape that does more around the admission,
	// such as an otelbulkhead.Tracer's Acquire, which records it on the
	// request's trace. It must admit through Bulkhead, whose permit the
	// transport releases. Nil means Bulkhead.Acquire.
	Acquire func(ctx context.Context, req *bulkhead.Request, opts ...bulkhead.Option) (*bulkhead.Permit, error)

	// MaxBodyBytes bounds the request bodies read, as ReadRequest's
	// maxBytes: zero and negative mean DefaultMaxBodyBytes, math.MaxInt64
	// no limit. A body's memory follows the bytes that arrive, whatever
	// length the request declares.
	MaxBodyBytes int64

	// Meter configures response metering. Its Format, SSE, Model and
	// StripUsageChunk are set per call; the other fields apply as given.
	Meter MeterOptions

	// KeepStreamOptions sends OpenAI chat streaming requests as the caller
	// wrote them. By default a streaming OpenAI chat request that does not
	// ask for usage is sent with stream_options.include_usage set, so the
	// provider reports exact usage at the end of the stream, and the extra
	// usage chunk this adds is removed from the response the caller reads.
	// Set it for a server that rejects stream_options.
	KeepStreamOptions bool
}

// ErrNoBulkhead is the error of a Transport whose Bulkhead is nil.
var ErrNoBulkhead = errors.New("stream: Transport.Bulkhead is nil")

// RoundTrip admits, sends and meters one request. It does not modify req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if _, ok := FormatOf(req.URL.Path); !ok || req.Method != http.MethodPost || req.Body == nil || req.Body == http.NoBody {
		return base.RoundTrip(req)
	}
	if t.Bulkhead == nil {
		req.Body.Close()
		return nil, ErrNoBulkhead
	}
	check := t.Meter
	check.Format, check.StripUsageChunk = OpenAIChat, false // set per call
	if err := validate(check); err != nil {
		req.Body.Close()
		return nil, err
	}

	// out is what goes to the base transport: req itself, unless the
	// transport must change something, which it changes in a copy: of the
	// request alone for its body (as WithContext copies it), of its
	// headers too for a header.
	out := req
	copied, ownHeader := false, false
	own := func(header bool) {
		if !copied {
			c := *req
			out, copied = &c, true
		}
		if header && !ownHeader {
			out.Header, ownHeader = req.Header.Clone(), true
		}
	}
	// fail closes req.Body, as a RoundTripper must on every error, unless
	// ReadRequest read and closed it already.
	bodyOpen := true
	fail := func(err error) (*http.Response, error) {
		if bodyOpen {
			req.Body.Close()
		}
		return nil, err
	}
	call := callOf(req.Context())
	if call == nil {
		own(false)
		var err error
		call, err = ReadRequest(out, t.MaxBodyBytes) // closes req.Body
		bodyOpen = false
		if err != nil {
			return nil, err
		}
	}
	strip := false
	if call.Format == OpenAIChat && call.Stream && !call.IncludeUsage && !t.KeepStreamOptions {
		raw := call.body // the request's body, as ReadRequest read it
		if raw == nil {
			body, err := out.GetBody()
			if err != nil {
				return fail(err)
			}
			if raw, err = io.ReadAll(body); err != nil {
				return fail(err)
			}
		}
		withUsage, err := addIncludeUsage(raw)
		if err != nil {
			return fail(err)
		}
		own(false)
		setBody(out, withUsage)
		if bodyOpen { // what is sent is the new body: the caller's is done with
			req.Body.Close()
			bodyOpen = false
		}
		strip = true
	}

	attempt, err := AttemptOf(req.Header, t.AttemptHeader)
	if err != nil {
		return fail(err)
	}
	var opts []bulkhead.Option
	if attempt > 0 {
		opts = append(opts, bulkhead.WithAttempt(attempt))
	}
	if t.Options != nil {
		opts = append(opts, t.Options(req, call)...)
	}
	// Let the base transport negotiate compression and decompress, so the
	// meter reads the body as the caller will.
	if _, ok := out.Header["Accept-Encoding"]; ok {
		own(true)
		out.Header.Del("Accept-Encoding")
	}
	acquire := t.Acquire
	if acquire == nil {
		acquire = t.Bulkhead.Acquire
	}
	permit, err := acquire(req.Context(), &call.Request, opts...)
	if err != nil {
		return fail(err)
	}
	resp, err := sendReleasing(base, out, permit)
	feedback(permit, resp, err)
	if err != nil {
		return nil, err
	}
	resp.Header.Set(AdmissionIDHeader, permit.ID().String())
	mo := t.Meter
	mo.Format, mo.Model, mo.StripUsageChunk = call.Format, call.Request.Model, strip
	if _, err := MeterResponse(resp, permit, mo); err != nil {
		resp.Body.Close()
		permit.Release(nil)
		return nil, err
	}
	return resp, nil
}

// sendReleasing sends out, releasing permit when sending fails or panics
// (nothing is then known of what the provider did); the panic goes on.
func sendReleasing(base http.RoundTripper, out *http.Request, permit *bulkhead.Permit) (resp *http.Response, err error) {
	sent := false
	defer func() {
		if !sent || err != nil {
			permit.Release(nil)
		}
	}()
	resp, err = base.RoundTrip(out)
	sent = true
	if err != nil && resp != nil && resp.Body != nil {
		resp.Body.Close() // a response beside an error is not used
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// AdmissionIDHeader is the response header in which a Transport returns
// the admission ID of the call, for logs and traces.
const AdmissionIDHeader = "X-Bulkhead-Admission-Id"

type callKey struct{}

// WithCall returns a copy of ctx that carries call, the result of
// ReadRequest on the request that will carry ctx: a Transport sending that
// request admits call as it is instead of reading the body again. A proxy
// that reads the body to choose where to send the call (by its model)
// passes it on this way.
func WithCall(ctx context.Context, call *Call) context.Context {
	return context.WithValue(ctx, callKey{}, call)
}

// callOf returns the call ctx carries, nil for none.
func callOf(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}
