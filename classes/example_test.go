package classes_test

import (
	"fmt"

	"github.com/llmbulkhead/bulkhead/actor/admission"
	"github.com/llmbulkhead/bulkhead/classes"
)

// A Table decides a call's class checks from the global view it is given:
// here 4 slots, 2 of them the interactive class's floor, so batch may
// borrow at most the other 2.
func ExampleNew() {
	limits := admission.Limits{MaxConcurrent: 4}
	t, err := classes.New("Classes", admission.Classes{Default: "interactive", Limits: map[string]admission.ClassLimits{
		"interactive": {ProtectedConcurrent: 2},
		"batch":       {},
	}}, limits)
	if err != nil {
		panic(err)
	}
	batch, _ := t.Lookup("batch")
	inFlight := 0
	for range 3 {
		why, constraint := t.Check(batch, classes.Capacity{MaxConcurrent: 4, InFlight: inFlight}, 0)
		if why != admission.NoReason {
			fmt.Println("batch refused:", why, constraint)
			continue
		}
		res := t.Admit(batch, 0)
		inFlight++
		fmt.Println("batch admitted, borrowed a slot:", res.BorrowedConcurrency)
	}
	// Output:
	// batch admitted, borrowed a slot: true
	// batch admitted, borrowed a slot: true
	// batch refused: concurrency_limit admission_class_protection
}
