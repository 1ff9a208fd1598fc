package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

// api is one of the APIs the handler serves.
type api uint8

const (
	chatAPI      api = iota + 1 // POST .../chat/completions
	responsesAPI                // POST .../responses
	messagesAPI                 // POST .../messages
	geminiAPI                   // POST .../models/{model}:generateContent or :streamGenerateContent
)

// MaxOutputTokens is the largest output cap a request may ask for; a larger
// one is answered 400, as a model's own maximum is.
const MaxOutputTokens = 1 << 20

// maxBodyBytes bounds a request body: a larger one is answered 413.
const maxBodyBytes = 32 << 20

// errKind is what went wrong with a request, which each API's dialect
// answers with its own status and error type.
type errKind uint8

const (
	badRequest errKind = iota + 1
	notFound
	methodNotAllowed
	tooLarge
	rateLimited
	overloaded
	internal
)

// apiError is a request the simulated API refuses before the account sees
// it (a body that is not JSON, a missing model or output cap where the API
// needs one, a bad value, an unknown path), or a 429 or an overload from
// the account. The handler answers it in the API's own error shape.
type apiError struct {
	kind  errKind
	param string // the request field at fault, OpenAI's "param"
	code  string // OpenAI's "code"
	msg   string

	// limit, retryAfter, used, max and requested describe a 429 or an
	// overload.
	limit                simprovider.Limit
	retryAfter           time.Duration
	used, max, requested int64
}

// Error returns the message the API's error body carries.
func (e *apiError) Error() string { return "httpapi: " + e.msg }

// status returns the HTTP status of the error in API a's dialect.
func (e *apiError) status(a api) int {
	switch e.kind {
	case badRequest:
		return http.StatusBadRequest
	case notFound:
		return http.StatusNotFound
	case methodNotAllowed:
		return http.StatusMethodNotAllowed
	case tooLarge:
		return http.StatusRequestEntityTooLarge
	case rateLimited:
		return http.StatusTooManyRequests
	case overloaded:
		if a == messagesAPI {
			return 529
		}
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func invalid(param, code, format string, args ...any) *apiError {
	return &apiError{kind: badRequest, param: param, code: code, msg: fmt.Sprintf(format, args...)}
}

// call is a parsed request: what the account and the answer need of it.
type call struct {
	api          api
	model        string
	stream       bool
	includeUsage bool  // chat: stream_options.include_usage
	sse          bool  // gemini: ?alt=sse (else a streamed JSON array)
	input        int64 // prompt tokens, counted from the text
	maxTokens    int64 // the output cap it asked for; 0 for none
}

// route returns the API of path and, for Gemini, the model and method it
// names; zero when path is no API the handler serves.
func route(path string) (a api, model, method string) {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return chatAPI, "", ""
	case strings.HasSuffix(path, "/responses"):
		return responsesAPI, "", ""
	case strings.HasSuffix(path, "/messages"):
		return messagesAPI, "", ""
	}
	i := strings.LastIndex(path, "/models/")
	if i < 0 {
		return 0, "", ""
	}
	model, method, ok := strings.Cut(path[i+len("/models/"):], ":")
	if !ok || strings.Contains(model, "/") || (method != "generateContent" && method != "streamGenerateContent") {
		return 0, "", ""
	}
	return geminiAPI, model, method
}

// parse reads the body of a request to API a. For Gemini, model and method
// come from the path and q is the query.
func parse(a api, model, method string, q url.Values, body []byte) (*call, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = errors.New("data after the top-level value")
		}
	}
	if err != nil {
		return nil, invalid("", "", "We could not parse the JSON body of your request: %v", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, invalid("", "", "The request body must be a JSON object, got %s", jsonType(v))
	}
	c := &call{api: a}
	if a == geminiAPI {
		if model == "" {
			return nil, invalid("model", "", "The model is missing from the URL: POST /v1beta/models/{model}:%s", method)
		}
		c.model, c.stream = model, method == "streamGenerateContent"
		c.sse = q.Get("alt") == "sse"
		return c.done(c.readGemini(obj))
	}
	m, ok := obj["model"].(string)
	if !ok || m == "" {
		if a == messagesAPI {
			return nil, invalid("model", "", "model: Field required")
		}
		return nil, invalid("model", "missing_required_parameter", "you must provide a model parameter")
	}
	c.model = m
	if c.stream, err = optBool(obj, "stream"); err != nil {
		return nil, err
	}
	switch a {
	case chatAPI:
		return c.done(c.readChat(obj))
	case responsesAPI:
		return c.done(c.readResponses(obj))
	}
	return c.done(c.readMessages(obj))
}

