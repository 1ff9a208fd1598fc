package fleet

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/rediscall"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed prelude.lua
	preludeLua string
	//go:embed reserve.lua
	reserveLua string
	//go:embed release.lua
	releaseLua string
	//go:embed adjust.lua
	adjustLua string
	//go:embed renew.lua
	renewLua string
)

// The four scripts: each is the prelude followed by its operation.
var (
	reserveScript = redis.NewScript(preludeLua + reserveLua)
	releaseScript = redis.NewScript(preludeLua + releaseLua)
	adjustScript  = redis.NewScript(preludeLua + adjustLua)
	renewScript   = redis.NewScript(preludeLua + renewLua)
)

// The operations, for error counting.
type op uint8

const (
	opReserve op = iota
	opRelease
	opAdjust
	opRenew
	opGen
)

// The reserve script's codes.
const (
	codeAdmitted   = 1
	codeDuplicate  = 2
	codeSlots      = 0
	codeTokens     = -1
	codeReleased   = -2
	codeRelearning = -3
)

// The renew and adjust scripts' codes.
const (
	codeLost       = 0
	codeRenewed    = 1
	codeReinstated = 2
	codeTombstoned = -2
	codeApplied    = 1
	codeStale      = 2
)

// reply is a decoded script reply.
type reply struct {
	slots, tokens int64
	seen                // the pool's generation and write sequence
	now           int64 // µs, server time: the script's time
	reclaimed     int
	extra         []int64 // the operation's codes or counts
}

// seen is a pool's generation and the sequence of its last write, as a
// replica last saw them. Generations only grow, and so does the sequence
// within one, so a state older than one a replica has seen shows as a
// smaller pair. (A generation's number is the end of its relearn window,
// and the sequence is at least the time of the last write, both in µs of
// server time.)
type seen struct {
	gen, seq int64
}

// newer reports whether s is a later state of the pool than o.
func (s seen) newer(o seen) bool {
	return s.gen > o.gen || (s.gen == o.gen && s.seq > o.seq)
}

// entry is one hold's values in an adjust or renew.
type entry struct {
	id  ID
	h   Hold
	seq uint64
}

// store runs the pool's scripts: one Redis round trip per call, no state
// of its own.
type store struct {
	client   redis.UniversalClient
	keys     []string
	head     []any // ARGV[2..6]: ttl, tombstone, reclaim batch, relearn window, quiet
	timeout  time.Duration
	inline   bool // the client gives up at the context's deadline itself
	noScript func(op)
	// inflight counts the commands left running in the background by a
	// client that does not give up at the context's deadline.
	inflight sync.WaitGroup
}

func newStore(s *settings) *store {
	base := s.Prefix + "{" + s.Pool + "}:"
	return &store{
		client: s.Client,
		keys:   []string{base + "holds", base + "vals", base + "agg", base + "gone"},
		head: []any{
			strconv.FormatInt(s.LeaseTTL.Microseconds(), 10),
			strconv.FormatInt(s.tombstone.Microseconds(), 10),
			strconv.Itoa(s.ReclaimBatch),
			strconv.FormatInt(s.relearn.Microseconds(), 10),
			strconv.FormatInt(s.quiet.Microseconds(), 10),
		},
		timeout:  s.CallTimeout,
		inline:   rediscall.HonoursDeadline(s.Client),
		noScript: func(op) {},
	}
}

// args returns the ARGV of a script: the time override (0: Redis TIME), the
// common head, what the caller has seen of the pool, then room for n more.
// (The client writes int64 arguments in decimal.)
func (s *store) args(now int64, sn seen, n int) []any {
	a := make([]any, 0, 8+n)
	var t, g, q any = "", "", ""
	if now != 0 {
		t = now
	}
	if sn.gen != 0 {
		g, q = sn.gen, sn.seq
	}
	return append(append(append(a, t), s.head...), g, q)
}

// reserve takes id's hold, after releasing the holds of released.
func (s *store) reserve(ctx context.Context, now int64, sn seen, id ID, h Hold, slotLimit, tokenLimit int64, released []pendingRelease) (reply, error) {
	a := append(s.args(now, sn, 5+len(released)), id.String(), h.Slots, h.Tokens, slotLimit, tokenLimit)
	for _, r := range released {
		a = append(a, r.id.String())
	}
	return s.run(ctx, opReserve, reserveScript, a, 2)
}

func (s *store) release(ctx context.Context, now int64, sn seen, ids []ID) (reply, error) {
	a := s.args(now, sn, len(ids))
	for _, id := range ids {
		a = append(a, id.String())
	}
	return s.run(ctx, opRelease, releaseScript, a, 2)
}

