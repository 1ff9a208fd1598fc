// Package gateway answers LLM API clients on a bulkhead's behalf: the
// responses of a call the bulkhead turned away, in the dialect of the API
// the client called (OpenAI, Anthropic or Gemini), with the status, the
// retry headers and the error body that the providers' own SDKs understand.
//
// A rejection is answered 429 when it is the caller's own limit (a rate
// limit, with retry-after and retry-after-ms set to the exact time it
// frees; or its admission class's quota), 503 (529 in the Anthropic dialect)
// when the shared capacity is full or its store cannot decide, and 413 when
// the call can never fit, with x-should-retry: false. A retry-after header
// is sent only with an honest time: capacity that frees when other calls
// finish has none. The body carries the rejection's reason and numbers under
// the key "bulkhead" (see Detail), and the header X-Bulkhead-Reason its
// reason alone.
//
// Handler is the proxy, built from Routes; it reads each call's body
// within bounds on memory and time whatever the client declares. Build
// makes a whole gateway from a configuration file (Config, LoadConfig):
// its bulkheads, the health and metrics endpoints, its clients (callers
// authenticated by keys, each in its tenant's class; a call without a
// client's key is answered 401 and never reaches the upstream), the
// request log (one line per request, however it ends), OpenTelemetry
// traces and metrics over OTLP when its telemetry section turns them on
// (TelemetryConfig), a Reload that applies a changed file without a
// restart (or nothing of it), and a Shutdown that drains and then cuts
// what is left.
package gateway
