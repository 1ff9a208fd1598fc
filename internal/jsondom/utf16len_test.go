package jsondom

import (
	"strings"
	"testing"
)

// TestUTF16LenDoesNotAllocate: measuring a long string, plain or with
// escapes, reads the source in place.
func TestUTF16LenDoesNotAllocate(t *testing.T) {
	long := strings.Repeat("hello world ", 20)
	src := []byte(`["` + long + `","` + long + `\n\u00e9` + long + `"]`)
	var d Doc
	if err := Parse(&d, src); err != nil {
		t.Fatal(err)
	}
	plain, esc := d.Root().Index(0), d.Root().Index(1)
	if n := plain.UTF16Len(); n != len(long) {
		t.Fatalf("UTF16Len = %d, want %d", n, len(long))
	}
	if n := esc.UTF16Len(); n != 2*len(long)+2 {
		t.Fatalf("escaped UTF16Len = %d, want %d", n, 2*len(long)+2)
	}
	if n := testing.AllocsPerRun(100, func() { _ = plain.UTF16Len() + esc.UTF16Len() }); n != 0 {
		t.Errorf("UTF16Len allocates %v times", n)
	}
}

func TestStringUTF16Len(t *testing.T) {
	for _, c := range []struct {
		in string
		n  int
		ok bool
	}{
		{`""`, 0, true},
		{`"abc"`, 3, true},
		{`"\u00e9t\u00e9 \ud83d\ude00"`, 6, true},
		{`"été 😀"`, 6, true},
		{`"a\"b"`, 3, true},
		{`"a\\"`, 2, true},
		{`"a\\""`, 0, false}, // a string and a stray quote
		{`"a" `, 0, false},
		{` "a"`, 0, false},
		{`"a`, 0, false},
		{`"a\x"`, 0, false},
		{"\"a\nb\"", 0, false},
		{`"a","b"`, 0, false},
		{`a`, 0, false},
		{``, 0, false},
	} {
		n, ok := StringUTF16Len([]byte(c.in))
		if n != c.n || ok != c.ok {
			t.Errorf("StringUTF16Len(%q) = %d, %v; want %d, %v", c.in, n, ok, c.n, c.ok)
		}
		var d Doc
		if err := Parse(&d, []byte(c.in)); c.ok && (err != nil || d.Root().UTF16Len() != n) {
			t.Errorf("%q: Parse disagrees: %v, %d", c.in, err, d.Root().UTF16Len())
		}
	}
	b := []byte(`"hello world, hello world, hello world"`)
	if a := testing.AllocsPerRun(100, func() { _, _ = StringUTF16Len(b) }); a != 0 {
		t.Errorf("StringUTF16Len allocates %v times", a)
	}
}

// FuzzStringUTF16Len: StringUTF16Len agrees with Parse on every input.
func FuzzStringUTF16Len(f *testing.F) {
	for _, s := range []string{`"abc"`, `"\u00e9\ud83d\ude00"`, `"a\"b"`, `"a\\"`, `"a`, ` "a"`, "\"\xff\"", `"a","b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, ok := StringUTF16Len(b)
		var d Doc
		err := Parse(&d, b)
		want := err == nil && d.Root().Kind() == String && len(b) > 0 && b[0] == '"' && b[len(b)-1] == '"'
		if ok != want || ok && n != d.Root().UTF16Len() {
			t.Fatalf("StringUTF16Len(%q) = %d, %v; Parse: %v, %d", b, n, ok, err, d.Root().UTF16Len())
		}
	})
}
