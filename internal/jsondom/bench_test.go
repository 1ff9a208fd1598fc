package jsondom

import (
	"fmt"
	"strings"
	"testing"
)

func BenchmarkParse400KB(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"gpt-4o","messages":[`)
	for i := 0; sb.Len() < 400<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"role":"user","content":"%s line %d\nwith an escape \u00e9"}`, strings.Repeat("lorem ipsum dolor sit amet ", 20), i)
	}
	sb.WriteString(`]}`)
	src := []byte(sb.String())
	b.SetBytes(int64(len(src)))
	var d Doc
	for b.Loop() {
		if err := Parse(&d, src); err != nil {
			b.Fatal(err)
		}
		n := 0
		for m := d.Root().Get("messages").First(); m.Exists(); m = m.Next() {
			n += m.Get("content").UTF16Len()
		}
		_ = d.Root().AppendCanonical(make([]byte, 0, len(src)))
	}
}
