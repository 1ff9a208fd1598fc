package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"
)

// The load generator is open loop: call i is due at start + i/rate whether
// or not the calls before it have been answered, and its latency counts
// from that moment, so a target that falls behind is charged for the wait
// (no coordinated omission). Each call goes on an idle keep-alive
// connection, or a new one when none is idle; its HTTP/1.1 is written by
// hand, so that the generator costs the shared cores little.

// target is where calls go: an address and the request written to it.
type target struct {
	name    string
	addr    string
	req     []byte        // the whole request: head and body
	timeout time.Duration // bounds a call; zero means callTimeout
	pool    connPool

	mu       sync.Mutex
	firstErr error // the first error of a call, for the report
}

// noteErr keeps the first error of a call.
func (t *target) noteErr(err error) {
	t.mu.Lock()
	if t.firstErr == nil {
		t.firstErr = err
	}
	t.mu.Unlock()
}

// newTarget makes the target at addr for calls with body and the extra
// header lines (each ending in CRLF).
func newTarget(name, addr, body, extra string) *target {
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Authorization: Bearer sk-bench\r\nUser-Agent: bench/1\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	return &target{name: name, addr: addr, req: []byte(head + body)}
}

// outcome is how one call ended.
type outcome uint8

const (
	failed outcome = iota // no complete answer: a connection error, a timeout, or not sent
	ok                    // 200, read to its end
	shed                  // 503 or 529 (the gateway's or nginx's answer to overload)
	other                 // another status
)

// result is one call's outcome and latency, from its scheduled start to
// the last byte of its answer.
type result struct {
	lat time.Duration
	out outcome
}

// maxConns bounds the connections a target may have open at once; a call
// due when all are busy counts as failed.
const maxConns = 12000

// callTimeout bounds one call, unless its target says otherwise.
const callTimeout = 10 * time.Second

// run sends calls to t at rate per second for d, and returns each call's
// result, in the order they were due.
func (t *target) run(rate float64, d time.Duration) []result {
	n := int(rate * d.Seconds())
	res := make([]result, n)
	var wg sync.WaitGroup
	interval := float64(time.Second) / rate
	start := time.Now().Add(5 * time.Millisecond)
	for i := 0; i < n; i++ {
		due := start.Add(time.Duration(float64(i) * interval))
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res[i].out = t.call(due)
			res[i].lat = time.Since(due)
		}(i)
	}
	wg.Wait()
	return res
}

// call sends one call and reads its answer to its end.
func (t *target) call(due time.Time) outcome {
	c, err := t.pool.get(t.addr)
	if err != nil {
		return failed
	}
	timeout := t.timeout
	if timeout == 0 {
		timeout = callTimeout
	}
	status, reuse, err := c.do(t.req, due.Add(timeout))
	if err != nil {
		t.noteErr(err)
		c.close()
		t.pool.gone()
		return failed
	}
	if reuse {
		t.pool.put(c)
	} else {
		c.close()
		t.pool.gone()
	}
	switch status {
	case 200:
		return ok
	case 503, 529:
		return shed
	}
	return other
}

// connPool keeps a target's idle connections.
type connPool struct {
	mu   sync.Mutex
	idle []*conn
	open int
}

var errTooManyConns = errors.New("too many connections")

func (p *connPool) get(addr string) (*conn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	if p.open >= maxConns {
		p.mu.Unlock()
		return nil, errTooManyConns
	}
	p.open++
	p.mu.Unlock()
	nc, err := net.DialTimeout("tcp", addr, callTimeout)
	if err != nil {
		p.gone()
		return nil, err
	}
	return &conn{c: nc, r: bufio.NewReaderSize(nc, 16<<10)}, nil
}

