package fleet

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/clock"
)

// The defaults of the Config fields left zero.
const (
	// DefaultPrefix starts every key when Config.Prefix is empty.
	DefaultPrefix = "bh:"
	// DefaultLeaseTTL is each hold's lease when Config.LeaseTTL is zero.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultRenewBatch bounds the holds one script renews when
	// Config.RenewBatch is zero.
	DefaultRenewBatch = 200
	// DefaultRelearnWindow is Config.RelearnWindow when zero.
	DefaultRelearnWindow = 2 * time.Second
	// DefaultGenCheckEvery is Config.GenCheckEvery when zero.
	DefaultGenCheckEvery = time.Second
	// DefaultCallTimeout bounds each Redis call when Config.CallTimeout is
	// zero.
	DefaultCallTimeout = 250 * time.Millisecond
	// DefaultAdjustMinInterval is Config.AdjustMinInterval when zero.
	DefaultAdjustMinInterval = time.Second
	// DefaultReclaimBatch bounds the expired holds one script reclaims when
	// Config.ReclaimBatch is zero.
	DefaultReclaimBatch = 64
	// DefaultBreakerCooldown is Config.BreakerCooldown when zero.
	DefaultBreakerCooldown = time.Second
)

// maxBatch bounds RenewBatch and ReclaimBatch: one script must stay short,
// because Redis runs nothing else meanwhile.
const maxBatch = 5000

// maxAmount is the largest token count or limit: integers above 2^53 are
// not exact in the scripts' arithmetic.
const maxAmount = 1<<53 - 1

// breakerErrors is the number of consecutive Redis errors that opens the
// circuit breaker.
const breakerErrors = 3

// FailurePolicy says what Reserve does when Redis cannot decide: it is
// unreachable, slower than Config.CallTimeout, answers with an error, or the
// circuit breaker is open after repeated failures. It does not apply when
// the caller's own context ended first, nor to invalid input, nor to a
// relearn window (Redis answers; see Config.RelearnWindow), nor to a pool
// whose leases ran out while Redis answers again (it refuses until its
// holds are registered; see Config.LeaseTTL).
type FailurePolicy uint8

const (
	// FailClosed rejects the reserve with Reason Unavailable. It is the
	// zero value and the default: the fleet limits are never exceeded
	// because of an outage.
	FailClosed FailurePolicy = iota
	// FailOpen admits the reserve without a Redis hold (Result.Unaccounted);
	// the pool registers the hold once Redis answers again. During an
	// outage every replica admits on its own, so the fleet may exceed its
	// limits, and stays over them after Redis is back until the calls
	// admitted meanwhile end.
	FailOpen
	// FailLocalShare admits the reserve without a Redis hold only while
	// this replica's live holds and the new one fit in Config.LocalShare;
	// beyond it the reserve is rejected with Reason Slots or Tokens. The
	// live holds include the calls Redis admitted before the outage, so a
	// replica that held more than its share when Redis went away admits
	// nothing until enough of those calls have ended.
	//
	// The share bounds each replica on its own, not the fleet: no replica
	// knows what the others hold once Redis is gone. During an outage the
	// fleet holds at most, in slots and in tokens, the sum over its
	// replicas of the larger of their share and what they held when Redis
	// went away. Set the share to about the limits divided by the number
	// of replicas: with shares that add up to the limits, the fleet goes
	// over them by what replicas held beyond their shares when Redis went
	// away (a replica holding 4 calls against a share of 2 while the
	// others fill theirs), until those calls end; each replica that starts
	// during the outage adds a share. Once Redis is back the calls
	// admitted meanwhile are registered, even above the limits, which then
	// admit nothing new until the fleet is under them again.
	FailLocalShare
)

// String returns "closed", "open" or "local_share".
func (p FailurePolicy) String() string {
	switch p {
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	case FailLocalShare:
		return "local_share"
	}
	return "FailurePolicy(" + strconv.Itoa(int(p)) + ")"
}

