package actor

import (
	"sync/atomic"

	"github.com/llmbulkhead/bulkhead/internal/mpsc"
)

// mpscNode links one message into an mpscQueue. Messages on the hot path
// embed their own node (see mpsc.Queued), so posting them allocates
// nothing.
type mpscNode = mpsc.Node

// mpscQueue is an intrusive multi-producer, single-consumer FIFO queue
// (Dmitry Vyukov's node-based design). Push is wait-free: one atomic swap
// and one store. Pop is for the single consumer only. A node that Pop has
// returned is no longer referenced by the queue and may be pushed again.
type mpscQueue struct {
	head atomic.Pointer[mpscNode] // producers' end: the last node pushed
	_    [56]byte                 // keep the producers' line apart from the consumer's
	tail *mpscNode                // consumer's end: the next node to pop
	stub mpscNode
}

func (q *mpscQueue) init() {
	q.head.Store(&q.stub)
	q.tail = &q.stub
}

func (q *mpscQueue) push(n *mpscNode) {
	n.Next.Store(nil)
	prev := q.head.Swap(n)
	prev.Next.Store(n)
}

// pop returns the oldest message, or nil when the queue is empty or a push
// is halfway done (the caller tries again later).
func (q *mpscQueue) pop() any {
	tail := q.tail
	next := tail.Next.Load()
	if tail == &q.stub {
		if next == nil {
			return nil
		}
		q.tail = next
		tail = next
		next = next.Next.Load()
	}
	if next != nil {
		q.tail = next
		return q.take(tail)
	}
	if tail != q.head.Load() {
		return nil // a producer has swapped head but not linked yet
	}
	q.push(&q.stub)
	if next = tail.Next.Load(); next != nil {
		q.tail = next
		return q.take(tail)
	}
	return nil
}

// empty reports whether the queue holds nothing, not even a push halfway
// done. Consumer only.
func (q *mpscQueue) empty() bool {
	return q.tail.Next.Load() == nil && q.head.Load() == q.tail
}

func (q *mpscQueue) take(n *mpscNode) any {
	msg := n.Msg
	n.Msg = nil
	return msg
}
