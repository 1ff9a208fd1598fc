package actor

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// mailbox is a protoactor Mailbox that allocates nothing per message.
//
// protoactor's default mailbox schedules itself with the method value
// m.processMessages, which allocates a closure every time the mailbox goes
// from idle to running: twice per acquire+release on the hot path. This one
// binds that closure once, at construction, and keeps both queues in one
// mutex-guarded ring. Its semantics are the default mailbox's: system
// messages first, suspension honoured, Throughput messages per turn.
type mailbox struct {
	mu   sync.Mutex
	user ring
	sys  ring

	userCount atomic.Int32
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
	m.process = m.processMessages
	return m
}

func (m *mailbox) PostUserMessage(msg any) {
	m.mu.Lock()
	m.user.push(msg)
	m.mu.Unlock()
	m.userCount.Add(1)
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

func (m *mailbox) UserMessageCount() int { return int(m.userCount.Load()) }

func (m *mailbox) schedule() {
	if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		m.dispatcher.Schedule(m.process)
	}
}

func (m *mailbox) processMessages() {
	for {
		m.run()
		m.status.Store(mailboxIdle)
		sys, user := m.sysCount.Load(), m.userCount.Load()
		if sys == 0 && (m.suspended.Load() || user == 0) {
			return
		}
		// Messages arrived after the loop ended: run again unless another
		// sender has already taken over.
		if !m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
			return
		}
	}
}

func (m *mailbox) pop(r *ring, count *atomic.Int32) any {
	m.mu.Lock()
	msg := r.pop()
	m.mu.Unlock()
	if msg != nil {
		count.Add(-1)
	}
	return msg
}

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
		if msg = m.pop(&m.sys, &m.sysCount); msg != nil {
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
		if msg = m.pop(&m.user, &m.userCount); msg == nil {
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
