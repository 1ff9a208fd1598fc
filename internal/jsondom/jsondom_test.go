package jsondom

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf16"
)

func parse(t testing.TB, src string) Value {
	t.Helper()
	var d Doc
	if err := Parse(&d, []byte(src)); err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return d.Root()
}

func TestNavigate(t *testing.T) {
	v := parse(t, ` {"model":"gpt-4o","n":3,"f":1.5e2,"ok":true,"no":null,
		"messages":[{"role":"user","content":"h\u00e9llo\n"},{"content":[{"type":"text","text":"x"}]}],
		"dup":1,"dup":2,"k\"ey":"v"} `)
	if s, ok := v.Get("model").Str(); !ok || s != "gpt-4o" {
		t.Errorf("model = %q %v", s, ok)
	}
	if n, ok := v.Get("n").Int(); !ok || n != 3 {
		t.Errorf("n = %d %v", n, ok)
	}
	if n, ok := v.Get("f").Int(); !ok || n != 150 {
		t.Errorf("f = %d %v", n, ok)
	}
	if b, ok := v.Get("ok").Bool(); !ok || !b {
		t.Errorf("ok = %v %v", b, ok)
	}
	if !v.Get("no").IsNull() || !v.Get("absent").IsNull() || v.Get("absent").Exists() {
		t.Error("null/absent")
	}
	msgs := v.Get("messages")
	if msgs.Kind() != Array || msgs.Len() != 2 {
		t.Fatalf("messages kind %v len %d", msgs.Kind(), msgs.Len())
	}
	c := msgs.Index(0).Get("content")
	if s, _ := c.Str(); s != "héllo\n" {
		t.Errorf("content = %q", s)
	}
	if c.UTF16Len() != 6 {
		t.Errorf("UTF16Len = %d", c.UTF16Len())
	}
	if s, _ := msgs.Index(1).Get("content").Index(0).Get("text").Str(); s != "x" {
		t.Errorf("text = %q", s)
	}
	if n, _ := v.Get("dup").Int(); n != 2 {
		t.Errorf("dup = %d, want the last", n)
	}
	if s, _ := v.Get(`k"ey`).Str(); s != "v" {
		t.Errorf("escaped key = %q", s)
	}
	if msgs.Index(2).Exists() || msgs.Index(-1).Exists() {
		t.Error("index out of range exists")
	}
}

func TestErrorsNamePath(t *testing.T) {
	cases := []struct{ src, path, msg string }{
		{`{"messages":[{"content":"a"},{"content":tru}]}`, "messages[1].content", "invalid literal"},
		{`{"a":[1,2,]}`, "a[2]", "want a value"},
		{`{"a":"x`, "a", "unterminated string"},
		{`[1 2]`, "", "want ',' or ']'"},
		{`{"a":1}x`, "", "after the top-level value"},
		{``, "", "unexpected end of input"},
		{`{"a":"\x"}`, "a", "invalid escape"},
		{`{"a":01}`, "", "want ',' or '}'"},
		{"{\"a\":\"\x01\"}", "a", "control character"},
		{strings.Repeat("[", MaxDepth+1), strings.Repeat("[0]", MaxDepth), "nested deeper"},
	}
	for _, c := range cases {
		var d Doc
		err := Parse(&d, []byte(c.src))
		se, ok := err.(*SyntaxError)
		if !ok {
			t.Errorf("Parse(%.40q) = %v, want a *SyntaxError", c.src, err)
			continue
		}
		if se.Path != c.path || !strings.Contains(se.Msg, c.msg) {
			t.Errorf("Parse(%.40q) = path %q msg %q, want %q, %q", c.src, se.Path, se.Msg, c.path, c.msg)
		}
	}
}

func TestIntExact(t *testing.T) {
	for src, want := range map[string]int64{"3": 3, "-7": -7, "1e3": 1000, "100.0": 100, "1.5e1": 15, "0.0": 0, "-0": 0,
		"9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63, "92233720368547758.07e2": 1<<63 - 1} {
		if n, ok := parse(t, src).Int(); !ok || n != want {
			t.Errorf("Int(%s) = %d, %v; want %d", src, n, ok, want)
		}
	}
	for _, src := range []string{"1.5", "1e-400", "1.0000000000000000001", "9223372036854775808", "1e19", "1e999999", "\"1\""} {
		if n, ok := parse(t, src).Int(); ok {
			t.Errorf("Int(%s) = %d, want not an integer", src, n)
		}
	}
}

func TestCanonical(t *testing.T) {
	a := parse(t, `{ "b" : [ 1 , {"z":1,"a":2} ], "a":"x" , "\u0061b":null}`)
	got := string(a.AppendCanonical(nil))
	want := `{"a":"x","\u0061b":null,"b":[1,{"a":2,"z":1}]}` // keys as written, sorted as decoded
	if got != want {
		t.Errorf("canonical = %s, want %s", got, want)
	}
}

