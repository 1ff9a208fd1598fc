package bulkhead

import (
	"time"

	"github.com/llmbulkhead/bulkhead/dedup"
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

// SetRateWaitHook sets the hook called once a paced call's timer is armed
// (for its turn, or for a cool-down before it), for the bulkheads created
// after; nil removes it.
func SetRateWaitHook(f func(time.Duration)) { testHookRateWait = f }
