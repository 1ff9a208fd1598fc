// Package benchmarks measures bulkhead against plain baselines: a
// sync.Mutex counter and golang.org/x/sync/semaphore doing the same
// accept/release work, so every figure reads as a ratio. Run with
//
//	go test -run xxx -bench . ./benchmarks/
package benchmarks

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
