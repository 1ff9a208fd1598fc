package bulkhead

import (
	"time"

	"github.com/llmbulkhead/bulkhead/dedup"
	"github.com/llmbulkhead/bulkhead/internal/seam"
)

// SetDedupHash replaces b's dedup digest, for tests that force collisions.
func SetDedupHash(b *Bulkhead, h func(scope, class, key string) uint64) {
	b.dedup.hash = func(k dedup.Key) uint64 { return h(k.Scope, k.Class, k.Canon) }
	b.dedup.hashBytes = nil
}

// CanonicalKey is the default dedup key of r.
func CanonicalKey(r *Request) string { return string(appendCanonical(nil, r)) }

// Unshareable reports whether followers cannot share v without ShareResult.
func Unshareable(v any) bool { return unshareable(v) }

// SetRateWaitHook sets the hook the engine calls once a paced call's timer
// is armed (for its turn, or for a cool-down before it), with the time it
// will wait, for every bulkhead; nil removes it.
func SetRateWaitHook(f func(time.Duration)) { seam.SetPark(f) }
