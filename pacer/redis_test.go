package pacer

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

// TestRedisKeyLayout checks the key name, the stored fields and the TTL.
func TestRedisKeyLayout(t *testing.T) {
	srv, client := startRedis(t)
	clk := newManualClock(startEpoch)
	store := newRedisStore(t, client, RedisOptions{Prefix: "app:", Clock: clk})
	p := mustNew(t, store, Options{Name: "rpm", QPS: 10})
	if got, want := store.Key("rpm", "gpt-4o"), "app:rpm:{gpt-4o}#us1"; got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
	if _, err := p.Pace(bg, "gpt-4o", 1); err != nil {
		t.Fatal(err)
	}
	keys, err := srv.Do("KEYS", "*")
	if err != nil || keys != "app:rpm:{gpt-4o}#us1" {
		t.Fatalf("keys %q, %v", keys, err)
	}
	now := startEpoch.UnixMicro()
	st, ok := redisState(t, client, "app:rpm:{gpt-4o}#us1")
	want := state{level: 0, last: now, next: now + 100_000, exp: now + 100_000 + graceUs}
	if !ok || st != want {
		t.Fatalf("state %+v, want %+v", st, want)
	}
	// TTL: the queue (100 ms) plus 120 s, plus the second Redis keeps the key
	// past its logical expiry.
	pttl, err := client.PTTL(bg, "app:rpm:{gpt-4o}#us1").Result()
	if err != nil || pttl <= 121*time.Second || pttl > 121100*time.Millisecond {
		t.Fatalf("PTTL %v, %v; want just under 121.1 s", pttl, err)
	}
	// Upstream's TTL example: qps 1, maxBurst 100, pace: 200 s to drain.
	q := mustNew(t, store, Options{Name: "big", QPS: 1, MaxBurst: 100})
	if _, err := q.Pace(bg, "k", 1); err != nil {
		t.Fatal(err)
	}
	pttl, _ = client.PTTL(bg, store.Key("big", "k")).Result()
	if pttl <= 320*time.Second || pttl > 321*time.Second {
		t.Fatalf("PTTL %v; want 320-321 s", pttl)
	}
	// A rejected RateLimit writes nothing, not even the TTL.
	before, _ := client.PTTL(bg, "app:rpm:{gpt-4o}#us1").Result()
	if out, err := p.RateLimit(bg, "gpt-4o", 1); err != nil || out.Delay != 100*time.Millisecond {
		t.Fatalf("RateLimit: %+v, %v", out, err)
	}
	if st2, _ := redisState(t, client, "app:rpm:{gpt-4o}#us1"); st2 != want {
		t.Fatalf("a rejected call changed the state: %+v", st2)
	}
	after, _ := client.PTTL(bg, "app:rpm:{gpt-4o}#us1").Result()
	if after > before {
		t.Fatalf("a rejected call refreshed the TTL: %v -> %v", before, after)
	}
}

