package pacer

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/rediscall"
)

//go:embed script.lua
var luaTemplate string

// luaSource is the decision script with the algorithm's constants filled in.
var luaSource = strings.NewReplacer(
	"@GRACE_US@", strconv.FormatInt(graceUs, 10),
	"@HORIZON_US@", strconv.FormatInt(horizonUs, 10),
).Replace(luaTemplate)

// luaSHA is the SHA-1 digest that EVALSHA runs luaSource by.
var luaSHA = func() string {
	h := sha1.Sum([]byte(luaSource))
	return hex.EncodeToString(h[:])
}()

// DefaultPrefix is the prefix of every Redis key when RedisOptions.Prefix is
// empty.
const DefaultPrefix = "bulkhead:pacer:"

// DefaultFailureDelay is the retry-after of a call that the FailClosed policy
// rejects, when RedisOptions.FailureDelay is zero.
const DefaultFailureDelay = time.Second

// DefaultTimeout bounds the Redis time of one decision when
// RedisOptions.Timeout is zero. A decision on a healthy server takes about
// one network round trip: well under a millisecond within a zone, a few
// milliseconds across zones.
const DefaultTimeout = 50 * time.Millisecond

// RedisClient is what the Redis store needs from a go-redis client.
// *redis.Client, *redis.ClusterClient, *redis.Ring and redis.UniversalClient
// all satisfy it.
type RedisClient interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
}

// FailurePolicy says what a call returns when the Redis store cannot decide
// (Redis unreachable, timed out, or answering with an error). It does not
// apply when the caller's own context ended first, nor to invalid input.
type FailurePolicy uint8

const (
	// FailError returns the error (matching ErrUnavailable) from every
	// method. It is the zero value and the default: the caller sees the
	// failure and decides.
	FailError FailurePolicy = iota

	// FailOpen lets the call go: a zero Delay and a nil error, with the
	// backend's error in Outcome.Fallback. Nothing is recorded. Use it when
	// pacing is best effort and an outage must not stop traffic.
	FailOpen

	// FailClosed holds the call back. RateLimit returns a rejection: Delay
	// is RedisOptions.FailureDelay, the error is nil and Outcome.Fallback
	// holds the backend's error, so a rate-limited caller answers "retry
	// later" as for any other rejection. Pace and PaceWait, which cannot hold
	// a call back without state, return the error as under FailError: the
	// caller must not act.
	FailClosed
)

