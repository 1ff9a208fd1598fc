package gateway

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/pacer"
)

// TestGoKeysCoverTheConfig checks goKeys, the map from the fields that
// bulkhead.New and fleet.New name in their errors to the file's keys:
// every field of bulkhead.Config and fleet.Config that a bulkhead's section
// sets has its key there, and every key there is one the file has.
func TestGoKeysCoverTheConfig(t *testing.T) {
	var b BulkheadConfig
	fill(reflect.ValueOf(&b).Elem())
	b.Adaptive.Rule, b.Adaptive.Cooldown, b.Fleet.OnFailure = "gradient", "shed", "open" // names of values other than the zero one
	// Stand-ins for the rates' store and the pool, which the file names
	// (rate_limits.redis, fleet) and Build makes.
	cfg := b.config(struct{ pacer.Store }{}, new(fleet.Pool), bulkhead.WeightLarger)
	fields := setFields(reflect.ValueOf(cfg), "bulkhead.Config")
	fields = append(fields, setFields(reflect.ValueOf(b.Fleet.config(nil)), "fleet.Config")...)
	if len(fields) < 35 {
		t.Fatalf("only %d fields set: %v", len(fields), fields)
	}
	for _, f := range fields {
		if f == "fleet.Config.Client" {
			continue // the client Build makes for fleet.redis (nil here)
		}
		if _, ok := goKeys[f]; !ok {
			t.Errorf("goKeys has no key for %s, which a bulkhead's section sets", f)
		}
	}
	for f, key := range goKeys {
		if !fileHasKey(reflect.TypeFor[Config](), strings.Split(key, ".")) {
			t.Errorf("goKeys maps %s to %s, which is not a key of the file", f, key)
		}
	}
}

// fill sets every field of v, recursively, to a value other than its
// zero: a map or a slice gets one element, named "c".
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("c")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Map:
		e := reflect.New(v.Type().Elem()).Elem()
		fill(e)
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(reflect.ValueOf("c"), e)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	}
}

// setFields returns the paths of v's fields that are set (not zero), each
// to a value that is not a struct or a map of structs, with map keys
// written [*].
func setFields(v reflect.Value, path string) []string {
	var out []string
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				out = append(out, setFields(v.Field(i), path+"."+f.Name)...)
			}
		}
	case reflect.Pointer:
		if !v.IsNil() && v.Elem().Kind() == reflect.Struct {
			out = setFields(v.Elem(), path)
		}
		if !v.IsNil() && len(out) == 0 { // a value, or a struct with nothing exported set (a *fleet.Pool)
			out = append(out, path)
		}
	case reflect.Map:
		if v.Len() > 0 && v.Type().Elem().Kind() == reflect.Struct {
			for _, k := range v.MapKeys() {
				out = append(out, setFields(v.MapIndex(k), path+"[*]")...)
			}
		} else if v.Len() > 0 {
			out = append(out, path)
		}
	default:
		if !v.IsZero() {
			out = append(out, path)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// fileHasKey reports whether the file, decoded into t, has the key path
// (a "*" is any map key or list index).
func fileHasKey(t reflect.Type, path []string) bool {
	for _, p := range path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			f, ok := fieldOf(t, p)
			if !ok {
				return false
			}
			t = f.Type
		case reflect.Map:
			t = t.Elem()
		case reflect.Slice:
			if _, err := strconv.Atoi(p); p != "*" && err != nil {
				return false
			}
			t = t.Elem()
		default:
			return false
		}
	}
	return true
}
