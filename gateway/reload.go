package gateway

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmbulkhead/bulkhead"
)

// ReloadOutcome is what a reload did.
type ReloadOutcome string

// The outcomes of a reload, as bulkhead_gateway_reloads_total counts them.
const (
	// ReloadApplied: the file changed what a running gateway can change,
	// and the gateway serves it now.
	ReloadApplied ReloadOutcome = "applied"
	// ReloadUnchanged: the file says what the gateway serves already.
	ReloadUnchanged ReloadOutcome = "unchanged"
	// ReloadInvalid: the file could not be read, or is not valid; nothing
	// changed.
	ReloadInvalid ReloadOutcome = "invalid"
	// ReloadRefused: the file changes what needs a restart (see
	// RestartError); nothing changed.
	ReloadRefused ReloadOutcome = "refused"
)

var reloadOutcomes = []ReloadOutcome{ReloadApplied, ReloadUnchanged, ReloadInvalid, ReloadRefused}

// ReloadResult is what Reload did.
type ReloadResult struct {
	// Outcome says whether the configuration was applied.
	Outcome ReloadOutcome
	// Revision is the revision of the configuration the gateway serves
	// after the reload: 1 for Build's, one more at each applied reload.
	Revision int64
	// Digest is the SHA-256 of the file the gateway serves, in hex.
	Digest string
	// Changes are what the file changes, key by key: those applied, or
	// (refused) those that need a restart.
	Changes []ConfigChange
	// At is when the reload ended.
	At time.Time
	// Err is why the file was not applied; nil when it was.
	Err error
}

// ConfigChange is a key whose value a reloaded file changes.
type ConfigChange struct {
	// Key is the key's path, such as "bulkheads.gpt4o.max_concurrent" or
	// "clients.batch".
	Key string
	// Line is the key's line in the new file; 0 for a key it removes.
	Line int
	// Old and New are the values, as the file writes them; "" for a key
	// that was absent, or that the change adds or removes whole. A
	// client's key digest is never shown.
	Old, New string
	// Added and Removed say that the change adds or removes the key.
	Added, Removed bool
}

// String returns "key: old -> new", "key: added" or "key: removed".
func (c ConfigChange) String() string {
	switch {
	case c.Added:
		return c.Key + ": added"
	case c.Removed:
		return c.Key + ": removed"
	case c.Old == "" && c.New == "":
		return c.Key + ": changed"
	}
	return c.Key + ": " + c.Old + " -> " + c.New
}

// RestartError is the error of a reload whose file changes what a running
// gateway keeps until it restarts: the listener (listen, tls), the
// request bodies' bounds (body_budget_bytes, body_timeout), the shutdown
// timings, the log's format, the redis servers, the telemetry section, the
// set of bulkheads, and a bulkhead's structure (see the gateway guide).
// The gateway goes on serving the configuration in force, whole.
type RestartError struct {
	// File is the new file's name.
	File string
	// Changes are the keys that need a restart.
	Changes []ConfigChange
}

// Error returns "gateway: <file>:<line>: <key>: <change>: needs a
// restart ...".
func (e *RestartError) Error() string {
	if len(e.Changes) == 0 {
		return "gateway: " + e.File + ": needs a restart"
	}
	c := e.Changes[0]
	loc := e.File
	if c.Line > 0 {
		loc += ":" + strconv.Itoa(c.Line)
	}
	msg := "gateway: " + loc + ": " + c.String() + ": a running gateway cannot change it; restart to apply the file (the configuration in force stays)"
	if n := len(e.Changes) - 1; n > 0 {
		keys := make([]string, 0, n)
		for _, c := range e.Changes[1:] {
			keys = append(keys, c.Key)
		}
		msg += "; nor " + strings.Join(keys, ", ")
	}
	return msg
}

// reloads is a gateway's reload bookkeeping.
type reloads struct {
	// mu lets one reload run at a time; it guards Gateway.cfg and
	// Gateway.transports.
	mu     sync.Mutex
	counts *prometheus.CounterVec
	last   atomic.Pointer[ReloadResult] // the last reload, for /status
	closed atomic.Bool                  // Shutdown has begun
}

