package pacer

import (
	"testing"
	"time"
)

// TestPeek checks that Peek answers what RateLimit would, on both stores,
// alone and in a composite, and never records anything: a key peeked at
// any number of times decides as if it had not been.
func TestPeek(t *testing.T) {
	for _, b := range backends(t, startEpoch) {
		t.Run(b.name, func(t *testing.T) {
			p := mustNew(t, b.store, Options{Name: "rpm", QPS: 10, MaxBurst: 1})
			tpm := mustNew(t, b.store, Options{Name: "tpm", QPS: 100})
			comp, err := NewComposite(p, tpm)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if out, err := p.Peek(bg, "k", 1); err != nil || out.Delay != 0 {
					t.Fatalf("peek %d on a fresh key: %+v, %v", i, out, err)
				}
			}
			if l, ok := b.store.(*Local); ok && l.Len() != 0 {
				t.Fatalf("Peek stored %d keys", l.Len())
			}
			// Two calls fill the bucket (MaxBurst 1, plus the free
			// overflowing call); the third would wait 100 ms.
			for i := 0; i < 2; i++ {
				if out, err := p.RateLimit(bg, "k", 1); err != nil || out.Delay != 0 {
					t.Fatalf("call %d: %+v, %v", i, out, err)
				}
			}
			peek, err := p.Peek(bg, "k", 1)
			if err != nil || peek.Delay != 100*time.Millisecond {
				t.Fatalf("peek on a full key: %+v, %v; want 100ms", peek, err)
			}
			rl, err := p.RateLimit(bg, "k", 1)
			if err != nil || rl != peek {
				t.Fatalf("RateLimit %+v, %v; Peek said %+v", rl, err, peek)
			}
			b.clk.Add(100 * time.Millisecond)
			if out, err := p.Peek(bg, "k", 1); err != nil || out.Delay != 0 {
				t.Fatalf("peek after the retry-after: %+v, %v", out, err)
			}
			if out, err := p.RateLimit(bg, "k", 1); err != nil || out.Delay != 0 {
				t.Fatalf("RateLimit after the retry-after: %+v, %v", out, err)
			}

			// A composite peek names the member that would reject and
			// records in none.
			if out, err := comp.RateLimit(bg, "c", 1, 100); err != nil || out.Delay != 0 {
				t.Fatalf("composite first call: %+v, %v", out, err)
			}
			cp, err := comp.Peek(bg, "c", 1, 150)
			if err != nil || cp.Pacer != tpm || cp.Delay != time.Second {
				t.Fatalf("composite peek: %+v, %v; want tpm, 1s", cp, err)
			}
			if out, err := comp.RateLimit(bg, "c", 1, 150); err != nil || out.Pacer != tpm || out.Delay != time.Second {
				t.Fatalf("composite RateLimit after the peek: %+v, %v; want what Peek said", out, err)
			}
		})
	}
}
