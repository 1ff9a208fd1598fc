package admission

import "math"

// Usage is the number of tokens a call consumed, as the provider reports it.
// Both fields are non-negative.
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

// Reservation is how many tokens an admission holds against the token
// budget: the input estimate plus the most output the call may produce.
//
// Reserved is Input + MaxOutput. In a per-call reservation override it may
// be left zero; when set it must equal Input + MaxOutput.
type Reservation struct {
	Input     int64
	MaxOutput int64
	Reserved  int64
}