// registerReloads registers the reloads' counter and the configuration's
// revision on reg.
func (g *Gateway) registerReloads(reg *prometheus.Registry) error {
	g.reload.counts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bulkhead_gateway_reloads_total",
		Help: "Reloads of the configuration file, by result: applied, unchanged, invalid (nothing changed), refused (a change that needs a restart; nothing changed)."},
		[]string{"result"})
	for _, o := range reloadOutcomes {
		g.reload.counts.WithLabelValues(string(o))
	}
	revision := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bulkhead_gateway_config_revision",
		Help: "The revision of the configuration the gateway serves: 1 at start, one more at each reload applied."},
		func() float64 { return float64(g.state.Load().revision) })
	if err := reg.Register(g.reload.counts); err != nil {
		return err
	}
	return reg.Register(revision)
}

// ReloadFile reads the configuration file at path again and applies it
// (see Reload). A file that cannot be read or parsed changes nothing, and
// is counted and logged as invalid.
func (g *Gateway) ReloadFile(path string) (*ReloadResult, error) {
	cfg, err := LoadConfig(path)
	if err != nil {
		g.reload.mu.Lock()
		defer g.reload.mu.Unlock()
		return g.reloaded(&ReloadResult{Outcome: ReloadInvalid}, err)
	}
	return g.Reload(cfg)
}

// Reload applies cfg, a configuration read again, to the running
// gateway, as one change, or not at all. What it may change:
//
//   - clients (added, removed, their keys, tenants and priority),
//     trust_headers, class and priority: from the next request on;
//   - upstreams and routes (added, removed, changed): from the next
//     request on; a request in flight (a stream included) goes on with the
//     route, upstream and key it started with;
//   - log.requests;
//   - a bulkhead's limits: max_concurrent, max_queue, token_budget (when
//     it had one), high_priority_reserve, and its classes' floors and
//     ceilings, applied as one revision of its limits (see
//     bulkhead.Bulkhead.ApplyLimits) in force from the next admission;
//     calls admitted before keep running, and a lowered limit takes
//     effect as they finish. With adaptive limits, max_concurrent and
//     token_budget are the controller's, and need a restart.
//
// Anything else that differs is refused with a *RestartError naming every
// such key, and an invalid file with a *ConfigError naming the file, the
// line and the key (as Build does): either way nothing changes, and the
// gateway serves the configuration in force, whole. Environment variables
// are read again with Build's lookupEnv (a client's or an upstream's key).
// Every reload is logged (with what it changed) on the request log's
// logger and counted in /metrics as bulkhead_gateway_reloads_total{result};
// /status shows the revision and the last reload.
//
// One reload runs at a time. A reload after Shutdown has begun fails with
// an error matching bulkhead.ErrShutdown.
func (g *Gateway) Reload(cfg *Config) (*ReloadResult, error) {
	g.reload.mu.Lock()
	defer g.reload.mu.Unlock()
	if g.reload.closed.Load() {
		return nil, fmt.Errorf("gateway: reload after Shutdown: %w", bulkhead.ErrShutdown)
	}
	file := cfg.file
	if file == "" {
		file = g.file
	}
	v := &validator{file: file, root: cfg.root}
	old := g.cfg
	res := &ReloadResult{Changes: diffConfig(old, cfg, v)}
	if len(res.Changes) == 0 {
		res.Outcome = ReloadUnchanged
		return g.reloaded(res, nil)
	}
	var restart []ConfigChange
	for _, c := range res.Changes {
		if !reloadable(c, old) {
			restart = append(restart, c)
		}
	}
	if len(restart) > 0 {
		res.Outcome, res.Changes = ReloadRefused, restart
		return g.reloaded(res, &RestartError{File: file, Changes: restart})
	}
	res.Outcome = ReloadInvalid
	st, err := g.newServed(cfg, v)
	if err != nil {
		return g.reloaded(res, err)
	}
	plan, err := g.limitChanges(old, cfg, v)
	if err != nil {
		return g.reloaded(res, err)
	}
	if err := applyAll(plan); err != nil {
		return g.reloaded(res, err)
	}
	st.revision, st.loaded = g.state.Load().revision+1, time.Now()
	g.state.Store(st)
	g.proxy.routes.Store(st.table)
	g.cfg = cfg
	res.Outcome = ReloadApplied
	return g.reloaded(res, nil)
}

