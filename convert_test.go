package bulkhead

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// The round trip: the engine's vocabulary (package actor/admission) is its
// own compact form, and the facade converts it into the public types on
// cold paths. Where the two must stay parallel, these tests guard them: an
// engine value is filled with a distinct value in every field, converted,
// and every public field must come out set; and every engine field must
// reach the public value (zeroing it changes what the facade makes of it).
// So a field added on one side cannot be forgotten on the other. Types the
// facade converts by a plain type conversion (Usage, Reservation,
// Resources, Timing, RateDetail, ...) are guarded by the compiler.

// filler fills every leaf of a value with a value of its own: counting up,
// or down from a large number (a field derived as a difference of two,
// clamped at 0, is set in one of the two).
type filler struct {
	n    int64
	down bool
}

func (f *filler) next() int64 {
	f.n++
	if f.down {
		return 1_000_000 - f.n
	}
	return f.n
}

var (
	timeType    = reflect.TypeFor[time.Time]()
	errorType   = reflect.TypeFor[error]()
	anyType     = reflect.TypeFor[any]()
	requestType = reflect.TypeFor[*Request]()
)

func (f *filler) fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(f.next())
	case reflect.Uint8:
		v.SetUint(uint64(1 + f.next()%200))
	case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(f.next()))
	case reflect.Float64:
		v.SetFloat(float64(f.next()) + 0.5)
	case reflect.String:
		v.SetString(fmt.Sprint("s", f.next()))
	case reflect.Struct:
		if v.Type() == timeType {
			v.Set(reflect.ValueOf(time.Unix(f.next(), 0)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i))
			}
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem())
		v.Set(p)
	case reflect.Array:
		for i := range v.Len() {
			f.fill(v.Index(i))
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		f.fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		f.fill(k)
		f.fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Interface:
		switch v.Type() {
		case errorType:
			v.Set(reflect.ValueOf(fmt.Errorf("error %d", f.next())))
		case anyType:
			// What the engine carries for a call: its request, tag and
			// attempt number.
			v.Set(reflect.ValueOf(&taggedCall{req: &Request{Model: fmt.Sprint("m", f.next())}, tag: "tag", attempt: 3}))
		}
	}
}

// filled returns a T with every field filled.
func filled[T any](down bool) T {
	var v T
	(&filler{down: down}).fill(reflect.ValueOf(&v).Elem())
	return v
}

// unset lists the leaves of v that are zero: nil pointers, empty maps and
// slices, zero numbers and strings. A call's *Request is the caller's own:
// it is set when it is not nil.
func unset(v reflect.Value, path string, out *[]string) {
	if v.Type() == requestType {
		if v.IsNil() {
			*out = append(*out, path)
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == timeType {
			if v.Interface().(time.Time).IsZero() {
				*out = append(*out, path)
			}
			return
		}
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				unset(v.Field(i), path+"."+f.Name, out)
			}
		}
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			*out = append(*out, path)
			return
		}
		unset(v.Elem(), path, out)
	case reflect.Map:
		if v.Len() == 0 {
			*out = append(*out, path)
		}
		for it := v.MapRange(); it.Next(); {
			unset(it.Value(), path+"[]", out)
		}
	case reflect.Slice:
		if v.Len() == 0 {
			*out = append(*out, path)
		}
		for i := range v.Len() {
			unset(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Array:
		for i := range v.Len() {
			unset(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Func:
	default:
		if v.IsZero() {
			*out = append(*out, path)
		}
	}
}

// leaves calls visit with the path of each leaf of v, addressable, and a
// function that sets it to zero.
func leaves(v reflect.Value, path string, visit func(path string, zero func())) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == timeType {
			break
		}
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				leaves(v.Field(i), path+"."+f.Name, visit)
			}
		}
		return
	case reflect.Pointer:
		if !v.IsNil() {
			leaves(v.Elem(), path, visit)
		}
		return
	case reflect.Array, reflect.Slice:
		for i := range v.Len() {
			leaves(v.Index(i), fmt.Sprintf("%s[%d]", path, i), visit)
		}
		return
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			leaves(e, path+"[]", func(p string, zero func()) {
				visit(p, func() { zero(); v.SetMapIndex(k, e) })
			})
		}
		return
	}
	visit(path, func() { v.Set(reflect.Zero(v.Type())) })
}

// roundTrip checks conversion conv of engine values of type E into public
// ones: every public leaf is set for one of the two fills but those in
// elsewhere (filled by the facade from elsewhere), and every engine leaf
// reaches the result but those in ignored.
func roundTrip[E any](t *testing.T, name string, conv func(*E) any, elsewhere, ignored []string) {
	t.Helper()
	var missing []string
	for i, down := range []bool{false, true} {
		e := filled[E](down)
		var out []string
		unset(reflect.ValueOf(conv(&e)), "", &out)
		if i == 0 {
			missing = out
		} else {
			missing = slices.DeleteFunc(missing, func(p string) bool { return !slices.Contains(out, p) })
		}
	}
	missing = slices.DeleteFunc(missing, func(p string) bool { return under(p, elsewhere) })
	if len(missing) > 0 {
		t.Errorf("%s: public fields the engine's fields never set: %s", name, strings.Join(missing, ", "))
	}
	// Each leaf zeroed in a value of its own: the public value may share
	// memory with the engine's.
	var paths []string
	e := filled[E](false)
	leaves(reflect.ValueOf(&e).Elem(), "", func(path string, _ func()) { paths = append(paths, path) })
	var lost []string
	for i, path := range paths {
		want, e := filled[E](false), filled[E](false)
		j := 0
		leaves(reflect.ValueOf(&e).Elem(), "", func(_ string, zero func()) {
			if j == i {
				zero()
			}
			j++
		})
		if reflect.DeepEqual(conv(&e), conv(&want)) && !under(path, ignored) {
			lost = append(lost, path)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%s: engine fields the public value never shows: %s", name, strings.Join(lost, ", "))
	}
}

// under reports whether path is one of paths or a field under one.
func under(path string, paths []string) bool {
	return slices.ContainsFunc(paths, func(p string) bool { return path == p || strings.HasPrefix(path, p+".") })
}

// prefixed returns the paths of fields under prefix.
func prefixed(prefix string, fields ...string) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = prefix + f
	}
	return out
}

