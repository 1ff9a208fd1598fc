package redistest

import (
	"testing"
)

// recordingTB records Skipf and Fatalf instead of ending the test.
type recordingTB struct {
	testing.TB
	skipped, failed bool
}

func (r *recordingTB) Helper()                 {}
func (r *recordingTB) Skipf(string, ...any)    { r.skipped = true }
func (r *recordingTB) Fatalf(string, ...any)   { r.failed = true }
func (r *recordingTB) Cleanup(func())          {}
func (r *recordingTB) TempDir() string         { return r.TB.TempDir() }
func (r *recordingTB) Logf(f string, a ...any) { r.TB.Logf(f, a...) }

// TestMissingBinary checks the rule for a missing redis-server: skip when
// CI is unset, fail when it is set.
func TestMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())

	t.Setenv("CI", "")
	r := &recordingTB{TB: t}
	binary(r, "redis-server")
	if !r.skipped || r.failed {
		t.Errorf("CI unset: skipped %v, failed %v; want a skip", r.skipped, r.failed)
	}

	t.Setenv("CI", "true")
	r = &recordingTB{TB: t}
	binary(r, "redis-server")
	if r.skipped || !r.failed {
		t.Errorf("CI=true: skipped %v, failed %v; want a failure", r.skipped, r.failed)
	}
}
