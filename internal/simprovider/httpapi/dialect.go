package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// dialect writes the answers of one API in its wire format.
type dialect interface {
	api() api
	// idPrefix starts the IDs of its responses: "chatcmpl-", "msg_" ...
	idPrefix() string
	// headers sets the request ID and rate-limit headers of an answer.
	headers(x *exchange, h http.Header, hr simprovider.Headroom, now time.Time)
	// errorBody is the body of an error answer with status.
	errorBody(status int, e *apiError, reqID string) []byte
	// limitMessage is the message of a 429 or an overload.
	limitMessage(model string, e *apiError) string
	// complete is the body of a completed request that was not streamed.
	complete(x *exchange, resp simprovider.Response) []byte
	// open, chunk and finish write a stream's opening events, the events
	// of each chunk of text (u: the cumulative usage) and its closing
	// events.
	open(x *exchange)
	chunk(x *exchange, text string, u simprovider.Usage)
	finish(x *exchange, resp simprovider.Response)
}

var dialects = map[api]dialect{
	chatAPI:      chatDialect{},
	responsesAPI: responsesDialect{},
	messagesAPI:  anthropicDialect{},
	geminiAPI:    geminiDialect{},
}

// mustJSON encodes v, whose types all encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("httpapi: " + err.Error())
	}
	return b
}

// event writes one server-sent event: an "event:" line when name is not
// empty, then v as its data.
func (x *exchange) event(name string, v any) {
	var b []byte
	if name != "" {
		b = append(b, "event: "+name+"\n"...)
	}
	b = append(b, "data: "...)
	b = append(b, mustJSON(v)...)
	b = append(b, "\n\n"...)
	x.write(b)
}

// typed writes one server-sent event named typ whose data is fields with
// "type": typ first, as the APIs that name their events write them.
func (x *exchange) typed(typ string, fields map[string]any) {
	b := append([]byte("event: "+typ+"\ndata: {\"type\":"), mustJSON(typ)...)
	if len(fields) > 0 {
		rest := mustJSON(fields) // {...}
		b = append(b, ',')
		b = append(b, rest[1:len(rest)-1]...)
	}
	b = append(b, "}\n\n"...)
	x.write(b)
}

// limitNames names each account limit: its unit, and OpenAI's name for it.
var limitNames = map[simprovider.Limit]struct{ unit, openai string }{
	simprovider.RequestLimit:     {"requests", "requests per min (RPM)"},
	simprovider.TokenLimit:       {"tokens", "tokens per min (TPM)"},
	simprovider.InputTokenLimit:  {"input tokens", "input tokens per min (ITPM)"},
	simprovider.OutputTokenLimit: {"output tokens", "output tokens per min (OTPM)"},
}

// tightest returns the window with the least left of those the account
// has, the zero Window when it has none.
func tightest(ws ...simprovider.Window) simprovider.Window {
	var out simprovider.Window
	for _, w := range ws {
		if w.Limit > 0 && (out.Limit == 0 || w.Remaining < out.Remaining) {
			out = w
		}
	}
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
