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