// done returns c, or nil and err when reading it failed.
func (c *call) done(err error) (*call, error) {
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c *call) readChat(obj map[string]any) error {
	msgs, err := messages(obj, "messages", false)
	if err != nil {
		return err
	}
	c.input = 3 + 3*int64(len(msgs)) + countValue(msgs, "") + countValue(obj["tools"], "")
	if opts, ok := obj["stream_options"]; ok && opts != nil {
		o, ok := opts.(map[string]any)
		if !ok {
			return invalid("stream_options", "invalid_type", "Invalid type for 'stream_options': expected an object, but got %s instead.", jsonType(opts))
		}
		if !c.stream {
			return invalid("stream_options", "invalid_value", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		if c.includeUsage, err = optBool(o, "include_usage"); err != nil {
			return err
		}
	}
	key := "max_completion_tokens"
	if _, ok := obj[key]; !ok {
		key = "max_tokens"
	}
	c.maxTokens, err = outputCap(obj, key, false)
	return err
}

func (c *call) readResponses(obj map[string]any) error {
	c.input = 3 + countValue(obj["instructions"], "") + countValue(obj["tools"], "")
	switch in := obj["input"].(type) {
	case nil:
	case string:
		c.input += 3 + countText(in)
	case []any:
		c.input += 3*int64(len(in)) + countValue(in, "")
	default:
		return invalid("input", "invalid_type", "Invalid type for 'input': expected a string or an array, but got %s instead.", jsonType(in))
	}
	var err error
	c.maxTokens, err = outputCap(obj, "max_output_tokens", false)
	return err
}

func (c *call) readMessages(obj map[string]any) error {
	msgs, err := messages(obj, "messages", true)
	if err != nil {
		return err
	}
	c.input = 3 + 3*int64(len(msgs)) + countValue(msgs, "") + countValue(obj["system"], "") + countValue(obj["tools"], "")
	c.maxTokens, err = outputCap(obj, "max_tokens", true)
	return err
}

func (c *call) readGemini(obj map[string]any) error {
	contents, err := messages(obj, "contents", false)
	if err != nil {
		return err
	}
	sys, _ := either(obj, "systemInstruction", "system_instruction")
	c.input = 3 + 3*int64(len(contents)) + countValue(contents, "") + countValue(sys, "") + countValue(obj["tools"], "")
	gc, key := either(obj, "generationConfig", "generation_config")
	if gc == nil {
		return nil
	}
	g, ok := gc.(map[string]any)
	if !ok {
		return invalid(key, "", "Invalid value at '%s': expected an object, got %s", key, jsonType(gc))
	}
	if _, ok := g["maxOutputTokens"]; ok {
		c.maxTokens, err = outputCap(g, "maxOutputTokens", false)
	} else {
		c.maxTokens, err = outputCap(g, "max_output_tokens", false)
	}
	return err
}

// either returns obj's value under camel, else under snake, and the key it
// was under (Gemini's JSON takes both spellings).
func either(obj map[string]any, camel, snake string) (any, string) {
	if v, ok := obj[camel]; ok {
		return v, camel
	}
	return obj[snake], snake
}

// messages returns the array obj holds under key, which must be there and
// not empty (Anthropic's may be empty: its error is the model's, not the
// request's).
func messages(obj map[string]any, key string, mayBeEmpty bool) ([]any, error) {
	v, ok := obj[key]
	if !ok || v == nil {
		return nil, invalid(key, "missing_required_parameter", "Missing required parameter: '%s'.", key)
	}
	list, ok := v.([]any)
	if !ok {
		return nil, invalid(key, "invalid_type", "Invalid type for '%s': expected an array, but got %s instead.", key, jsonType(v))
	}
	if len(list) == 0 && !mayBeEmpty {
		return nil, invalid(key, "empty_array", "Invalid '%s': empty array. Expected an array with minimum length 1, but got an empty array instead.", key)
	}
	return list, nil
}

// optBool returns obj's boolean under key, false when it is absent or null.
func optBool(obj map[string]any, key string) (bool, error) {
	switch v := obj[key].(type) {
	case nil:
		return false, nil
	case bool:
		return v, nil
	default:
		return false, invalid(key, "invalid_type", "Invalid type for '%s': expected a boolean, but got %s instead.", key, jsonType(v))
	}
}

// outputCap returns the output cap obj holds under key: an integer from 1
// to MaxOutputTokens; 0 when it is absent or null and not required.
func outputCap(obj map[string]any, key string, required bool) (int64, error) {
	v, ok := obj[key]
	if !ok || v == nil {
		if required {
			return 0, invalid(key, "missing_required_parameter", "%s: Field required", key)
		}
		return 0, nil
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, invalid(key, "invalid_type", "Invalid type for '%s': expected an integer, but got %s instead.", key, jsonType(v))
	}
	n, err := num.Int64()
	if err != nil {
		if f, ferr := num.Float64(); ferr == nil && f == float64(int64(f)) && f >= 1 && f <= MaxOutputTokens {
			return int64(f), nil // 512.0
		}
		return 0, invalid(key, "invalid_type", "Invalid type for '%s': expected an integer, but got %s instead.", key, num)
	}
	if n < 1 {
		return 0, invalid(key, "integer_below_min_value", "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", key, n)
	}
	if n > MaxOutputTokens {
		return 0, invalid(key, "integer_above_max_value", "Invalid '%s': %d is too large. The simulated models write at most %d tokens.", key, n, MaxOutputTokens)
	}
	return n, nil
}

// jsonType names the JSON type of a decoded value.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

// opaqueTokens is what a string under an opaque key counts: an image, a
// file or audio given by URL or as data, counted as a small image is.
const opaqueTokens = 85

// opaque lists the keys whose string values are data or references, not
// text.
var opaque = map[string]bool{"data": true, "url": true, "image_url": true, "file_data": true, "file_id": true, "file_uri": true, "fileUri": true}

// countValue counts the tokens of the text in a decoded JSON value: every
// string, walked through arrays and objects (keys are not counted); key is
// the key v was found under.
func countValue(v any, key string) int64 {
	switch v := v.(type) {
	case string:
		if opaque[key] {
			return opaqueTokens
		}
		return countText(v)
	case []any:
		var n int64
		for _, e := range v {
			n += countValue(e, key)
		}
		return n
	case map[string]any:
		var n int64
		for k, e := range v {
			n += countValue(e, k)
		}
		return n
	}
	return 0
}

// countText counts the tokens of s as the simulated models' tokenizer
// does: a run of ASCII letters and digits is one token per six characters
// (rounded up), and every other character but white space is a token of
// its own. English prose comes to about a token per word, somewhat fewer
// than a real tokenizer counts, so an estimate of about four characters a
// token errs on the safe side.
func countText(s string) int64 {
	var n int64
	run := 0
	end := func() {
		if run > 0 {
			n += int64(run+5) / 6
			run = 0
		}
	}
	for _, r := range s {
		switch {
		case r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r)):
			run++
		case unicode.IsSpace(r):
			end()
		default:
			end()
			n++
		}
	}
	end()
	return n
}

