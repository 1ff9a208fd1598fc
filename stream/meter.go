package stream

import (
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/jsondom"
	"github.com/llmbulkhead/bulkhead/internal/tokens"
)

// Admission is what a Meter reports usage to. *bulkhead.Permit implements
// it (the meter releases the permit when it settles), and so does
// *bulkhead.RunContext (the meter records the final usage with SetUsage
// when it settles, and Run releases when its callback returns). With any
// other implementation the meter only reports.
type Admission interface {
	ReportUsage(u bulkhead.Usage, p *bulkhead.Progressive) (bulkhead.UsageReport, error)
	Reservation() *bulkhead.Reservation
}

// MeterOptions configures a Meter.
type MeterOptions struct {
	// Format is the provider API the response comes from. Required.
	Format Format

	// SSE is true when the body is a stream of server-sent events. False
	// means one JSON document; for Gemini, also a JSON array of responses,
	// which is what streamGenerateContent returns without alt=sse.
	// MeterResponse sets it from the response's Content-Type.
	SSE bool

	// Model is the model the response comes from, for the default
	// characters-per-token ratio.
	Model string

	// CharsPerToken is the ratio that turns generated text (counted in
	// UTF-16 code units) into estimated output tokens. Zero means the
	// bulkhead's built-in ratio for Model, as its default estimator uses,
	// or 4 for a model the table does not know. Otherwise it must be
	// positive and finite.
	CharsPerToken float64

	// ReportEvery is how many estimated output tokens a stream generates
	// between two progressive usage reports. Zero means 32; it must not be
	// negative.
	ReportEvery int64

	// SafetyMargin is what a progressive report holds on top of the output
	// the stream may still produce. Zero means a quarter of the output
	// estimated so far, rounded up; it must not be negative.
	SafetyMargin int64

	// StripUsageChunk removes from what the caller reads the extra chunk
	// (empty choices, usage set) that stream_options.include_usage adds to
	// an OpenAI chat stream, for a caller that did not ask for it: a
	// gateway that turns include_usage on to meter the stream sets it.
	// Only that event's bytes are removed. OpenAI chat streams only.
	StripUsageChunk bool

	// MaxJSONBytes is the most bytes of a plain JSON body (or of one
	// element of a Gemini JSON array) the meter keeps to read the usage
	// in it. Zero means 32 MiB; it must not be negative. The output of a
	// larger document is estimated from its size.
	MaxJSONBytes int64

	// RecordResponse makes the meter note what the response says of
	// itself as it passes, its ID, model and finish reasons, for
	// Meter.Response. It costs a little on the events the meter parses in
	// full (never on the plain text deltas of a stream).
	RecordResponse bool
}

// The defaults of MeterOptions.
const (
	defaultReportEvery  = 32
	defaultMaxJSONBytes = 32 << 20
)

