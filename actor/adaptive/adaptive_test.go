package adaptive

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/clock"
)

// step is one recorded answer: the clock moves by after, then the sample
// is taken at the clock's time.
type step struct {
	after    time.Duration
	outcome  Outcome
	latency  time.Duration
	inFlight int
}

func ok(after, lat time.Duration, inFlight int) step {
	return step{after: after, outcome: Success, latency: lat, inFlight: inFlight}
}

func drop(after time.Duration, o Outcome, lat time.Duration) step {
	return step{after: after, outcome: o, latency: lat}
}

func aimd() Params {
	return Params{Rule: AIMD, Min: 1, Max: 10, Backoff: 0.5, Step: 1, Tolerance: 1.5, Smoothing: 0.2, Window: time.Second}
}

func run(p Params, start int, steps []step) []int {
	clk := clock.NewMock()
	c := New(p)
	limit := start
	var got []int
	for _, s := range steps {
		clk.Add(s.after)
		limit = c.Update(limit, Sample{At: clk.Now(), Outcome: s.outcome, Latency: s.latency, InFlight: s.inFlight})
		got = append(got, limit)
	}
	return got
}

func TestAIMD(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		p     Params
		start int
		steps []step
		want  []int
	}{
		{"successes at the limit add one each, up to Max", aimd(), 8, []step{
			ok(ms, 0, 8), ok(ms, 0, 9), ok(ms, 0, 10), ok(ms, 0, 10),
		}, []int{9, 10, 10, 10}},
		{"a success below half the limit holds", aimd(), 8, []step{
			ok(ms, 0, 3), ok(ms, 0, 4), ok(ms, 0, 0),
		}, []int{8, 9, 10}},
		{"a burst of 429s is one decrease", aimd(), 10, []step{
			drop(ms, RateLimited, 100*ms), drop(0, RateLimited, 100*ms), drop(ms, Overloaded, 100*ms), drop(10*ms, Timeout, 50*ms),
		}, []int{5, 5, 5, 5}},
		{"a drop of a call sent after the decrease, a window later, decreases again", aimd(), 10, []step{
			drop(ms, RateLimited, 100*ms), drop(time.Second, RateLimited, 500*ms), drop(time.Second, RateLimited, 2*time.Second),
		}, []int{5, 2, 2}},
		{"never below Min, at least one lower", Params{Rule: AIMD, Min: 2, Max: 10, Backoff: 0.9, Step: 1, Window: 0}, 4, []step{
			drop(ms, RateLimited, 0), drop(ms, RateLimited, 0), drop(ms, RateLimited, 0),
		}, []int{3, 2, 2}},
		{"successes sent before the decrease do not undo it", aimd(), 10, []step{
			drop(ms, RateLimited, 0), ok(ms, 100*ms, 10), ok(ms, ms/2, 5), ok(ms, 0, 5),
		}, []int{5, 5, 6, 7}},
		{"failed calls say nothing", aimd(), 6, []step{
			{after: ms, outcome: Failed, inFlight: 6}, {after: ms, outcome: Failed},
		}, []int{6, 6}},
		{"a step of 3", Params{Rule: AIMD, Min: 1, Max: 10, Backoff: 0.5, Step: 3}, 4, []step{
			ok(ms, 0, 4), ok(ms, 0, 4), ok(ms, 0, 10),
		}, []int{7, 10, 10}},
		{"a limit above Max comes back within bounds on the next move", aimd(), 40, []step{
			ok(ms, 0, 40),
		}, []int{10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(tt.p, tt.start, tt.steps); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("limits = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestGradient(t *testing.T) {
	ms := time.Millisecond
	p := Params{Rule: Gradient, Min: 2, Max: 40, Backoff: 0.5, Step: 1, Tolerance: 1.5, Smoothing: 0.2, Window: time.Second}
	steady := func(n int, lat time.Duration, inFlight int) []step {
		s := make([]step, n)
		for i := range s {
			s[i] = ok(10*ms, lat, inFlight)
		}
		return s
	}
	tests := []struct {
		name  string
		start int
		steps []step
		want  []int
	}{
		// Stable latency: the limit grows by 0.2*sqrt(limit) per answer.
		{"steady latency grows the limit", 16, steady(6, 100*ms, 16), []int{16, 17, 18, 19, 20, 21}},
		// Latency trebles: the gradient falls to 0.5 and the limit with it.
		{"rising latency lowers the limit", 20, append(steady(10, 100*ms, 20), steady(6, 900*ms, 20)...),
			[]int{20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 27, 26, 24, 23, 21, 20}},
		{"a 429 is a drop", 20, []step{ok(ms, 100*ms, 20), drop(ms, RateLimited, 0), drop(0, Overloaded, 0)}, []int{20, 10, 10}},
		{"an answer without latency holds", 20, []step{ok(ms, 0, 20), ok(ms, 0, 20)}, []int{20, 20}},
		{"an idle limit holds", 20, steady(3, 100*ms, 5), []int{20, 20, 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(p, tt.start, tt.steps); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("limits = %v, want %v", got, tt.want)
			}
		})
	}
}

// A limit changed by someone else between two moves starts without the
// carry of the earlier moves.
func TestNextResyncs(t *testing.T) {
	c := New(Params{Rule: Gradient, Min: 1, Max: 100, Backoff: 0.5, Step: 1, Tolerance: 1, Smoothing: 1})
	m := Move{Kind: Steer, Scale: 1, Add: 0.6}
	if got := c.Next(10, m); got != 10 {
		t.Fatalf("Next = %d, want 10", got)
	}
	if got := c.Next(10, m); got != 11 { // 10.6 + 0.6
		t.Fatalf("Next with carry = %d, want 11", got)
	}
	if got := c.Next(30, m); got != 30 { // someone set 30: no carry
		t.Fatalf("Next after a resync = %d, want 30", got)
	}
	if got := c.Next(5, Move{}); got != 5 {
		t.Fatalf("Hold = %d, want 5", got)
	}
}

// The limit arithmetic never overflows, at the ends of int.
func TestNextExtremes(t *testing.T) {
	c := New(Params{Rule: AIMD, Min: 1, Max: math.MaxInt, Backoff: 0.5, Step: math.MaxInt})
	if got := c.Next(math.MaxInt-1, Move{Kind: Increase}); got != math.MaxInt {
		t.Fatalf("increase at the top = %d", got)
	}
	if got := c.Next(math.MaxInt, Move{Kind: Steer, Scale: 2, Add: 1e300}); got != math.MaxInt {
		t.Fatalf("steer at the top = %d", got)
	}
	if got := c.Next(math.MaxInt, Move{Kind: Decrease}); got != math.MaxInt/2+1 && got != math.MaxInt/2 {
		t.Fatalf("decrease from the top = %d", got)
	}
	if got := c.Next(1, Move{Kind: Decrease}); got != 1 {
		t.Fatalf("decrease at the bottom = %d", got)
	}
}

// With epochs, a call admitted before the last decrease is told apart
// without any latency.
func TestEpochs(t *testing.T) {
	clk := clock.NewMock()
	c := New(Params{Rule: AIMD, Min: 1, Max: 10, Backoff: 0.5, Step: 1, Window: time.Second})
	at := func(o Outcome, epoch uint64) Sample {
		clk.Add(2 * time.Second)
		return Sample{At: clk.Now(), Outcome: o, Epoch: epoch}
	}
	limit := 8
	var got []int
	for _, s := range []Sample{
		at(RateLimited, 1), // admitted before any decrease: decreases
		at(RateLimited, 1), // the same epoch: already answered
		at(Success, 1),     // sent under the old limit: holds
		at(Success, 2),     // sent under the new one: increases
		at(Overloaded, 2),  // decreases
		at(RateLimited, 3), // admitted after the second: decreases
	} {
		limit = c.Update(limit, s)
		got = append(got, limit)
	}
	if want := []int{4, 4, 4, 5, 2, 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("limits = %v, want %v", got, want)
	}
}
