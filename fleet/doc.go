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
//	<prefix>{<pool>}:agg    hash: the sums over vals, the generation, the write sequence, the server
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
// Every script that changes the pool bumps a write sequence, and each
// replica remembers the newest generation and sequence it has seen; the
// state also records the Redis server (its run_id) it was last found on.
// The pool starts a new generation when its state is missing (a new pool,
// or Redis lost the state: a restart without persistence, FLUSHALL), when
// it is older than one a replica has seen (Redis restarted from an older
// snapshot, or a lagging replica took over), when another server serves it
// (a restart, a failover: recognised by the first script that server runs
// for the pool, whichever replica sends it), and when leases ran out while
// no replica wrote to the pool for half their renewal margin (Redis was
// unreachable or frozen for longer than the leases; a crashed replica's
// holds running out while nobody else used the pool look the same). For
// Config.RelearnWindow after that, no replica is
// admitted (Reason Relearning) and no hold is reclaimed, while those with
// running calls register their holds again, which they do as soon as a
// reply or their generation check shows the new generation. Holds are
// registered again even above the limits: the calls are running. Redis
// cannot tell a new pool from a lost one, so a pool's first use costs one
// window too, unless it was created by a handle with no window.
//
// Leases cannot tell a crashed replica from a paused one: a replica paused
// for longer than its leases has its holds reclaimed while its calls run,
// and others may take their capacity. Once it runs again it refuses new
// holds until it has registered its live ones, so it adds nothing more.
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
// volatile-* policy: only the tombstone key carries a TTL. Its scripts
// call TIME and INFO.
package fleet