// Meter wraps a provider's response body. The caller reads every byte of
// the body unchanged through it (except the chunk StripUsageChunk
// removes), while the meter follows the response's events and reports the
// call's usage to its admission as they pass:
//
//   - Output is estimated from the generated text seen so far (message
//     text, refusals, reasoning and thinking text, tool-call arguments;
//     never the JSON around them), in UTF-16 code units divided by the
//     characters-per-token ratio. Once the provider reports its own
//     cumulative output count, output is that count plus the estimate of
//     any text seen since.
//   - Input is the provider's count once it reports one, else the
//     reservation's input estimate. Input counts every input token,
//     including those read from or written to the provider's prompt
//     cache; Output counts every output token, including reasoning.
//
// With a token budget, the meter reports progressively when generation
// starts, each time the estimated output grows by ReportEvery tokens, and
// when the provider reports usage: the admission then holds only what the
// stream may still produce (the reservation's max output less the output
// so far) plus a safety margin, so a long stream frees what it will not
// use. Without a budget it reports plain usage at the same points. A Read
// makes at most one report, with the usage as of the end of the bytes it
// returns (and none when the response ends in them: the meter settles
// instead), so a fast reader does not pay a report for every few events.
//
// The meter settles exactly once: at the response's terminal event, at the
// end of the body, at Close, at a read error (which Read returns), or at a
// provider error event. It settles with the provider's own usage when the
// provider reported it, else with the estimate. A *bulkhead.Permit is
// released with that usage; a *bulkhead.RunContext gets it through
// SetUsage, so with Run the meter must settle (be read to the end or
// closed) before the callback returns.
//
// After a provider error event the bytes still pass through, and where the
// body would end with io.EOF, Read returns the *ProviderError instead.
//
// The meter keeps only what it must: in a stream, a line split between two
// reads and the event being read. A line (or an event's data) longer than
// 16 MiB ends the metering: the bytes still pass, and the meter settles
// with the usage seen so far when the body ends.
//
// Read must not be called from two goroutines at once; Close, Usage,
// Settled and Err may be called at any time, from any goroutine. Close
// does not wait for a Read blocked on the body.
type Meter struct {
	body   io.ReadCloser
	a      Admission
	res    *bulkhead.Reservation // nil without a budget
	format Format
	sse    bool
	ratio  float64
	every  int64
	margin int64

	// stripMode is StripUsageChunk: Read goes through the buffers below.
	stripMode bool
	record    bool   // RecordResponse
	out       []byte // bytes ready for the caller, beside its buffer
	outPos    int
	rerr      error // what Read returns once out is drained

	mu sync.Mutex
	// The fields below are guarded by mu.
	closed   bool
	passive  bool // a response whose status is not 2xx: nothing to meter
	metering bool // the meter still reads events
	settled  bool
	final    bulkhead.Usage
	counts   tokenCounts // final with its breakdown
	exact    bool        // final is the provider's own count
	perr     *ProviderError
	resp     ResponseInfo // with record: what the response says of itself

	prov      rawUsage // the provider's counts so far
	finished  bool     // generation ended: the provider's counts are final (Gemini)
	chars     int64    // generated text since the provider last counted output
	started   bool     // generation has started
	reported  bool     // a report has been made
	lastOut   int64    // the output of the last report
	quiet     int64    // up to this much text, output stays below the next report
	due       bool     // a report is due at the end of the bytes being read
	noReports bool     // a report failed: make no more
	prog      bulkhead.Progressive

	sc  sseScanner
	js  jsonSplitter
	tpl template

	stripping bool   // still removing the usage chunk
	hold      []byte // the bytes of the block being read, in stripMode, between two reads
	chunk     []byte // the bytes being scanned, in stripMode: the caller's buffer (or, in spill mode, the body's read)
	off       int    // where in chunk the bytes fed to the scanner start (after hold's)
	cbs       int    // where in chunk the current block starts
	w         int    // the end of the bytes that go out, at the start of chunk
	spill     bool   // hold did not fit in the caller's buffer: chunk is beside it, and what goes out goes to out
}

// NewMeter wraps body, reporting to a. The admission's reservation is read
// once, now. a may be nil: the meter then only measures (see Usage).
// Invalid options are a *bulkhead.ConfigError naming the field, such as
// "MeterOptions.Format"; nothing is settled then and body is not closed.
func NewMeter(body io.ReadCloser, a Admission, opts MeterOptions) (*Meter, error) {
	if body == nil {
		return nil, &bulkhead.ConfigError{Field: "body", Problem: "must not be nil"}
	}
	if err := validate(opts); err != nil {
		return nil, err
	}
	if opts.StripUsageChunk && !opts.SSE {
		return nil, &bulkhead.ConfigError{Field: "MeterOptions.StripUsageChunk", Problem: "needs SSE"}
	}
	return newMeter(body, a, opts, false), nil
}

