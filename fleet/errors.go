package fleet

import (
	"errors"
	"fmt"
	"strings"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// ErrUnavailable matches every error about Redis failing to answer a pool
// operation: unreachable, too slow (longer than Config.CallTimeout), answering
// with an error, or skipped because the circuit breaker is open. The error
// wraps the client's own error too, so errors.As can reach it. Reserve puts
// it in Result.Fallback, never in its returned error.
var ErrUnavailable = errors.New("fleet: Redis unavailable")

// ErrClosed is the error of a Reserve or SetLimits on a closed Pool.
var ErrClosed = errors.New("fleet: pool closed")

// ConfigError reports an invalid Config field or argument. It matches
// bulkhead.ErrInvalid, like the bulkhead's own configuration errors. Invalid
// input is caught before Redis is called.
type ConfigError struct {
	// Field names the bad field or argument, such as "Config.Pool".
	Field string
	// Problem says what is wrong with it.
	Problem string
}

// Error returns "fleet: invalid <Field>: <Problem>".
func (e *ConfigError) Error() string { return "fleet: invalid " + e.Field + ": " + e.Problem }

// Is reports whether target is bulkhead.ErrInvalid.
func (e *ConfigError) Is(target error) bool { return target == admission.ErrInvalid }

func invalidf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// checkName refuses names that would break the key's hash tag.
func checkName(field, v string) error {
	if strings.ContainsAny(v, "{}") {
		return invalidf(field, "must not contain '{' or '}', got %q", v)
	}
	return nil
}

// unavailable wraps a Redis error so that it matches ErrUnavailable.
func unavailable(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