// reloaded completes res with err and the state in force, counts and logs
// it, and returns it with err. g.reload.mu is held.
func (g *Gateway) reloaded(res *ReloadResult, err error) (*ReloadResult, error) {
	st := g.state.Load()
	res.Err, res.Revision, res.Digest, res.At = err, st.revision, hex.EncodeToString(st.digest[:]), time.Now()
	g.reload.counts.WithLabelValues(string(res.Outcome)).Inc()
	g.reload.last.Store(res)
	attrs := []slog.Attr{slog.String("result", string(res.Outcome)), slog.Int64("revision", res.Revision), slog.String("digest", res.Digest[:16])}
	if len(res.Changes) > 0 {
		changes := make([]string, len(res.Changes))
		for i, c := range res.Changes {
			changes[i] = c.String()
		}
		attrs = append(attrs, slog.Any("changes", changes))
	}
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	g.logger.LogAttrs(context.Background(), level, "configuration reload", attrs...)
	flushLogs(g.logger)
	return res, err
}

// limitChange is a new revision of one bulkhead's limits.
type limitChange struct {
	b    *bulkhead.Bulkhead
	next func(cur bulkhead.Limits) bulkhead.Limits // from the limits in force
}

// limitChanges returns the changes of limits from old to cfg, each
// bulkhead's new limits checked first as Build checks them.
func (g *Gateway) limitChanges(old, cfg *Config, v *validator) ([]limitChange, error) {
	var plan []limitChange
	for _, name := range sortedKeys(cfg.Bulkheads) {
		was, now := old.Bulkheads[name], cfg.Bulkheads[name]
		if reflect.DeepEqual(was, now) {
			continue
		}
		weight, _ := cfg.tokenWeight(name) // checked by ParseConfig
		probe, err := bulkhead.New(now.config(nil, nil, weight))
		if err != nil {
			var ce *bulkhead.ConfigError
			if errors.As(err, &ce) {
				return nil, v.at(keyOf("bulkhead", ce.Field, name), "%s", keyProblem("bulkhead", ce.Field, ce.Problem))
			}
			return nil, err
		}
		_, _ = probe.Shutdown(context.Background())
		plan = append(plan, limitChange{b: g.Bulkheads[name], next: func(cur bulkhead.Limits) bulkhead.Limits {
			return nextLimits(cur, was, now)
		}})
	}
	return plan, nil
}

// nextLimits returns cur, the limits in force, with what the file changes
// from was to now.
func nextLimits(cur bulkhead.Limits, was, now BulkheadConfig) bulkhead.Limits {
	next := cur.Clone()
	next.Revision = cur.Revision + 1
	if was.MaxConcurrent != now.MaxConcurrent {
		next.MaxConcurrent = now.MaxConcurrent
	}
	if was.MaxQueue != now.MaxQueue {
		next.MaxQueue = now.MaxQueue
	}
	if tb := next.TokenBudget; tb != nil && was.TokenBudget != nil && now.TokenBudget != nil {
		if *was.TokenBudget != *now.TokenBudget {
			tb.Budget = *now.TokenBudget
		}
		if was.HighPriorityReserve != now.HighPriorityReserve {
			tb.HighPriorityReserve = now.HighPriorityReserve
		}
	}
	if next.Classes != nil && was.Classes != nil && now.Classes != nil {
		for name, l := range now.Classes.Limits {
			if !reflect.DeepEqual(was.Classes.Limits[name], l) {
				next.Classes.Limits[name] = l.limits()
			}
		}
	}
	return next
}

// maxApplyTries bounds the tries of a change of limits that an adaptive
// controller's own changes keep making stale.
const maxApplyTries = 8

// applyAll applies every change of plan, or none: when one fails, those
// applied before it are undone.
func applyAll(plan []limitChange) error {
	var done []limitChange
	var prev []bulkhead.Limits
	for _, c := range plan {
		was, err := apply(c.b, c.next)
		if err != nil {
			for i := len(done) - 1; i >= 0; i-- {
				p := prev[i]
				_, _ = apply(done[i].b, func(cur bulkhead.Limits) bulkhead.Limits {
					p.Revision = cur.Revision + 1
					return p
				})
			}
			return err
		}
		done, prev = append(done, c), append(prev, was)
	}
	return nil
}

// apply applies next of the limits in force to b, again when another
// change made it stale, and returns the limits it replaced.
func apply(b *bulkhead.Bulkhead, next func(bulkhead.Limits) bulkhead.Limits) (bulkhead.Limits, error) {
	for range maxApplyTries {
		res, err := b.ApplyLimits(next(b.Limits()))
		switch {
		case err != nil:
			return bulkhead.Limits{}, err
		case res.Applied:
			return res.Previous, nil
		}
	}
	return bulkhead.Limits{}, fmt.Errorf("gateway: the limits changed %d times while being applied", maxApplyTries)
}

