package gateway

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// A streamed answer goes to the client event by event, but not a write
// per event: the proxy writes what each read of the upstream brings, and
// the coalescer flushes it to the client only when the next read of the
// upstream connection would wait for more (or at the end of the answer).
// Events that arrive together leave together; an event followed by a
// pause leaves at once. This needs to see the upstream connection's
// reads: the connections of the routes' default transport are
// watchedConns; with another transport (and over HTTP/2, where the
// connection carries other calls too) the coalescer flushes every write,
// as the proxy asks.

// watchedConn is an upstream connection that tells the call reading it
// (its owner) when a read is about to wait for the upstream.
type watchedConn struct {
	net.Conn
	raw   syscall.RawConn
	owner atomic.Pointer[coalescer]

	// The read in progress, for readRaw, which is made into readFn once
	// so that a read allocates nothing: the transport reads a connection
	// from one goroutine at a time.
	p       []byte
	n       int
	rerr    error
	flushed bool
	reader  *coalescer // the owner when the read began
	readFn  func(fd uintptr) bool
}

// newWatchedConn watches c, whose raw connection is raw.
func newWatchedConn(c net.Conn, raw syscall.RawConn) *watchedConn {
	wc := &watchedConn{Conn: c, raw: raw}
	wc.readFn = wc.readRaw
	return wc
}

// Read reads as net.Conn's Read does; when the connection has no bytes to
// give and the read is about to wait, it first flushes what its owner has
// written to its client.
func (c *watchedConn) Read(p []byte) (int, error) {
	owner := c.owner.Load()
	if owner == nil || len(p) == 0 {
		return c.Conn.Read(p)
	}
	c.p, c.reader, c.flushed = p, owner, false
	err := c.raw.Read(c.readFn)
	n, rerr, flushed := c.n, c.rerr, c.flushed
	c.p, c.reader, c.rerr = nil, nil, nil
	if flushed {
		owner.readDone()
	}
	switch {
	case err != nil: // the deadline passed, or the connection was closed
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
		return 0, &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	case n <= 0:
		return 0, io.EOF
	}
	return n, nil
}

// readRaw reads the connection's descriptor into p, without waiting; when
// there is nothing to read it flushes the owner's writes (once a read)
// and asks to wait.
func (c *watchedConn) readRaw(fd uintptr) bool {
	for {
		c.n, c.rerr = readFD(fd, c.p)
		if c.rerr != syscall.EINTR {
			break
		}
	}
	if c.rerr == syscall.EAGAIN {
		if !c.flushed {
			c.flushed = true
			c.reader.flushPending()
		}
		return false // wait until there is something to read
	}
	return true
}

// coalescer is the ResponseWriter a streamed call's answer is proxied
// through (see the top of this file).
type coalescer struct {
	http.ResponseWriter
	mu      sync.Mutex
	conn    *watchedConn // the upstream connection that tells when to flush; nil: flush every write
	pending bool         // written since the last flush
	waiting bool         // a read of conn waits for the upstream: a flush cannot wait for it
	done    bool         // the proxy is done with the answer
}

// trace attaches c to the upstream connection its call gets.
func (c *coalescer) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { c.attach(info.Conn) }}
}

func (c *coalescer) attach(conn net.Conn) {
	if tc, ok := conn.(*tls.Conn); ok {
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			conn = nil // the connection's reads are every call's
		} else {
			conn = tc.NetConn()
		}
	}
	wc, _ := conn.(*watchedConn)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil { // a retry on another connection
		c.conn.owner.CompareAndSwap(c, nil)
	}
	c.conn = wc
	if wc != nil {
		wc.owner.Store(c)
	}
}

func (c *coalescer) WriteHeader(status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ResponseWriter.WriteHeader(status)
}

func (c *coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ResponseWriter.Write(p)
}

// Flush flushes at once without a watched connection; with one, it leaves
// the flush to the moment the connection's next read would wait, unless a
// read waits already (the proxy's first flush, of the answer's head, comes
// from a timer while the proxy waits for the body).
func (c *coalescer) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && !c.waiting {
		c.pending = true
		return
	}
	_ = http.NewResponseController(c.ResponseWriter).Flush()
}

// flushPending flushes what was written since the last flush, unless the
// proxy is done with the answer (the server then writes it), as a read of
// the connection is about to wait; until readDone, flushes are not
// deferred.
func (c *coalescer) flushPending() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting = true
	if c.pending && !c.done {
		c.pending = false
		_ = http.NewResponseController(c.ResponseWriter).Flush()
	}
}

// readDone notes that the read that waited has returned.
func (c *coalescer) readDone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting = false
}

// finish ends the coalescer's use of its connection, once the proxy is
// done with the answer. What waits is left to the server, which writes it
// with the answer's end, unless the proxy aborted the answer (the upstream
// broke off, say): it goes to the client now, before the connection is
// closed.
func (c *coalescer) finish(aborted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if aborted && c.pending {
		_ = http.NewResponseController(c.ResponseWriter).Flush()
	}
	c.pending, c.done = false, true
	if c.conn != nil {
		c.conn.owner.CompareAndSwap(c, nil)
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (c *coalescer) Unwrap() http.ResponseWriter { return c.ResponseWriter }
