package bulkhead

import (
	"context"
	"sync"

	"github.com/llmbulkhead/bulkhead/actor"
)

// AcquireFuture is the pending answer of AcquireAsync: for callers that send
// admission requests from an event loop or a scheduler and must not block.
type AcquireFuture struct {
	done <-chan struct{}
	r    *actor.AcquireRequest
	p    *Permit
	stop func() bool

	once  sync.Once
	res   *Permit
	err   error
	panic any
}

// Done returns a channel closed once the answer is in. It is safe to select
// on from many goroutines.
func (f *AcquireFuture) Done() <-chan struct{} { return f.done }

// Result waits for the answer and returns it: the Permit of an admission, or
// the rejection or validation error. It may be called any number of times.
// An admitted Permit must be released like one from Acquire, so call Result
// for every future that may admit.
func (f *AcquireFuture) Result() (*Permit, error) {
	<-f.done
	f.once.Do(func() {
		if f.r == nil {
			return // failed before it was sent; err is set
		}
		f.stop()
		f.panic = f.r.Panic
		if f.r.Err != nil {
			_, tag := callOf(f.r.Request)
			f.err = withTag(publicError(f.r.Err), tag)
			return
		}
		f.res = f.p
	})
	if f.panic != nil {
		panic(f.panic)
	}
	return f.res, f.err
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// AcquireAsync is Acquire without the wait: it returns at once with a
// future whose Done channel closes when the call is admitted or rejected.
// ctx cancels the wait in the queue, as for Acquire. Invalid input gives a
// future that is already done with the *ConfigError.
//
// A call that is not queued is decided before AcquireAsync returns, and a
// queued one when a release, a timeout or new limits let it through, on
// the goroutine that caused it; rate limits on the in-process store are
// checked in that same step. A paced call waits for its turn on a timer of
// the engine's; with a fleet pool or rate limits kept in Redis, the Redis
// calls run on a worker of the engine's, and the answer comes once they
// have. Result panics, on the goroutine that calls it, with the panic of
// code run for the call's checks (its context, a Redis hook), as Acquire
// does.
func (b *Bulkhead) AcquireAsync(ctx context.Context, req *Request, opts ...Option) *AcquireFuture {
	o := resolve(opts)
	r, p, err := b.prepare(ctx, req, &o, "AcquireAsync", b.eng.NewAsyncRequest)
	if err != nil {
		return &AcquireFuture{done: closedChan, err: err}
	}
	done, stop := b.eng.AcquireAsync(r)
	return &AcquireFuture{done: done, r: r, p: p, stop: stop}
}
