package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// The fake upstream is an OpenAI-compatible chat completions endpoint that
// speaks just enough HTTP/1.1 (keep-alive, Content-Length and chunked
// request bodies) to cost the machine little: the gateway, nginx and the
// load generator share its cores. Three request headers shape its answer:
//
//	X-Bench-Delay-Ms  wait this long before answering (plain) or before
//	                  the first event (streamed)
//	X-Bench-Events    the streamed answer's text deltas (default 10)
//	X-Bench-Gap-Us    the wait between two events (default 0: each is
//	                  still written, and flushed, on its own)
//	X-Bench-Stamp     with any value, the slow drip of a held stream: the
//	                  deltas are due every gap from the first event, on a
//	                  schedule that does not drift, and each carries the
//	                  wall-clock time it was written, in nanoseconds, as
//	                  its obfuscation string (see stampedDelta), for the
//	                  load generator to time its trip
//
// A body with "stream":true gets a text/event-stream of chat chunks, each
// in its own HTTP chunk, with the usage chunk when the body asks for
// include_usage, then [DONE]; any other body gets one JSON completion.

// serveUpstream serves the fake upstream on ln until it is closed.
func serveUpstream(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go upstreamConn(c)
	}
}

// upstreamHeaders are the headers of every answer, as OpenAI sends them
// (the gateway reads the rate-limit ones).
const upstreamHeaders = "X-Request-Id: req_bench\r\nOpenai-Processing-Ms: 1\r\n" +
	"X-Ratelimit-Limit-Requests: 1000000\r\nX-Ratelimit-Remaining-Requests: 999999\r\nX-Ratelimit-Reset-Requests: 6ms\r\n" +
	"X-Ratelimit-Limit-Tokens: 100000000\r\nX-Ratelimit-Remaining-Tokens: 99999000\r\nX-Ratelimit-Reset-Tokens: 0s\r\n"

const plainAnswerBody = `{"id":"chatcmpl-bench","object":"chat.completion","created":1755137933,"model":"gpt-4o-mini-2024-07-18",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21},"system_fingerprint":"fp_bench"}`

var plainAnswer = []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + upstreamHeaders +
	"Content-Length: " + strconv.Itoa(len(plainAnswerBody)) + "\r\n\r\n" + plainAnswerBody)

var streamHead = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" + upstreamHeaders +
	"Transfer-Encoding: chunked\r\n\r\n")

const chunkHead = `{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1755137933,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_bench","choices":[{"index":0,"delta":`

// The events of a streamed answer, each framed as one HTTP chunk.
var (
	firstEvent  = chunk("data: " + chunkHead + `{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Qz7"}` + "\n\n")
	deltaEvent  = chunk("data: " + chunkHead + `{"content":" word"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"xk2Lq"}` + "\n\n")
	finishEvent = chunk("data: " + chunkHead + `{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n")
	usageEvent  = chunk(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1755137933,"model":"gpt-4o-mini-2024-07-18","choices":[],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":11,"total_tokens":23}}` + "\n\n")
	doneEvent = chunk("data: [DONE]\n\n")
)

// stampedDelta appends to b a delta event, framed as one chunk, whose
// obfuscation string is t in Unix nanoseconds (19 digits until 2286).
func stampedDelta(b []byte, t time.Time) []byte {
	var e [len(stampedPrefix) + 19 + len(stampedSuffix)]byte
	ev := append(strconv.AppendInt(append(e[:0], stampedPrefix...), t.UnixNano(), 10), stampedSuffix...)
	b = strconv.AppendInt(b, int64(len(ev)), 16)
	b = append(b, "\r\n"...)
	b = append(b, ev...)
	return append(b, "\r\n"...)
}

// The bytes of a stamped delta around its stamp; stampMark is what the
// load generator looks for.
const (
	stampMark     = `"obfuscation":"`
	stampedPrefix = "data: " + chunkHead + `{"content":" word"},"logprobs":null,"finish_reason":null}],"usage":null,` + stampMark
	stampedSuffix = "\"}\n\n"
)

// chunk frames e as one chunk of a chunked body.
func chunk(e string) []byte { return fmt.Appendf(nil, "%x\r\n%s\r\n", len(e), e) }

