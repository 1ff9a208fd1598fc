package actor

import (
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testMsg struct {
	producer, seq int
	node          mpscNode
}

func (m *testMsg) MailboxNode() *mpscNode { return &m.node }

// TestMPSCQueueKeepsEveryMessageInProducerOrder pushes from many
// goroutines while one consumer pops, and checks that nothing is lost or
// duplicated and each producer's messages come out in order.
func TestMPSCQueueKeepsEveryMessageInProducerOrder(t *testing.T) {
	const producers, perProducer = 8, 20000
	var q mpscQueue
	q.init()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				m := &testMsg{producer: p, seq: i}
				m.node.Msg = m
				q.push(&m.node)
			}
		}()
	}
	next := make([]int, producers)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	got, finished := 0, false
	for got < producers*perProducer {
		v := q.pop()
		if v == nil {
			if finished {
				// Producers are done: an empty pop now must mean empty.
				if v = q.pop(); v == nil {
					t.Fatalf("queue empty after %d of %d messages", got, producers*perProducer)
				}
			} else {
				select {
				case <-done:
					finished = true
				default:
				}
				continue
			}
		}
		m := v.(*testMsg)
		if m.seq != next[m.producer] {
			t.Fatalf("producer %d: got seq %d, want %d", m.producer, m.seq, next[m.producer])
		}
		next[m.producer]++
		got++
	}
	if v := q.pop(); v != nil {
		t.Fatalf("extra message %v", v)
	}
}

// TestMPSCNodeReuse pushes the same node again once it has been popped, as
// the engine does with pooled requests.
func TestMPSCNodeReuse(t *testing.T) {
	var q mpscQueue
	q.init()
	m := &testMsg{}
	for i := range 100 {
		m.seq = i
		m.node.Msg = m
		q.push(&m.node)
		if v := q.pop(); v != m {
			t.Fatalf("round %d: popped %v", i, v)
		}
		if v := q.pop(); v != nil {
			t.Fatalf("round %d: queue not empty", i)
		}
	}
}

func TestRingIsFIFOAcrossGrowth(t *testing.T) {
	var r ring
	want := 0
	for i := range 100 {
		r.push(i)
		if i%3 == 0 { // pop now and then, so the ring wraps before it grows
			if v := r.pop(); v != want {
				t.Fatalf("pop = %v, want %d", v, want)
			}
			want++
		}
	}
	for v := r.pop(); v != nil; v = r.pop() {
		if v != want {
			t.Fatalf("pop = %v, want %d", v, want)
		}
		want++
	}
	if want != 100 {
		t.Fatalf("popped %d values, want 100", want)
	}
}
