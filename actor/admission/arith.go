package admission

import "math"

// Token arithmetic. Every token count is a non-negative int64, and no sum
// of them may wrap: a gauge (what is held now) that would pass
// math.MaxInt64 is an error for the operation that would take it there,
// checked before anything changes; a cumulative total (what was ever
// reserved, consumed, refunded or overrun) saturates at math.MaxInt64
// instead, since no single operation is to blame for a long life.

// Exceeds reports whether used + add > limit, for non-negative used, add
// and limit, without overflowing.
func Exceeds(used, add, limit int64) bool {
	return used > limit || add > limit-used
}

// Add returns a + b for non-negative a and b, and false when the sum
// overflows int64.
func Add(a, b int64) (int64, bool) {
	if b > math.MaxInt64-a {
		return math.MaxInt64, false
	}
	return a + b, true
}

// AddSat returns a + b for non-negative a and b, or math.MaxInt64 when the
// sum would pass it: the rule for cumulative totals.
func AddSat(a, b int64) int64 {
	s, _ := Add(a, b)
	return s
}
