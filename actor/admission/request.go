package admission

import "math"

// Usage is the engine's form of bulkhead.Usage; the facade
// converts it with a type conversion, so the two must keep the same fields
// in the same order, and the root type documents them. The engine counts
// Input + Output only; CachedInput, CacheCreation and Reasoning are parts
// of those totals, carried onto events and never used for accounting.
type Usage struct {
	Input, Output                         int64
	CachedInput, CacheCreation, Reasoning int64
}

// Total returns Input + Output.
func (u Usage) Total() int64 { return u.Input + u.Output }

// Valid reports whether Input and Output are non-negative and their sum
// fits an int64. It ignores the breakdown: the facade validates it, and
// clamping each field of a cumulative report separately may leave the parts
// above their totals, which is harmless as nothing counts them.
func (u Usage) Valid() bool {
	return u.Input >= 0 && u.Output >= 0 && u.Input <= math.MaxInt64-u.Output
}

// Reservation is the engine's form of bulkhead.Reservation; the facade
// converts it with a type conversion, and the root type documents the
// fields.
type Reservation struct{ Input, MaxOutput, Reserved int64 }