// upstreamConn serves the requests of one connection, one after another.
func upstreamConn(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 16<<10)
	w := bufio.NewWriterSize(c, 16<<10)
	var body []byte
	for {
		req, err := readRequest(r, body[:0])
		if err != nil {
			return
		}
		body = req.body
		if req.delay > 0 {
			time.Sleep(req.delay)
		}
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			if _, err := w.Write(plainAnswer); err != nil || w.Flush() != nil {
				return
			}
		} else if !writeStream(w, req, bytes.Contains(body, []byte(`"include_usage":true`))) {
			return
		}
		if req.close {
			return
		}
	}
}

// writeStream writes a streamed answer, flushing each event on its own.
func writeStream(w *bufio.Writer, req request, usage bool) bool {
	if _, err := w.Write(streamHead); err != nil {
		return false
	}
	event := func(e []byte) bool {
		_, err := w.Write(e)
		return err == nil && w.Flush() == nil
	}
	if !event(firstEvent) {
		return false
	}
	start := time.Now()
	var stamped []byte
	for i := 0; i < req.events; i++ {
		if req.stamp {
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * req.gap)))
			stamped = stampedDelta(stamped[:0], time.Now())
			if !event(stamped) {
				return false
			}
			continue
		}
		if req.gap > 0 {
			time.Sleep(req.gap)
		}
		if !event(deltaEvent) {
			return false
		}
	}
	if !event(finishEvent) || usage && !event(usageEvent) || !event(doneEvent) {
		return false
	}
	_, err := io.WriteString(w, "0\r\n\r\n")
	return err == nil && w.Flush() == nil
}

// request is what the fake upstream reads of a request.
type request struct {
	body   []byte
	delay  time.Duration
	gap    time.Duration
	events int
	stamp  bool
	close  bool
}

var errMalformed = errors.New("malformed request")

// readRequest reads one request's head and body (appended to body).
func readRequest(r *bufio.Reader, body []byte) (request, error) {
	req := request{events: 10}
	if _, err := r.ReadSlice('\n'); err != nil { // the request line
		return req, err
	}
	length, chunked := -1, false
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return req, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return req, errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case headerIs(name, "content-length"):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return req, errMalformed
			}
		case headerIs(name, "transfer-encoding"):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case headerIs(name, "connection"):
			req.close = bytes.EqualFold(value, []byte("close"))
		case headerIs(name, "x-bench-delay-ms"):
			n, _ := strconv.Atoi(string(value))
			req.delay = time.Duration(n) * time.Millisecond
		case headerIs(name, "x-bench-gap-us"):
			n, _ := strconv.Atoi(string(value))
			req.gap = time.Duration(n) * time.Microsecond
		case headerIs(name, "x-bench-events"):
			req.events, _ = strconv.Atoi(string(value))
		case headerIs(name, "x-bench-stamp"):
			req.stamp = true
		}
	}
	var err error
	switch {
	case chunked:
		req.body, err = readChunked(r, body, true)
	case length > 0:
		start := len(body)
		body = append(body, make([]byte, length)...)
		_, err = io.ReadFull(r, body[start:])
		req.body = body
	default:
		req.body = body
	}
	return req, err
}

// headerIs reports whether a header's name is want (in lower case).
func headerIs(name []byte, want string) bool {
	return len(name) == len(want) && bytes.EqualFold(name, []byte(want))
}

// readChunked reads a chunked body to its end, appending it to body when
// keep is true, discarding it otherwise.
func readChunked(r *bufio.Reader, body []byte, keep bool) ([]byte, error) {
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return body, err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil || n < 0 {
			return body, errMalformed
		}
		if n == 0 {
			for { // trailers, then the blank line
				line, err := r.ReadSlice('\n')
				if err != nil {
					return body, err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return body, nil
				}
			}
		}
		if keep {
			start := len(body)
			body = append(body, make([]byte, n)...)
			if _, err := io.ReadFull(r, body[start:]); err != nil {
				return body, err
			}
		} else if _, err := r.Discard(int(n)); err != nil {
			return body, err
		}
		if _, err := r.Discard(2); err != nil { // CRLF
			return body, err
		}
	}
}
