package bulkhead

import (
	"log/slog"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/fleet"
)

// Config configures a Bulkhead. The zero value of each optional field is
// documented with it; New rejects anything invalid with a *ConfigError
// naming the field.
type Config struct {
	// Model is the model the bulkhead guards, such as "gpt-4o". The default
	// estimator reads it, so it is required with a TokenBudget that names
	// no Estimator; otherwise it is optional. A request's own Model wins.
	Model string

	// MaxConcurrent is the number of calls that may be in flight at once.
	// Zero rejects every call with ConcurrencyLimit until ApplyLimits raises
	// it (a fail-closed start).
	MaxConcurrent int

	// MaxQueue is how many calls may wait for a slot. Zero means fail fast:
	// a call that finds no free slot is rejected at once.
	MaxQueue int

	// QueueTimeout bounds the wait in the queue. Zero means wait until the
	// call's context ends.
	QueueTimeout time.Duration

	// Queue chooses how waiting calls are served. The zero value is one
	// first-come, first-served line in which calls wait for a slot only.
	Queue QueuePolicy

	// InitialRevision is the revision of the starting limits. ApplyLimits
	// takes only snapshots with a higher revision.
	InitialRevision int64

	// TokenBudget turns on token admission. Nil means none: calls are
	// admitted on concurrency alone.
	TokenBudget *TokenBudget

	// Classes partitions capacity between a fixed set of admission classes
	// (tenants, workloads), with floors no other class may take and
	// ceilings a class may not exceed. Nil means none.
	Classes *Classes

	// RateLimits caps the calls and tokens per minute, per model or per
	// class, on top of the concurrency and token limits. Nil means none.
	RateLimits *RateLimits

	// Fleet shares the bulkhead's concurrency and token limits with the
	// other replicas of the service, through a pool in Redis (see package
	// fleet). Nil means none. The pool stays the caller's: close it after
	// the bulkhead's Shutdown. A pool with a token budget needs TokenBudget
	// (its estimator makes the reservations the pool holds). In observe
	// mode a call the pool turns away for a shadowed reason
	// (ConcurrencyLimit, BudgetLimit) is bypassed, as a race bypass; a
	// bypassed call takes no fleet hold.
	Fleet *fleet.Pool

	// Adaptive moves MaxConcurrent and the token budget from what the
	// provider answers (see Bulkhead.Feedback), within bounds. Nil means
	// the limits move only when the caller applies them.
	Adaptive *Adaptive

	// RetryBudgets bound the retries the bulkhead admits (calls made with
	// WithAttempt above 0) to a share of the first attempts it admits. Nil
	// means none: a retry is admitted as any call.
	RetryBudgets *RetryBudgets

	// Dedup turns on in-flight deduplication for Run: identical calls made
	// while one of them is in flight share its result instead of each
	// calling the provider. Nil means off.
	Dedup *DedupConfig

	// Clock is the time source. Nil means the wall clock; tests pass
	// clock.NewMock().
	Clock clock.Clock

	// Logger receives the bulkhead's own diagnostics (recovered panics,
	// suspect usage figures, overruns too large to book). Nil means
	// silence. A handler that panics loses its record, nothing else.
	Logger *slog.Logger

	// UsageCeiling is the most tokens (Input + Output) that one call's
	// usage may report. A figure above it is taken for an error of the
	// provider or of whatever read it, not for usage: it is logged, counted
	// in Stats().Calls.SuspectUsage and clamped to the ceiling, so that it
	// can neither hold the token budget nor book a tokens-per-minute rate
	// far beyond what any call uses. Zero means DefaultUsageCeiling; it
	// must not be negative.
	UsageCeiling int64
}

// DefaultUsageCeiling is the UsageCeiling of a Config that sets none:
// 16 million tokens, more than any model takes in and gives out in one call
// today.
const DefaultUsageCeiling = 16_000_000

// TokenBudget bounds the tokens that admitted calls may hold at once. It is
// an in-flight ceiling, not a spend cap: each admission holds its
// reservation (input estimate + max output) until it is released.
type TokenBudget struct {
	// Budget is the most tokens admitted calls may hold at once. Zero is
	// valid: it admits only calls that reserve nothing.
	Budget int64

	// HighPriorityReserve is the part of Budget that only High priority
	// calls may use. It must not exceed Budget.
	HighPriorityReserve int64

	// Estimator turns a request into its reservation. Nil means the
	// default: characters per token by model (Config.Model, or the
	// request's own), with OutputCap for requests that set no MaxTokens.
	Estimator Estimator

	// OutputCap is the default estimator's max output for a request that
	// sets no MaxTokens. Zero means 2048. It must be zero when Estimator is
	// set.
	OutputCap int64
}

