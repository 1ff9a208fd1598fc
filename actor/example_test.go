package actor_test

import (
	"context"
	"fmt"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The engine under the root package's facade, for a caller that sends
// admission messages itself: a pooled request in, a lease out.
func ExampleStart() {
	e, err := actor.Start(actor.Config{Limits: admission.Limits{MaxConcurrent: 1}})
	if err != nil {
		panic(err)
	}
	acquire := func() (*actor.Lease, error) {
		r := e.NewRequest()
		defer e.PutRequest(r)
		r.Ctx, r.Request, r.Lease = context.Background(), "a request", &actor.Lease{}
		return r.Lease, e.Acquire(r)
	}
	first, err := acquire()
	fmt.Println(err)
	_, err = acquire() // the one slot is taken, and there is no queue
	fmt.Println(err)
	first.Release(nil)
	fmt.Println(e.Stats().Admissions.Admitted, e.Stats().InFlight)

	e.Close()
	fmt.Println(e.Drain(context.Background()).Drained)
	// Output:
	// <nil>
	// bulkhead: rejected: concurrency_limit
	// 1 0
	// true
}
