// Package pacer paces calls to a target rate and limits their rate, with a
// burst allowance, in one process or across many through Redis.
//
// Both stores run the same integer step function and give identical results
// on the same calls.
//
// # Modes
//
// A Pacer has a name, a target rate (Options.QPS, in weight units per second)
// and a bucket (Options.MaxBurst); every call names a key (a model, a tenant,
// an API) and has a weight (1 for a plain call, or a token count). Each key
// is paced on its own.
//
//   - Pace returns how long the call must wait and books it: the caller
//     waits Outcome.Delay, then acts. Concurrent callers are spaced
//     weight/QPS apart, so at 10 QPS three simultaneous calls get 0, 100 and
//     200 ms. This is for clients that must not exceed a rate (a provider's
//     requests per minute) and would rather wait than fail.
//   - PaceWait is Pace plus the wait, on the store's clock, honouring the
//     context: it returns when the call may go. When the context's deadline
//     comes before the slot, it books nothing and fails at once.
//   - RateLimit decides whether the call may go now. A zero Delay admits
//     and records it; a positive Delay rejects it, records nothing, and is
//     the exact retry-after. This is for servers that answer 429.
//   - A Composite combines pacers on one store, for example requests per
//     minute and tokens per minute: the delay is the largest of the members'
//     delays, the outcome names the member that set it, and the call is
//     recorded in every member or in none.
//   - Book and Settle correct a call's booking once its real weight is
//     known: Book records weight spent beyond what the call was counted
//     for, and Settle does that or, for a call that used less, gives the
//     unused weight back to the bucket (as a provider that counts a
//     request's maximum output on entry and adjusts it to the real output
//     at the end does).
//
// # The algorithm
//
// Each key has a bucket level W, the time of its last drip L and its next
// free slot N. A call of weight w at time now does:
//
//	I = max(L, N)                                         the queue has been empty since I
//	N = max(N, now)
//	if N <= now: W = max(0, W - (now-I) * QPS * factor)   the bucket drains only while nothing is queued
//	L = now
//	W = W + w
//	if W <= MaxBurst and N <= now: the call goes now; N is unchanged
//	else:                          the call is scheduled at N, and N = N + w/QPS
//	W = min(MaxBurst, W), or W - w if the call did not overflow (it is queued)
//	delay = scheduled time - now
//
// Weight given back (Settle) lowers W, never below zero. The bucket has
// room while calls are queued only after such a give-back, and that room
// waits for the queue to run out, so calls keep their turns.
//
// So from idle MaxBurst+1 weight-1 calls go at once (the first call that
// overflows the bucket still finds the queue empty and only books the next
// slot), and after that calls are spaced w/QPS apart. The bucket drains at
// QPS*factor, where factor is Options.BurstFactor, by default 0.5 for Pace
// (burst allowance comes back at half the rate, so a steady caller does not
// flip in and out of burst mode) and 1 for RateLimit, and only from the
// moment the queue runs empty. MaxBurst 0 is plain spacing: one call at
// once, then one per 1/QPS.
//
// # The bound a rate keeps
//
// Over any window of time T, a key lets through at most
// MaxBurst + QPS*T weight, plus the weight of one call (the call that
// overflows an idle bucket and takes the next slot), in RateLimit and Pace
// alike (a paced call counts when its delay ends), on both stores, whatever
// the arrival pattern. Kept saturated at 60 calls a minute with MaxBurst 4,
// a key lets 25 calls through in 20 seconds. Weight given back (Settle)
// comes on top: over any window, what a key lets through less what it was
// given back within the window keeps the bound.
//
// To keep that bound the bucket drains only from the moment the queue runs
// empty (the time a queued call books is not credited to the bucket as
// well), a call goes now only when its delay is zero to the microsecond,
// each call books w/QPS rounded up to the microsecond, and a paced
// Composite books every member's slot at the time the call goes, the
// largest of the members' delays.
//
// Times are integer microseconds, exact both in Go and in Redis's Lua, and
// one pure step function is the algorithm for both stores; the Redis script
// is its transcription, and a property test checks that the stores agree
// bit for bit on random call sequences.
//
// # Stores
//
// NewLocal keeps state in this process: sharded maps under mutexes, a
// decision in about a hundred nanoseconds without allocation, idle state
// dropped as it expires and its memory given back, a few entries per
// decision.
//
// NewRedis keeps state in Redis through a go-redis client (*redis.Client,
// *redis.ClusterClient, *redis.Ring), so every process that uses the same
// Redis and the same pacer name shares the rate. Each decision is one round
// trip running one Lua script by its digest (EVALSHA, falling back to EVAL
// when the server's script cache lacks it). Each pacer key is a single Redis
// key, "<prefix><name>:{<key>}#us1", holding 32 bytes (four doubles: the
// level and three times): Redis Cluster routes it, different keys
// spread over the nodes, and the pacers of one key share a slot so a
// Composite decides atomically in one script. The script reads the time
// from the Redis server (TIME), so clients with skewed clocks agree; set
// RedisOptions.Clock to use the client's clock instead (tests do). A key
// expires when its queue has run out and then its bucket has drained, plus
// two minutes of slack.
//
// The decision command is never retried by go-redis, whatever the client's
// MaxRetries: a script whose reply was lost may have run, and running it
// again would book the call twice. Each decision spends at most
// RedisOptions.Timeout (50 ms by default) on Redis: a server that is down,
// paused or too slow costs a call that much, not the client's seconds of
// dial retries and read timeouts, and the failure policy decides the call.
// Configure the client with ContextTimeoutEnabled and short timeouts as well
// (the README shows a configuration), so that it abandons the command at the
// same moment.
//
// # Failures and invalid input
//
// Invalid input (QPS not > 0 or above MaxQPS, a weight so small that it
// books less than half a microsecond, MaxBurst negative or not finite,
// BurstFactor outside 0 to 1, a weight negative or not finite, an empty key) is a
// *ConfigError naming the field, matching bulkhead.ErrInvalid; it is caught before the store is called, so it never
// writes state. A call whose context is already done fails with the
// context's cause and records nothing.
//
// A Redis failure (an error, or no answer within RedisOptions.Timeout) is an
// error matching ErrUnavailable (and wrapping the client's error, if any).
// A caller whose own context ends before the store's timeout gets the
// context's error instead, and no policy applies. A caller that wants a
// decision anyway sets
// RedisOptions.OnFailure: FailOpen lets calls go, FailClosed makes RateLimit
// reject with RedisOptions.FailureDelay as retry-after (and Pace fail); the
// outcome's Fallback then carries the error, for logs and metrics.
//
// # Guarantees
//
//   - Input is validated before anything is written: a bad rate, burst,
//     weight or key is an error and never leaves state behind.
//   - The bound above: no window of T lets more than MaxBurst + QPS*T
//     through, plus one call's weight.
//   - A call that goes is recorded: RateLimit never lets a call through
//     that it does not book.
//   - A call of weight 0 (say a zero-token call on a tokens-per-minute
//     pacer) is never delayed and books nothing.
//   - State is integer microseconds.
//   - Redis TIME by default, not the client's clock; and time never runs
//     backwards for a key (a client or server clock that steps back neither
//     refills the bucket nor moves the queue): until the clock is back at
//     the key's last call, time stands still for the key, Pace delays count
//     from that call, and a RateLimit rejection's retry-after includes the
//     time the clock needs to get back, so a retry after it goes.
//   - A rejected RateLimit writes nothing at all.
//   - A Composite records all or nothing, atomically.
//   - Pace books at most Options.MaxDelay (three years by default) ahead,
//     and PaceWait books nothing it cannot wait for before its deadline.
//   - Options are fixed when a Pacer is made; make a new Pacer with the
//     same name to change them, and the state carries over.
package pacer