// The headers a caller may send to fix what the simulated account does
// with its request, as the demo does to replay the same calls over HTTP as
// in process. Each is optional; a bad value is answered 400.
const (
	// HeaderID is the request's ID (an unsigned integer), which with the
	// provider's seed fixes its random draws: output length and latency
	// noise. Without it, requests are numbered 1, 2, 3 ... as they come.
	HeaderID = "X-Sim-Id"
	// HeaderInputTokens is the request's prompt size in tokens, in place of
	// the count from its text.
	HeaderInputTokens = "X-Sim-Input-Tokens"
	// HeaderOutputTokens is how many tokens the model writes, capped at the
	// request's output cap, in place of a draw.
	HeaderOutputTokens = "X-Sim-Output-Tokens"
)

// maxInputTokens bounds HeaderInputTokens, so that no sum overflows.
const maxInputTokens = 1 << 40

// simHeaders applies the simulation headers of h to req.
func simHeaders(h http.Header, req *simprovider.Request) error {
	if v := h.Get(HeaderID); v != "" {
		id, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return invalid(HeaderID, "", "%s must be an unsigned integer, got %q", HeaderID, v)
		}
		req.ID = id
	}
	for _, f := range []struct {
		name string
		max  int64
		dst  *int64
	}{{HeaderInputTokens, maxInputTokens, &req.InputTokens}, {HeaderOutputTokens, MaxOutputTokens, &req.OutputTokens}} {
		v := h.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > f.max {
			return invalid(f.name, "", "%s must be an integer from 0 to %d, got %q", f.name, f.max, v)
		}
		*f.dst = n
	}
	return nil
}
