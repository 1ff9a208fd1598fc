package sim_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/cmd/bulkhead/internal/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var epoch = time.Unix(0, 0)

func TestOrderAndTies(t *testing.T) {
	s := sim.New(epoch)
	var got []string
	at := func(name string) func() {
		return func() { got = append(got, name+"@"+s.Now().Sub(epoch).String()) }
	}
	s.AfterFunc(2*time.Second, at("b"))
	s.AfterFunc(time.Second, at("a"))
	s.AfterFunc(2*time.Second, at("c")) // same time as b: after it
	s.AfterFunc(-time.Second, at("now"))
	s.At(epoch.Add(time.Second), at("a2"))
	s.Run(nil)
	want := []string{"now@0s", "a@1s", "a2@1s", "b@2s", "c@2s"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if s.Steps() != 5 || s.Pending() != 0 {
		t.Fatalf("steps %d, pending %d", s.Steps(), s.Pending())
	}
}

func TestEventsScheduledWhileRunning(t *testing.T) {
	s := sim.New(epoch)
	var got []time.Duration
	s.AfterFunc(time.Second, func() {
		got = append(got, s.Now().Sub(epoch))
		s.AfterFunc(0, func() { got = append(got, s.Now().Sub(epoch)) })
		s.AfterFunc(time.Second, func() { got = append(got, s.Now().Sub(epoch)) })
	})
	s.AfterFunc(1500*time.Millisecond, func() { got = append(got, s.Now().Sub(epoch)) })
	after := 0
	s.Run(func() { after++ })
	want := []time.Duration{time.Second, time.Second, 1500 * time.Millisecond, 2 * time.Second}
	if len(got) != len(want) || after != 4 {
		t.Fatalf("got %v (after called %d times), want %v", got, after, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestStop(t *testing.T) {
	s := sim.New(epoch)
	fired := 0
	a := s.AfterFunc(time.Second, func() { fired++ })
	b := s.AfterFunc(2*time.Second, func() { fired += 10 })
	c := s.AfterFunc(3*time.Second, func() { fired += 100 })
	if a.C() != nil {
		t.Fatal("AfterFunc timer has a channel")
	}
	if !b.Stop() || b.Stop() {
		t.Fatal("Stop of a pending timer: want true, then false")
	}
	s.Run(nil)
	if fired != 101 {
		t.Fatalf("fired = %d, want 101 (the stopped timer did not run)", fired)
	}
	if a.Stop() || c.Stop() {
		t.Fatal("Stop of a fired timer = true")
	}
	if !s.Now().Equal(epoch.Add(3 * time.Second)) {
		t.Fatalf("now = %v", s.Now())
	}
}

func TestNewTimer(t *testing.T) {
	s := sim.New(epoch)
	tm := s.NewTimer(time.Minute)
	select {
	case <-tm.C():
		t.Fatal("timer fired before the simulation moved")
	default:
	}
	if !s.Step() {
		t.Fatal("no event")
	}
	select {
	case at := <-tm.C():
		if !at.Equal(epoch.Add(time.Minute)) {
			t.Fatalf("sent %v", at)
		}
	default:
		t.Fatal("timer did not send")
	}
	if tm.Stop() || s.Step() {
		t.Fatal("fired timer stopped, or an event left")
	}
	stopped := s.NewTimer(time.Second)
	if !stopped.Stop() || s.Pending() != 0 {
		t.Fatal("Stop left the timer queued")
	}
}

func TestDiscard(t *testing.T) {
	s := sim.New(epoch)
	ran := 0
	var late []bool
	a := s.AfterFunc(time.Second, func() {
		ran++
		s.Discard()
	})
	b := s.AfterFunc(2*time.Second, func() { ran++ })
	s.Run(nil)
	late = append(late, a.Stop(), b.Stop())
	if ran != 1 || s.Pending() != 0 || late[0] || late[1] {
		t.Fatalf("ran %d, pending %d, Stop after Discard %v", ran, s.Pending(), late)
	}
	s.AfterFunc(0, func() { ran++ })
	s.Run(nil)
	if ran != 2 {
		t.Fatal("a Sim does not run events scheduled after Discard")
	}
}