// check compares the parser with encoding/json on src.
func check(t *testing.T, src []byte) {
	var d Doc
	err := Parse(&d, src)
	if valid := json.Valid(src); valid != (err == nil) {
		t.Fatalf("Parse(%q) err = %v, json.Valid = %v", src, err, valid)
	}
	if err != nil {
		return
	}
	want, err := decode(src)
	if err != nil {
		t.Fatal(err)
	}
	canon := d.Root().AppendCanonical(nil)
	got, err := decode(canon)
	if err != nil {
		t.Fatalf("canonical %q of %q does not parse: %v", canon, src, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("canonical %q of %q decodes to %v, want %v", canon, src, got, want)
	}
	walk(t, d.Root(), want)
}

func decode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers too large for a float64 are valid JSON
	var v any
	err := dec.Decode(&v)
	return v, err
}

// walk checks every string's decoding and length against encoding/json's.
func walk(t *testing.T, v Value, want any) {
	switch w := want.(type) {
	case string:
		s, ok := v.Str()
		if !ok || string([]rune(s)) != w { // invalid UTF-8 is kept; encoding/json replaces it
			t.Fatalf("Str = %q, want %q", s, w)
		}
		if sh, ok := v.StrShared(); !ok || sh != s {
			t.Fatalf("StrShared = %q, want %q", sh, s)
		}
		var a Arena
		if in, ok := v.StrIn(&a); !ok || in != s {
			t.Fatalf("StrIn = %q, want %q", in, s)
		}
		if n := len(utf16.Encode([]rune(w))); v.UTF16Len() != n {
			t.Fatalf("UTF16Len(%q) = %d, want %d", v.Raw(), v.UTF16Len(), n)
		}
	case []any:
		i := 0
		for e := v.First(); e.Exists(); e = e.Next() {
			walk(t, e, w[i])
			i++
		}
	case map[string]any:
		for m := v.First(); m.Exists(); m = m.Next() {
			if m.Next().Exists() && v.Get(m.Key()).i != m.i {
				continue // a repeated key: encoding/json keeps the last
			}
			walk(t, m, w[m.Key()])
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2,{"b":"c\u00e9\ud83d\ude00"}],"d":-0.5e+3,"e":true,"f":null}`,
		`"\ud800x"`, `"\ud83d\u0041"`, `[]`, `{}`, `{"a":{"b":{"c":[[[]]]}}}`, "\"\xff\xfe\"",
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(check)
}

func TestStrSharedAliasesTheSource(t *testing.T) {
	src := []byte(`["plain","esc\u00e9",""]`)
	var d Doc
	if err := Parse(&d, src); err != nil {
		t.Fatal(err)
	}
	plain := d.Root().Index(0)
	if n := testing.AllocsPerRun(100, func() { _, _ = plain.StrShared() }); n != 0 {
		t.Errorf("StrShared of a plain string allocates %v times", n)
	}
	s, _ := plain.StrShared()
	src[2] = 'P' // the view sees the source change
	if s != "Plain" {
		t.Errorf("StrShared = %q after the source changed, want a view of it", s)
	}
	if s, _ := d.Root().Index(1).StrShared(); s != "escé" {
		t.Errorf("escaped StrShared = %q", s)
	}
	if s, ok := d.Root().Index(2).StrShared(); !ok || s != "" {
		t.Errorf("empty StrShared = %q %v", s, ok)
	}
	if _, ok := d.Root().StrShared(); ok {
		t.Error("StrShared of an array is ok")
	}
}

func TestReset(t *testing.T) {
	var d Doc
	if err := Parse(&d, []byte(`[1,2,3]`)); err != nil {
		t.Fatal(err)
	}
	d.Reset()
	if d.src != nil || len(d.nodes) != 0 || cap(d.nodes) == 0 || d.Root().Exists() {
		t.Errorf("after Reset: src %q, %d nodes of %d, root exists %v", d.src, len(d.nodes), cap(d.nodes), d.Root().Exists())
	}
	if err := Parse(&d, []byte("[0"+strings.Repeat(",0", maxKeptNodes)+"]")); err != nil {
		t.Fatal(err)
	}
	d.Reset()
	if cap(d.nodes) != 0 {
		t.Errorf("Reset kept %d nodes of storage, want at most %d", cap(d.nodes), maxKeptNodes)
	}
}

func TestArena(t *testing.T) {
	var sb strings.Builder
	sb.WriteByte('[')
	var want []string
	for i := range 300 {
		if i > 0 {
			sb.WriteByte(',')
		}
		x, y := strings.Repeat("x", i*7), strings.Repeat("y", i%5)
		sb.WriteString(`"` + x + `\n\u00e9\ud83d\ude00` + y + `"`)
		want = append(want, x+"\n\u00e9\U0001F600"+y)
	}
	sb.WriteByte(']')
	v := parse(t, sb.String())
	var got []string
	allocs := testing.AllocsPerRun(1, func() {
		var a Arena
		got = got[:0]
		for e := v.First(); e.Exists(); e = e.Next() {
			s, _ := e.StrIn(&a)
			got = append(got, s)
		}
	})
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("string %d = %q, want %q", i, got[i], want[i])
		}
	}
	if allocs > 20 {
		t.Errorf("%v allocations for %d escaped strings, want a few blocks", allocs, len(want))
	}
}
