// Package stream puts real provider traffic behind a bulkhead: it reads
// admission requests out of provider request bodies, meters provider
// responses (streamed or not) so the admission's token hold follows the
// response as it arrives, and offers an http.RoundTripper that does both for
// any SDK's HTTP client.
//
// Four provider APIs are understood, named by Format: OpenAI Chat
// Completions, OpenAI Responses, Anthropic Messages and Gemini
// generateContent.
//
// There are three ways in:
//
//   - ParseRequest (or ReadRequest for an *http.Request) turns a request body
//     into a bulkhead.Request, with the model, the streaming flag and a
//     canonical key for deduplication.
//   - NewMeter wraps a response body: the caller reads every byte unchanged,
//     while the usage the response reveals is reported to the admission as
//     it passes, and the admission is settled exactly once.
//   - Transport is an http.RoundTripper that admits every recognised request
//     before it is sent, meters its response, and reports the answer (a 429
//     and its Retry-After, an overload, a timeout, a success, and the
//     rate-limit headroom its headers report) to the bulkhead's cool-downs
//     and adaptive limits (OutcomeOf, RetryAfter, HeadroomOf).
package stream