func TestStatsRoundTrip(t *testing.T) {
	roundTrip(t, "Stats", func(s *admission.Stats) any { return stats(*s) },
		// The facade's own counts, filled in by Bulkhead.Stats.
		[]string{".Events.Backlog", ".Calls.SuspectUsage", ".Calls.SuspectTokens"},
		// The gate counts no abandonment: an abandoned slot is a release there.
		prefixed(".Gate.Abandoned", "[0]", "[1]"))
}

func TestRejectDetailRoundTrip(t *testing.T) {
	// RateLimit: NeverFits comes from the engine's field alone.
	roundTrip(t, "RejectDetail", func(d *admission.RejectDetail) any { return rejectDetailFor(d, RateLimit) }, nil, nil)
	roundTrip(t, "Bypass", func(b *actor.Bypass) any { return bypassOf(b) }, nil, nil)
	// A rejection's tag is the facade's (withTag).
	roundTrip(t, "RejectedError", func(e *admission.RejectedError) any { return publicError(e) }, []string{".Tag"}, nil)
	roundTrip(t, "ConfigError", func(e *admission.ConfigError) any { return publicError(e) }, nil, nil)
}

func TestLimitsRoundTrip(t *testing.T) {
	roundTrip(t, "Limits", func(l *admission.Limits) any { return publicLimits(*l) }, nil, nil)
	roundTrip(t, "engine Limits", func(l *Limits) any { return engineLimits(*l) }, nil, nil)
	roundTrip(t, "ApplyResult", func(r *admission.ApplyResult) any { return applyResult(*r) }, nil, nil)
}

func TestUsageReportRoundTrip(t *testing.T) {
	// What a Permit's lease knows of the admission, and the engine's answer.
	type report struct {
		ID          admission.ID
		Revision    int64
		Class       string
		Reservation admission.Reservation
		Result      admission.UsageResult
	}
	b := &Bulkhead{hasBudget: true}
	roundTrip(t, "UsageReport", func(r *report) any {
		return b.usageReport(&actor.Lease{ID: r.ID, Revision: r.Revision, Class: r.Class, Reservation: r.Reservation}, r.Result)
	}, nil, []string{
		// A report counts totals (Consumed is Input + Output); the input
		// estimate is the estimator's business.
		".Reservation.Input", ".Result.Usage.CachedInput", ".Result.Usage.CacheCreation", ".Result.Usage.Reasoning",
	})
}

// kindField is the path of a field of the public event of kind k, in the
// list that deliverAll returns.
func kindField(k admission.EventKind, field string) string { return fmt.Sprintf("[%d]%s", k, field) }

// deliverAll converts e as an event of every kind, in the order of the
// kinds.
func deliverAll(b *Bulkhead, e *admission.Event) any {
	var out []any
	keep := func(ev any) { out = append(out, ev) }
	h := Hooks{
		Admit:         func(ev AdmitEvent) { keep(ev) },
		Reject:        func(ev RejectEvent) { keep(ev) },
		Release:       func(ev ReleaseEvent) { keep(ev) },
		Reconfigure:   func(ev ReconfigureEvent) { keep(ev) },
		Usage:         func(ev UsageEvent) { keep(ev) },
		Abandon:       func(ev AbandonEvent) { keep(ev) },
		Bypass:        func(ev BypassEvent) { keep(ev) },
		BypassUsage:   func(ev BypassUsageEvent) { keep(ev) },
		BypassRelease: func(ev BypassReleaseEvent) { keep(ev) },
		Dedup:         func(ev DedupEvent) { keep(ev) },
	}
	for k := range admission.NumEventKinds {
		ek := *e
		ek.Kind = k
		b.deliver(&h, &ek)
	}
	return out
}

func TestEventsRoundTrip(t *testing.T) {
	b := &Bulkhead{hasBudget: true}
	var elsewhere []string
	for _, k := range []admission.EventKind{admission.EventBypass, admission.EventBypassUsage, admission.EventBypassRelease} {
		// A bypassed call holds nothing.
		elsewhere = append(elsewhere, kindField(k, ".Admission.Resources"))
	}
	roundTrip(t, "events", func(e *admission.Event) any { return deliverAll(b, e) }, elsewhere,
		// The kind is what deliverAll varies; the reservation's input
		// estimate is on no event.
		[]string{".Kind", ".Reservation.Input"})
	e := filled[admission.Event](false)
	if got := deliverAll(b, &e).([]any); len(got) != int(admission.NumEventKinds) {
		t.Fatalf("%d kinds delivered, want %d", len(got), admission.NumEventKinds)
	}
}