// String returns "error", "open" or "closed".
func (p FailurePolicy) String() string {
	switch p {
	case FailError:
		return "error"
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "FailurePolicy(" + strconv.Itoa(int(p)) + ")"
}

// RedisOptions configures NewRedis. The zero value is ready to use.
type RedisOptions struct {
	// Prefix starts every key. Empty means DefaultPrefix. It must not
	// contain '{' or '}', because the key's hash tag follows it.
	Prefix string

	// Clock, when set, is the source of decision time: each call sends the
	// clock's time to the script. Leave it nil
	// in production: the script then reads Redis TIME, so clients whose
	// clocks disagree still agree on every decision. Tests set it to a mock
	// clock to replay exact timings; PaceWait also waits on this clock (on
	// the wall clock when nil).
	Clock clock.Clock

	// OnFailure is what a call returns when Redis cannot decide. The zero
	// value, FailError, returns the error.
	OnFailure FailurePolicy

	// FailureDelay is the retry-after of a call that FailClosed rejects.
	// Zero means DefaultFailureDelay; it must not be negative.
	FailureDelay time.Duration

	// Timeout bounds the time one decision spends on Redis (connecting,
	// sending, waiting for the reply, resending the script when the server
	// lacks it). When Redis has not answered by then, the call is a failure
	// and OnFailure decides it, whatever the client's own timeouts and
	// however long the caller's context would have let it wait. Only a
	// caller's context that ends before Timeout makes the call fail with the
	// context's error instead. Zero means DefaultTimeout (50 ms); it must
	// not be negative.
	//
	// When the client honours context deadlines (ContextTimeoutEnabled on a
	// *redis.Client, *redis.ClusterClient or *redis.Ring), the client itself
	// gives up at Timeout. With any other client, the store stops waiting at
	// Timeout but the command runs on in the background, holding a pooled
	// connection, until the client's own read or write timeout ends it.
	Timeout time.Duration
}

// Redis is the Store shared by many processes through Redis.
//
// Each decision is one round trip: one Lua script that reads, decides and
// writes atomically on the server, run by its SHA-1 digest (EVALSHA) and sent
// in full (EVAL) only when the server's script cache does not have it (after
// a restart, a SCRIPT FLUSH or on a new cluster node), which also caches it
// again.
//
// Each pacer key is one Redis string,
//
//	<prefix><pacer name>:{<call key>}#us1
//
// whose value is 32 bytes: four little-endian IEEE 754 doubles, the bucket
// level and three times in integer microseconds (the last drip, the next
// free slot and the logical expiry). A binary value costs the script no
// number formatting and lets one SET write the state and its TTL: a few
// microseconds less than a hash, in a decision meant to cost little more
// than a PING.
//
// A key that holds anything else (a list or a hash, a string of another
// length, numbers no decision writes) counts as absent: the call is decided
// as on a fresh key, and the first call recorded replaces the value with a
// state and its TTL. A damaged key thus never fails calls.
//
// The call key is the key's Redis Cluster hash tag: a pacer key is a
// single key that Redis Cluster routes to one node,
// different call keys spread over the cluster, and all pacers of one call key
// (say the requests-per-minute and tokens-per-minute pacers of one model)
// share a slot, so a Composite decides on all of them in one atomic script.
// The key expires, on the server's clock, a little after its state has
// stopped mattering: when its queue has run out and its bucket has drained,
// plus two minutes.
//
// By default decisions use the Redis server's clock (TIME, read inside the
// script), and the reply carries only relative delays, so the clients'
// clocks never matter.
//
// The decision command is never retried by the client: a script whose reply
// was lost may have run, and running it again would book the call twice. The
// store marks the command as not retryable, whatever the client's MaxRetries;
// a failure is returned (or handled by OnFailure) instead. Each decision
// spends at most RedisOptions.Timeout (50 ms by default) on Redis, so an
// outage costs milliseconds per call. Give the client ContextTimeoutEnabled
// and short dial, read, write and pool timeouts too, so that it also
// abandons the command then instead of holding a connection for seconds.
//
// Redis 5.0 or later is needed (a script that reads TIME and then writes
// relies on effects replication, the default since 5.0); it is tested with
// Redis 7.
type Redis struct {
	client       RedisClient
	prefix       string
	clk          clock.Clock // nil: Redis TIME
	waitClk      clock.Clock
	onFailure    FailurePolicy
	failureDelay time.Duration
	timeout      time.Duration
	inline       bool // the client gives up at the context's deadline itself
}

// NewRedis returns a store that keeps pacer state in Redis through client.
// It does not talk to Redis; call Preload to load the script up front.
func NewRedis(client RedisClient, opts RedisOptions) (*Redis, error) {
	if client == nil {
		return nil, invalidf("client", "must not be nil")
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := checkName("RedisOptions.Prefix", prefix); err != nil {
		return nil, err
	}
	if opts.OnFailure > FailClosed {
		return nil, invalidf("RedisOptions.OnFailure", "unknown policy %d", opts.OnFailure)
	}
	delay := opts.FailureDelay
	if delay < 0 {
		return nil, invalidf("RedisOptions.FailureDelay", "must be >= 0, got %v", delay)
	}
	if delay == 0 {
		delay = DefaultFailureDelay
	}
	timeout := opts.Timeout
	if timeout < 0 {
		return nil, invalidf("RedisOptions.Timeout", "must be >= 0, got %v", timeout)
	}
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	return &Redis{
		client:       client,
		prefix:       prefix,
		clk:          opts.Clock,
		waitClk:      clock.OrReal(opts.Clock),
		onFailure:    opts.OnFailure,
		failureDelay: delay,
		timeout:      timeout,
		inline:       rediscall.HonoursDeadline(client),
	}, nil
}

// Preload loads the decision script into the server's script cache (on
// every master of a cluster), so that the first decisions need not send it.
// It is optional: a decision that finds the script missing sends it itself.
func (r *Redis) Preload(ctx context.Context) error {
	sha, err := r.client.ScriptLoad(ctx, luaSource).Result()
	if err != nil {
		return unavailable(err)
	}
	if sha != luaSHA {
		return fmt.Errorf("pacer: SCRIPT LOAD returned digest %s, want %s", sha, luaSHA)
	}
	return nil
}

// Key returns the Redis key that holds the state of the pacer named name for
// the call key key.
func (r *Redis) Key(name, key string) string {
	return r.prefix + name + ":{" + key + "}#us1"
}

// noRetryCmd is a command that go-redis must not retry once it may have
// reached the server: a decision that ran but whose reply was lost must not
// run again. (go-redis still resends a command that never left the client.)
type noRetryCmd struct{ *redis.Cmd }

// NoRetry reports true: never retry the decision.
func (noRetryCmd) NoRetry() bool { return true }

// errReply is the error of a reply the script cannot have sent.
var errReply = errors.New("pacer: unexpected reply from the Redis script")

func (r *Redis) decide(ctx context.Context, reqs []request, out []stepResult) (bool, error) {
	n := len(reqs)
	args := make([]any, 0, 4+7*n)
	args = append(args, "evalsha", luaSHA, n)
	for i := range reqs {
		args = append(args, r.Key(reqs[i].name, reqs[i].key))
	}
	now := ""
	if r.clk != nil {
		now = strconv.FormatInt(r.clk.Now().UnixMicro(), 10)
	}
	args = append(args, now)
	for i := range reqs {
		p := &reqs[i].p
		args = append(args, fmtFloat(p.weight), fmtFloat(p.qps), fmtFloat(p.burst), fmtFloat(p.factor),
			strconv.FormatInt(p.maxWaitUs, 10), strconv.FormatInt(p.capUs, 10))
	}
	vals, err := r.call(ctx, args)
	if err != nil {
		return false, err
	}
	bad := func() (bool, error) { return false, fmt.Errorf("%w: %s", errReply, formatReply(vals)) }
	if len(vals) != 1+2*n {
		return bad()
	}
	flag, ok := vals[0].(int64)
	if !ok || (flag != 0 && flag != 1) {
		return bad()
	}
	commit := flag == 1
	for i := range reqs {
		delay, ok1 := vals[1+2*i].(int64)
		level, ok2 := vals[2+2*i].(string)
		if !ok1 || !ok2 || delay < 0 || len(level) != 8 {
			return bad()
		}
		out[i] = stepResult{
			delayUs: delay,
			before:  math.Float64frombits(binary.LittleEndian.Uint64([]byte(level))),
			commit:  delay <= reqs[i].p.maxWaitUs,
		}
		if commit && !out[i].commit {
			return bad()
		}
	}
	return commit, nil
}

// call runs the decision script with args, bounded by r.timeout: when Redis
// has not answered by then, it returns an error saying so (and the caller's
// context error instead when that context ended first).
func (r *Redis) call(ctx context.Context, args []any) ([]any, error) {
	vals, err, timedOut := rediscall.Bounded(ctx, r.timeout, r.inline, nil, func(rctx context.Context) ([]any, error) {
		return r.eval(rctx, args)
	})
	switch {
	case err == nil:
	case ended(ctx):
		err = fmt.Errorf("%w: %w", callerErr(ctx), err)
	case err == rediscall.ErrNoAnswer:
		err = fmt.Errorf("pacer: Redis did not answer within %v", r.timeout)
	case timedOut:
		// Not wrapped: the client's error is then the store's context
		// deadline, which must not pass for the caller's.
		err = fmt.Errorf("pacer: Redis did not answer within %v (%v)", r.timeout, err)
	}
	return vals, err
}

// ended reports whether ctx is done or its deadline has passed. (A client
// that sets its socket deadlines from the context's can fail a moment before
// the context itself reports the deadline.)
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// callerErr is the error of a caller's context that has ended: its cause, or
// context.DeadlineExceeded when its deadline has passed but it does not say
// so yet.
func callerErr(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return context.DeadlineExceeded
}

// eval runs the script by its digest, and in full when the server lacks it.
func (r *Redis) eval(ctx context.Context, args []any) ([]any, error) {
	cmd := r.run(ctx, args)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", luaSource
		cmd = r.run(ctx, args)
	}
	return cmd.Slice()
}

func (r *Redis) run(ctx context.Context, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = r.client.Process(ctx, noRetryCmd{cmd})
	return cmd
}

func (r *Redis) waitClock() clock.Clock { return r.waitClk }

func (r *Redis) failure() (FailurePolicy, time.Duration) { return r.onFailure, r.failureDelay }

// formatReply prints a script reply readably, whatever it holds: integers in
// decimal, strings quoted with their bytes escaped, nested arrays in
// brackets, anything else with %#v.
func formatReply(v any) string {
	switch v := v.(type) {
	case []any:
		var b strings.Builder
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(formatReply(e))
		}
		b.WriteByte(']')
		return b.String()
	case string:
		return strconv.Quote(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case nil:
		return "nil"
	}
	return fmt.Sprintf("%#v", v)
}

// fmtFloat formats f as the shortest decimal that Lua's tonumber reads back
// as the same double.
func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
