// Package mpsc holds the queue node of the engine's mailboxes, so that the
// messages of every actor package can carry their own node and be posted
// without an allocation.
package mpsc

import "sync/atomic"

// Node links one message into a mailbox's queue. A message that embeds one
// returns it from its MailboxNode method (see Queued); the mailbox owns it
// while the message is queued.
type Node struct {
	Next atomic.Pointer[Node]
	Msg  any
}

// Queued is implemented by messages that carry their own Node. Such a
// message must not be posted again before it has been received.
type Queued interface {
	MailboxNode() *Node
}