// Share is the part of the fleet's capacity one replica may hold on its own
// while Redis is unavailable (the FailLocalShare policy).
type Share struct {
	// Slots and Tokens bound the replica's live holds: their slots and
	// their tokens, counting the calls admitted before the outage that
	// still run.
	Slots, Tokens int64
}

// Config configures a Pool: one fleet-wide pair of limits, shared through
// Redis by every replica that uses the same Client, Prefix and Pool name.
// Only Client and Pool are required; the other zero values are documented
// defaults.
type Config struct {
	// Client is the Redis client: a *redis.Client, *redis.ClusterClient or
	// failover client. Give it ContextTimeoutEnabled, so that it abandons a
	// command at CallTimeout rather than at its own read timeout.
	Client redis.UniversalClient

	// Pool names the pool, for example one provider account or model. It
	// must not be empty nor contain '{' or '}': the pool's four keys are
	// "<Prefix>{<Pool>}:holds", ":vals", ":agg" and ":gone", one Redis
	// Cluster hash slot.
	Pool string

	// Prefix starts every key; empty means "bh:". It must not contain '{'
	// or '}'.
	Prefix string

	// MaxConcurrent bounds the fleet's holds that take a slot. -1 means
	// not enforced; 0 admits no hold that takes a slot.
	MaxConcurrent int64

	// TokenBudget bounds the tokens held fleet-wide by running calls. -1
	// means not enforced; 0 admits only holds of no tokens.
	TokenBudget int64

	// HighPriorityReserve is the part of TokenBudget that only
	// high-priority reserves may use: a normal one must fit in
	// TokenBudget - HighPriorityReserve. It must not exceed TokenBudget.
	HighPriorityReserve int64

	// LeaseTTL is each hold's lease: a hold its replica stops renewing (the
	// replica crashed) is reclaimed by any replica once it has passed, so
	// a crashed replica's capacity comes back within LeaseTTL. Zero means
	// 30s.
	//
	// A lease cannot tell a crashed replica from one that is only stopped:
	// a process paused (SIGSTOP, a long garbage collection, a frozen VM) or
	// cut off from Redis for longer than LeaseTTL while its calls run has
	// its holds reclaimed, and other replicas may fill their slots, so the
	// fleet runs more than its limits until those calls end. Choose a TTL
	// well above the pauses you expect. A pool whose leases ran out
	// unrenewed refuses new holds (Reason Relearning, without asking Redis)
	// until it has registered all its live ones again, so it adds nothing
	// to the excess when it resumes; those registrations count even above
	// the limits, and block new admissions fleet-wide until the pool is
	// back under them.
	LeaseTTL time.Duration

	// RenewEvery is how often the pool renews its live holds' leases; a
	// failed renewal is tried again within BreakerCooldown. Zero means
	// LeaseTTL/3; it must be less than LeaseTTL. A hold's lease runs out
	// only when its renewals fail, or come late, for LeaseTTL - RenewEvery
	// in a row.
	RenewEvery time.Duration

	// RenewBatch bounds the holds renewed, and the releases and
	// adjustments sent, by one script. Zero means 200.
	RenewBatch int

	// Tombstone is how long a released ID refuses a late reserve. Zero
	// means LeaseTTL.
	Tombstone time.Duration

	// OnFailure is what Reserve does when Redis cannot decide. The zero
	// value is FailClosed.
	OnFailure FailurePolicy

	// LocalShare bounds the holds the FailLocalShare policy lets this
	// replica keep on its own, its calls from before the outage included
	// (see FailLocalShare for what it bounds fleet-wide).
	LocalShare Share

	// RelearnWindow is how long the pool admits nothing, on every replica
	// (Reason Relearning), after its state in Redis starts a new
	// generation, while the replicas with running calls register their
	// holds again; no hold is reclaimed meanwhile either. A new generation
	// starts when the pool's state is missing (Redis lost it: a restart
	// without persistence, FLUSHALL), when it is older than one a replica
	// has seen (Redis came back from an older snapshot, or a lagging
	// replica took over), when another Redis server process serves the
	// state than the one it was last found on (Redis restarted, from an
	// RDB snapshot or an append-only file, even one that lost nothing; a
	// failover; the pool's Redis Cluster slot moved to another node), and
	// when leases ran out after no replica wrote to the pool for
	// (LeaseTTL - RenewEvery)/2 (Redis was unreachable or frozen for
	// longer than the leases; a crashed replica's holds running out in a
	// pool nobody else used meanwhile look the same, and cost a window at
	// the pool's next use). Zero means 2s; negative turns it off, and then
	// the fleet may run more than its limits after such an event, until
	// the running calls are registered again.
	//
	// A restarted or replaced server is recognised by the first script it
	// runs for the pool, whichever replica sends it and whatever that
	// replica saw before. The check needs a millisecond without writes to
	// the pool before that script, which a restart or a failover takes,
	// and the scripts must be allowed to call INFO: when the Redis user's
	// ACL denies it, the pool's Logger warns, and only a replica that saw
	// a newer state than the server's notices.
	//
	// The window must cover the time a replica needs to notice and to
	// register its holds: GenCheckEvery plus a renewal (CallTimeout at
	// most), and BreakerCooldown if Redis was failing. A replica that
	// registers later has its holds counted even above the limits, so the
	// fleet may exceed them until those calls end.
	//
	// Redis cannot tell a new pool from one whose state it lost, so a pool
	// also starts with a window: the first RelearnWindow after a pool is
	// first used admits nothing. The replica whose script starts a
	// generation sets its window, so give every replica the same
	// RelearnWindow; a pool created deliberately by a handle with a
	// negative RelearnWindow (when no call of it can be running anywhere,
	// for example by a deployment step) starts without one.
	RelearnWindow time.Duration

	// GenCheckEvery is how often a pool holding live holds checks the
	// pool's generation and write sequence, to register them again at once
	// when Redis lost or rewound its state. Zero means 1s.
	GenCheckEvery time.Duration

	// CallTimeout bounds each Redis call. When Redis has not answered by
	// then, Reserve applies OnFailure. Zero means 250ms.
	CallTimeout time.Duration

	// AdjustMinInterval is the shortest time between two adjustments of one
	// hold sent to Redis; later ones are coalesced into the next. An
	// adjustment that raises the tokens above the last value sent (an
	// overrun) is sent at once. Zero means 1s; negative sends every
	// adjustment at once.
	AdjustMinInterval time.Duration

	// ReclaimBatch bounds the expired holds one script reclaims. Zero means
	// 64.
	ReclaimBatch int

	// BreakerCooldown is how long Reserve applies OnFailure without calling
	// Redis after three consecutive failed calls, before one reserve probes
	// Redis again. Zero means 1s.
	BreakerCooldown time.Duration

	// Clock schedules renewals, retries, adjustment coalescing and the
	// breaker. Nil means the wall clock.
	Clock clock.Clock

	// Logger receives state changes: state losses, the breaker opening and
	// closing, holds found expired. Nil means silent.
	Logger *slog.Logger

	// OnEvent, when not nil, is called with each state change the pool
	// logs (see Event), to count or act on them. It is called
	// synchronously, with the pool's lock held: it must return quickly
	// and must not call the Pool's methods.
	OnEvent func(Event)
}