func (p *connPool) put(c *conn) {
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

func (p *connPool) gone() {
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

// closeIdle closes the idle connections.
func (p *connPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.open = nil, p.open-len(idle)
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}

// conn is one keep-alive connection to a target.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func (c *conn) close() { c.c.Close() }

var errBadResponse = errors.New("malformed response")

// do writes req and reads the answer to its end: its status, and whether
// the connection may carry another call.
func (c *conn) do(req []byte, deadline time.Time) (status int, reuse bool, err error) {
	if err := c.c.SetDeadline(deadline); err != nil {
		return 0, false, err
	}
	if _, err := c.c.Write(req); err != nil {
		return 0, false, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, false, errBadResponse
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, errBadResponse
	}
	length, chunked, reuse := -1, false, true
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, found := bytes.Cut(line, []byte(":"))
		if !found {
			return 0, false, errBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case headerIs(name, "content-length"):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, false, errBadResponse
			}
		case headerIs(name, "transfer-encoding"):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case headerIs(name, "connection"):
			reuse = !bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		_, err = readChunked(c.r, nil, false)
	case length >= 0:
		_, err = c.r.Discard(length)
	default: // the body runs to the connection's end
		for err == nil {
			_, err = c.r.Discard(c.r.Buffered() + 1)
		}
		return status, false, nil
	}
	return status, reuse, err
}

// stats summarises the results of a round.
type stats struct {
	calls, ok, shed, failed, other int
	p50, p99                       time.Duration // of every call; one that did not succeed counts as slower than any
	okP99                          time.Duration // of the calls that succeeded
	goodput                        float64       // successful calls per second
}

// summarise reads the results of a round of d.
func summarise(res []result, d time.Duration) stats {
	s := stats{calls: len(res)}
	all := make([]time.Duration, 0, len(res))
	okLat := make([]time.Duration, 0, len(res))
	for _, r := range res {
		switch r.out {
		case ok:
			s.ok++
			okLat = append(okLat, r.lat)
			all = append(all, r.lat)
			continue
		case shed:
			s.shed++
		case other:
			s.other++
		default:
			s.failed++
		}
		all = append(all, time.Duration(1<<62))
	}
	s.p50, s.p99 = quantile(all, 0.50), quantile(all, 0.99)
	s.okP99 = quantile(okLat, 0.99)
	s.goodput = float64(s.ok) / d.Seconds()
	return s
}

// quantile returns the q-quantile of ds (sorting it), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[int(q*float64(len(ds)-1)+0.5)]
}

// ms formats d in milliseconds; "∞" for a quantile that fell on a call
// that did not succeed.
func ms(d time.Duration) string {
	if d >= 1<<62 {
		return "∞"
	}
	return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond))
}

// held is what the load generator saw of one held stream.
type held struct {
	lats   []int32 // the trip of each stamped event, from its stamp to its arrival, in microseconds
	status int
	done   bool  // read to its end
	err    error // what ended it early
}

// hold sends one streamed call on a connection of its own and reads its
// answer to its end, timing each stamped event (see stampedDelta): from
// the time the upstream wrote it to the time the chunk that completes it
// was read. lats is appended to.
func (t *target) hold(deadline time.Time, lats []int32) held {
	h := held{lats: lats}
	nc, err := net.DialTimeout("tcp", t.addr, callTimeout)
	if err != nil {
		h.err = err
		return h
	}
	defer nc.Close()
	if err := nc.SetDeadline(deadline); err != nil {
		h.err = err
		return h
	}
	if _, err := nc.Write(t.req); err != nil {
		h.err = err
		return h
	}
	r := bufio.NewReaderSize(nc, 4<<10)
	line, err := r.ReadSlice('\n')
	if err != nil {
		h.err = err
		return h
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		h.err = errBadResponse
		return h
	}
	h.status, _ = strconv.Atoi(string(line[9:12]))
	chunked := false
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			h.err = err
			return h
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && headerIs(name, "transfer-encoding") {
			chunked = bytes.EqualFold(bytes.TrimSpace(value), []byte("chunked"))
		}
	}
	if h.status != 200 || !chunked {
		h.err = fmt.Errorf("status %d, chunked %v", h.status, chunked)
		return h
	}
	var pending []byte // the bytes of the event being read
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			h.err = err
			return h
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil || n < 0 {
			h.err = errBadResponse
			return h
		}
		if n == 0 { // the last chunk: trailers, then a blank line
			for {
				line, err := r.ReadSlice('\n')
				if err != nil {
					h.err = err
					return h
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					h.done = true
					return h
				}
			}
		}
		start := len(pending)
		pending = append(pending, make([]byte, n)...)
		if _, err := io.ReadFull(r, pending[start:]); err != nil {
			h.err = err
			return h
		}
		if _, err := r.Discard(2); err != nil {
			h.err = err
			return h
		}
		now := time.Now().UnixNano()
		for {
			end := bytes.Index(pending, []byte("\n\n"))
			if end < 0 {
				break
			}
			if i := bytes.Index(pending[:end], []byte(stampMark)); i >= 0 {
				digits := pending[i+len(stampMark) : end]
				if j := bytes.IndexByte(digits, '"'); j > 0 {
					if stamp, err := strconv.ParseInt(string(digits[:j]), 10, 64); err == nil {
						h.lats = append(h.lats, int32(min((now-stamp)/1e3, 1<<31-1)))
					}
				}
			}
			pending = pending[:copy(pending, pending[end+2:])]
		}
	}
}
