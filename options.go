package bulkhead

import (
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Option is a per-call choice for Acquire, AcquireAsync, Run and
// WouldAdmit, such as
// WithPriority(High). Options that make no sense for a method are an error
// there, not silently ignored.
type Option interface {
	apply(callOptions) callOptions
}

// callOptions is the resolved set of per-call options.
type callOptions struct {
	priority        Priority
	reservation     *Reservation
	queueTimeout    time.Duration
	hasQueueTimeout bool
	detail          bool
	class           string
	tag             string
	attempt         int

	// Run only.
	borrowedDeadline    time.Duration
	hasBorrowedDeadline bool
	mode                Mode
	hasMode             bool
	shadow              []Reason
	hasShadow           bool
	// shadowSet is the reasons to bypass, set by validate.
	shadowSet     admission.ReasonSet
	noDedup       bool
	dedupScope    string
	hasDedupScope bool
	dedupKey      string
	hasDedupKey   bool
}

func resolve(opts []Option) callOptions {
	var o callOptions
	for _, opt := range opts {
		if opt != nil {
			o = opt.apply(o)
		}
	}
	return o
}

// validate checks the options that a method takes, and resolves the
// reasons to bypass. method names the method for the error message.
func (o *callOptions) validate(method string, queueing bool) error {
	var err error
	if o.shadowSet, err = o.validateMode(method); err != nil {
		return err
	}
	if o.priority != Normal && o.priority != High {
		return invalidf("WithPriority", "unknown priority %d", o.priority)
	}
	if o.attempt < 0 {
		return invalidf("WithAttempt", "must be >= 0, got %d", o.attempt)
	}
	if o.tag != "" && !queueing {
		return invalidf("WithTag", "applies to calls that may be admitted, not %s", method)
	}
	if len(o.tag) > MaxTagLen {
		return invalidf("WithTag", "must be at most %d bytes, got %d", MaxTagLen, len(o.tag))
	}
	if o.hasQueueTimeout {
		if !queueing {
			return invalidf("WithQueueTimeout", "does not apply to %s", method)
		}
		if o.queueTimeout < 0 {
			return invalidf("WithQueueTimeout", "must be >= 0, got %v", o.queueTimeout)
		}
	}
	if o.detail && queueing {
		return invalidf("WithDetail", "applies to WouldAdmit only, not %s", method)
	}
	if o.noDedup && method != "Run" {
		return invalidf("NoDedup", "applies to Run only, not %s", method)
	}
	if o.hasDedupScope && method != "Run" {
		return invalidf("WithDedupScope", "applies to Run only, not %s", method)
	}
	if o.hasDedupKey && method != "Run" {
		return invalidf("WithDedupKey", "applies to Run only, not %s", method)
	}
	if o.hasBorrowedDeadline {
		if method != "Run" {
			return invalidf("WithBorrowedDeadline", "applies to Run only, not %s", method)
		}
		if o.borrowedDeadline < MinBorrowedDeadline || o.borrowedDeadline > MaxBorrowedDeadline {
			return invalidf("WithBorrowedDeadline", "must be in [%v, %v], got %v",
				MinBorrowedDeadline, MaxBorrowedDeadline, o.borrowedDeadline)
		}
	}
	return nil
}

type priorityOption Priority

func (p priorityOption) apply(o callOptions) callOptions {
	o.priority = Priority(p)
	return o
}

// WithPriority sets the call's priority. High calls may use the whole token
// budget; Normal calls (the default) may not use the high-priority reserve.
func WithPriority(p Priority) Option { return priorityOption(p) }

type reservationOption struct{ r Reservation }

func (r *reservationOption) apply(o callOptions) callOptions {
	o.reservation = &r.r
	return o
}

// WithReservation makes the call reserve exactly r instead of running the
// estimator. r.Reserved may be zero; when set it must equal r.Input +
// r.MaxOutput. A Reservation returned by Estimate round-trips. Without a
// token budget nothing is reserved, but r is still checked: a malformed
// one (a negative field, a Reserved that is not the sum, a sum that
// overflows) is a *ConfigError, as it would be with a budget.
func WithReservation(r Reservation) Option { return &reservationOption{r: r} }

type queueTimeoutOption time.Duration

func (d queueTimeoutOption) apply(o callOptions) callOptions {
	o.queueTimeout, o.hasQueueTimeout = time.Duration(d), true
	return o
}

// WithQueueTimeout bounds how long this call may wait in the queue,
// overriding Config.QueueTimeout. Zero waits until the context ends.
func WithQueueTimeout(d time.Duration) Option { return queueTimeoutOption(d) }

type detailOption struct{}

func (detailOption) apply(o callOptions) callOptions {
	o.detail = true
	return o
}

// WithDetail makes WouldAdmit return the capacity snapshot with every
// decision, admissions included.
func WithDetail() Option { return detailOption{} }

type classOption string

func (c classOption) apply(o callOptions) callOptions {
	o.class = string(c)
	return o
}

// WithClass puts the call in admission class name (see Config.Classes).
// Without it a call is in the default class. A name that is not in the
// class table, or any name on a bulkhead without classes, is an error.
func WithClass(name string) Option { return classOption(name) }

// The bounds of a borrowed-slot deadline.
const (
	MinBorrowedDeadline = time.Millisecond
	MaxBorrowedDeadline = (1<<31 - 1) * time.Millisecond
)

type borrowedDeadlineOption time.Duration

func (d borrowedDeadlineOption) apply(o callOptions) callOptions {
	o.borrowedDeadline, o.hasBorrowedDeadline = time.Duration(d), true
	return o
}

// WithBorrowedDeadline bounds how long a Run may keep a slot it borrowed
// from the classes' shared pool. When the deadline expires
// first, the slot is given back (abandoned, cause deadline), the callback's
// context is cancelled with a *BorrowedDeadlineError as its cause, and Run
// returns that error at once; the callback's later result is discarded but
// its tokens are still settled when it returns. An admission that did not
// borrow its slot is not affected. d must be within [MinBorrowedDeadline,
// MaxBorrowedDeadline], whether or not the call borrows. Run only.
func WithBorrowedDeadline(d time.Duration) Option { return borrowedDeadlineOption(d) }

type tagOption string

func (t tagOption) apply(o callOptions) callOptions {
	o.tag = string(t)
	return o
}

// MaxTagLen is the longest tag WithTag accepts, in bytes.
const MaxTagLen = 256

// WithTag labels the call with tag, such as a request ID or a tenant: it is
// carried on every event of the call, on its rejection (RejectedError.Tag,
// and the error's message) and by its Permit. At most MaxTagLen bytes. For
// Acquire, AcquireAsync and Run; WouldAdmit has nothing to carry it.
func WithTag(tag string) Option { return tagOption(tag) }

type attemptOption int

func (n attemptOption) apply(o callOptions) callOptions {
	o.attempt = int(n)
	return o
}

// WithAttempt says which attempt of a call this is: 0 for the first (the
// default), 1 for its first retry, and so on, as the official OpenAI and
// Anthropic SDKs count in the X-Stainless-Retry-Count header. A retry is
// admitted only while its retry budget has room (see Config.RetryBudgets),
// and in the queue first attempts go ahead of it for a while (see
// QueuePolicy.RetryAging); events carry the number (Admission.Attempt). A
// negative n is a *ConfigError. For Acquire, AcquireAsync, Run and
// WouldAdmit.
func WithAttempt(n int) Option { return attemptOption(n) }
