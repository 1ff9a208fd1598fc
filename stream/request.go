package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/jsondom"
)

// DefaultMaxBodyBytes is the request body limit used when none is set: 32 MiB.
const DefaultMaxBodyBytes = 32 << 20

// Call is what a provider request body says about one LLM call.
type Call struct {
	// Format is the provider API the body was read as.
	Format Format

	// Request is the admission request read from the body: the model, the
	// system prompt, every message and the output cap.
	//
	// Text (string content, text parts, refusals, Responses function
	// outputs, Anthropic tool results) becomes text the estimator counts. Every other
	// part (images, audio, files, tool calls, thinking) becomes an opaque
	// Block whose Type is the provider's own part type: "image_url",
	// "input_image", "image", "inlineData" and so on; an OpenAI chat tool
	// call is "tool_call", a Responses one "function_call". A part without a
	// string type is an opaque Block with Type "". Each tool the body
	// declares is an opaque Block of Type "tool_definition" at the end of
	// SystemBlocks: each entry of its top-level tools array, and for Gemini,
	// whose entries group tools, each function declaration and each other
	// tool (such as googleSearch) of an entry. MaxTokens is the API's own
	// output cap (max_completion_tokens, else max_tokens, for OpenAI chat),
	// 0 when the body sets none.
	Request bulkhead.Request

	// Stream is true when the call asks for a streamed (server-sent events)
	// response.
	Stream bool

	// IncludeUsage is true when an OpenAI chat body sets
	// stream_options.include_usage (always false for other formats).
	IncludeUsage bool

	// body is the request body, which the strings of Request are views of,
	// and route the part of the URL that goes into the key.
	body  []byte
	route string
}

// Key returns the call's canonical key for deduplication (see
// bulkhead.WithDedupKey): two bodies that are equal as JSON values up to the
// order of object members and whitespace get the same key; any other
// difference, provider parameters such as temperature included, gives a
// different key. Strings and numbers are compared as written, so "\u0061" and
// "a" differ. The key starts with the format's name and, for a Gemini request
// read by ReadRequest, the model and method of its URL (and its alt
// parameter), so equal bodies sent to different Gemini models differ.
//
// The key holds the whole body: compare it, do not log it. It is built on
// each call, at about the cost of parsing the body again, so that a call that
// never deduplicates does not pay for it. The zero Call's key is "".
func (c *Call) Key() string {
	if c == nil || c.body == nil {
		return ""
	}
	d := getDoc()
	defer putDoc(d)
	if err := jsondom.Parse(d, c.body); err != nil {
		return "" // unreachable: the body parsed before, and nobody writes it
	}
	return canonicalKey(c.Format, c.route, d.Root(), len(c.body))
}

// ParseRequest reads the request body of one call in format f.
//
// A body that is not JSON, or has a field of the wrong JSON type where the
// API defines one (messages that are not an array, a content that is a
// number, a max_tokens that is not a non-negative integer, a model that is
// not a string, a stream that is not a boolean...), is a *BodyError naming
// the field by its JSON path, such as "messages[2].content"; it matches
// bulkhead.ErrInvalid. A JSON null counts as absent. Members the format does
// not define are ignored, except in Key. A Format that is none of the four is
// a *bulkhead.ConfigError.
//
// Gemini bodies name neither the model nor streaming (the URL does), so for
// Gemini the Request's Model is "" and Stream is false; ReadRequest fills
// both in from the URL.
//
// ParseRequest does not keep body: the caller may reuse it.
func ParseRequest(f Format, body []byte) (*Call, error) {
	if f.String() == "" {
		return nil, &bulkhead.ConfigError{Field: "Format", Problem: fmt.Sprintf("unknown format %d", uint8(f))}
	}
	// One copy, so that every string of the Call may be a view of it.
	return parse(f, bytes.Clone(body), "")
}

