package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/semconv"
	"github.com/llmbulkhead/bulkhead/otelbulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// The attributes of the gateway's spans, besides those of package
// semconv: the generative AI conventions', HTTP's, and the gateway's own.
const (
	genAIRequestStream  = attribute.Key("gen_ai.request.stream")
	genAIResponseModel  = attribute.Key("gen_ai.response.model")
	genAIResponseID     = attribute.Key("gen_ai.response.id")
	genAIFinishReasons  = attribute.Key("gen_ai.response.finish_reasons")
	genAIInputMessages  = attribute.Key("gen_ai.input.messages")
	genAISystem         = attribute.Key("gen_ai.system_instructions")
	httpMethod          = attribute.Key("http.request.method")
	httpStatus          = attribute.Key("http.response.status_code")
	urlPath             = attribute.Key("url.path")
	urlScheme           = attribute.Key("url.scheme")
	urlFull             = attribute.Key("url.full")
	serverAddress       = attribute.Key("server.address")
	serverPort          = attribute.Key("server.port")
	clientAddress       = attribute.Key("client.address")
	userAgent           = attribute.Key("user_agent.original")
	keyEnd              = attribute.Key("bulkhead.gateway.end")
	keyRoute            = attribute.Key("bulkhead.gateway.route")
	keyClient           = attribute.Key("bulkhead.gateway.client")
	keyRequestID        = attribute.Key("bulkhead.gateway.request_id")
	keyUpstream         = attribute.Key("bulkhead.gateway.upstream")
	keyConfigRevision   = attribute.Key("bulkhead.gateway.config_revision")
	maxCapturedMessages = 32
	maxCapturedText     = 8 << 10
)

// operationOf is the gen_ai.operation.name of a call of format.
func operationOf(format stream.Format) string {
	if format == stream.Gemini {
		return "generate_content"
	}
	return "chat"
}

// providerOf is the gen_ai.provider.name of an upstream of format, as the
// conventions name the providers whose API it is.
func providerOf(format stream.Format) string {
	switch format {
	case stream.AnthropicMessages:
		return "anthropic"
	case stream.Gemini:
		return "gcp.gemini"
	}
	return "openai"
}

