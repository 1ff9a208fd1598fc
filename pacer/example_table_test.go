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

// An owner whose paced calls may not go at their turns (the provider asked
// for a pause) gives the turns back and books the calls again, in their
// order, once they may go: they take the turns from then on, not after the
// ones they gave back.
func ExampleTable_Rewind() {
	t := pacer.NewTable()
	p, err := pacer.New(t, pacer.Options{Name: "api", QPS: 10})
	if err != nil {
		panic(err)
	}
	start := time.Unix(1723075200, 0)
	t.SetTime(start)
	var turns []time.Time
	for range 20 {
		out, _ := p.Pace(context.Background(), "gpt-4o", 1) // 0, 100ms, ..., 1.9s
		turns = append(turns, start.Add(out.Delay))
	}
	// At 50ms a pause of 1s: the calls waiting for turns 1 to 19 give them
	// back, and book again once it is over.
	t.SetTime(start.Add(50 * time.Millisecond))
	t.Rewind("api", "gpt-4o", turns[1])
	end := start.Add(1050 * time.Millisecond)
	t.SetTime(end)
	for i := 1; i <= 3; i++ {
		out, _ := p.Pace(context.Background(), "gpt-4o", 1)
		fmt.Printf("call %d: %v after the pause\n", i, out.Delay)
	}
	// Output:
	// call 1: 0s after the pause
	// call 2: 100ms after the pause
	// call 3: 200ms after the pause
}