// ReadRequest reads the body of r, a request to a provider endpoint, and
// parses it with ParseRequest's rules in the format that FormatOf finds for
// r.URL.Path. An endpoint FormatOf does not recognise is an error matching
// ErrUnknownEndpoint.
//
// It reads at most maxBytes: a longer body is a *TooLargeError after reading
// at most maxBytes+1 bytes, or none when r.ContentLength already says so.
// Zero and negative maxBytes mean DefaultMaxBodyBytes; math.MaxInt64 sets no
// limit but memory.
//
// Memory follows the bytes that arrive, never the length the client
// declares: the body is read into buffers of 64 KiB, so that while it reads
// ReadRequest holds at most 64 KiB beyond the bytes read, and at the end
// copies them into one buffer of their exact size, which the Call keeps
// (for that moment the body is held twice). It
// reads r.Body only through Read, with buffers of at most 64 KiB, and closes
// it once, before it returns, whatever the outcome. A caller can therefore
// bound what reading costs by wrapping r.Body before the call: a reader that
// counts or charges the bytes each Read returns, or fails a Read (its error
// is wrapped in ReadRequest's, for errors.Is), sees every byte as it
// arrives. A read error (a read deadline set with http.ResponseController,
// a client gone) is returned wrapped.
//
// Once the body has been read in full, r is left re-sendable, even when the
// endpoint is unknown or the body does not parse: r.Body reads the same bytes
// again, r.GetBody returns a fresh reader of them and r.ContentLength is their
// length. After a read error or a *TooLargeError the body is lost and r
// cannot be sent.
//
// For Gemini the model comes from the path (".../models/{model}:generateContent")
// and Stream is true for ":streamGenerateContent".
func ReadRequest(r *http.Request, maxBytes int64) (*Call, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBodyBytes
	}
	body, err := readBody(r, maxBytes)
	if err != nil {
		return nil, err
	}
	setBody(r, body)
	path := ""
	if r.URL != nil {
		path = r.URL.Path
	}
	f, ok := FormatOf(path)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownEndpoint, path)
	}
	if f != Gemini {
		return parse(f, body, "")
	}
	path = strings.TrimSuffix(path, "/")
	model, streaming, _ := geminiMethod(path)
	// The model, the method and the framing, each length-prefixed so that no
	// two URLs share a route.
	method := "generateContent"
	if streaming {
		method = "streamGenerateContent"
	}
	var route string
	for _, f := range []string{model, method, r.URL.Query().Get("alt")} {
		route += strconv.Itoa(len(f)) + ":" + f
	}
	c, err := parse(f, body, route)
	if err != nil {
		return nil, err
	}
	c.Request.Model, c.Stream = model, streaming
	return c, nil
}

// bodyChunk is the size of the buffers readBody reads a body into: the most
// it holds beyond the bytes that have arrived.
const bodyChunk = 64 << 10

// bodyChunks keeps the buffers between bodies.
var bodyChunks = sync.Pool{New: func() any { return new([bodyChunk]byte) }}

// readBody reads and closes r's body, at most max+1 bytes of it (max > 0),
// into buffers of bodyChunk bytes taken as the bytes arrive, and returns
// them in one slice of their exact length.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	defer r.Body.Close()
	if r.ContentLength > max {
		return nil, &TooLargeError{Limit: max}
	}
	var chunks []*[bodyChunk]byte
	defer func() {
		for _, c := range chunks {
			bodyChunks.Put(c)
		}
	}()
	var total int64 // the bytes read, at most max+1
	n := bodyChunk  // the bytes in the last chunk
	for {
		if n == bodyChunk {
			chunks = append(chunks, bodyChunks.Get().(*[bodyChunk]byte))
			n = 0
		}
		want := bodyChunk - n
		if left := max - total; left < int64(want) {
			want = int(left) + 1 // one byte over the limit tells
		}
		k, err := r.Body.Read(chunks[len(chunks)-1][n : n+want])
		if k < 0 || k > want {
			return nil, fmt.Errorf("stream: reading the request body: Read returned %d bytes for a buffer of %d", k, want)
		}
		n += k
		total += int64(k)
		if total > max {
			return nil, &TooLargeError{Limit: max}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("stream: reading the request body: %w", err)
		}
	}
	body := make([]byte, 0, total)
	for _, c := range chunks[:len(chunks)-1] {
		body = append(body, c[:]...)
	}
	return append(body, chunks[len(chunks)-1][:n]...), nil
}