// QueuePolicy chooses how the queue serves the calls that wait in it.
type QueuePolicy struct {
	// Fair serves waiting calls class by class (it needs Classes): when a
	// slot frees, it goes to the waiting class that has been admitted the
	// fewest tokens, divided by its weight, so one class's burst cannot
	// starve another's waiters. Within a class, High priority calls go
	// first, then the others in arrival order. A class's count starts
	// level with the class served last when it begins to wait, so a class
	// that was idle has saved up no credit. Every admission counts its
	// reservation, and a call without one counts as one token. The result:
	// two classes with equal weights that both keep calls waiting are
	// admitted within twice the largest reservation of each other.
	// False serves the whole queue in arrival order.
	Fair bool

	// Weights is each class's share of the slots that free up under Fair:
	// a class of weight 2 is admitted twice the tokens of a class of
	// weight 1 while both wait. A class it does not name has weight 1.
	// Weights range from 1 to 1,000,000.
	Weights map[string]int

	// WaitForCapacity lets a call that fails only the token budget or a
	// class limit (a ceiling, another class's floor) wait in the queue for
	// that capacity, as it would for a slot, bounded by its queue timeout
	// and context, and be checked again whenever capacity frees (a release,
	// a usage report that lowers a hold, new limits, a waiter leaving).
	// Within a class the waiters keep their order: a call waits behind the
	// calls of its class that are already waiting, even if it would fit
	// now. A waiter short of its class's own room (a ceiling, or the shared
	// pool the floors leave) holds back only its class: the other classes
	// go ahead. A waiter short of the token budget, which every class
	// shares, holds back the whole queue until the tokens come, so smaller
	// calls cannot starve it. A call that can never fit the current limits
	// (see RejectedError.NeverFits) is rejected at once, a waiter that new
	// limits make unfittable is rejected then, and a call that finds the
	// queue full is rejected for the capacity it lacked. False, the
	// default, rejects such calls at once: only a slot is waited for.
	WaitForCapacity bool

	// RetryAging bounds how long first attempts go ahead of a waiting
	// retry (a call made with WithAttempt above 0). In the queue a first
	// attempt goes ahead of the retries waiting before it (in the fair
	// queue, those of its class and priority), so that under overload the
	// calls whose users are still waiting get the capacity; once a retry
	// has waited RetryAging, it goes in arrival order with the first
	// attempts, so that no retry waits for ever: it waits at most
	// RetryAging longer than it would in arrival order. Zero means
	// DefaultRetryAging; a negative value keeps retries in arrival order.
	RetryAging time.Duration
}

// Interactive returns a Config for latency-sensitive traffic: no queue, so a
// call that finds every slot taken is rejected at once.
func Interactive(model string, maxConcurrent int) Config {
	return Config{Model: model, MaxConcurrent: maxConcurrent}
}

// Batch returns a Config for throughput traffic: up to 20 calls wait, each
// for at most 30 seconds.
func Batch(model string, maxConcurrent int) Config {
	return Config{Model: model, MaxConcurrent: maxConcurrent, MaxQueue: 20, QueueTimeout: 30 * time.Second}
}

func (cfg *Config) validate() error {
	if cfg.MaxConcurrent < 0 {
		return invalidf("Config.MaxConcurrent", "must be >= 0, got %d", cfg.MaxConcurrent)
	}
	if cfg.MaxQueue < 0 {
		return invalidf("Config.MaxQueue", "must be >= 0, got %d", cfg.MaxQueue)
	}
	if cfg.QueueTimeout < 0 {
		return invalidf("Config.QueueTimeout", "must be >= 0, got %v", cfg.QueueTimeout)
	}
	if err := checkNonNegative("Config.InitialRevision", cfg.InitialRevision); err != nil {
		return err
	}
	if err := checkNonNegative("Config.UsageCeiling", cfg.UsageCeiling); err != nil {
		return err
	}
	if err := cfg.Queue.validate(cfg.Classes); err != nil {
		return err
	}
	tb := cfg.TokenBudget
	if cfg.Fleet != nil && tb == nil {
		if _, budget, _ := cfg.Fleet.Limits(); budget >= 0 {
			return invalidf("Config.Fleet", "has a token budget (%d), which needs Config.TokenBudget: its estimator makes the reservations the pool holds", budget)
		}
	}
	if tb == nil {
		return nil
	}
	if err := checkNonNegative("Config.TokenBudget.Budget", tb.Budget); err != nil {
		return err
	}
	if err := checkNonNegative("Config.TokenBudget.HighPriorityReserve", tb.HighPriorityReserve); err != nil {
		return err
	}
	if tb.HighPriorityReserve > tb.Budget {
		return invalidf("Config.TokenBudget.HighPriorityReserve",
			"must not exceed Budget (%d), got %d", tb.Budget, tb.HighPriorityReserve)
	}
	if err := checkNonNegative("Config.TokenBudget.OutputCap", tb.OutputCap); err != nil {
		return err
	}
	if tb.Estimator != nil && tb.OutputCap != 0 {
		return invalidf("Config.TokenBudget.OutputCap", "applies to the default estimator only; set the cap on the Estimator")
	}
	if tb.Estimator == nil && strings.TrimSpace(cfg.Model) == "" {
		return invalidf("Config.Model", "must not be blank: the default estimator reads it (or set TokenBudget.Estimator)")
	}
	return nil
}

func (q *QueuePolicy) validate(c *Classes) error {
	if !q.Fair {
		if len(q.Weights) > 0 {
			return invalidf("Config.Queue.Weights", "apply to the fair queue only; set Queue.Fair")
		}
		return nil
	}
	if c == nil {
		return invalidf("Config.Queue.Fair", "needs Config.Classes: the fair queue serves class by class")
	}
	for name, w := range q.Weights {
		if _, ok := c.Limits[name]; !ok {
			return invalidf("Config.Queue.Weights", "names class %q, which is not in Config.Classes", name)
		}
		if w < 1 || w > actor.MaxWeight {
			return invalidf("Config.Queue.Weights", "class %q: must be between 1 and %d, got %d", name, actor.MaxWeight, w)
		}
	}
	return nil
}
