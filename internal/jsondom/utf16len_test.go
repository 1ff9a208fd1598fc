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

func TestScanString(t *testing.T) {
	for _, c := range []struct {
		in   string
		size int
		n    int
		ok   bool
	}{
		{`""`, 2, 0, true},
		{`"abc"`, 5, 3, true},
		{`"abc",`, 5, 3, true},
		{`"\u00e9t\u00e9 \ud83d\ude00"}`, 28, 6, true},
		{`"été 😀"`, 12, 6, true},
		{`"a\"b"x`, 6, 3, true},
		{`"a\\"`, 5, 2, true},
		{`"a\\""`, 5, 2, true},
		{` "a"`, 0, 0, false},
		{`"a`, 0, 0, false},
		{`"é`, 0, 0, false},
		{`"a\x"`, 0, 0, false},
		{"\"a\nb\"", 0, 0, false},
		{"\"\xff\"", 3, 1, true}, // invalid UTF-8 is kept, one unit a byte
		{`a`, 0, 0, false},
		{``, 0, 0, false},
	} {
		size, n, ok := ScanString([]byte(c.in))
		if size != c.size || n != c.n || ok != c.ok {
			t.Errorf("ScanString(%q) = %d, %d, %v; want %d, %d, %v", c.in, size, n, ok, c.size, c.n, c.ok)
		}
	}
	b := []byte(`"hello world, hello world, hello world", "été"`)
	if a := testing.AllocsPerRun(100, func() { _, _, _ = ScanString(b); _, _, _ = ScanString(b[41:]) }); a != 0 {
		t.Errorf("ScanString allocates %v times", a)
	}
}

// FuzzScanString: ScanString agrees with Parse on every input.
func FuzzScanString(f *testing.F) {
	for _, s := range []string{`"abc"`, `"\u00e9\ud83d\ude00",1`, `"a\"b"`, `"a\\"`, `"a`, ` "a"`, "\"\xff\"", `"a","b"`, `"é"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		size, n, ok := ScanString(b)
		if !ok {
			// No prefix of b is a string Parse takes.
			for i := 2; i <= len(b); i++ {
				var d Doc
				if Parse(&d, b[:i]) == nil && d.Root().Kind() == String && b[0] == '"' {
					t.Fatalf("ScanString(%q) failed, Parse takes %q", b, b[:i])
				}
			}
			return
		}
		var d Doc
		if err := Parse(&d, b[:size]); err != nil || d.Root().Kind() != String || d.Root().UTF16Len() != n {
			t.Fatalf("ScanString(%q) = %d, %d; Parse of %q: %v, %d", b, size, n, b[:size], err, d.Root().UTF16Len())
		}
	})
}
