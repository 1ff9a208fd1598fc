// Package props_test holds bulkhead's property and soak tests: a model-based
// state machine of the whole public engine (SPEC section I) and a bounded
// soak under concurrency. They use only the public API.
package props_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when any test leaves a goroutine behind: after
// Close and a complete Drain no goroutine of a bulkhead may remain (F33, I3).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
