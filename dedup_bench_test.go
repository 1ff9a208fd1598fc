package bulkhead

import (
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead/actor"
)

// BenchmarkDedupKey is the default dedup key alone, as a Run builds it: the
// call's parameters and the canonical encoding of the benchmarks' request (one user message of 224
// characters, MaxTokens 256) into a pooled buffer, and its seeded xxhash64.
func BenchmarkDedupKey(b *testing.B) {
	r := &Request{Messages: []Message{{Role: "user", Content: strings.Repeat("abcdefgh", 28)}}, MaxTokens: 256}
	d := newDeduper(DedupConfig{})
	ar, o := &actor.AcquireRequest{}, &callOptions{}
	b.ReportAllocs()
	for b.Loop() {
		_, _, buf := d.key(nil, r, ar, o, "")
		d.putBuffer(buf)
	}
}
