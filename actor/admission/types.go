package admission

import (
	"encoding/hex"
	"strconv"
	"time"
)

// Priority is a call's claim on the token budget's high-priority reserve.
type Priority uint8

// The priorities. Normal is the zero value.
const (
	// Normal calls may use the budget less the high-priority reserve.
	Normal Priority = iota
	// High calls may use the whole budget.
	High
)

// String returns "normal" or "high".
func (p Priority) String() string {
	if p == High {
		return "high"
	}
	return "normal"
}

// MarshalText encodes the priority as "normal" or "high".
func (p Priority) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// ID identifies one admission. It is a random RFC 4122 version 4 UUID,
// minted when the call is admitted and carried by every artefact of that
// admission: its token, run context, usage reports and events. A bypass's
// ID is a version 8 UUID (see Bypass).
type ID [16]byte

// Bypass reports whether the ID is a bypass's: version 8, where an
// admission's is version 4.
func (id ID) Bypass() bool { return id[6]>>4 == 8 }

// String formats the ID as a UUID, such as
// "1b4e28ba-2fa1-41d2-883f-0016d3cca427", with the prefix "shadow-" for a
// bypass's. The zero ID formats as "".
func (id ID) String() string {
	if id == (ID{}) {
		return ""
	}
	if id.Bypass() {
		return "shadow-" + id.UUID()
	}
	return id.UUID()
}

// UUID formats the ID as a canonical 36-character UUID, whatever its
// version, the zero ID included.
func (id ID) UUID() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// MarshalText encodes the ID as its UUID string.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// The engine's forms of bulkhead.Resources, bulkhead.DrainResult and
// bulkhead.Timing: the facade converts each with a type conversion, so the
// fields stay the same, in the same order, and the root types document
// them.
type (
	Resources struct {
		BorrowedConcurrency bool
		BorrowedTokens      int64
	}
	DrainResult struct {
		Drained                                  bool
		InFlight, Pending, Bypassed, DedupActive int
	}
	Timing struct{ DecisionDuration, QueueWait, RateWait time.Duration }
)

// AbandonCause says why a borrowed slot was given back early.
type AbandonCause uint8

// The abandonment causes.
const (
	// AbandonManual is a call to AbandonBorrowedConcurrency.
	AbandonManual AbandonCause = iota
	// AbandonDeadline is the expiry of a borrowed-slot deadline.
	AbandonDeadline
	numCauses
)

// NumCauses is the number of abandonment causes; causes index arrays of
// that size.
const NumCauses = int(numCauses)

// String returns "manual" or "deadline".
func (c AbandonCause) String() string {
	switch c {
	case AbandonManual:
		return "manual"
	case AbandonDeadline:
		return "deadline"
	}
	return "cause(" + strconv.Itoa(int(c)) + ")"
}
