package classes

import (
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/clock"
)

// parent spawns a LeaseActor as its child and forwards what the child tells
// it to expired.
type parent struct {
	clk     *clock.Mock
	child   *actor.PID
	tel     *Telemetry
	expired chan string
	ready   chan struct{}
}

func (p *parent) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		props, tel := NewLeaseActor[string]("bg", p.clk)
		p.child, p.tel = ctx.Spawn(props), tel
		close(p.ready)
	case *DeadlineExpired[string]:
		p.expired <- m.Class + "/" + m.Lease
	case *StartDeadline[string], *EndDeadline[string]:
		ctx.Send(p.child, m)
	}
}

func TestLeaseActorDeadlines(t *testing.T) {
	clk := clock.NewMock()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	p := &parent{clk: clk, expired: make(chan string, 4), ready: make(chan struct{})}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p },
		actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))))
	<-p.ready
	defer func() {
		sys.Root.Stop(pid)
		sys.Shutdown()
	}()

	t0 := clk.Now()
	sys.Root.Send(pid, &StartDeadline[string]{Lease: "a", At: t0.Add(10 * time.Millisecond)})
	sys.Root.Send(pid, &StartDeadline[string]{Lease: "b", At: t0.Add(10 * time.Millisecond)})
	sys.Root.Send(pid, &EndDeadline[string]{Lease: "b"})           // b ends first: never expires
	sys.Root.Send(pid, &StartDeadline[string]{Lease: "c", At: t0}) // due on arrival
	if got := <-p.expired; got != "bg/c" {
		t.Fatalf("first expiry = %s, want bg/c (due on arrival)", got)
	}
	clk.Add(9 * time.Millisecond)
	select {
	case got := <-p.expired:
		t.Fatalf("%s expired before its deadline", got)
	default:
	}
	clk.Add(time.Millisecond)
	if got := <-p.expired; got != "bg/a" {
		t.Fatalf("expiry = %s, want bg/a", got)
	}
	clk.Add(time.Second)
	select {
	case got := <-p.expired:
		t.Fatalf("%s expired after it ended or already expired", got)
	default:
	}
	want := admission.DeadlineStats{Started: 3, Expired: 2, Ended: 1}
	if got := p.tel.Snapshot(); got != want {
		t.Fatalf("telemetry = %+v, want %+v", got, want)
	}
}
