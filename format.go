package bulkhead

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// format writes a struct like %+v does, but follows pointers (nil prints
// as <nil>) and sorts map keys, so the values of optional fields show
// instead of their addresses.
func format(v any) string {
	var b strings.Builder
	writeValue(&b, reflect.ValueOf(v))
	return b.String()
}

func writeValue(b *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			b.WriteString("<nil>")
			return
		}
		writeValue(b, v.Elem())
	case reflect.Struct:
		t := v.Type()
		if isLeaf(t) {
			fmt.Fprint(b, v.Interface())
			return
		}
		b.WriteByte('{')
		first := true
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			if !first {
				b.WriteByte(' ')
			}
			first = false
			if !f.Anonymous {
				b.WriteString(f.Name)
				b.WriteByte(':')
			}
			writeValue(b, v.Field(i))
		}
		b.WriteByte('}')
	case reflect.Map:
		if v.IsNil() {
			b.WriteString("map[]")
			return
		}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(x, y reflect.Value) int {
			return strings.Compare(fmt.Sprint(x.Interface()), fmt.Sprint(y.Interface()))
		})
		b.WriteString("map[")
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprint(b, k.Interface())
			b.WriteByte(':')
			writeValue(b, v.MapIndex(k))
		}
		b.WriteByte(']')
	default:
		if v.CanInterface() {
			fmt.Fprint(b, v.Interface())
		}
	}
}

// isLeaf reports whether t is a struct printed as a whole by its own
// String method (an ID or a time), not field by field.
func isLeaf(t reflect.Type) bool {
	return t.PkgPath() == "time"
}