// MeterResponse meters resp's body, replacing resp.Body with the Meter.
// SSE is taken from the Content-Type (text/event-stream), the format from
// opts.Format; StripUsageChunk applies only when the body is SSE, and then
// resp's length is unknown (ContentLength -1, no Content-Length header),
// since the body the caller reads is shorter than the provider's. For a
// response whose status is not 2xx the meter reads nothing and settles
// with zero usage (the provider did no work) when the body ends or is
// closed. Invalid options are a *bulkhead.ConfigError and leave resp as it
// was.
func MeterResponse(resp *http.Response, a Admission, opts MeterOptions) (*Meter, error) {
	if resp == nil {
		return nil, &bulkhead.ConfigError{Field: "resp", Problem: "must not be nil"}
	}
	if err := validate(opts); err != nil {
		return nil, err
	}
	opts.SSE = isEventStream(resp.Header.Get("Content-Type"))
	opts.StripUsageChunk = opts.StripUsageChunk && opts.SSE
	if opts.StripUsageChunk { // the body the caller reads is shorter
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	body := resp.Body
	if body == nil {
		body = http.NoBody
	}
	m := newMeter(body, a, opts, resp.StatusCode < 200 || resp.StatusCode > 299)
	resp.Body = m
	return m, nil
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		mt, _, _ = strings.Cut(ct, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt == "text/event-stream"
}

func validate(o MeterOptions) error {
	bad := func(field, format string, args ...any) error {
		return &bulkhead.ConfigError{Field: "MeterOptions." + field, Problem: fmt.Sprintf(format, args...)}
	}
	switch {
	case o.Format < OpenAIChat || o.Format > Gemini:
		return bad("Format", "must be one of the formats, got %d", o.Format)
	case o.CharsPerToken < 0 || math.IsNaN(o.CharsPerToken) || math.IsInf(o.CharsPerToken, 0):
		return bad("CharsPerToken", "must be positive and finite, or 0 for the model's ratio, got %v", o.CharsPerToken)
	case o.ReportEvery < 0:
		return bad("ReportEvery", "must be >= 0, got %d", o.ReportEvery)
	case o.SafetyMargin < 0:
		return bad("SafetyMargin", "must be >= 0, got %d", o.SafetyMargin)
	case o.MaxJSONBytes < 0:
		return bad("MaxJSONBytes", "must be >= 0, got %d", o.MaxJSONBytes)
	case o.StripUsageChunk && o.Format != OpenAIChat:
		return bad("StripUsageChunk", "applies to openai_chat only, got %s", o.Format)
	}
	return nil
}

func newMeter(body io.ReadCloser, a Admission, o MeterOptions, passive bool) *Meter {
	switch v := a.(type) { // a typed nil is no admission
	case *bulkhead.Permit:
		if v == nil {
			a = nil
		}
	case *bulkhead.RunContext:
		if v == nil {
			a = nil
		}
	}
	m := &Meter{
		body:      body,
		a:         a,
		format:    o.Format,
		sse:       o.SSE,
		ratio:     o.CharsPerToken,
		every:     o.ReportEvery,
		margin:    o.SafetyMargin,
		passive:   passive,
		metering:  !passive,
		stripMode: o.StripUsageChunk,
		stripping: o.StripUsageChunk,
		record:    o.RecordResponse,
	}
	if m.ratio == 0 {
		m.ratio, _ = tokens.BuiltinRatio(o.Model)
	}
	if m.every == 0 {
		m.every = defaultReportEvery
	}
	if a != nil {
		if r := a.Reservation(); r != nil {
			res := *r
			m.res = &res
		}
	}
	m.sc.sink, m.sc.max = m, maxLine
	m.js.sink = m
	m.js.max = o.MaxJSONBytes
	if m.js.max == 0 {
		m.js.max = defaultMaxJSONBytes
	}
	m.tpl.on = o.SSE && o.Format != OpenAIResponses // Responses events number themselves: no two look alike
	return m
}

// Read reads from the body into p, metering what passes.
func (m *Meter) Read(p []byte) (int, error) {
	if m.stripMode {
		return m.readStripped(p)
	}
	n, err := m.body.Read(p)
	m.mu.Lock()
	if n > 0 && m.metering {
		m.feed(p[:n])
	}
	err = m.ended(err)
	m.mu.Unlock()
	return n, err
}

// feed meters the next bytes of the body, and reports if a report is due.
// mu is held.
func (m *Meter) feed(b []byte) {
	if m.sse {
		m.sc.feed(b)
		if m.sc.dead { // a line too long to keep: stop here
			m.metering = false
		}
	} else {
		m.js.feed(b)
	}
	if m.due && !m.settled {
		m.report()
	}
}

// ended handles the error the body returned, settling on any, and returns
// the error for the caller: the provider's error in place of io.EOF when
// the stream carried one. mu is held.
func (m *Meter) ended(err error) error {
	if err == nil {
		return nil
	}
	if err == io.EOF && m.metering && m.sse {
		m.sc.finish()
	}
	m.cutShort()
	if err == io.EOF && m.perr != nil {
		return m.perr
	}
	return err
}

// readStripped is Read for StripUsageChunk: the bytes of each block of
// lines wait until its blank line shows whether it is the usage chunk.
// The body is read into p, the caller's buffer, where the blocks that go
// out are moved together: the meter has no read buffer of its own, and
// while the stream waits for its next event it keeps only the bytes of a
// block split between two reads (hold), which go first in p at the next
// read. A block too long for p is kept beside it (spill mode).
func (m *Meter) readStripped(p []byte) (int, error) {
	for {
		if m.outPos < len(m.out) {
			n := copy(p, m.out[m.outPos:])
			m.outPos += n
			if m.outPos == len(m.out) {
				m.out, m.outPos = nil, 0
			}
			return n, nil
		}
		if m.rerr != nil {
			return 0, m.rerr
		}
		if len(p) == 0 {
			return 0, nil
		}
		h := len(m.hold)
		spill := h >= len(p)
		buf := p
		if !spill {
			buf = p[copy(p, m.hold):]
		}
		n, err := m.body.Read(buf)
		m.mu.Lock()
		m.spill, m.cbs, m.w = spill, 0, 0
		if spill {
			m.chunk, m.off = buf[:n], 0
		} else {
			m.chunk, m.off = p[:h+n], h
			m.hold = m.hold[:0] // its bytes are at the start of chunk
		}
		if n > 0 && m.metering {
			m.feed(buf[:n])
		}
		tail := m.chunk[m.cbs:]
		switch {
		case m.metering && m.stripping && len(m.hold)+len(tail) <= m.sc.max:
			m.hold = append(m.hold, tail...)
		case spill:
			m.stripping = false // nothing more to strip: what is held goes out
			m.out = append(append(m.out, m.hold...), tail...)
			m.hold = m.hold[:0]
		default:
			m.stripping = false
			m.w += copy(p[m.w:], tail)
		}
		m.chunk, m.cbs = nil, 0
		if err != nil {
			m.rerr = m.ended(err) // what is held goes out, after p[:w]
			m.out = append(m.out, m.hold...)
			m.hold = nil
		} else if len(m.hold) == 0 && cap(m.hold) > maxKeptHold {
			m.hold = nil // nothing to keep while the stream waits
		}
		w := m.w
		m.mu.Unlock()
		switch {
		case w > 0:
			return w, nil
		case n == 0 && err == nil:
			return 0, nil
		}
	}
}

// maxKeptHold is the most capacity an empty hold keeps between reads, for
// the next split block.
const maxKeptHold = 4 << 10

// blockEnd is the sseSink's: in stripMode a block's bytes go out, or are
// dropped: moved to the caller's buffer after the blocks before it, or,
// in spill mode or at the body's end, appended to out. mu is held.
func (m *Meter) blockEnd(pos int, drop bool) {
	if !m.stripping {
		return
	}
	if m.chunk == nil || m.spill {
		if !drop {
			m.out = append(append(m.out, m.hold...), m.chunk[m.cbs:pos]...)
		}
		m.hold, m.cbs = m.hold[:0], pos
		return
	}
	pos += m.off
	if !drop {
		m.w += copy(m.chunk[m.w:], m.chunk[m.cbs:pos])
	}
	m.cbs = pos
}

// event is the sseSink's: one event of the stream. mu is held.
func (m *Meter) event(name, data []byte) (drop bool) {
	if m.format == OpenAIChat && isDone(data) {
		m.settle()
		return false
	}
	if chars, ok := m.tpl.match(name, data); ok {
		if fastPathCheck != nil {
			fastPathCheck(m.format, nil, name, data, eventInfo{chars: chars, texts: 1, started: m.tpl.started})
		}
		m.applyText(chars, m.tpl.started)
		return false
	}
	doc := getDoc() // the tree goes back to the pool: a waiting stream keeps none
	defer putDoc(doc)
	if jsondom.Parse(doc, data) != nil {
		return false // not JSON: nothing to meter
	}
	var e eventInfo
	root := doc.Root()
	parseEvent(m.format, name, root, true, &e)
	if m.record {
		describe(m.format, name, root, &m.resp)
	}
	if m.tpl.on && e.pure() {
		m.tpl.learn(name, data, root, &e)
	}
	m.apply(&e)
	return m.stripping && e.usageRow
}

// wholeBlock is the sseSink's: a block the template reads whole. mu is
// held.
func (m *Meter) wholeBlock(b []byte) int {
	size, data, chars, ok := m.tpl.matchBlock(b)
	if !ok {
		return 0
	}
	if fastPathCheck != nil {
		var name []byte
		if m.tpl.hasName {
			name = m.tpl.name
		}
		fastPathCheck(m.format, b[:size], name, data, eventInfo{chars: chars, texts: 1, started: m.tpl.started})
	}
	m.applyText(chars, m.tpl.started)
	return size
}

// fastPathCheck, when set (by tests), checks each event the template read
// against a full parse, and each block it read against the SSE scanner.
var fastPathCheck func(f Format, block, name, data []byte, got eventInfo)

// value is the jsonSink's: one JSON document, or one element of a
// top-level array. mu is held.
func (m *Meter) value(doc []byte) {
	d := getDoc()
	defer putDoc(d)
	if jsondom.Parse(d, doc) != nil {
		return
	}
	var e eventInfo
	parseEvent(m.format, nil, d.Root(), false, &e)
	if m.record {
		describe(m.format, nil, d.Root(), &m.resp)
	}
	if m.js.base > 0 {
		e.terminal = false // one response of an array: the array's end settles
	} else {
		e.finished = true // the whole response
	}
	m.apply(&e)
}

// oversized is the jsonSink's: a value too large to keep counts by its
// size. mu is held.
func (m *Meter) oversized(n int) {
	m.apply(&eventInfo{chars: int64(n), started: true})
}

// end is the jsonSink's: the end of the body's JSON. mu is held.
func (m *Meter) end() { m.settle() }

// cutShort settles a body that ended (or was closed) before its end: the
// part of a plain JSON document that arrived counts by its size, as a
// document too large to keep does. mu is held.
func (m *Meter) cutShort() {
	if !m.settled && !m.sse && m.metering && m.js.inValue && !m.js.over && len(m.js.buf) > 0 {
		m.oversized(len(m.js.buf))
	}
	m.settle()
}

// apply takes in what one event said. mu is held.
func (m *Meter) apply(e *eventInfo) {
	m.chars += e.chars
	m.started = m.started || e.started
	m.finished = m.finished || e.finished
	counted := e.usage.any()
	if counted {
		m.prov.merge(&e.usage)
		if e.usage.outputKnown() {
			m.chars = 0 // the provider's count covers the text so far
		}
	}
	if e.perr != nil && m.perr == nil {
		m.perr = e.perr
	}
	if e.terminal || e.perr != nil {
		m.settle()
		return
	}
	m.checkDue(counted)
}

// applyText takes in an event that carried only text (see eventInfo.pure).
// mu is held.
func (m *Meter) applyText(chars int64, started bool) {
	m.chars += chars
	m.started = m.started || started
	m.checkDue(false)
}

// checkDue notes whether a report is due after an event; counted is true
// when the provider's counts came with it. mu is held.
func (m *Meter) checkDue(counted bool) {
	if m.a == nil || m.noReports || !m.started || m.due {
		return
	}
	m.due = !m.reported || counted || m.chars > m.quiet && m.output()-m.lastOut >= m.every
}

// estimate is the output the text seen since the provider's last count
// makes, in tokens.
func (m *Meter) estimate() int64 {
	t, ok := tokens.CeilTokens(float64(m.chars) / m.ratio)
	if !ok {
		return math.MaxInt64
	}
	return t
}

// output is the output so far.
func (m *Meter) output() int64 {
	if m.prov.outputKnown() {
		return addSat(m.prov.counts(m.format).output, m.estimate())
	}
	return m.estimate()
}

// current is the usage so far. mu is held.
func (m *Meter) current() tokenCounts {
	if m.passive {
		return tokenCounts{}
	}
	c := m.prov.counts(m.format)
	if !m.prov.inputKnown() {
		c.input, c.cachedInput, c.cacheCreation = 0, 0, 0
		if m.res != nil {
			c.input = m.res.Input
		}
	}
	if m.prov.outputKnown() {
		c.output = addSat(c.output, m.estimate())
	} else {
		c.output, c.reasoning = m.estimate(), 0
	}
	return c
}

// isExact reports whether the usage so far is the provider's own final
// count: a Gemini stream's counts are running totals until the chunk that
// ends generation. mu is held.
func (m *Meter) isExact() bool {
	return !m.passive && m.prov.inputKnown() && m.prov.outputKnown() && m.chars == 0 &&
		(m.format != Gemini || m.finished)
}

// report reports the usage so far. mu is held.
func (m *Meter) report() {
	m.reported, m.due = true, false
	u := toUsage(m.current())
	m.lastOut = u.Output
	m.quiet = m.quietChars()
	var prog *bulkhead.Progressive
	if m.res != nil {
		margin := m.margin
		if margin == 0 {
			margin = u.Output/4 + min(u.Output%4, 1)
		}
		m.prog = bulkhead.Progressive{RemainingOutput: max(0, m.res.MaxOutput-u.Output), SafetyMargin: margin}
		prog = &m.prog
	}
	if _, err := m.a.ReportUsage(u, prog); err != nil {
		m.noReports = true
	}
}

// quietChars returns how much text the output may take before it reaches
// the next report: below ceil(chars/ratio) >= target there is no need to
// compute it. A bound that is too low only costs a computation.
func (m *Meter) quietChars() int64 {
	base := int64(0)
	if m.prov.outputKnown() {
		base = m.prov.counts(m.format).output
	}
	target := m.lastOut - base + m.every // the estimate that reports next
	if target <= 1 {
		return -1
	}
	q := float64(target-1) * m.ratio
	if q >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q) - 1 // a character short, against rounding
}

// settle settles the admission, once. mu is held.
func (m *Meter) settle() {
	if m.settled {
		return
	}
	m.settled, m.metering, m.sc.stop = true, false, true
	m.counts = m.current().valid()
	m.final, m.exact = toUsage(m.counts), m.isExact()
	switch a := m.a.(type) {
	case nil:
	case *bulkhead.Permit:
		u := m.final
		_ = a.Release(&u)
	case *bulkhead.RunContext:
		m.finalReport()
		_ = a.SetUsage(m.final)
	default:
		m.finalReport()
	}
}

// finalReport reports the final usage to an admission the meter does not
// release: with a budget as a progressive report that holds nothing more
// for output, since the response is complete. mu is held.
func (m *Meter) finalReport() {
	if m.noReports {
		return
	}
	var prog *bulkhead.Progressive
	if m.res != nil {
		m.prog = bulkhead.Progressive{}
		prog = &m.prog
	}
	if _, err := m.a.ReportUsage(m.final, prog); err != nil {
		m.noReports = true
	}
}

// Close settles the admission, if the meter has not settled yet, with the
// usage seen so far, and closes the body. Only the first call closes the
// body and returns its error; later calls return nil. It may be called
// while a Read is blocked on the body, which closing the body unblocks.
func (m *Meter) Close() error {
	m.mu.Lock()
	m.cutShort()
	first := !m.closed
	m.closed = true
	m.mu.Unlock()
	if !first {
		return nil
	}
	return m.body.Close()
}

// Usage returns the usage so far, or the settled usage once the meter has
// settled. exact is true when it is the provider's own final count of both
// input and output, false when either is an estimate or, in a Gemini
// response read as a stream, a running count: until the chunk with a
// finishReason. Input counts cache reads and writes, Output counts
// reasoning (see Meter).
func (m *Meter) Usage() (u bulkhead.Usage, exact bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settled {
		return m.final, m.exact
	}
	return toUsage(m.current()), m.isExact()
}

// Settled reports whether the meter has settled the admission.
func (m *Meter) Settled() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settled
}

// Err returns the error the provider reported inside the response (a
// *ProviderError), or nil.
func (m *Meter) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.perr == nil {
		return nil
	}
	return m.perr
}