// startSpan starts the span of request r, the child of the trace context
// its headers carry (W3C traceparent and tracestate), if any: a server
// span named for its operation, renamed "{operation} {model}" once its
// model is known. A call to a provider's API gets the generative AI
// attributes; any other request only the HTTP ones.
func (t *telemetry) startSpan(r *http.Request) (context.Context, trace.Span) {
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	name := r.Method
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, httpMethod.String(r.Method), urlPath.String(r.URL.Path))
	if r.TLS != nil {
		attrs = append(attrs, urlScheme.String("https"))
	} else {
		attrs = append(attrs, urlScheme.String("http"))
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		attrs = append(attrs, clientAddress.String(host))
	}
	if ua := r.UserAgent(); ua != "" {
		attrs = append(attrs, userAgent.String(ua))
	}
	if format, ok := stream.FormatOf(r.URL.Path); ok && r.Method == http.MethodPost {
		name = operationOf(format)
		attrs = append(attrs, semconv.GenAIOperation.String(name), semconv.GenAIProvider.String(providerOf(format)))
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// endSpan records how request r ended on its span and ends it: what the
// request log says of it, the call's model, streaming and output cap, the
// answer's model, ID, finish reasons and usage, and the prompt when the
// configuration captures content. Nothing secret goes on it: no key, no
// credential header, no query string.
func (t *telemetry) endSpan(span trace.Span, r *http.Request, rec *recorder, status int, st *served) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	note := rec.note
	attrs := make([]attribute.KeyValue, 0, 24)
	attrs = append(attrs, httpStatus.Int(status), keyEnd.String(note.end), keyConfigRevision.Int64(st.revision))
	if id := r.Header.Get(RequestIDHeader); id != "" {
		attrs = append(attrs, keyRequestID.String(id))
	}
	if c := note.client; c != nil {
		attrs = append(attrs, keyClient.String(c.name))
	}
	if note.route >= 0 && note.route < len(st.bulkhead) {
		attrs = append(attrs, keyRoute.Int(note.route), semconv.BulkheadName.String(st.bulkhead[note.route]), keyUpstream.String(st.upstream[note.route]))
	}
	if note.model != "" {
		attrs = append(attrs, semconv.GenAIRequestModel.String(note.model))
		if format, ok := stream.FormatOf(r.URL.Path); ok {
			span.SetName(operationOf(format) + " " + note.model)
		}
	}
	if call := note.call; call != nil {
		attrs = append(attrs, genAIRequestStream.Bool(call.Stream))
		if call.Request.MaxTokens > 0 {
			attrs = append(attrs, semconv.GenAIRequestMaxTokens.Int64(call.Request.MaxTokens))
		}
		if t.capture {
			attrs = appendContent(attrs, &call.Request)
		}
	}
	if note.class != "" {
		attrs = append(attrs, semconv.BulkheadClass.String(note.class))
	}
	if note.high {
		attrs = append(attrs, semconv.BulkheadPriority.String(bulkhead.High.String()))
	}
	if id := rec.Header().Get(stream.AdmissionIDHeader); id != "" {
		attrs = append(attrs, semconv.BulkheadAdmissionID.String(id))
	}
	reason := rec.Header().Get("X-Bulkhead-Reason")
	if reason != "" {
		attrs = append(attrs, semconv.BulkheadReason.String(reason))
	}
	if a := note.answer; a != nil {
		u, _ := a.Usage()
		attrs = append(attrs, otelbulkhead.UsageAttributes(&u)...)
		resp := a.Response()
		if resp.Model != "" {
			attrs = append(attrs, genAIResponseModel.String(resp.Model))
		}
		if resp.ID != "" {
			attrs = append(attrs, genAIResponseID.String(resp.ID))
		}
		if len(resp.FinishReasons) > 0 {
			attrs = append(attrs, genAIFinishReasons.StringSlice(resp.FinishReasons))
		}
	}
	switch {
	case note.end == endShed && reason != "":
		attrs = append(attrs, semconv.ErrorType.String(reason))
		span.SetStatus(codes.Error, "shed: "+reason)
	case note.end != endDone:
		attrs = append(attrs, semconv.ErrorType.String(note.end))
		if note.end == endShed || note.end == endUpstream || note.end == endShutdown || status >= 500 {
			span.SetStatus(codes.Error, note.end)
		}
	case status >= 500:
		attrs = append(attrs, semconv.ErrorType.String(strconv.Itoa(status)))
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.SetAttributes(attrs...)
}

// appendContent appends req's prompt to attrs, in the conventions' shape:
// gen_ai.system_instructions, the system prompt's text parts, and
// gen_ai.input.messages, the last maxCapturedMessages messages with their
// text parts (each cut at maxCapturedText bytes) and the types of their
// other parts, as JSON.
func appendContent(attrs []attribute.KeyValue, req *bulkhead.Request) []attribute.KeyValue {
	type part struct {
		Type    string `json:"type"`
		Content string `json:"content,omitempty"`
	}
	type message struct {
		Role  string `json:"role"`
		Parts []part `json:"parts"`
	}
	text := func(s string) part { return part{Type: "text", Content: cut(s, maxCapturedText)} }
	parts := func(content string, blocks []bulkhead.Block, skipTools bool) []part {
		ps := []part{}
		if content != "" {
			ps = append(ps, text(content))
		}
		for _, b := range blocks {
			switch {
			case b.Type == "text":
				ps = append(ps, text(b.Text))
			case skipTools && b.Type == "tool_definition":
			default:
				ps = append(ps, part{Type: b.Type})
			}
		}
		return ps
	}
	if sys := parts(req.System, req.SystemBlocks, true); len(sys) > 0 {
		if b, err := json.Marshal(sys); err == nil {
			attrs = append(attrs, genAISystem.String(string(b)))
		}
	}
	msgs := req.Messages
	if len(msgs) > maxCapturedMessages {
		msgs = msgs[len(msgs)-maxCapturedMessages:]
	}
	out := make([]message, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, message{Role: m.Role, Parts: parts(m.Content, m.Blocks, false)})
	}
	if b, err := json.Marshal(out); err == nil {
		attrs = append(attrs, genAIInputMessages.String(string(b)))
	}
	return attrs
}

// cut returns s cut to at most n bytes, on a character boundary, with "…"
// when cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// tracedTransport sends an admitted call upstream on a client span of its
// own, a child of the call's span, and sends the span's trace context
// upstream (W3C traceparent and tracestate) in place of what the client
// sent. The span ends when the answer has been read, or sending failed.
type tracedTransport struct {
	base   http.RoundTripper
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func (t *tracedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL
	attrs := make([]attribute.KeyValue, 0, 6)
	// The URL without its query, which may hold a Gemini client's key.
	attrs = append(attrs, httpMethod.String(req.Method), urlFull.String(u.Scheme+"://"+u.Host+u.EscapedPath()), serverAddress.String(u.Hostname()))
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, serverPort.Int(n))
		}
	} else if u.Scheme == "https" {
		attrs = append(attrs, serverPort.Int(443))
	} else {
		attrs = append(attrs, serverPort.Int(80))
	}
	ctx, span := t.tracer.Start(req.Context(), req.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	out := req.WithContext(ctx)
	out.Header = req.Header.Clone()
	out.Header.Del("Traceparent")
	out.Header.Del("Tracestate")
	t.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		span.SetAttributes(semconv.ErrorType.String(errorTypeOf(err)))
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return nil, err
	}
	span.SetAttributes(httpStatus.Int(resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetAttributes(semconv.ErrorType.String(strconv.Itoa(resp.StatusCode)))
		span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, nil
}

// errorTypeOf is the error.type of a failed upstream call.
func errorTypeOf(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "upstream_unavailable"
}

// spanBody ends its span once the body has been read to its end, failed,
// or been closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		if err != io.EOF {
			b.span.SetStatus(codes.Error, err.Error())
		}
		b.end()
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

func (b *spanBody) end() { b.once.Do(func() { b.span.End() }) }
