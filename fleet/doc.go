// Package fleet shares concurrency and token budgets across the replicas of
// a service through Redis, so that a fleet of processes calling one LLM
// provider account stays within that account's limits together.
//
// A Pool is one replica's handle on a fleet-wide pool. Every admission takes
// a hold in Redis, keyed by its admission ID, before its call starts
// (Reserve, one round trip on the caller's goroutine); usage reports adjust
// the hold (Adjust) and the end of the call releases it (Release), both in
// the background. Each decision is one Lua script, atomic on the server,
// over four keys that share one hash tag, so the pool lives in one Redis
// Cluster slot:
//
//	<prefix>{<pool>}:holds  sorted set: admission ID -> lease expiry
//	<prefix>{<pool>}:vals   hash: admission ID -> "slots tokens sequence"
//	<prefix>{<pool>}:agg    hash: the sums over vals, the generation
//	<prefix>{<pool>}:gone   sorted set: released IDs, refusing late retries
//
// Time comes from the Redis server (TIME), never from the replicas' clocks.
//
// Holds carry leases: each replica renews its live holds in batches, so the
// holds of a replica that crashed return to the fleet within the lease
// (Config.LeaseTTL); every script reclaims expired holds first. Released
// IDs are tombstoned, so a retried reserve cannot bring a hold back. Usage
// adjustments carry absolute values and the usage sequence, so retried and
// reordered reports change nothing. Every script is idempotent, which makes
// the client's automatic retries after a dropped connection harmless.
//
// When Redis loses the pool's state (a restart without persistence,
// FLUSHALL), the pool gets a new generation. Replicas that knew the old one
// are refused for Config.RelearnWindow (Reason Relearning) while those with
// running calls register their holds again, which they do on their next
// renewal or at once when their generation check notices the change. Holds
// are registered again even above the limits: the calls are running.
//
// When Redis fails (unreachable, slower than Config.CallTimeout, errors),
// Config.OnFailure decides: FailClosed rejects (the default), FailOpen
// admits without a hold and registers it once Redis is back, FailLocalShare
// admits within a fixed local share. After three consecutive failures a
// circuit breaker applies the policy without calling Redis, probing once
// per Config.BreakerCooldown. Renewals go on through outages: holds are
// never dropped because Redis is down.
//
// The pool needs Redis 5 or later, with maxmemory-policy noeviction or a
// volatile-* policy: only the tombstone key carries a TTL.
package fleet