// setBody makes r send body.
func setBody(r *http.Request, body []byte) {
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
		r.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// parse reads body, which nobody writes again: the Call's strings are views
// of it. route is the part of the URL that goes into the key.
func parse(f Format, body []byte, route string) (*Call, error) {
	d := getDoc()
	defer putDoc(d)
	if err := jsondom.Parse(d, body); err != nil {
		return nil, syntaxError(f, err)
	}
	root := d.Root()
	c := &Call{Format: f}
	var r reader
	var err *BodyError
	if root.Kind() != jsondom.Object {
		err = mistyped(root, "want an object")
	} else {
		switch f {
		case OpenAIChat:
			err = r.readChat(c, root)
		case OpenAIResponses:
			err = r.readResponses(c, root)
		case AnthropicMessages:
			err = r.readAnthropic(c, root)
		case Gemini:
			err = r.readGemini(c, root)
		}
	}
	if err == nil {
		err = readTools(&c.Request, root, f)
	}
	if err != nil {
		err.Format = f
		return nil, err
	}
	if verr := c.Request.Validate(); verr != nil { // unreachable: counts are checked as read
		return nil, &BodyError{Format: f, Offset: -1, Problem: verr.Error()}
	}
	c.body, c.route = body, route
	return c, nil
}

// docs keeps parsed documents' storage for the next body, and for the
// next event or response a Meter parses.
var docs = sync.Pool{New: func() any { return new(jsondom.Doc) }}

func getDoc() *jsondom.Doc { return docs.Get().(*jsondom.Doc) }

// putDoc returns d to the pool once its values are no longer used.
func putDoc(d *jsondom.Doc) {
	d.Reset()
	docs.Put(d)
}

// syntaxError is the *BodyError of a body in format f that jsondom.Parse
// refused with err.
func syntaxError(f Format, err error) *BodyError {
	var se *jsondom.SyntaxError
	if errors.As(err, &se) {
		return &BodyError{Format: f, Field: se.Path, Offset: se.Offset, Problem: se.Msg}
	}
	return &BodyError{Format: f, Offset: -1, Problem: err.Error()}
}

// canonicalKey returns the format's name, a 0 byte, route, a 0 byte and the
// canonical form of root, whose source is size bytes.
func canonicalKey(f Format, route string, root jsondom.Value, size int) string {
	name := f.String()
	b := make([]byte, 0, len(name)+len(route)+2+size)
	b = append(b, name...)
	b = append(b, 0)
	b = append(b, route...)
	b = append(b, 0)
	b = root.AppendCanonical(b)
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is never written again
}

// reader reads the members of one body.
type reader struct {
	// arena holds the strings with escapes, decoded; the others are views
	// of the body.
	arena jsondom.Arena
}

func (r *reader) readChat(c *Call, root jsondom.Value) *BodyError {
	if err := r.readCommon(c, root, "max_tokens"); err != nil {
		return err
	}
	if n, set, err := count(root, "max_completion_tokens"); err != nil {
		return err
	} else if set {
		c.Request.MaxTokens = n
	}
	if opts := root.Get("stream_options"); !opts.IsNull() {
		if opts.Kind() != jsondom.Object {
			return mistyped(opts, "want an object").under("stream_options")
		}
		var err *BodyError
		if c.IncludeUsage, err = boolean(opts, "include_usage"); err != nil {
			return err.under("stream_options")
		}
	}
	return r.readList(c, root, "messages", func(m jsondom.Value) (bulkhead.Message, *BodyError) {
		msg, err := r.readMessage(m, OpenAIChat)
		if err == nil {
			err = appendOpaque(&msg.Blocks, m, "tool_calls", "tool_call")
		}
		return msg, err
	})
}

// readList sets c.Request.Messages to the messages that one reads from the
// elements of the array obj[key].
func (r *reader) readList(c *Call, obj jsondom.Value, key string, one func(jsondom.Value) (bulkhead.Message, *BodyError)) *BodyError {
	a, err := array(obj, key)
	if err != nil {
		return err
	}
	if a.Len() > 0 {
		c.Request.Messages = make([]bulkhead.Message, 0, a.Len())
	}
	i := 0
	for e := a.First(); e.Exists(); e, i = e.Next(), i+1 {
		msg, err := one(e)
		if err != nil {
			return err.under(index(key, i))
		}
		c.Request.Messages = append(c.Request.Messages, msg)
	}
	return nil
}

func (r *reader) readResponses(c *Call, root jsondom.Value) *BodyError {
	if err := r.readCommon(c, root, "max_output_tokens"); err != nil {
		return err
	}
	var err *BodyError
	if c.Request.System, err = r.str(root, "instructions"); err != nil {
		return err
	}
	input := root.Get("input")
	switch input.Kind() {
	case jsondom.Missing, jsondom.Null:
		return nil
	case jsondom.String:
		s, _ := input.StrIn(&r.arena)
		c.Request.Messages = []bulkhead.Message{{Role: "user", Content: s}}
		return nil
	case jsondom.Array:
		return r.readList(c, root, "input", r.readItem)
	}
	return mistyped(input, "want a string or an array").under("input")
}

// readItem reads one item of a Responses input array.
func (r *reader) readItem(it jsondom.Value) (bulkhead.Message, *BodyError) {
	if it.Kind() != jsondom.Object {
		return bulkhead.Message{}, mistyped(it, "want an object")
	}
	t := it.Get("type")
	if t.StrIs("message") || (t.IsNull() && !it.Get("role").IsNull()) {
		return r.readMessage(it, OpenAIResponses)
	}
	role, err := r.str(it, "role")
	if err != nil {
		return bulkhead.Message{}, err
	}
	msg := bulkhead.Message{Role: role}
	typ, _ := t.StrIn(&r.arena)
	out := it.Get("output")
	switch {
	case typ == "function_call_output" && out.Kind() == jsondom.String:
		s, _ := out.StrIn(&r.arena)
		msg.Blocks = []bulkhead.Block{{Type: "text", Text: s}}
	case typ == "function_call_output" && out.Kind() == jsondom.Array:
		if err := r.appendParts(&msg.Blocks, out, OpenAIResponses); err != nil {
			return bulkhead.Message{}, err.under("output")
		}
	default:
		msg.Blocks = []bulkhead.Block{{Type: typ}}
	}
	return msg, nil
}

func (r *reader) readAnthropic(c *Call, root jsondom.Value) *BodyError {
	if err := r.readCommon(c, root, "max_tokens"); err != nil {
		return err
	}
	switch sys := root.Get("system"); sys.Kind() {
	case jsondom.Missing, jsondom.Null:
	case jsondom.String:
		c.Request.System, _ = sys.StrIn(&r.arena)
	case jsondom.Array:
		if err := r.appendParts(&c.Request.SystemBlocks, sys, AnthropicMessages); err != nil {
			return err.under("system")
		}
	default:
		return mistyped(sys, "want a string or an array").under("system")
	}
	return r.readList(c, root, "messages", func(m jsondom.Value) (bulkhead.Message, *BodyError) {
		return r.readMessage(m, AnthropicMessages)
	})
}

// readCommon reads the members the OpenAI and Anthropic formats share:
// model, stream and the output cap named maxKey.
func (r *reader) readCommon(c *Call, root jsondom.Value, maxKey string) *BodyError {
	var err *BodyError
	if c.Request.Model, err = r.str(root, "model"); err != nil {
		return err
	}
	if c.Stream, err = boolean(root, "stream"); err != nil {
		return err
	}
	c.Request.MaxTokens, _, err = count(root, maxKey)
	return err
}

// readMessage reads a message object's role and content, in format f.
func (r *reader) readMessage(m jsondom.Value, f Format) (bulkhead.Message, *BodyError) {
	if m.Kind() != jsondom.Object {
		return bulkhead.Message{}, mistyped(m, "want an object")
	}
	role, err := r.str(m, "role")
	if err != nil {
		return bulkhead.Message{}, err
	}
	msg := bulkhead.Message{Role: role}
	switch v := m.Get("content"); v.Kind() {
	case jsondom.Missing, jsondom.Null:
	case jsondom.String:
		msg.Content, _ = v.StrIn(&r.arena)
	case jsondom.Array:
		if err := r.appendParts(&msg.Blocks, v, f); err != nil {
			return bulkhead.Message{}, err.under("content")
		}
	default:
		return bulkhead.Message{}, mistyped(v, "want a string or an array").under("content")
	}
	return msg, nil
}

// appendParts appends the blocks of the content parts in the array parts,
// in format f (not Gemini).
func (r *reader) appendParts(dst *[]bulkhead.Block, parts jsondom.Value, f Format) *BodyError {
	if *dst == nil && parts.Len() > 0 {
		*dst = make([]bulkhead.Block, 0, parts.Len())
	}
	i := 0
	for p := parts.First(); p.Exists(); p, i = p.Next(), i+1 {
		if err := r.appendPart(dst, p, f, true); err != nil {
			return err.under(index("", i))
		}
	}
	return nil
}

// appendPart appends the blocks of one content part in format f (not
// Gemini). With expand, an Anthropic tool_result becomes the blocks of its
// content (whose own tool results, which the API does not allow, stay
// opaque).
func (r *reader) appendPart(dst *[]bulkhead.Block, p jsondom.Value, f Format, expand bool) *BodyError {
	typ, ok := p.Get("type").StrIn(&r.arena) // missing when p is not an object
	if !ok {
		*dst = append(*dst, bulkhead.Block{})
		return nil
	}
	switch {
	case typ == "text",
		(typ == "input_text" || typ == "output_text") && f == OpenAIResponses:
		return r.appendText(dst, p, "text")
	case typ == "refusal" && f != AnthropicMessages:
		return r.appendText(dst, p, "refusal")
	case typ == "tool_result" && f == AnthropicMessages && expand:
		switch c := p.Get("content"); c.Kind() {
		case jsondom.Missing, jsondom.Null:
		case jsondom.String:
			*dst = append(*dst, r.textBlock(c))
		case jsondom.Array:
			i := 0
			for e := c.First(); e.Exists(); e, i = e.Next(), i+1 {
				if err := r.appendPart(dst, e, f, false); err != nil {
					return err.under(index("content", i))
				}
			}
		default:
			return mistyped(c, "want a string or an array").under("content")
		}
	default:
		*dst = append(*dst, bulkhead.Block{Type: typ})
	}
	return nil
}

// appendText appends the text block of part p's member key: an error when
// it is there but not a string, a malformed block when it is missing.
func (r *reader) appendText(dst *[]bulkhead.Block, p jsondom.Value, key string) *BodyError {
	v := p.Get(key)
	if !v.IsNull() && v.Kind() != jsondom.String {
		return mistyped(v, "want a string").under(key)
	}
	*dst = append(*dst, r.textBlock(v))
	return nil
}

// textBlock is a text block of the string v, or a malformed block when v is
// not a string.
func (r *reader) textBlock(v jsondom.Value) bulkhead.Block {
	s, ok := v.StrIn(&r.arena)
	if !ok {
		return bulkhead.Block{}
	}
	return bulkhead.Block{Type: "text", Text: s}
}

func (r *reader) readGemini(c *Call, root jsondom.Value) *BodyError {
	if key, sys := either(root, "systemInstruction", "system_instruction"); !sys.IsNull() {
		if err := r.appendGeminiContent(&c.Request.SystemBlocks, sys); err != nil {
			return err.under(key)
		}
	}
	if key, gc := either(root, "generationConfig", "generation_config"); !gc.IsNull() {
		if gc.Kind() != jsondom.Object {
			return mistyped(gc, "want an object").under(key)
		}
		maxKey, _ := either(gc, "maxOutputTokens", "max_output_tokens")
		var err *BodyError
		if c.Request.MaxTokens, _, err = count(gc, maxKey); err != nil {
			return err.under(key)
		}
	}
	return r.readList(c, root, "contents", func(m jsondom.Value) (bulkhead.Message, *BodyError) {
		var msg bulkhead.Message
		err := r.appendGeminiContent(&msg.Blocks, m)
		if err == nil {
			msg.Role, err = r.str(m, "role")
		}
		return msg, err
	})
}

// either returns the member camel of obj, or snake when camel is absent or
// null, with the key it used.
func either(obj jsondom.Value, camel, snake string) (string, jsondom.Value) {
	if v := obj.Get(camel); !v.IsNull() {
		return camel, v
	}
	return snake, obj.Get(snake)
}

// appendGeminiContent appends the blocks of the parts of a Gemini Content
// object.
func (r *reader) appendGeminiContent(dst *[]bulkhead.Block, content jsondom.Value) *BodyError {
	if content.Kind() != jsondom.Object {
		return mistyped(content, "want an object")
	}
	parts, err := array(content, "parts")
	if err != nil {
		return err
	}
	if *dst == nil && parts.Len() > 0 {
		*dst = make([]bulkhead.Block, 0, parts.Len())
	}
	for p := parts.First(); p.Exists(); p = p.Next() {
		*dst = append(*dst, r.geminiPart(p))
	}
	return nil
}

// geminiData is the data members of a Gemini Part, by their names in the
// blocks (the proto names) and the REST API's snake-case aliases.
var geminiData = [...]struct{ name, alias string }{
	{"inlineData", "inline_data"},
	{"fileData", "file_data"},
	{"functionCall", "function_call"},
	{"functionResponse", "function_response"},
	{"executableCode", "executable_code"},
	{"codeExecutionResult", "code_execution_result"},
}

// geminiMeta is the members of a Gemini Part that describe its data rather
// than being it.
var geminiMeta = [...]string{
	"thought", "thoughtSignature", "thought_signature", "videoMetadata", "video_metadata",
	"partMetadata", "part_metadata", "mediaResolution", "media_resolution",
}

// geminiPart is the block of a Gemini Part: text for a text part (a thought
// too), else an opaque block named by the part's data member.
func (r *reader) geminiPart(p jsondom.Value) bulkhead.Block {
	if p.Kind() != jsondom.Object {
		return bulkhead.Block{}
	}
	if t := p.Get("text"); !t.IsNull() {
		return r.textBlock(t)
	}
	for _, d := range geminiData {
		if p.Get(d.name).Exists() || p.Get(d.alias).Exists() {
			return bulkhead.Block{Type: d.name}
		}
	}
	for m := p.First(); m.Exists(); m = m.Next() {
		if k := m.Key(); !isGeminiMeta(k) {
			return bulkhead.Block{Type: k} // a kind of data this package does not know
		}
	}
	return bulkhead.Block{}
}

func isGeminiMeta(key string) bool {
	for _, k := range geminiMeta {
		if k == key {
			return true
		}
	}
	return false
}

// readTools adds a tool_definition block to req.SystemBlocks for each tool
// the body declares in format f: each entry of its tools array, or for
// Gemini each tool of each entry (see geminiTools).
func readTools(req *bulkhead.Request, root jsondom.Value, f Format) *BodyError {
	if f != Gemini {
		return appendOpaque(&req.SystemBlocks, root, "tools", "tool_definition")
	}
	tools, err := array(root, "tools")
	if err != nil {
		return err
	}
	i := 0
	for t := tools.First(); t.Exists(); t, i = t.Next(), i+1 {
		n, err := geminiTools(t)
		if err != nil {
			return err.under(index("tools", i))
		}
		for range n {
			req.SystemBlocks = append(req.SystemBlocks, bulkhead.Block{Type: "tool_definition"})
		}
	}
	return nil
}

// geminiTools returns the number of tools a Gemini Tool object declares:
// one for each element of its functionDeclarations array, and one for each
// other member that is not null (googleSearch, codeExecution, urlContext...).
// An entry that is not an object counts as one tool, as in the other
// formats.
func geminiTools(t jsondom.Value) (int, *BodyError) {
	if t.Kind() != jsondom.Object {
		return 1, nil
	}
	n := 0
	for m := t.First(); m.Exists(); m = m.Next() {
		switch k := m.Key(); {
		case k != "functionDeclarations" && k != "function_declarations":
			if !m.IsNull() {
				n++
			}
		case m.Kind() == jsondom.Array:
			n += m.Len()
		case !m.IsNull():
			return 0, mistyped(m, "want an array").under(k)
		}
	}
	return n, nil
}

// appendOpaque appends an opaque block of type typ for each element of the
// array obj[key].
func appendOpaque(dst *[]bulkhead.Block, obj jsondom.Value, key, typ string) *BodyError {
	a, err := array(obj, key)
	if err != nil || a.Len() == 0 {
		return err
	}
	*dst = append(*dst, make([]bulkhead.Block, a.Len())...)
	for i := len(*dst) - a.Len(); i < len(*dst); i++ {
		(*dst)[i].Type = typ
	}
	return nil
}

// str returns the string obj[key], "" when it is absent or null.
func (r *reader) str(obj jsondom.Value, key string) (string, *BodyError) {
	v := obj.Get(key)
	if v.IsNull() {
		return "", nil
	}
	s, ok := v.StrIn(&r.arena)
	if !ok {
		return "", mistyped(v, "want a string").under(key)
	}
	return s, nil
}

// boolean returns the boolean obj[key], false when it is absent or null.
func boolean(obj jsondom.Value, key string) (bool, *BodyError) {
	v := obj.Get(key)
	if v.IsNull() {
		return false, nil
	}
	b, ok := v.Bool()
	if !ok {
		return false, mistyped(v, "want a boolean").under(key)
	}
	return b, nil
}

// array returns the array obj[key], a missing value when it is absent or
// null.
func array(obj jsondom.Value, key string) (jsondom.Value, *BodyError) {
	v := obj.Get(key)
	switch v.Kind() {
	case jsondom.Array:
		return v, nil
	case jsondom.Missing, jsondom.Null:
		return jsondom.Value{}, nil
	}
	return jsondom.Value{}, mistyped(v, "want an array").under(key)
}

// count returns the non-negative integer obj[key] and whether it is set
// (present and not null).
func count(obj jsondom.Value, key string) (int64, bool, *BodyError) {
	v := obj.Get(key)
	if v.IsNull() {
		return 0, false, nil
	}
	n, ok := v.Int()
	if !ok || n < 0 {
		got := v.Kind().String()
		if raw := v.Raw(); v.Kind() == jsondom.Number && len(raw) <= 24 {
			got = string(raw)
		}
		return 0, false, &BodyError{Field: key, Offset: v.Offset(), Problem: "want a non-negative integer, got " + got}
	}
	return n, true, nil
}

// mistyped is the error for the value v, which is not what want says.
func mistyped(v jsondom.Value, want string) *BodyError {
	return &BodyError{Offset: v.Offset(), Problem: want + ", got " + v.Kind().String()}
}

// under puts e's field inside seg, a key or "[i]", and returns e.
func (e *BodyError) under(seg string) *BodyError {
	switch {
	case e.Field == "":
		e.Field = seg
	case e.Field[0] == '[':
		e.Field = seg + e.Field
	default:
		e.Field = seg + "." + e.Field
	}
	return e
}

// index is the path segment key[i] (or [i] for key "").
func index(key string, i int) string { return key + "[" + strconv.Itoa(i) + "]" }

// addIncludeUsage returns the OpenAI chat body body with
// stream_options.include_usage set true and every other byte as it was: an
// include_usage member is rewritten in place, else it is added to the
// stream_options object (a null stream_options becomes that object), else
// stream_options is added to the top-level object. It returns body itself
// when include_usage is already true. A body that is not a JSON object, or
// whose stream_options is neither an object nor null, is a *BodyError.
func addIncludeUsage(body []byte) ([]byte, error) {
	d := getDoc()
	defer putDoc(d)
	if err := jsondom.Parse(d, body); err != nil {
		return nil, syntaxError(OpenAIChat, err)
	}
	root := d.Root()
	if root.Kind() != jsondom.Object {
		err := mistyped(root, "want an object")
		err.Format = OpenAIChat
		return nil, err
	}
	switch opts := root.Get("stream_options"); opts.Kind() {
	case jsondom.Missing:
		return insertMember(body, root, `"stream_options":{"include_usage":true}`), nil
	case jsondom.Null:
		return splice(body, opts, `{"include_usage":true}`), nil
	case jsondom.Object:
		iu := opts.Get("include_usage")
		if !iu.Exists() {
			return insertMember(body, opts, `"include_usage":true`), nil
		}
		if b, _ := iu.Bool(); b {
			return body, nil
		}
		return splice(body, iu, "true"), nil
	default:
		err := mistyped(opts, "want an object").under("stream_options")
		err.Format = OpenAIChat
		return nil, err
	}
}

// splice returns a copy of body with the value v replaced by repl.
func splice(body []byte, v jsondom.Value, repl string) []byte {
	at, n := v.Offset(), len(v.Raw())
	out := make([]byte, 0, len(body)-n+len(repl))
	out = append(out, body[:at]...)
	out = append(out, repl...)
	return append(out, body[at+n:]...)
}

// insertMember returns a copy of body with member added at the end of the
// object obj.
func insertMember(body []byte, obj jsondom.Value, member string) []byte {
	end := obj.Offset() + len(obj.Raw()) - 1 // the closing brace
	out := make([]byte, 0, len(body)+len(member)+1)
	out = append(out, body[:end]...)
	if obj.Len() > 0 {
		out = append(out, ',')
	}
	out = append(out, member...)
	return append(out, body[end:]...)
}