func (s *store) adjust(ctx context.Context, now int64, sn seen, es []entry) (reply, error) {
	return s.run(ctx, opAdjust, adjustScript, appendEntries(s.args(now, sn, 4*len(es)), es), len(es))
}

func (s *store) renew(ctx context.Context, now int64, sn seen, reinstate bool, es []entry) (reply, error) {
	flag := "0"
	if reinstate {
		flag = "1"
	}
	a := appendEntries(append(s.args(now, sn, 1+4*len(es)), flag), es)
	return s.run(ctx, opRenew, renewScript, a, len(es))
}

func appendEntries(a []any, es []entry) []any {
	for _, e := range es {
		a = append(a, e.id.String(), e.h.Slots, e.h.Tokens, strconv.FormatUint(e.seq, 10))
	}
	return a
}

// poolState is what a generation check reads of the pool's state.
type poolState struct {
	seen // zero when the pool has none (new, or Redis lost it)
	// blind: the scripts could not read the server's identity (INFO is
	// not allowed to them), so they cannot tell a restarted or replaced
	// server by it.
	blind bool
}

// state reads the pool's generation, write sequence and server.
func (s *store) state(ctx context.Context) (poolState, error) {
	return bounded(s, ctx, func(ctx context.Context) (poolState, error) {
		v, err := s.client.HMGet(ctx, s.keys[2], "gen", "seq", "srv").Result()
		if err != nil {
			return poolState{}, err
		}
		var ps poolState
		if g, ok := v[0].(string); ok {
			ps.gen, _ = strconv.ParseInt(g, 10, 64)
		}
		if q, ok := v[1].(string); ok {
			ps.seq, _ = strconv.ParseInt(q, 10, 64)
		}
		ps.blind = v[2] == ""
		return ps, nil
	})
}

// errReply is the error of a reply the scripts cannot have sent.
var errReply = errors.New("fleet: unexpected reply from the Redis script")

// run runs a script, by digest and in full when the server lacks it, and
// decodes its reply, which must carry want extra values.
func (s *store) run(ctx context.Context, o op, sc *redis.Script, args []any, want int) (reply, error) {
	vals, err := bounded(s, ctx, func(ctx context.Context) ([]any, error) {
		cmd := sc.EvalSha(ctx, s.client, s.keys, args...)
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			s.noScript(o)
			cmd = sc.Eval(ctx, s.client, s.keys, args...)
		}
		return cmd.Slice()
	})
	if err != nil {
		return reply{}, err
	}
	r, ok := decode(vals, want)
	if !ok {
		return r, fmt.Errorf("%w: %v", errReply, vals)
	}
	return r, nil
}

// replyHead is the number of values every reply starts with.
const replyHead = 6

func decode(vals []any, want int) (reply, bool) {
	if len(vals) != replyHead+want {
		return reply{}, false
	}
	var head [replyHead]int64
	for i := range head {
		v, isInt := vals[i].(int64)
		if !isInt {
			return reply{}, false
		}
		head[i] = v
	}
	r := reply{slots: head[0], tokens: head[1], seen: seen{head[2], head[3]},
		now: head[4], reclaimed: int(head[5])}
	r.extra = make([]int64, want)
	for i := range r.extra {
		v, isInt := vals[replyHead+i].(int64)
		if !isInt {
			return r, false
		}
		r.extra[i] = v
	}
	return r, true
}

// errTimedOut is the error of a Redis call that did not answer within the
// pool's CallTimeout.
var errTimedOut = errors.New("fleet: Redis did not answer")

// errNoAnswer is the error when the pool stops waiting for a client that
// does not give up at the context's deadline.
var errNoAnswer = rediscall.ErrNoAnswer

// bounded runs f with a context that ends at s.timeout. When Redis has not
// answered by then it returns an error saying so (errTimedOut); when the
// caller's own context ended first, a *callerError.
func bounded[T any](s *store, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	v, err, timedOut := rediscall.Bounded(ctx, s.timeout, s.inline, &s.inflight, f)
	switch {
	case err == nil:
		return v, nil
	case ctx.Err() != nil:
		return v, &callerError{cause: context.Cause(ctx), err: err}
	case timedOut || errors.Is(err, context.DeadlineExceeded):
		// Not context.DeadlineExceeded: the deadline was the pool's own,
		// and must not pass for the caller's.
		return v, fmt.Errorf("%w within %v (%v)", errTimedOut, s.timeout, err)
	}
	return v, err
}

// callerError is the error of a call whose caller's context ended first.
type callerError struct{ cause, err error }

func (e *callerError) Error() string { return e.cause.Error() + ": " + e.err.Error() }
func (e *callerError) Unwrap() error { return e.cause }