// reloadable reports whether a running gateway can make change c to old
// (see Reload).
func reloadable(c ConfigChange, old *Config) bool {
	path := strings.Split(c.Key, ".")
	switch path[0] {
	case "clients", "trust_headers", "class", "priority", "allow_unauthenticated", "upstreams", "routes", "attempt_header":
		return true
	case "log":
		return len(path) == 2 && path[1] == "requests"
	case "bulkheads":
		if len(path) < 3 {
			return false // a bulkhead added or removed
		}
		adaptive := old.Bulkheads[path[1]].Adaptive != nil
		switch path[2] {
		case "max_queue", "high_priority_reserve":
			return true
		case "max_concurrent":
			return !adaptive
		case "token_budget":
			return !adaptive && !c.Added && !c.Removed
		case "classes":
			// A class's floors and ceilings: classes.limits.<class>.<key>.
			return len(path) >= 6 && path[3] == "limits"
		}
	}
	return false
}

// diffConfig returns the keys whose values differ from a to b, in the
// order of the file's keys, with their lines in b.
func diffConfig(a, b *Config, v *validator) []ConfigChange {
	var out []ConfigChange
	diffValue(reflect.ValueOf(*a), reflect.ValueOf(*b), nil, v, &out)
	return out
}

// diffValue appends to out the differences between a and b, the values at
// path.
func diffValue(a, b reflect.Value, path []string, v *validator, out *[]ConfigChange) {
	key := strings.Join(path, ".")
	change := func(c ConfigChange) {
		c.Key = key
		if !c.Removed {
			c.Line = v.line(path)
		}
		*out = append(*out, c)
	}
	switch a.Kind() {
	case reflect.Struct:
		t := a.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if name := yamlName(f); f.IsExported() && name != "" && name != "-" {
				diffValue(a.Field(i), b.Field(i), append(slices.Clip(path), name), v, out)
			}
		}
		return
	case reflect.Pointer:
		switch {
		case a.IsNil() && b.IsNil():
		case a.IsNil():
			change(ConfigChange{Added: true, New: scalar(b.Elem(), path)})
		case b.IsNil():
			change(ConfigChange{Removed: true, Old: scalar(a.Elem(), path)})
		default:
			diffValue(a.Elem(), b.Elem(), path, v, out)
		}
		return
	case reflect.Map:
		keys := map[string]bool{}
		for _, k := range a.MapKeys() {
			keys[k.String()] = true
		}
		for _, k := range b.MapKeys() {
			keys[k.String()] = true
		}
		for _, k := range sortedKeys(keys) {
			av, bv := a.MapIndex(reflect.ValueOf(k)), b.MapIndex(reflect.ValueOf(k))
			p := append(slices.Clip(path), k)
			switch {
			case !av.IsValid():
				*out = append(*out, ConfigChange{Key: strings.Join(p, "."), Line: v.line(p), Added: true})
			case !bv.IsValid():
				*out = append(*out, ConfigChange{Key: strings.Join(p, "."), Removed: true})
			default:
				diffValue(av, bv, p, v, out)
			}
		}
		return
	case reflect.Slice:
		if a.Type().Elem().Kind() == reflect.Struct { // routes: each by its index
			for i := range max(a.Len(), b.Len()) {
				p := append(slices.Clip(path), strconv.Itoa(i))
				switch {
				case i >= a.Len():
					*out = append(*out, ConfigChange{Key: strings.Join(p, "."), Line: v.line(p), Added: true})
				case i >= b.Len():
					*out = append(*out, ConfigChange{Key: strings.Join(p, "."), Removed: true})
				default:
					diffValue(a.Index(i), b.Index(i), p, v, out)
				}
			}
			return
		}
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		change(ConfigChange{Old: scalar(a, path), New: scalar(b, path)})
	}
}

// scalar is how the change of the value x at path is shown: "" for a
// mapping (the key's path says which), a client's key digest, or nothing.
func scalar(x reflect.Value, path []string) string {
	if len(path) > 0 && path[len(path)-1] == "key_sha256" {
		return ""
	}
	if d, ok := x.Interface().(Duration); ok {
		return time.Duration(d).String()
	}
	switch x.Kind() {
	case reflect.Struct, reflect.Map:
		return ""
	case reflect.String:
		return strconv.Quote(x.String())
	}
	return fmt.Sprint(x.Interface())
}
