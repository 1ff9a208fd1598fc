package actor

import (
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// The two ways a synchronous facade can wait for an actor's answer, on the
// smallest admission actor (a counter of calls in flight) run as the
// engine runs its own, on protoactor's synchronized dispatcher: a
// protoactor future (RequestFuture, Respond, Result), and what the facade
// does, a pooled request that carries a one-shot reply channel (Send, and a
// select on the reply and the engine's stop). One op is an acquire that
// waits for its answer and a fire-and-forget release. docs/design.md quotes
// the figures.

// probeAcquire asks the probe actor for a slot: answered on reply, or by
// Respond when reply is nil.
type probeAcquire struct{ reply chan bool }

type probeRelease struct{}

// Shared, immutable messages: the future path allocates no message.
var (
	askByFuture  = &probeAcquire{}
	releaseProbe = &probeRelease{}
)

type probeActor struct{ inUse, limit int }

func (p *probeActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *probeAcquire:
		ok := p.inUse < p.limit
		if ok {
			p.inUse++
		}
		if m.reply == nil {
			ctx.Respond(ok)
			return
		}
		m.reply <- ok
	case *probeRelease:
		p.inUse--
	}
}

// BenchmarkReplyPath measures an acquire and a release through the probe
// actor, from one goroutine and from 64, by a protoactor future and by a
// pooled reply channel.
func BenchmarkReplyPath(b *testing.B) {
	for _, g := range []int{1, 64} {
		for _, path := range []string{"future", "reply-channel"} {
			b.Run(path+map[int]string{1: "-g1", 64: "-g64"}[g], func(b *testing.B) {
				sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
					return slog.New(slog.DiscardHandler)
				}), actor.WithDeadLetterRequestLogging(false))
				root := sys.Root
				pid := root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &probeActor{limit: 1 << 30} },
					actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))))
				stopped := make(chan struct{})
				defer func() {
					close(stopped)
					_ = root.PoisonFuture(pid).Wait()
					sys.Shutdown()
				}()
				pool := sync.Pool{New: func() any { return &probeAcquire{reply: make(chan bool, 1)} }}
				op := func() bool {
					v, err := root.RequestFuture(pid, askByFuture, 5*time.Second).Result()
					root.Send(pid, releaseProbe)
					return err == nil && v.(bool)
				}
				if path == "reply-channel" {
					op = func() bool {
						r := pool.Get().(*probeAcquire)
						root.Send(pid, r)
						var ok bool
						select {
						case ok = <-r.reply:
						case <-stopped:
							return false
						}
						pool.Put(r)
						root.Send(pid, releaseProbe)
						return ok
					}
				}
				b.ReportAllocs()
				if g == 1 {
					for b.Loop() {
						if !op() {
							b.Fatal("refused")
						}
					}
					return
				}
				b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if !op() {
							b.Error("refused")
							return
						}
					}
				})
			})
		}
	}
}
