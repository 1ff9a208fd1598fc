package stream

import (
	"errors"
	"fmt"

	"github.com/llmbulkhead/bulkhead"
)

// BodyError is a request body that cannot be read as its format: not JSON,
// or a field of the wrong type. It matches bulkhead.ErrInvalid: such a call
// is refused before anything is taken.
type BodyError struct {
	// Format is the format the body was read as.
	Format Format
	// Field is the JSON path of the bad field, such as
	// "messages[2].content"; "" for the body as a whole.
	Field string
	// Offset is the byte offset in the body where the problem was found,
	// -1 when it is not known.
	Offset int
	// Problem says what is wrong, such as "want a string or an array,
	// got a number".
	Problem string
}

// Error returns "stream: invalid <format> body: <field>: <problem>".
func (e *BodyError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("stream: invalid %s body: %s", e.Format, e.Problem)
	}
	return fmt.Sprintf("stream: invalid %s body: %s: %s", e.Format, e.Field, e.Problem)
}

// Is reports whether target is bulkhead.ErrInvalid.
func (e *BodyError) Is(target error) bool { return target == bulkhead.ErrInvalid }

// ErrUnknownEndpoint is the error of ReadRequest for a request to an
// endpoint that FormatOf does not recognise.
var ErrUnknownEndpoint = errors.New("stream: unknown endpoint")

// ErrBodyTooLarge matches every *TooLargeError.
var ErrBodyTooLarge = errors.New("stream: request body too large")

// TooLargeError is a request body over the configured size limit. It is
// reported before the body is parsed, having read at most Limit+1 bytes.
// It matches ErrBodyTooLarge and bulkhead.ErrInvalid.
type TooLargeError struct {
	// Limit is the limit in bytes.
	Limit int64
}

// Error returns "stream: request body larger than <limit> bytes".
func (e *TooLargeError) Error() string {
	return fmt.Sprintf("stream: request body larger than %d bytes", e.Limit)
}

// Is reports whether target is ErrBodyTooLarge or bulkhead.ErrInvalid.
func (e *TooLargeError) Is(target error) bool {
	return target == ErrBodyTooLarge || target == bulkhead.ErrInvalid
}
