package admission

import "math"

// Usage is the engine's form of bulkhead.Usage; the facade
// converts it, and the root type documents the fields.
type Usage struct {
	Input  int64
	Output int64
}

// Total returns Input + Output.
func (u Usage) Total() int64 { return u.Input + u.Output }

// Valid reports whether both fields are non-negative and their sum fits an
// int64.
func (u Usage) Valid() bool {
	return u.Input >= 0 && u.Output >= 0 && u.Input <= math.MaxInt64-u.Output
}

// Reservation is the engine's form of bulkhead.Reservation; the facade
// converts it, and the root type documents the fields.
type Reservation struct {
	Input     int64
	MaxOutput int64
	Reserved  int64
}
