package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A proc is a process the benchmark measures: a gateway, or nginx with its
// workers.
type proc struct {
	name string
	cmd  *exec.Cmd
	// pids lists the processes whose CPU and memory count: the process,
	// and for nginx its workers.
	pids func() []int
	// pprof is the address of the process's profiling endpoint, if it
	// has one.
	pprof string
}

// usage is what /proc says of a proc's processes: CPU time (user and
// system) and the sum of their peak resident set sizes since the last
// resetPeak.
type usage struct {
	cpu     time.Duration
	peakRSS int64 // bytes
}

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// Linux).
const clockTick = 10 * time.Millisecond

// usage reads the proc's CPU time and peak RSS.
func (p *proc) usage() usage {
	var u usage
	for _, pid := range p.pids() {
		u.cpu += cpuTime(pid)
		u.peakRSS += statusKB(pid, "VmHWM:") << 10
	}
	return u
}

// resetPeak restarts the peak RSS of the proc's processes from their
// current RSS.
func (p *proc) resetPeak() {
	for _, pid := range p.pids() {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
}

// cpuTime is the user and system time of process pid (all its threads,
// living or ended), from /proc/<pid>/stat.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name is in parentheses and may hold spaces: the fields
	// count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of the line
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(utime+stime) * clockTick
}

// machineCPU reads the machine's busy and total CPU time so far, in clock
// ticks, from /proc/stat (every process, this benchmark's and others').
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i < 8 { // guest time is counted in user already
			total += n
			if i != 3 && i != 4 {
				busy += n
			}
		}
	}
	return busy, total
}

// rss is the resident set size of the proc's processes now.
func (p *proc) rss() int64 {
	var n int64
	for _, pid := range p.pids() {
		n += statusKB(pid, "VmRSS:") << 10
	}
	return n
}

// statusKB reads a "kB" line of /proc/<pid>/status.
func statusKB(pid int, key string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), key); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// stop ends the proc's process (SIGTERM, then SIGKILL after 5 s).
func (p *proc) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// freePort returns a loopback address no one listens on.
func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitListening waits until addr accepts connections.
func waitListening(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not listening after %v: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gatewayConfig is the benchmark's gateway configuration: one route to
// the fake upstream through a bulkhead of limit calls at once, with a
// token budget that never binds (so that the meter reports as it would in
// production), and the request log as logMode says.
func gatewayConfig(listen, upstream string, limit, queue int, logMode string) string {
	return fmt.Sprintf(`listen: %q
log: {format: json, requests: %s}
upstreams:
  fake: {base_url: "http://%s"}
bulkheads:
  bench:
    model: gpt-4o-mini
    max_concurrent: %d
    max_queue: %d
    queue_timeout: 1s
    token_budget: 100000000
routes:
  - {api: openai-chat, upstream: fake, bulkhead: bench}
`, listen, logMode, upstream, limit, queue)
}

// startGateway runs the gateway command bin, as target name, with a
// configuration for the upstream; its output (the request log) goes to
// dir/<name>.out, with env in its environment. An empty bin runs the gateway in this benchmark's
// binary, with a profiling endpoint (see serveGatewayInProcess).
func startGateway(name, bin, dir, upstream string, limit, queue int, logMode string, env []string) (*proc, string, error) {
	addr := freePort()
	cfg := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfg, []byte(gatewayConfig(addr, upstream, limit, queue, logMode)), 0o600); err != nil {
		return nil, "", err
	}
	if bin == "" {
		pprof := freePort()
		p, err := launch(name, dir, addr, false, env, os.Args[0], "gateway-inproc", cfg, pprof)
		if p != nil {
			p.pprof = pprof
			fmt.Printf("%s: in process, profiling endpoint http://%s/debug/pprof/\n", name, pprof)
		}
		return p, addr, err
	}
	p, err := launch(name, dir, addr, false, env, bin, "gateway", "-config", cfg)
	return p, addr, err
}

// launch starts bin with args (and env added to this process's
// environment), its output in dir/<name>.out, and waits
// until it listens on addr. The proc counts the process, and its children
// too when withChildren is set (nginx's workers).
func launch(name, dir, addr string, withChildren bool, env []string, bin string, args ...string) (*proc, error) {
	out, err := os.Create(filepath.Join(dir, name+".out"))
	if err != nil {
		return nil, err
	}
	defer out.Close() // the process has its own
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	p := &proc{name: name, cmd: cmd, pids: func() []int { return []int{pid} }}
	if withChildren {
		p.pids = func() []int { return append([]int{pid}, children(pid)...) }
	}
	if err := waitListening(addr, 10*time.Second); err != nil {
		p.stop()
		b, _ := os.ReadFile(out.Name())
		return nil, fmt.Errorf("%s: %w: %s", name, err, b)
	}
	return p, nil
}

// nginxConfig is nginx as a plain reverse proxy to the upstream with
// limit_conn at limit (503 beyond it), keep-alive on both sides, no
// response buffering (streams pass event by event), two workers, and an
// access log line per request when logging.
func nginxConfig(dir, listen, upstream string, limit int, log bool) string {
	access := "access_log off;"
	if log {
		access = fmt.Sprintf("access_log %s/nginx.access.log;", dir)
	}
	user := ""
	if os.Geteuid() == 0 { // the workers write the access log in dir, which is root's
		user = "user root;"
	}
	return fmt.Sprintf(`%[6]s
worker_processes 2;
worker_rlimit_nofile 65536;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx.error.log warn;
events { worker_connections 16384; }
http {
  %[5]s
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  limit_conn_zone $server_addr zone=calls:1m;
  upstream fake {
    server %[3]s;
    keepalive 256;
    keepalive_requests 1000000;
  }
  server {
    listen %[2]s backlog=4096;
    location / {
      limit_conn calls %[4]d;
      limit_conn_status 503;
      proxy_pass http://fake;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
`, dir, listen, upstream, limit, access, user)
}

// serveGoProxy serves a bare httputil.ReverseProxy to upstream on ln, with
// keep-alive connections to it: the floor of a proxy in Go, against which
// the gateway's own work shows. Like the gateway it reads a request's body
// before sending it on (a body streamed from the client connection can
// outlive the handler in the transport, which then closes the upstream
// connection under the next call).
func serveGoProxy(ln net.Listener, upstream string) error {
	u, err := url.Parse("http://" + upstream)
	if err != nil {
		return err
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, Transport: t}
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(shedHeader) != "" {
			// The floor of a call a Go server answers itself: its body
			// read and discarded, a small JSON error written.
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"message":"overloaded","type":"service_unavailable_error","code":"server_is_overloaded"}}`)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		proxy.ServeHTTP(w, r)
	}))
}

// shedHeader asks the bare Go proxy to answer a call itself, 503, as the
// gateway answers a call it sheds: the floor of a shed call in Go.
const shedHeader = "X-Bench-Shed"

// nginxBinary finds nginx, "" when it is not installed.
func nginxBinary() string {
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	return ""
}

// startNginx runs nginx in front of the upstream.
func startNginx(bin, dir, upstream string, limit int, log bool) (*proc, string, error) {
	addr := freePort()
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(nginxConfig(dir, addr, upstream, limit, log)), 0o600); err != nil {
		return nil, "", err
	}
	p, err := launch("nginx", dir, addr, true, nil, bin, "-c", cfg, "-p", dir, "-e", filepath.Join(dir, "nginx.error.log"))
	return p, addr, err
}
