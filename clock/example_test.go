package clock_test

import (
	"fmt"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// A mock clock moves only when told to, and fires every timer due by then:
// a test of timeouts runs in no time and the same way every time.
func ExampleNewMock() {
	c := clock.NewMock()
	fired := make(chan time.Duration, 1)
	start := c.Now()
	c.AfterFunc(30*time.Second, func() { fired <- c.Now().Sub(start) })

	c.Add(10 * time.Second)
	select {
	case <-fired:
		fmt.Println("too early")
	default:
		fmt.Println("not yet")
	}
	c.Add(20 * time.Second)
	fmt.Println("fired after", <-fired)
	// Output:
	// not yet
	// fired after 30s
}
