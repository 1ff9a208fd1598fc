package pacer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/llmbulkhead/bulkhead/pacer"
)

// A Table is the store of a single owner that says what time it is, such as
// an event loop or a simulation: every decision is made at the time last set.
func ExampleNewTable() {
	t := pacer.NewTable()
	p, err := pacer.New(t, pacer.Options{Name: "api", QPS: 1, MaxBurst: 1})
	if err != nil {
		panic(err)
	}
	start := time.Unix(1723075200, 0)
	for _, at := range []time.Duration{0, 0, 0, 2 * time.Second} {
		t.SetTime(start.Add(at))
		out, _ := p.RateLimit(context.Background(), "tenant-1", 1)
		fmt.Printf("at %v: delay %v\n", at, out.Delay)
	}
	// Output:
	// at 0s: delay 0s
	// at 0s: delay 0s
	// at 0s: delay 1s
	// at 2s: delay 0s
}
