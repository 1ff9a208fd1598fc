package gateway

import (
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unknownKey finds the first key of n (a document node, or a node under
// path) that t, the type it decodes into, does not take, and reports it
// with its line and the section it is in, and the nearest key t takes when
// one is close enough to be a misspelling.
func (v *validator) unknownKey(n *yaml.Node, t reflect.Type, path []string) bool {
	if n == nil {
		return false
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return false // a value such as a duration, read by its own method
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if v.unknownKey(c, t, path) {
				return true
			}
		}
	case yaml.AliasNode:
		return v.unknownKey(n.Alias, t, path)
	case yaml.SequenceNode:
		if t.Kind() == reflect.Struct { // the mappings of a merge: <<: [*a, *b]
			for _, c := range n.Content {
				if v.unknownKey(c, t, path) {
					return true
				}
			}
			return false
		}
		if t.Kind() != reflect.Slice {
			return false // a type error, which the decoder reports
		}
		for i, c := range n.Content {
			if v.unknownKey(c, t.Elem(), append(path, strconv.Itoa(i))) {
				return true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			switch t.Kind() {
			case reflect.Map:
				if v.unknownKey(val, t.Elem(), append(path, k.Value)) {
					return true
				}
			case reflect.Struct:
				if k.Tag == "!!merge" { // <<: *anchor merges a mapping (or a list of them) into this one
					if v.unknownKey(val, t, path) {
						return true
					}
					continue
				}
				f, ok := fieldOf(t, k.Value)
				if !ok {
					v.err = &ConfigError{File: v.file, Line: k.Line, Key: strings.Join(path, "."), Problem: unknownProblem(t, k.Value)}
					return true
				}
				if v.unknownKey(val, f.Type, append(path, k.Value)) {
					return true
				}
			}
		}
	}
	return false
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// fieldOf is the field of struct t that the YAML key name decodes into.
func fieldOf(t reflect.Type, name string) (reflect.StructField, bool) {
	for _, f := range yamlFields(t) {
		if yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// yamlFields are the exported fields of struct t that YAML keys decode
// into, with those of its inline structs (`yaml:",inline"`).
func yamlFields(t reflect.Type) []reflect.StructField {
	var fs []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case !f.IsExported():
		case f.Type.Kind() == reflect.Struct && strings.Contains(f.Tag.Get("yaml"), ",inline"):
			fs = append(fs, yamlFields(f.Type)...)
		default:
			fs = append(fs, f)
		}
	}
	return fs
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

// unknownProblem says that struct t takes no key name, and suggests the key
// it takes that is nearest name, when one is within two edits of it.
func unknownProblem(t reflect.Type, name string) string {
	problem := "unknown key " + strconv.Quote(name)
	best, bestDist := "", 3
	for _, f := range yamlFields(t) {
		if d := editDistance(name, yamlName(f)); d < bestDist {
			best, bestDist = yamlName(f), d
		}
	}
	if best != "" {
		problem += " (did you mean " + best + "?)"
	}
	return problem
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
