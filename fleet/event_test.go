package fleet

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// eventLog records the events a pool reports.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// count returns the events of each kind, and fails t on an event of
// another pool.
func (l *eventLog) count(t *testing.T, pool string) map[EventKind]int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[EventKind]int{}
	for _, e := range l.events {
		if e.Pool != pool {
			t.Fatalf("an event of pool %q; want %q", e.Pool, pool)
		}
		n[e.Kind]++
	}
	return n
}

// TestPoolReportsEvents: the state changes a pool logs reach OnEvent too,
// each once, with the pool's name: the breaker opening when Redis goes
// away, the live holds' leases lapsing meanwhile; once Redis is back
// (empty), the breaker closing, the state found lost, the live hold
// registered again and the leases restored.
func TestPoolReportsEvents(t *testing.T) {
	srv, client := startRedis(t)
	cfg := faultConfig(client)
	cfg.OnFailure = FailOpen
	clk := clock.NewMock()
	cfg.Clock = clk
	var events eventLog
	cfg.OnEvent = events.add
	p := mustPool(t, cfg)
	reserveOK(t, p, idn(1), Hold{1, 10}, false)
	if n := events.count(t, cfg.Pool); len(n) != 0 {
		t.Fatalf("events before any change: %v", n)
	}
	srv.Stop()
	openBreaker(t, p)
	clk.Add(cfg.LeaseTTL) // the renewals fail meanwhile
	p.Reserve(bg, idn(2), Hold{1, 10}, false)
	if n := events.count(t, cfg.Pool); fmt.Sprint(n) != fmt.Sprint(map[EventKind]int{BreakerOpened: 1, LeasesLapsed: 1}) {
		t.Fatalf("events during the outage: %v; want the breaker opened and the leases lapsed, once each", n)
	}
	srv.Restart()
	poll(t, 5*time.Second, "the live holds registered again", func() bool {
		clk.Add(cfg.BreakerCooldown) // the renewer's next attempt
		st := p.Stats()
		return st.Unaccounted == 0 && !st.BreakerOpen && !p.lapsedNow()
	})
	n := events.count(t, cfg.Pool)
	for _, k := range EventKinds() {
		if n[k] != 1 {
			t.Errorf("%d %s events; want 1 (all: %v)", n[k], k, n)
		}
	}
}

// lapsedNow reports whether the pool refuses reserves for lapsed leases.
func (p *Pool) lapsedNow() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lapsed
}

func TestEventKindNames(t *testing.T) {
	var names []string
	for _, k := range EventKinds() {
		names = append(names, k.String())
	}
	if got := fmt.Sprint(names); got != "[state_lost breaker_opened breaker_closed leases_lapsed leases_restored hold_reinstated]" {
		t.Fatalf("names %s", got)
	}
	if s := EventKind(0).String(); s != "EventKind(0)" {
		t.Fatalf("the zero kind: %s", s)
	}
}
