package seam

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParkHook(t *testing.T) {
	Parked(time.Second) // unset: nothing to call
	var got []time.Duration
	SetPark(func(d time.Duration) { got = append(got, d) })
	Parked(time.Second)
	SetPark(nil)
	Parked(2 * time.Second)
	if len(got) != 1 || got[0] != time.Second {
		t.Fatalf("hook saw %v; want [1s]", got)
	}
}