// commandCalls returns how many times the server ran cmd (INFO commandstats).
func commandCalls(t *testing.T, srv *redistest.Server, cmd string) int {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestRedisRunsByHash checks that decisions run by digest (EVALSHA), that the
// script is sent (EVAL) only when the server lacks it, and that a flushed
// script cache is survived.
func TestRedisRunsByHash(t *testing.T) {
	srv, client := startRedis(t)
	store := newRedisStore(t, client, RedisOptions{})
	p := mustNew(t, store, Options{Name: "p", QPS: 1000})
	for i := 0; i < 10; i++ {
		if _, err := p.Pace(bg, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := commandCalls(t, srv, "eval"); got != 1 {
		t.Errorf("EVAL ran %d times for 10 calls on a cold cache, want 1", got)
	}
	if got := commandCalls(t, srv, "evalsha"); got != 10 {
		t.Errorf("EVALSHA ran %d times, want 10 (1 NOSCRIPT + 9)", got)
	}
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if _, err := p.RateLimit(bg, "k", 1); err != nil {
			t.Fatalf("after SCRIPT FLUSH: %v", err)
		}
	}
	if got := commandCalls(t, srv, "eval"); got != 2 {
		t.Errorf("EVAL ran %d times after a flush, want 2", got)
	}
	// Preload makes the first call run by digest.
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := store.Preload(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pace(bg, "k", 1); err != nil {
		t.Fatal(err)
	}
	if got := commandCalls(t, srv, "eval"); got != 2 {
		t.Errorf("EVAL ran after Preload")
	}
}

// TestRedisServerClock checks that, by default, decisions take time from the
// Redis server, so clients whose clocks disagree by minutes still agree.
func TestRedisServerClock(t *testing.T) {
	_, client := startRedis(t)
	prefix := uniquePrefix(t)
	// Two "processes" whose clocks are an hour apart: with their clocks the
	// second would see the first's booking as long gone (or an hour away).
	ahead := newManualClock(time.Now().Add(time.Hour))
	sA := newRedisStore(t, client, RedisOptions{Prefix: prefix})
	sB := newRedisStore(t, client, RedisOptions{Prefix: prefix})
	pA := mustNew(t, sA, Options{Name: "p", QPS: 1})
	pB := mustNew(t, sB, Options{Name: "p", QPS: 1})
	if out, err := pA.Pace(bg, "k", 1); err != nil || out.Delay != 0 {
		t.Fatalf("A: %+v, %v", out, err)
	}
	out, err := pB.RateLimit(bg, "k", 1)
	if err != nil || out.Delay < 900*time.Millisecond || out.Delay > time.Second {
		t.Fatalf("B: %+v, %v; want a delay just under 1 s", out, err)
	}

	// With client clocks an hour apart, the same calls disagree: the client
	// that is ahead sees the other's booking as long past, and goes at once.
	// (The other way round, the per-key clock never runs backwards, so a
	// client behind is decided as at the last call instead of an hour early.)
	prefix = uniquePrefix(t)
	cA := newRedisStore(t, client, RedisOptions{Prefix: prefix, Clock: ahead})
	cB := newRedisStore(t, client, RedisOptions{Prefix: prefix, Clock: newManualClock(time.Now())})
	if _, err := mustNew(t, cB, Options{Name: "p", QPS: 1}).Pace(bg, "k", 1); err != nil {
		t.Fatal(err)
	}
	out, _ = mustNew(t, cA, Options{Name: "p", QPS: 1}).RateLimit(bg, "k", 1)
	if out.Delay != 0 {
		t.Fatalf("client clocks: delay %v, want 0 (the skew lets the call through)", out.Delay)
	}
}

// dropProxy is a TCP proxy in front of a Redis server that can lose one
// reply: when armed, it closes the client's connection instead of passing on
// the next array reply (the script's), after the server has run the command.
type dropProxy struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped atomic.Int32
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *dropProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { // client -> server
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			s.Close()
		}()
		go func() { // server -> client, dropping an armed array reply
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if bytes.HasPrefix(buf[:n], []byte("*")) && p.armed.CompareAndSwap(true, false) {
						p.dropped.Add(1)
						return // the reply is lost with the connection
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (p *dropProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestRedisDecisionIsNotRetried checks that a decision whose reply is lost
// is reported as a failure and not run again, even on a client configured to
// retry, and that without that precaution go-redis would run it twice.
func TestRedisDecisionIsNotRetried(t *testing.T) {
	srv, _ := startRedis(t)
	proxy := newDropProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), MaxRetries: 5, Protocol: 2})
	t.Cleanup(func() { client.Close() })
	clk := newManualClock(startEpoch)
	store := newRedisStore(t, client, RedisOptions{Clock: clk})
	if err := store.Preload(bg); err != nil {
		t.Fatal(err)
	}
	p := mustNew(t, store, Options{Name: "p", QPS: 10})
	if _, err := p.Pace(bg, "k", 1); err != nil { // books the slot at +100 ms
		t.Fatal(err)
	}
	proxy.armed.Store(true)
	_, err := p.Pace(bg, "k", 1) // runs (books +200 ms), reply lost
	if !errors.Is(err, ErrUnavailable) || proxy.dropped.Load() != 1 {
		t.Fatalf("Pace with a lost reply: %v (dropped %d)", err, proxy.dropped.Load())
	}
	out, err := p.RateLimit(bg, "k", 1)
	if err != nil || out.Delay != 200*time.Millisecond {
		t.Fatalf("next slot in %v, %v; want 200ms (the lost call ran exactly once)", out.Delay, err)
	}

	// The control: the same script through go-redis's own Script.Run is
	// retried after the lost reply, and books twice.
	script := redis.NewScript(luaSource)
	now := strconv.FormatInt(startEpoch.UnixMicro(), 10)
	proxy.armed.Store(true)
	res, err := script.Run(bg, client, []string{store.Key("p", "k")}, now, "1", "10", "0", "0.5", strconv.FormatInt(horizonUs, 10), "0").Slice()
	if err != nil || proxy.dropped.Load() != 2 {
		t.Fatalf("control: %v, %v (dropped %d)", res, err, proxy.dropped.Load())
	}
	if res[1] != int64(300_000) {
		t.Fatalf("control: the retried script returned delay %v µs, want 300000 (a second booking)", res[1])
	}
}
