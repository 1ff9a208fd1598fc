package dedup_test

import (
	"fmt"

	"github.com/llmbulkhead/bulkhead/dedup"
)

// The table's digest: equal keys have equal digests, a key in another
// scope or class another one, and NewHashBytes gives the same digest over
// the key laid out in one buffer.
func ExampleNewHash() {
	h := dedup.NewHash(42) // seeded at random once per process in the bulkhead
	a := dedup.Key{Scope: "tenant-1", Canon: "the request"}
	same := dedup.Key{Scope: "tenant-1", Canon: "the request"}
	b := dedup.Key{Scope: "tenant-2", Canon: "the request"}
	fmt.Println(h(a) == h(same), h(a) == h(b))
	flat := dedup.NewHashBytes(42)
	fmt.Println(flat([]byte("tenant-1\x00\x00the request")) == h(a))
	// Output:
	// true false
	// true
}
