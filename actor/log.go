package actor

import (
	"context"
	"fmt"
	"log/slog"
)

// Logging: the engine's records go through a guarded handler, so a logger
// that panics loses its records, never the engine's state.

// log writes one record to the engine's logger.
func (e *Engine) log(level slog.Level, msg string, args ...any) {
	e.logger.Log(context.Background(), level, msg, args...)
}

// LogError logs an error record through the engine's guarded logger.
func (e *Engine) LogError(msg string, args ...any) { e.log(slog.LevelError, msg, args...) }

// guardedHandler passes records to the caller's handler and swallows a
// panic in it: a broken logger loses its records, never the engine's state
// or its event delivery.
type guardedHandler struct{ h slog.Handler }

func (g guardedHandler) Enabled(ctx context.Context, l slog.Level) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return g.h.Enabled(ctx, l)
}

func (g guardedHandler) Handle(ctx context.Context, r slog.Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("bulkhead: log handler panicked: %v", p)
		}
	}()
	return g.h.Handle(ctx, r)
}

func (g guardedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return guardedHandler{g.h.WithAttrs(attrs)}
}

func (g guardedHandler) WithGroup(name string) slog.Handler {
	return guardedHandler{g.h.WithGroup(name)}
}