// settings is a Config with its defaults applied.
type settings struct {
	Config
	renewEvery, tombstone, relearn time.Duration
	// quiet: holds whose leases ran out while no script wrote to the pool
	// for this long start a relearn window rather than being reclaimed
	// (zero: never). A holder renews every RenewEvery, so its lease runs
	// out LeaseTTL - RenewEvery after its last write at the earliest; half
	// of that leaves the other half for renewals that come late.
	quiet time.Duration
}

func (c Config) settings() (settings, error) {
	s := settings{Config: c}
	if c.Client == nil {
		return s, invalidf("Config.Client", "must not be nil")
	}
	if c.Pool == "" {
		return s, invalidf("Config.Pool", "must not be empty")
	}
	if err := checkName("Config.Pool", c.Pool); err != nil {
		return s, err
	}
	if s.Prefix == "" {
		s.Prefix = DefaultPrefix
	}
	if err := checkName("Config.Prefix", s.Prefix); err != nil {
		return s, err
	}
	if err := checkLimits("Config.", c.MaxConcurrent, c.TokenBudget, c.HighPriorityReserve); err != nil {
		return s, err
	}
	durations := []struct {
		field string
		v     *time.Duration
		def   time.Duration
		neg   bool // negative allowed
	}{
		{"Config.LeaseTTL", &s.LeaseTTL, DefaultLeaseTTL, false},
		{"Config.RenewEvery", &s.RenewEvery, 0, false},
		{"Config.Tombstone", &s.Tombstone, 0, false},
		{"Config.RelearnWindow", &s.RelearnWindow, DefaultRelearnWindow, true},
		{"Config.GenCheckEvery", &s.GenCheckEvery, DefaultGenCheckEvery, false},
		{"Config.CallTimeout", &s.CallTimeout, DefaultCallTimeout, false},
		{"Config.AdjustMinInterval", &s.AdjustMinInterval, DefaultAdjustMinInterval, true},
		{"Config.BreakerCooldown", &s.BreakerCooldown, DefaultBreakerCooldown, false},
	}
	for _, d := range durations {
		if *d.v < 0 && !d.neg {
			return s, invalidf(d.field, "must be >= 0, got %v", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if s.LeaseTTL < time.Millisecond {
		return s, invalidf("Config.LeaseTTL", "must be at least 1ms, got %v", s.LeaseTTL)
	}
	s.renewEvery = s.RenewEvery
	if s.renewEvery == 0 {
		s.renewEvery = s.LeaseTTL / 3
	}
	if s.renewEvery >= s.LeaseTTL {
		return s, invalidf("Config.RenewEvery", "must be less than LeaseTTL (%v), got %v", s.LeaseTTL, s.renewEvery)
	}
	s.tombstone = s.Tombstone
	if s.tombstone == 0 {
		s.tombstone = s.LeaseTTL
	}
	s.relearn = max(s.RelearnWindow, 0)
	if s.relearn > 0 {
		s.quiet = (s.LeaseTTL - s.renewEvery) / 2
	}
	for _, b := range []struct {
		field string
		v     *int
		def   int
	}{
		{"Config.RenewBatch", &s.RenewBatch, DefaultRenewBatch},
		{"Config.ReclaimBatch", &s.ReclaimBatch, DefaultReclaimBatch},
	} {
		if *b.v < 0 || *b.v > maxBatch {
			return s, invalidf(b.field, "must be in [0, %d], got %d", maxBatch, *b.v)
		}
		if *b.v == 0 {
			*b.v = b.def
		}
	}
	if c.OnFailure > FailLocalShare {
		return s, invalidf("Config.OnFailure", "unknown policy %d", c.OnFailure)
	}
	if c.LocalShare.Slots < 0 || c.LocalShare.Tokens < 0 {
		return s, invalidf("Config.LocalShare", "must not be negative, got %+v", c.LocalShare)
	}
	s.Clock = clock.OrReal(c.Clock)
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// checkLimits validates a pool's limits.
func checkLimits(prefix string, maxConcurrent, tokenBudget, reserve int64) error {
	if maxConcurrent < -1 || maxConcurrent > maxAmount {
		return invalidf(prefix+"MaxConcurrent", "must be -1 or in [0, 2^53), got %d", maxConcurrent)
	}
	if tokenBudget < -1 || tokenBudget > maxAmount {
		return invalidf(prefix+"TokenBudget", "must be -1 or in [0, 2^53), got %d", tokenBudget)
	}
	if reserve < 0 || (tokenBudget >= 0 && reserve > tokenBudget) {
		return invalidf(prefix+"HighPriorityReserve", "must be in [0, TokenBudget], got %d (budget %d)", reserve, tokenBudget)
	}
	return nil
}
