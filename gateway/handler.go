package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// Route sends the calls of one provider API to an upstream, through a
// bulkhead.
type Route struct {
	// Format is the API: a request whose path the stream package
	// recognises as this format (stream.FormatOf) takes this route.
	Format stream.Format

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

	// Transport sends the admitted requests. Nil means
	// http.DefaultTransport. Set its timeouts (ResponseHeaderTimeout) for
	// an upstream that may hang.
	Transport http.RoundTripper

	// MaxBodyBytes bounds request bodies; zero means
	// stream.DefaultMaxBodyBytes.
	MaxBodyBytes int64
}

// Handler is an HTTP reverse proxy in front of LLM providers: each call is
// admitted by its route's bulkhead before the first byte goes upstream,
// its response (streamed or not) is metered to settle its tokens, and a call
// the bulkhead turns away is answered in the dialect of the API the client
// called (see WriteError). A client that goes away mid-stream ends the
// upstream request and releases its admission at once. A request to a path
// that is not a route's API endpoint is answered 404; a request to one that
// is not a POST is passed upstream without admission.
type Handler struct {
	routes map[stream.Format]*httputil.ReverseProxy
}

// New returns a Handler for routes, at most one per format.
func New(routes ...Route) (*Handler, error) {
	h := &Handler{routes: map[stream.Format]*httputil.ReverseProxy{}}
	for i, r := range routes {
		field := fmt.Sprintf("routes[%d]", i)
		switch r.Format {
		case stream.OpenAIChat, stream.OpenAIResponses, stream.AnthropicMessages, stream.Gemini:
		default:
			return nil, &bulkhead.ConfigError{Field: field + ".Format", Problem: fmt.Sprintf("must be a stream format, got %d", r.Format)}
		}
		switch {
		case h.routes[r.Format] != nil:
			return nil, &bulkhead.ConfigError{Field: field + ".Format", Problem: fmt.Sprintf("%v has a route already", r.Format)}
		case r.Upstream == nil || r.Upstream.Scheme == "" || r.Upstream.Host == "":
			return nil, &bulkhead.ConfigError{Field: field + ".Upstream", Problem: "must be an absolute URL, such as https://api.openai.com"}
		case r.Bulkhead == nil:
			return nil, &bulkhead.ConfigError{Field: field + ".Bulkhead", Problem: "must not be nil"}
		}
		h.routes[r.Format] = proxy(r)
	}
	return h, nil
}

// proxy is the reverse proxy of route r.
func proxy(r Route) *httputil.ReverseProxy {
	format, upstream, key := r.Format, r.Upstream, r.APIKey
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			if key != "" {
				setKey(pr.Out.Header, format, key)
			}
		},
		Transport: &stream.Transport{
			Bulkhead:     r.Bulkhead,
			Base:         r.Transport,
			Options:      r.Options,
			MaxBodyBytes: r.MaxBodyBytes,
		},
		FlushInterval: -1, // streams go to the client event by event
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, req.Context().Err()) && req.Context().Err() != nil {
				err = req.Context().Err() // the client went away
			}
			WriteError(w, format, err)
		},
	}
}

// setKey puts the upstream's credentials in h, in the header of format's
// API, in place of the client's.
func setKey(h http.Header, format stream.Format, key string) {
	h.Del("Authorization")
	h.Del("X-Api-Key")
	h.Del("X-Goog-Api-Key")
	switch format {
	case stream.AnthropicMessages:
		h.Set("X-Api-Key", key)
	case stream.Gemini:
		h.Set("X-Goog-Api-Key", key)
	default:
		h.Set("Authorization", "Bearer "+key)
	}
}

// ServeHTTP proxies req to the route of its API, or answers 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	format, ok := stream.FormatOf(req.URL.Path)
	rp := h.routes[format]
	if !ok || rp == nil {
		writeNotFound(w, format, req.URL.Path)
		return
	}
	rp.ServeHTTP(w, req)
}

// writeNotFound answers a request no route covers.
func writeNotFound(w http.ResponseWriter, format stream.Format, path string) {
	r := Rejection{Status: http.StatusNotFound, Type: invalidType(format), Code: "not_found", Message: fmt.Sprintf("gateway: no route for %s", path)}
	write(w, format, r)
}
