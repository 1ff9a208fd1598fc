// Package bulkhead decides whether an LLM call should run before it runs.
//
// A Bulkhead admits, queues or rejects each call in microseconds, in-process,
// from how many calls are in flight and how many tokens they have already
// committed. Services that call LLM providers under concurrent traffic wrap
// each call in one: a fast, typed rejection beats a request that piles onto a
// saturated provider and turns a burst into a storm of 429s.
//
// Build one with New, from a Config or a profile (Interactive, Batch). Wrap a
// call with Run, or hold its capacity by hand with Acquire and
// Permit.Release. Rejections are *RejectedError values: errors.Is(err,
// ErrRejected) matches them all, errors.Is(err, ErrBudgetLimit) (one
// sentinel per reason) matches one reason, and errors.As gives the capacity
// snapshot the decision was made on. Invalid input is a *ConfigError, never
// a rejection, and takes nothing.
//
// With Config.Dedup, identical Runs made while one of them is in flight
// share its result instead of each calling the provider (see DedupConfig).
//
// Report what the provider answered with Permit.Feedback (a stream.Transport
// does it for you): a 429 with a Retry-After cools its model down, what the
// provider says is left of its rate limits stops calls before they would
// meet a 429 (see Headroom), and with Config.Adaptive the answers move the
// limits (see Adaptive).
//
// Shutdown (or Close, then Drain) ends a Bulkhead: no goroutine of it
// remains afterwards.
package bulkhead
