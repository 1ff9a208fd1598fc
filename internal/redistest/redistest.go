// Package redistest runs throwaway redis-server processes for tests: a
// standalone server or a small Redis Cluster, on free 127.0.0.1 ports, with
// persistence off, stopped when the test ends.
//
// When redis-server is not installed, the tests that need it are skipped,
// unless the CI environment variable is set: in CI a missing redis-server is
// a failure (scripts/test.sh installs it).
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 15 * time.Second

// Server is a redis-server child process listening on 127.0.0.1.
type Server struct {
	tb   testing.TB
	port int
	dir  string
	args []string // the command line, without the binary

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts a standalone redis-server on a free loopback port, with no
// persistence, waits until it answers PING, and stops it when tb ends. The
// extra arguments are appended to the command line, for example
// "--maxmemory", "10mb".
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return start(tb, binary(tb, "redis-server"), extra)
}

// TryStart is Start for tests that can run without Redis too: when
// redis-server is not installed and CI is not set, it logs that and returns
// nil instead of skipping the test. (When CI is set, a missing redis-server
// still fails the test.)
func TryStart(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") == "" {
		tb.Logf("redistest: redis-server is not installed; running without Redis")
		return nil
	}
	return Start(tb, extra...)
}

func start(tb testing.TB, bin string, extra []string) *Server {
	tb.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		s := newServer(tb, ports[0], extra)
		if lastErr = s.start(bin); lastErr == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("redistest: %v", lastErr)
	return nil
}

func newServer(tb testing.TB, port int, extra []string) *Server {
	dir := tb.TempDir()
	args := []string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
	}
	return &Server{tb: tb, port: port, dir: dir, args: append(args, extra...)}
}

// start runs the server and waits until it answers PING.
func (s *Server) start(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		reply, err := Do(s.Addr(), "PING")
		if err == nil && reply == "PONG" {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at startup: %s", s.port, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v (last: %q, %v): %s",
				s.port, startTimeout, reply, err, s.logTail())
		}
		time.Sleep(5 * time.Millisecond) // polling the server until it answers
	}
}

// Addr returns the server's address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// Stop kills the server, as a crash would, and waits until it has exited.
// It is safe to call more than once; the test's cleanup calls it too.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts a stopped server again on the same port. Its dataset is
// empty, unless a SAVE wrote a snapshot to its directory: then it starts
// from that snapshot, as a crashed server with RDB persistence would (and,
// for a cluster node, with its saved cluster configuration).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	if err := s.start(binary(s.tb, "redis-server")); err != nil {
		s.tb.Fatalf("redistest: restarting: %v", err)
	}
}

// Running reports whether the server process is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Do sends one command to the server and returns its reply (see Do).
func (s *Server) Do(args ...string) (string, error) { return Do(s.Addr(), args...) }

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// binary returns the path of the named Redis binary, or skips the test when
// it is not installed and the CI variable is not set (and fails it when CI
// is set).
func binary(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("redistest: %s is not installed, and CI=%q requires it (apt-get install redis-server): %v", name, os.Getenv("CI"), err)
		return ""
	}
	tb.Skipf("redistest: %s is not installed; skipping (set CI to make this a failure)", name)
	return ""
}

// freePorts returns n distinct TCP ports that are free on 127.0.0.1 now.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for len(ports) < n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		lns = append(lns, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		if port > 55535 {
			continue // a cluster bus port is port+10000 by default; stay clear
		}
		ports = append(ports, port)
	}
	return ports, nil
}

// Do sends one command to the Redis server at addr on a new connection and
// returns its reply as text: a status or bulk string as it is, an integer in
// decimal, nil as "", and an array as its elements joined by newlines. An
// error reply is returned as an error. It is meant for test setup and
// inspection (SCRIPT FLUSH, INFO, CLUSTER INFO), not for speed.
func Do(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("redistest: empty reply line")
	}
	switch body := line[1:]; line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", errors.New(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", err
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}
