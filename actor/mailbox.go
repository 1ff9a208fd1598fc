package actor

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/llmbulkhead/bulkhead/internal/mpsc"
)

// mailbox is a protoactor Mailbox that allocates nothing per message.
//
// protoactor's default mailbox schedules itself with the method value
// m.processMessages, which allocates a closure every time the mailbox goes
// from idle to running: twice per acquire+release on the hot path. This one
// binds that closure once, at construction.
//
// User messages go through a lock-free intrusive queue: the messages of the
// hot path (acquire requests, releases, cancellations) carry their own
// queue node, so posting them takes one atomic swap and no allocation, and
// 64 callers posting at once do not fight over a lock. System messages,
// which are rare, keep a mutex-guarded ring. Its semantics are the default
// mailbox's: system messages first, suspension honoured, Throughput
// messages per turn.
type mailbox struct {
	user mpscQueue
	mu   sync.Mutex
	sys  ring // system messages, guarded by mu

	sysCount  atomic.Int32
	status    atomic.Int32 // idle or running
	suspended atomic.Bool

	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	process    func()
}

const (
	mailboxIdle int32 = iota
	mailboxRunning
)

// newMailbox is an actor.MailboxProducer.
func newMailbox() actor.Mailbox {
	m := &mailbox{}
	m.user.init()
	m.process = m.processMessages
	return m
}

func (m *mailbox) PostUserMessage(msg any) {
	var n *mpscNode
	if q, ok := msg.(mpsc.Queued); ok {
		n = q.MailboxNode()
	} else {
		n = new(mpscNode)
	}
	n.Msg = msg
	m.user.push(n)
	m.schedule()
}

func (m *mailbox) PostSystemMessage(msg any) {
	m.mu.Lock()
	m.sys.push(msg)
	m.mu.Unlock()
	m.sysCount.Add(1)
	m.schedule()
}

func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker = invoker
	m.dispatcher = dispatcher
}

func (m *mailbox) Start() {}

// UserMessageCount reports 1 when user messages are waiting and 0 when none
// are: the queue keeps no count, so that posting takes no shared counter.
// Only protoactor's optional mailbox-length metric reads it.
func (m *mailbox) UserMessageCount() int {
	if m.user.head.Load() == &m.user.stub && m.user.stub.Next.Load() == nil {
		return 0
	}
	return 1
}

func (m *mailbox) schedule() {
	// Test before test-and-set: under contention the mailbox is nearly
	// always running, and a failed CAS costs as much as a successful one.
	// A sender that sees it running leaves its message to the runner,
	// which looks at the queue again after it goes idle.
	if m.status.Load() == mailboxIdle && m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		m.dispatcher.Schedule(m.process)
	}
}

func (m *mailbox) processMessages() {
	for {
		m.run()
		// Still the owner: note whether the queue is empty and where its
		// producers' end is, then go idle.
		head := m.user.head.Load()
		empty := m.user.empty()
		m.status.Store(mailboxIdle)
		// A sender whose schedule lost to this goroutine before it went
		// idle pushed first, so it shows here as a non-empty queue or a
		// moved head: its message is still ours to run. A later sender
		// finds the mailbox idle and runs it itself.
		if m.sysCount.Load() == 0 && (m.suspended.Load() || (empty && m.user.head.Load() == head)) {
			return
		}
		if !m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
			return // another sender has taken over
		}
	}
}

func (m *mailbox) popSystem() any {
	if m.sysCount.Load() == 0 {
		return nil
	}
	m.mu.Lock()
	msg := m.sys.pop()
	m.mu.Unlock()
	if msg != nil {
		m.sysCount.Add(-1)
	}
	return msg
}

func (m *mailbox) popUser() any { return m.user.pop() }

func (m *mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	throughput := m.dispatcher.Throughput()
	for i := 0; ; i++ {
		if i > throughput {
			i = 0
			runtime.Gosched()
		}
		if msg = m.popSystem(); msg != nil {
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			continue
		}
		if m.suspended.Load() {
			return
		}
		if msg = m.popUser(); msg == nil {
			return
		}
		m.invoker.InvokeUserMessage(msg)
	}
}

// ring is a growable FIFO ring buffer. Its length is a power of two.
type ring struct {
	buf  []any
	head int
	n    int
}

func (r *ring) push(v any) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

func (r *ring) pop() any {
	if r.n == 0 {
		return nil
	}
	v := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return v
}

func (r *ring) grow() {
	size := 2 * len(r.buf)
	if size == 0 {
		size = 16
	}
	buf := make([]any, size)
	for i := 0; i < r.n; i++ {
		buf[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf, r.head = buf, 0
}
