package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

func dedupConfig(maxConcurrent int) bulkhead.Config {
	cfg := bulkhead.Batch("gpt-4o", maxConcurrent)
	cfg.Dedup = &bulkhead.DedupConfig{}
	return cfg
}

// gate is a Run callback held until released, which counts its calls.
type gate struct {
	mu      sync.Mutex
	calls   int
	started chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{started: make(chan struct{}, 100), release: make(chan struct{})} }

func (g *gate) fn(v string, err error) func(context.Context, *bulkhead.RunContext) (string, error) {
	return func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
		g.mu.Lock()
		g.calls++
		g.mu.Unlock()
		g.started <- struct{}{}
		<-g.release
		return v, err
	}
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

type runOut struct {
	v   string
	err error
}

func runAsync(ctx context.Context, b *bulkhead.Bulkhead, r *bulkhead.Request, fn func(context.Context, *bulkhead.RunContext) (string, error), opts ...bulkhead.Option) <-chan runOut {
	ch := make(chan runOut, 1)
	go func() {
		v, err := bulkhead.Run(ctx, b, r, fn, opts...)
		ch <- runOut{v, err}
	}()
	return ch
}

// mockDedup builds a dedup bulkhead on a mock clock, with edit applied to
// its config.
func mockDedup(t *testing.T, maxConcurrent int, edit func(*bulkhead.Config)) (*bulkhead.Bulkhead, *clock.Mock) {
	t.Helper()
	clk := clock.NewMock()
	cfg := dedupConfig(maxConcurrent)
	cfg.Clock = clk
	if edit != nil {
		edit(&cfg)
	}
	return newBulkhead(t, cfg), clk
}

// recordRejects subscribes to b's reject events and returns what has been
// seen so far, once n have.
func recordRejects(t *testing.T, b *bulkhead.Bulkhead) func(n int) []bulkhead.RejectEvent {
	var mu sync.Mutex
	var rejects []bulkhead.RejectEvent
	b.Subscribe(bulkhead.Hooks{Reject: func(e bulkhead.RejectEvent) { mu.Lock(); rejects = append(rejects, e); mu.Unlock() }})
	return func(n int) []bulkhead.RejectEvent {
		t.Helper()
		testutil.WaitFor(t, "reject events", func() bool { mu.Lock(); defer mu.Unlock(); return len(rejects) == n })
		mu.Lock()
		defer mu.Unlock()
		return append([]bulkhead.RejectEvent(nil), rejects...)
	}
}

func waitHits(t *testing.T, b *bulkhead.Bulkhead, n int64) {
	t.Helper()
	testutil.WaitFor(t, "dedup hits", func() bool { return b.Stats().Dedup.Hits == n })
}

func TestDedupSharesOneExecution(t *testing.T) {
	b := newBulkhead(t, dedupConfig(4))
	g := newGate()
	var events []bulkhead.DedupEvent
	var mu sync.Mutex
	b.Subscribe(bulkhead.Hooks{Dedup: func(e bulkhead.DedupEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	ctx := context.Background()
	leader := runAsync(ctx, b, req("hello", 10), g.fn("answer", nil))
	<-g.started
	const n = 5
	var followers []<-chan runOut
	for range n {
		followers = append(followers, runAsync(ctx, b, req("hello", 10), g.fn("wrong", nil)))
	}
	waitHits(t, b, n)
	if st := b.Stats(); st.Dedup.Active != 1 || st.Calls.Admitted != 1 || st.Gate.InFlight != 1 {
		t.Fatalf("stats while shared: %+v %+v", st.Dedup, st.Calls)
	}
	close(g.release)
	for _, ch := range append(followers, leader) {
		if o := <-ch; o.v != "answer" || o.err != nil {
			t.Fatalf("got %q, %v", o.v, o.err)
		}
	}
	if g.count() != 1 {
		t.Fatalf("fn ran %d times", g.count())
	}
	st := b.Stats()
	if *st.Dedup != (bulkhead.DedupStats{Active: 0, Hits: n}) || st.Calls.Admitted != 1 || st.Calls.Released != 1 {
		t.Fatalf("stats after: %+v %+v", st.Dedup, st.Calls)
	}
	testutil.WaitFor(t, "dedup events", func() bool { mu.Lock(); defer mu.Unlock(); return len(events) == n })
}

// leaderAndFollowers starts a leader held by g and n followers of the same
// request and options, and waits until all have joined.
func leaderAndFollowers(t *testing.T, b *bulkhead.Bulkhead, g *gate, r *bulkhead.Request, n int, opts ...bulkhead.Option) (<-chan runOut, []<-chan runOut) {
	t.Helper()
	hits := b.Stats().Dedup.Hits
	leader := runAsync(context.Background(), b, r, g.fn("answer", nil), opts...)
	<-g.started
	var fs []<-chan runOut
	for range n {
		fs = append(fs, runAsync(context.Background(), b, r, g.fn("wrong", nil), opts...))
	}
	waitHits(t, b, hits+int64(n))
	return leader, fs
}

func wantIdle(t *testing.T, b *bulkhead.Bulkhead) {
	t.Helper()
	st := b.Stats()
	if st.Dedup.Active != 0 || st.Calls.InFlight != 0 || st.Gate.InFlight != 0 || st.Gate.Pending != 0 {
		t.Fatalf("not idle: dedup %+v calls %+v gate %+v", st.Dedup, st.Calls, st.Gate)
	}
}

func TestDedupScopesAndClassesIsolate(t *testing.T) {
	cfg := dedupConfig(8)
	cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}, "b": {}}}
	b := newBulkhead(t, cfg)
	g := newGate()
	var outs []<-chan runOut
	for _, opts := range [][]bulkhead.Option{
		nil,
		{bulkhead.WithDedupScope("tenant-1")},
		{bulkhead.WithDedupScope("tenant-2")},
		{bulkhead.WithClass("b")},
		{bulkhead.WithClass("b"), bulkhead.WithDedupScope("tenant-1")},
	} {
		outs = append(outs, runAsync(context.Background(), b, req("same", 10), g.fn("v", nil), opts...))
		<-g.started
	}
	if st := b.Stats(); st.Dedup.Active != 5 || st.Dedup.Hits != 0 || st.Calls.Admitted != 5 {
		t.Fatalf("stats %+v %+v", st.Dedup, st.Calls)
	}
	// The default class named explicitly is the same partition.
	f := runAsync(context.Background(), b, req("same", 10), g.fn("wrong", nil), bulkhead.WithClass("a"))
	waitHits(t, b, 1)
	close(g.release)
	for _, ch := range append(outs, f) {
		if o := <-ch; o.v != "v" || o.err != nil {
			t.Fatalf("got %q, %v", o.v, o.err)
		}
	}
	if g.count() != 5 {
		t.Fatalf("fn ran %d times, want 5", g.count())
	}
	wantIdle(t, b)
}

func TestDedupOptOut(t *testing.T) {
	keys := map[string]string{"hello": "k"} // "other" has no key
	var panicked bool
	cfg := dedupConfig(8)
	cfg.Dedup.KeyFunc = func(r *bulkhead.Request) string {
		if r.Messages[0].Content == "boom" {
			panicked = true
			panic("key func bug")
		}
		return keys[r.Messages[0].Content]
	}
	b := newBulkhead(t, cfg)
	g := newGate()
	runs := []struct {
		text string
		opts []bulkhead.Option
	}{
		{"hello", nil}, // the leader
		{"hello", []bulkhead.Option{bulkhead.NoDedup()}},
		{"other", nil}, {"other", nil}, // empty key
		{"boom", nil}, {"boom", nil}, // a panicking KeyFunc
	}
	var outs []<-chan runOut
	for _, r := range runs {
		outs = append(outs, runAsync(context.Background(), b, req(r.text, 10), g.fn("v", nil), r.opts...))
		<-g.started
	}
	if st := b.Stats(); st.Dedup.Active != 1 || st.Dedup.Hits != 0 || st.Calls.Admitted != int64(len(runs)) || !panicked {
		t.Fatalf("stats %+v %+v", st.Dedup, st.Calls)
	}
	close(g.release)
	for _, ch := range outs {
		if o := <-ch; o.err != nil {
			t.Fatal(o.err)
		}
	}
	// NoDedup without Config.Dedup changes nothing.
	plain := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	if _, err := bulkhead.Run(context.Background(), plain, req("x", 1), func(context.Context, *bulkhead.RunContext) (int, error) { return 1, nil }, bulkhead.NoDedup()); err != nil {
		t.Fatal(err)
	}
	if plain.Stats().Dedup != nil {
		t.Fatal("Stats().Dedup without Config.Dedup")
	}
}

// TestDedupKeyOption: a per-call key wins over the request: calls with
// equal requests but different keys (say, temperatures) run apart, calls with
// different requests but one key share, and an empty key opts out.
func TestDedupKeyOption(t *testing.T) {
	b := newBulkhead(t, dedupConfig(8))
	g := newGate()
	runs := []struct {
		text, key string
	}{
		{"hello", "t=0.2"}, // a leader
		{"hello", "t=0.9"}, // the same request, another key: a leader
		{"other", "t=0.2"}, // another request, the first key: a follower
		{"hello", ""},      // an empty key: on its own
	}
	var outs []<-chan runOut
	for i, r := range runs {
		outs = append(outs, runAsync(context.Background(), b, req(r.text, 10), g.fn("v", nil), bulkhead.WithDedupKey(r.key)))
		if i == 2 {
			waitHits(t, b, 1)
		} else {
			<-g.started
		}
	}
	if st := b.Stats(); st.Dedup.Active != 2 || st.Dedup.Hits != 1 || st.Calls.Admitted != 3 {
		t.Fatalf("stats %+v %+v", st.Dedup, st.Calls)
	}
	close(g.release)
	for _, ch := range outs {
		if o := <-ch; o.err != nil || o.v != "v" {
			t.Fatal(o.v, o.err)
		}
	}
	if g.count() != 3 {
		t.Errorf("fn ran %d times, want 3", g.count())
	}
	wantIdle(t, b)
}

func TestDedupFollowerCancelIsolated(t *testing.T) {
	b := newBulkhead(t, dedupConfig(2))
	rejects := recordRejects(t, b)
	g := newGate()
	leader, fs := leaderAndFollowers(t, b, g, req("q", 10), 2)
	ctx, cancel := context.WithCancel(context.Background())
	quitter := runAsync(ctx, b, req("q", 10), g.fn("wrong", nil), bulkhead.WithTag("quitter"))
	waitHits(t, b, 3)
	cancel()
	o := <-quitter
	rej := wantReason(t, o.err, bulkhead.Aborted)
	if rej.Detail != nil || rej.Tag != "quitter" || !errors.Is(o.err, context.Canceled) {
		t.Fatalf("aborted follower: %+v (%v)", rej, o.err)
	}
	if st := b.Stats(); st.Calls.Rejected != 1 || st.Calls.RejectedByReason[bulkhead.Aborted] != 1 || st.Gate.Rejected != 0 || st.Calls.InFlight != 1 {
		t.Fatalf("stats %+v %+v", st.Calls, st.Gate)
	}
	close(g.release)
	for _, ch := range append(fs, leader) {
		if o := <-ch; o.v != "answer" || o.err != nil {
			t.Fatalf("got %q, %v", o.v, o.err)
		}
	}
	if e := rejects(1)[0]; e.Reason != bulkhead.Aborted || e.Detail != nil || e.Tag != "quitter" || e.Request.Messages[0].Content != "q" {
		t.Fatalf("reject event %v", e)
	}
	wantIdle(t, b)
}

func TestDedupFollowerQueueTimeout(t *testing.T) {
	b, clk := mockDedup(t, 2, func(cfg *bulkhead.Config) { cfg.QueueTimeout = time.Millisecond }) // not applied to followers
	g := newGate()
	leader, fs := leaderAndFollowers(t, b, g, req("q", 10), 1)
	short := runAsync(context.Background(), b, req("q", 10), g.fn("wrong", nil), bulkhead.WithQueueTimeout(20*time.Millisecond))
	waitHits(t, b, 2)
	clk.Add(10 * time.Millisecond)
	select {
	case o := <-short:
		t.Fatalf("timed out early: %v", o.err)
	default:
	}
	clk.Add(10 * time.Millisecond)
	rej := wantReason(t, (<-short).err, bulkhead.Timeout)
	if rej.Detail != nil {
		t.Fatalf("detail %v", rej.Detail)
	}
	clk.Add(time.Hour) // the other follower has no bound of its own
	close(g.release)
	for _, ch := range append(fs, leader) {
		if o := <-ch; o.v != "answer" || o.err != nil {
			t.Fatalf("got %q, %v", o.v, o.err)
		}
	}
	if st := b.Stats(); st.Calls.RejectedByReason[bulkhead.Timeout] != 1 || st.Gate.TimedOut != 0 {
		t.Fatalf("stats %+v", st.Calls)
	}
	wantIdle(t, b)
}

func TestDedupLeaderPanics(t *testing.T) {
	b := newBulkhead(t, dedupConfig(2))
	started, release := make(chan struct{}), make(chan struct{})
	leaderPanic := make(chan any, 1)
	go func() {
		defer func() { leaderPanic <- recover() }()
		_, _ = bulkhead.Run(context.Background(), b, req("p", 1), func(context.Context, *bulkhead.RunContext) (string, error) {
			close(started)
			<-release
			panic("leader bug")
		})
	}()
	<-started
	g := newGate()
	f := runAsync(context.Background(), b, req("p", 1), g.fn("wrong", nil))
	waitHits(t, b, 1)
	close(release)
	if p := <-leaderPanic; p != "leader bug" {
		t.Fatalf("leader panic %v", p)
	}
	o := <-f
	if !errors.Is(o.err, bulkhead.ErrLeaderPanicked) || !strings.Contains(o.err.Error(), "leader bug") || g.count() != 0 {
		t.Fatalf("follower: %v (fn ran %d)", o.err, g.count())
	}
	wantIdle(t, b)

	// runtime.Goexit, likewise.
	started, release = make(chan struct{}), make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_, _ = bulkhead.Run(context.Background(), b, req("p", 1), func(context.Context, *bulkhead.RunContext) (string, error) {
			close(started)
			<-release
			runtime.Goexit()
			return "", nil
		})
	}()
	<-started
	f = runAsync(context.Background(), b, req("p", 1), g.fn("wrong", nil))
	waitHits(t, b, 2)
	close(release)
	<-exited
	if o := <-f; !errors.Is(o.err, bulkhead.ErrLeaderPanicked) || !strings.Contains(o.err.Error(), "Goexit") {
		t.Fatalf("follower of a Goexit: %v", o.err)
	}
	wantIdle(t, b)
}

func TestDedupFollowersJoinQueuedLeaderAndShareItsRejection(t *testing.T) {
	b, clk := mockDedup(t, 1, func(cfg *bulkhead.Config) { cfg.QueueTimeout = 30 * time.Millisecond })
	hold := mustAcquire(t, b, req("hold", 1))
	g := newGate()
	leader := runAsync(context.Background(), b, req("q", 1), g.fn("answer", nil), bulkhead.WithTag("leader"))
	testutil.WaitFor(t, "the leader queued", pending(b))
	f := runAsync(context.Background(), b, req("q", 1), g.fn("wrong", nil), bulkhead.WithTag("follower"))
	waitHits(t, b, 1)
	clk.Add(30 * time.Millisecond)
	lr := wantReason(t, (<-leader).err, bulkhead.Timeout)
	fr := wantReason(t, (<-f).err, bulkhead.Timeout)
	if lr.Tag != "leader" || fr.Tag != "follower" || fr.Detail == nil || g.count() != 0 {
		t.Fatalf("leader %+v, follower %+v", lr, fr)
	}
	if errors.Is(lr, bulkhead.ErrLeaderRejected) || !errors.Is(fr, bulkhead.ErrLeaderRejected) || !errors.Is(fr, bulkhead.ErrTimeout) {
		t.Fatalf("leader %v, follower %v: only the follower's is the leader's own", lr, fr)
	}
	if st := b.Stats(); st.Calls.Rejected != 1 {
		t.Fatalf("the shared rejection counted %d times", st.Calls.Rejected)
	}
	_ = hold.Release(nil)

	// Joined while queued, and admitted with it.
	hold = mustAcquire(t, b, req("hold", 1))
	leader = runAsync(context.Background(), b, req("q", 1), g.fn("answer", nil))
	testutil.WaitFor(t, "the leader queued", pending(b))
	f = runAsync(context.Background(), b, req("q", 1), g.fn("wrong", nil))
	waitHits(t, b, 2)
	_ = hold.Release(nil)
	<-g.started
	close(g.release)
	if o, p := <-leader, <-f; o.v != "answer" || p.v != "answer" || o.err != nil || p.err != nil {
		t.Fatalf("leader %v, follower %v", o, p)
	}
	wantIdle(t, b)
}

func TestDedupCollisionSharesNothing(t *testing.T) {
	b := newBulkhead(t, dedupConfig(4))
	bulkhead.SetDedupHash(b, func(string, string, string) uint64 { return 42 })
	g := newGate()
	a := runAsync(context.Background(), b, req("a", 1), g.fn("A", nil))
	<-g.started
	c := runAsync(context.Background(), b, req("c", 1), g.fn("C", nil))
	<-g.started
	if st := b.Stats(); st.Dedup.Active != 1 || st.Dedup.Hits != 0 || st.Calls.Admitted != 2 {
		t.Fatalf("stats %+v %+v", st.Dedup, st.Calls)
	}
	// The same key still shares.
	f := runAsync(context.Background(), b, req("a", 1), g.fn("wrong", nil))
	waitHits(t, b, 1)
	close(g.release)
	if x, y, z := <-a, <-c, <-f; x.v != "A" || y.v != "C" || z.v != "A" {
		t.Fatalf("results %v %v %v", x, y, z)
	}
	wantIdle(t, b)
}

// share runs a leader returning v, held until one follower of type T has
// joined, and returns both outcomes.
func share[T any](t *testing.T, b *bulkhead.Bulkhead, v any) (leader any, follower T, err error) {
	t.Helper()
	started, release := make(chan struct{}), make(chan struct{})
	lch := make(chan any, 1)
	go func() {
		got, err := bulkhead.Run(context.Background(), b, req("s", 1), func(context.Context, *bulkhead.RunContext) (any, error) {
			close(started)
			<-release
			return v, nil
		})
		if err != nil {
			t.Error(err)
		}
		lch <- got
	}()
	<-started
	hits := b.Stats().Dedup.Hits
	type out struct {
		v   T
		err error
	}
	fch := make(chan out, 1)
	go func() {
		got, err := bulkhead.Run(context.Background(), b, req("s", 1), func(context.Context, *bulkhead.RunContext) (T, error) {
			t.Error("a follower's fn ran")
			var zero T
			return zero, nil
		})
		fch <- out{got, err}
	}()
	waitHits(t, b, hits+1)
	close(release)
	leader = <-lch
	o := <-fch
	return leader, o.v, o.err
}

func TestDedupUnshareable(t *testing.T) {
	b := newBulkhead(t, dedupConfig(2))
	rejects := recordRejects(t, b)
	body := &http.Response{Body: io.NopCloser(strings.NewReader("x"))}
	seq := func(yield func(int) bool) {}
	seq2 := func(yield func(int, string) bool) {}
	for _, v := range []any{strings.NewReader("x"), make(chan int), body, iter.Seq[int](seq), seq2} {
		leader, _, err := share[any](t, b, v)
		if reflect.ValueOf(leader).Pointer() != reflect.ValueOf(v).Pointer() {
			t.Fatalf("%T: the leader got %v", v, leader)
		}
		rej := wantReason(t, err, bulkhead.UnshareableResult)
		if rej.Detail != nil || !strings.Contains(err.Error(), "single-consumer") {
			t.Fatalf("%T: %v", v, err)
		}
	}
	for _, v := range []any{"text", 3, &http.Response{}, &http.Response{Body: http.NoBody}, func() {}, func(func(int) int) {}, []byte("x")} {
		if bulkhead.Unshareable(v) {
			t.Fatalf("%T is shareable", v)
		}
	}
	if st := b.Stats(); st.Calls.RejectedByReason[bulkhead.UnshareableResult] != 5 {
		t.Fatalf("stats %+v", st.Calls)
	}
	if e := rejects(5)[0]; e.Reason != bulkhead.UnshareableResult || e.Detail != nil {
		t.Fatalf("reject event %v", e)
	}
	wantIdle(t, b)
}

func TestDedupShareResult(t *testing.T) {
	cfg := dedupConfig(2)
	var calls int
	cfg.Dedup.ShareResult = func(v any) (any, error) {
		calls++
		switch x := v.(type) {
		case *strings.Reader:
			s, _ := io.ReadAll(x)
			return strings.NewReader(string(s)), nil
		case string:
			return x + " (copy)", nil
		case int:
			return "not an int", nil
		}
		return nil, errors.New("cannot copy")
	}
	b := newBulkhead(t, cfg)
	r := strings.NewReader("body")
	leader, f, err := share[any](t, b, r)
	if err != nil || leader != r || f == r {
		t.Fatalf("reader: leader %v follower %v %v", leader, f, err)
	}
	if s, _ := io.ReadAll(f.(io.Reader)); string(s) != "body" {
		t.Fatalf("the follower's copy reads %q", s)
	}
	if _, s, err := share[any](t, b, "v"); s != "v (copy)" || err != nil {
		t.Fatalf("string: %v %v", s, err)
	}
	if _, _, err := share[any](t, b, 1.5); err == nil || err.Error() != "cannot copy" {
		t.Fatalf("the hook's error: %v", err)
	}
	if calls != 3 {
		t.Fatalf("ShareResult called %d times", calls)
	}
	if st := b.Stats(); st.Calls.Rejected != 0 {
		t.Fatalf("a hook error counted as a rejection: %+v", st.Calls)
	}
}

func TestDedupTypeMismatch(t *testing.T) {
	b := newBulkhead(t, dedupConfig(2))
	// The leader's Run is of any, the follower's of int.
	_, v, err := share[int](t, b, 3)
	if !errors.Is(err, bulkhead.ErrInvalid) || v != 0 || !strings.Contains(err.Error(), "int") {
		t.Fatalf("follower of another type: %v, %v", v, err)
	}
	// A nil value of an interface type is shared as nil.
	if l, f, err := share[any](t, b, nil); l != nil || f != nil || err != nil {
		t.Fatalf("nil: %v %v %v", l, f, err)
	}
	cfg := dedupConfig(2)
	cfg.Dedup.ShareResult = func(v any) (any, error) { return 7, nil }
	b2 := newBulkhead(t, cfg)
	if _, f, err := share[string](t, b2, "x"); err == nil || f != "" {
		t.Fatalf("ShareResult of the wrong type: %q %v", f, err)
	}
}

func TestDedupObserveFollowerBypass(t *testing.T) {
	b, clk := mockDedup(t, 3, nil)
	g := newGate()
	leader, _ := leaderAndFollowers(t, b, g, req("q", 1), 0, bulkhead.WithMode(bulkhead.Observe))
	shadowBudget := []bulkhead.Option{bulkhead.WithMode(bulkhead.Observe), bulkhead.WithShadowReasons(bulkhead.BudgetLimit)}
	leader2, _ := leaderAndFollowers(t, b, g, req("q", 1), 0, shadowBudget...)
	bypassed := make(chan *bulkhead.Bypass, 1)
	f := runAsync(context.Background(), b, req("q", 1), func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
		bypassed <- rc.Bypass()
		return "own", nil
	}, bulkhead.WithMode(bulkhead.Observe), bulkhead.WithQueueTimeout(10*time.Millisecond))
	waitHits(t, b, 1)
	clk.Add(10 * time.Millisecond)
	if o := <-f; o.v != "own" || o.err != nil {
		t.Fatalf("bypassed follower: %v", o)
	}
	if bp := <-bypassed; bp == nil || bp.Reason != bulkhead.Timeout || !bp.Race || bp.Detail != nil {
		t.Fatalf("bypass %+v", bp)
	}
	// Not shadowed: rejected.
	f = runAsync(context.Background(), b, req("q", 1), g.fn("wrong", nil), append(shadowBudget, bulkhead.WithQueueTimeout(10*time.Millisecond))...)
	waitHits(t, b, 2)
	clk.Add(10 * time.Millisecond)
	wantReason(t, (<-f).err, bulkhead.Timeout)
	st := b.Stats()
	if st.Observe.Bypassed != 1 || st.Observe.RaceBypassed != 1 || st.Calls.RejectedByReason[bulkhead.Timeout] != 2 {
		t.Fatalf("stats %+v %+v", st.Observe, st.Calls)
	}
	close(g.release)
	if o, o2 := <-leader, <-leader2; o.v != "answer" || o2.v != "answer" {
		t.Fatalf("leaders %v %v", o, o2)
	}
	wantIdle(t, b)
}

func TestDedupBorrowedDeadlineReachesFollowers(t *testing.T) {
	b, clk := mockDedup(t, 2, func(cfg *bulkhead.Config) {
		cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}} // no floor: every slot borrowed
	})
	g := newGate()
	leader, fs := leaderAndFollowers(t, b, g, req("d", 1), 1, bulkhead.WithBorrowedDeadline(time.Second), bulkhead.WithTag("t"))
	testutil.WaitFor(t, "the deadline armed", func() bool { return b.Stats().Classes.Classes["a"].Deadlines.Active == 1 })
	clk.Add(time.Second)
	var le, fe *bulkhead.BorrowedDeadlineError
	if o := <-leader; !errors.As(o.err, &le) {
		t.Fatalf("leader: %v", o.err)
	}
	if o := <-fs[0]; !errors.As(o.err, &fe) || fe.AdmissionID != le.AdmissionID {
		t.Fatalf("follower: %v", o.err)
	}
	close(g.release)
	testutil.WaitFor(t, "the late release", func() bool { return b.Stats().Calls.Released == 1 })
	wantIdle(t, b)
}

func TestDedupOptionsAndInput(t *testing.T) {
	b := newBulkhead(t, dedupConfig(1))
	ctx := context.Background()
	for name, err := range map[string]error{
		"Acquire NoDedup":            func() error { _, err := b.Acquire(ctx, req("x", 1), bulkhead.NoDedup()); return err }(),
		"Acquire WithDedupScope":     func() error { _, err := b.Acquire(ctx, req("x", 1), bulkhead.WithDedupScope("s")); return err }(),
		"AcquireAsync NoDedup":       func() error { _, err := b.AcquireAsync(ctx, req("x", 1), bulkhead.NoDedup()).Result(); return err }(),
		"WouldAdmit WithDedupScope":  func() error { _, err := b.WouldAdmit(req("x", 1), bulkhead.WithDedupScope("s")); return err }(),
		"Acquire WithDedupKey":       func() error { _, err := b.Acquire(ctx, req("x", 1), bulkhead.WithDedupKey("k")); return err }(),
		"Run with an invalid option": func() error { _, err := bulkhead.Run(ctx, b, req("x", -1), okFn); return err }(),
	} {
		if !errors.Is(err, bulkhead.ErrInvalid) {
			t.Errorf("%s: %v, want invalid input", name, err)
		}
	}
	plain := newBulkhead(t, bulkhead.Interactive("gpt-4o", 1))
	if _, err := bulkhead.Run(ctx, plain, req("x", 1), okFn, bulkhead.WithDedupScope("s")); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Errorf("WithDedupScope without Config.Dedup: %v", err)
	}
	if _, err := bulkhead.Run(ctx, plain, req("x", 1), okFn, bulkhead.WithDedupKey("k")); !errors.Is(err, bulkhead.ErrInvalid) {
		t.Errorf("WithDedupKey without Config.Dedup: %v", err)
	}
	// A done context is rejected at once, with its detail, joining nothing.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if rej := wantReason(t, func() error { _, err := bulkhead.Run(done, b, req("x", 1), okFn); return err }(), bulkhead.Aborted); rej.Detail == nil {
		t.Fatal("no detail")
	}
	if st := b.Stats(); st.Dedup.Hits != 0 || st.Dedup.Active != 0 {
		t.Fatalf("stats %+v", st.Dedup)
	}
}

func okFn(context.Context, *bulkhead.RunContext) (int, error) { return 1, nil }

// TestCanonicalKeyCoversEveryField: the default key tells apart requests
// that differ in any one field, and a new field of Request, Message or
// Block fails here until the key covers it.
func TestCanonicalKeyCoversEveryField(t *testing.T) {
	for typ, n := range map[reflect.Type]int{
		reflect.TypeFor[bulkhead.Request](): 6, reflect.TypeFor[bulkhead.Message](): 3, reflect.TypeFor[bulkhead.Block](): 2,
	} {
		if typ.NumField() != n {
			t.Fatalf("%v has %d fields, the canonical key covers %d: extend appendCanonical", typ, typ.NumField(), n)
		}
	}
	base := func() *bulkhead.Request {
		return &bulkhead.Request{Model: "m", System: "s", SystemBlocks: []bulkhead.Block{{Type: "text", Text: "t"}},
			Messages: []bulkhead.Message{{Role: "user", Content: "c", Blocks: []bulkhead.Block{{Type: "image"}}}}, MaxTokens: 5, ExtraInputTokens: 2}
	}
	edits := map[string]func(*bulkhead.Request){
		"Model":             func(r *bulkhead.Request) { r.Model = "n" },
		"System":            func(r *bulkhead.Request) { r.System = "" },
		"SystemBlocks.Type": func(r *bulkhead.Request) { r.SystemBlocks[0].Type = "image" },
		"SystemBlocks.Text": func(r *bulkhead.Request) { r.SystemBlocks[0].Text = "u" },
		"SystemBlocks":      func(r *bulkhead.Request) { r.SystemBlocks = nil },
		"Messages":          func(r *bulkhead.Request) { r.Messages = append(r.Messages, bulkhead.Message{}) },
		"Role":              func(r *bulkhead.Request) { r.Messages[0].Role = "assistant" },
		"Content":           func(r *bulkhead.Request) { r.Messages[0].Content = "d" },
		"Blocks":            func(r *bulkhead.Request) { r.Messages[0].Blocks = nil },
		"MaxTokens":         func(r *bulkhead.Request) { r.MaxTokens = 6 },
		"ExtraInputTokens":  func(r *bulkhead.Request) { r.ExtraInputTokens = 0 },
		// Moving text across a boundary changes the key too.
		"System into Model": func(r *bulkhead.Request) { r.Model, r.System = "ms", "" },
	}
	seen := map[string]string{bulkhead.CanonicalKey(base()): "base"}
	for name, edit := range edits {
		r := base()
		edit(r)
		k := bulkhead.CanonicalKey(r)
		if other, dup := seen[k]; dup {
			t.Fatalf("%s has the key of %s", name, other)
		}
		seen[k] = name
	}
	if a, b := bulkhead.CanonicalKey(base()), bulkhead.CanonicalKey(base()); a != b {
		t.Fatal("not stable")
	}
}

// TestDedupObserveFollowerNotBypassedAfterClose: a closed bulkhead is never
// bypassed, not even for a follower whose own queue timeout fires after
// Close: it is rejected Timeout and its fn never runs.
func TestDedupObserveFollowerNotBypassedAfterClose(t *testing.T) {
	b, clk := mockDedup(t, 2, nil)
	g := newGate()
	leader, _ := leaderAndFollowers(t, b, g, req("q", 1), 0, bulkhead.WithMode(bulkhead.Observe))
	ran := make(chan *bulkhead.Bypass, 1)
	f := runAsync(context.Background(), b, req("q", 1), func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
		ran <- rc.Bypass()
		return "own", nil
	}, bulkhead.WithMode(bulkhead.Observe), bulkhead.WithQueueTimeout(10*time.Millisecond))
	waitHits(t, b, 1)
	b.Close()
	clk.Add(10 * time.Millisecond)
	wantReason(t, (<-f).err, bulkhead.Timeout)
	select {
	case bp := <-ran:
		t.Fatalf("fn ran bypassed on a closed bulkhead: %+v", bp)
	default:
	}
	if st := b.Stats(); st.Observe.Bypassed != 0 || st.Calls.RejectedByReason[bulkhead.Timeout] != 1 {
		t.Fatalf("stats %+v %+v", st.Observe, st.Calls)
	}
	close(g.release)
	if o := <-leader; o.v != "answer" || o.err != nil {
		t.Fatalf("leader %v", o)
	}
	wantIdle(t, b)
}

// TestDedupCloseWins: after Close a Run joins no call in flight, it is
// rejected Shutdown like any later call (and never runs its fn, bypassed or
// not); a follower that joined before Close still gets its leader's value.
func TestDedupCloseWins(t *testing.T) {
	b := newBulkhead(t, dedupConfig(2))
	g := newGate()
	leader, fs := leaderAndFollowers(t, b, g, req("q", 1), 1)
	b.Close()
	// Were they to join, they would wait for the leader: bounded, so that
	// the test fails rather than hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wantReason(t, (<-runAsync(ctx, b, req("q", 1), g.fn("wrong", nil))).err, bulkhead.Shutdown)
	ran := false
	_, err := bulkhead.Run(ctx, b, req("q", 1), func(context.Context, *bulkhead.RunContext) (string, error) {
		ran = true
		return "own", nil
	}, bulkhead.WithMode(bulkhead.Observe), bulkhead.WithQueueTimeout(time.Millisecond))
	wantReason(t, err, bulkhead.Shutdown)
	if ran {
		t.Fatal("a Run after Close ran its fn")
	}
	if st := b.Stats(); st.Dedup.Hits != 1 || st.Dedup.Active != 1 {
		t.Fatalf("joined after Close: %+v", st.Dedup)
	}
	close(g.release)
	for _, ch := range append(fs, leader) {
		if o := <-ch; o.v != "answer" || o.err != nil {
			t.Fatalf("a call joined before Close: %+v", o)
		}
	}
	wantIdle(t, b)
}

// TestDedupSettledBeforeRelease: a leader's entry is settled before its
// admission is released, however fn ends (with or without a borrowed-slot
// deadline): a listener that sees the leader's release sees the entry gone,
// and so does a Drain.
func TestDedupSettledBeforeRelease(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func() (string, error)
		opts []bulkhead.Option
	}{
		{"return", func() (string, error) { return "answer", nil }, nil},
		{"error", func() (string, error) { return "", errors.New("boom") }, nil},
		{"panic", func() (string, error) { panic("leader bug") }, nil},
		{"Goexit", func() (string, error) { runtime.Goexit(); return "", nil }, nil},
		{"deadline return", func() (string, error) { return "answer", nil }, []bulkhead.Option{bulkhead.WithBorrowedDeadline(time.Hour)}},
		{"deadline panic", func() (string, error) { panic("leader bug") }, []bulkhead.Option{bulkhead.WithBorrowedDeadline(time.Hour)}},
	} {
		// The window it closes is narrow: try it often.
		t.Run(tc.name, func(t *testing.T) {
			for range 50 {
				settledBeforeRelease(t, tc.end, tc.opts)
			}
		})
	}
}

func settledBeforeRelease(t *testing.T, end func() (string, error), opts []bulkhead.Option) {
	t.Helper()
	b, _ := mockDedup(t, 2, func(cfg *bulkhead.Config) {
		cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}} // every slot borrowed
	})
	// The listener reads the stats as soon as the release is
	// delivered, while the leader's Run may still be returning.
	released := make(chan int64, 1)
	b.Subscribe(bulkhead.Hooks{Release: func(bulkhead.ReleaseEvent) { released <- b.Stats().Dedup.Active }})
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }()
		_, _ = bulkhead.Run(context.Background(), b, req("s", 1), func(context.Context, *bulkhead.RunContext) (string, error) {
			close(started)
			<-release
			return end()
		}, opts...)
	}()
	<-started
	f := runAsync(context.Background(), b, req("s", 1), newGate().fn("wrong", nil), opts...)
	waitHits(t, b, 1)
	close(release)
	if active := <-released; active != 0 {
		t.Fatalf("released with %d entries active", active)
	}
	if res, err := b.Shutdown(context.Background()); err != nil || !res.Drained || b.Stats().Dedup.Active != 0 {
		t.Fatalf("Shutdown: %+v, %v, %+v", res, err, b.Stats().Dedup)
	}
	<-f
	<-done
}

// TestDedupPartitionsByParameters: calls share only with calls of the same
// priority, mode, shadow reasons and reservation override, whatever their
// key (the default one, KeyFunc's or WithDedupKey's).
func TestDedupPartitionsByParameters(t *testing.T) {
	variants := map[string][]bulkhead.Option{
		"priority":       {bulkhead.WithPriority(bulkhead.High)},
		"mode":           {bulkhead.WithMode(bulkhead.Observe)},
		"shadow reasons": {bulkhead.WithMode(bulkhead.Observe), bulkhead.WithShadowReasons(bulkhead.Timeout)},
		"override":       {override(10, 10)},
		"other override": {override(10, 11)},
	}
	for name, keyed := range map[string]struct {
		keyFunc func(*bulkhead.Request) string
		opts    []bulkhead.Option
	}{
		"default key":  {},
		"KeyFunc":      {keyFunc: func(*bulkhead.Request) string { return "k" }},
		"WithDedupKey": {opts: []bulkhead.Option{bulkhead.WithDedupKey("k")}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := dedupConfig(16)
			cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 1 << 20}
			cfg.Dedup.KeyFunc = keyed.keyFunc
			b := newBulkhead(t, cfg)
			g := newGate()
			base := append([]bulkhead.Option{override(10, 10)}, keyed.opts...)
			leader, fs := leaderAndFollowers(t, b, g, req("p", 1), 1, base...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for what, opts := range variants {
				if what == "override" {
					opts = nil // no override at all
				}
				v, err := bulkhead.Run(ctx, b, req("p", 1), func(context.Context, *bulkhead.RunContext) (string, error) { return "own", nil },
					append(opts, keyed.opts...)...)
				if v != "own" || err != nil {
					t.Errorf("%s: (%q, %v), want its own run", what, v, err)
				}
			}
			if st := b.Stats(); st.Dedup.Hits != 1 {
				t.Fatalf("hits %d, want only the identical follower", st.Dedup.Hits)
			}
			close(g.release)
			for _, ch := range append(fs, leader) {
				if o := <-ch; o.v != "answer" || o.err != nil {
					t.Fatalf("%+v", o)
				}
			}
			wantIdle(t, b)
		})
	}
}

// TestDedupHighFollowerNotRejectedForNormalLeader: a High-priority call
// does not follow a Normal one, so it never gets a Normal leader's
// BudgetLimit (the high-priority reserve): it is admitted on its own.
func TestDedupHighFollowerNotRejectedForNormalLeader(t *testing.T) {
	cfg := bulkhead.Batch("gpt-4o", 1)
	cfg.TokenBudget = &bulkhead.TokenBudget{Budget: 100, HighPriorityReserve: 50}
	cfg.Dedup = &bulkhead.DedupConfig{}
	b := newBulkhead(t, cfg)
	hold := mustAcquire(t, b, req("hold", 0), override(5, 5), bulkhead.WithPriority(bulkhead.High))
	g := newGate()
	leader := runAsync(context.Background(), b, req("q", 0), g.fn("answer", nil), override(10, 10))
	testutil.WaitFor(t, "the leader queued", func() bool { return b.Stats().Gate.Pending == 1 })
	high := runAsync(context.Background(), b, req("q", 0), g.fn("own", nil), override(10, 10), bulkhead.WithPriority(bulkhead.High))
	testutil.WaitFor(t, "the High call queued", func() bool { return b.Stats().Gate.Pending == 2 })
	if _, err := b.SetBudget(60); err != nil { // Normal may fill 10 now, High 60
		t.Fatal(err)
	}
	_ = hold.Release(nil)
	wantReason(t, (<-leader).err, bulkhead.BudgetLimit)
	close(g.release)
	if o := <-high; o.v != "own" || o.err != nil {
		t.Fatalf("High call: %+v", o)
	}
	if st := b.Stats(); st.Dedup.Hits != 0 {
		t.Fatalf("hits %d", st.Dedup.Hits)
	}
}

// TestDedupObserveCallDoesNotFollowEnforcedLeader: an Observe call does not
// follow an enforced one, so it is bypassed where the enforced leader is
// rejected Timeout, as it would be without deduplication.
func TestDedupObserveCallDoesNotFollowEnforcedLeader(t *testing.T) {
	b, clk := mockDedup(t, 1, func(cfg *bulkhead.Config) { cfg.QueueTimeout = 30 * time.Millisecond })
	hold := mustAcquire(t, b, req("hold", 1))
	g := newGate()
	leader := runAsync(context.Background(), b, req("q", 1), g.fn("answer", nil))
	testutil.WaitFor(t, "the leader queued", func() bool { return b.Stats().Gate.Pending == 1 })
	observed := runAsync(context.Background(), b, req("q", 1), func(_ context.Context, rc *bulkhead.RunContext) (string, error) {
		if rc.Bypass() == nil {
			return "admitted", nil
		}
		return "bypassed", nil
	}, bulkhead.WithMode(bulkhead.Observe))
	testutil.WaitFor(t, "the observed call queued", func() bool { return b.Stats().Gate.Pending == 2 })
	clk.Add(30 * time.Millisecond)
	wantReason(t, (<-leader).err, bulkhead.Timeout)
	if o := <-observed; o.v != "bypassed" || o.err != nil {
		t.Fatalf("observed call: %+v", o)
	}
	_ = hold.Release(nil)
}

// TestDedupFollowerSharesLeadersOwnAbort pins the documented behaviour: a
// leader rejected Aborted by its own context, while queued, hands that
// rejection (with its cause) to a follower whose context is alive. The
// follower tells it was inherited (its own ctx.Err() is nil), and a retry
// leads on its own and runs.
func TestDedupFollowerSharesLeadersOwnAbort(t *testing.T) {
	b := newBulkhead(t, dedupConfig(1))
	hold := mustAcquire(t, b, req("hold", 1))
	g := newGate()
	lctx, lcancel := context.WithCancel(context.Background())
	leader := runAsync(lctx, b, req("q", 1), g.fn("answer", nil))
	testutil.WaitFor(t, "the leader queued", pending(b))
	fctx := context.Background()
	f := runAsync(fctx, b, req("q", 1), g.fn("own", nil), bulkhead.WithTag("follower"))
	waitHits(t, b, 1)
	lcancel()
	if err := (<-leader).err; !errors.Is(err, context.Canceled) || errors.Is(err, bulkhead.ErrLeaderRejected) {
		t.Fatalf("leader: %v, want its own context's cause", err)
	}
	o := <-f
	// Its own context is alive: the rejection says it is the leader's, and
	// does not match the leader's context error.
	r := wantReason(t, o.err, bulkhead.Aborted)
	if r.Tag != "follower" || !errors.Is(o.err, bulkhead.ErrLeaderRejected) || errors.Is(o.err, context.Canceled) || fctx.Err() != nil {
		t.Fatalf("follower: %v", o.err)
	}
	if want := `bulkhead: rejected: aborted: the context ended before admission: the identical call in flight was rejected for a cause of its own (context canceled) (tag "follower")`; o.err.Error() != want {
		t.Fatalf("follower's message\n got %s\nwant %s", o.err, want)
	}
	if st := b.Stats(); st.Calls.Rejected != 1 || g.count() != 0 || st.Dedup.Active != 0 {
		t.Fatalf("calls %+v dedup %+v, fn ran %d", st.Calls, st.Dedup, g.count())
	}
	retry := runAsync(fctx, b, req("q", 1), g.fn("retried", nil))
	testutil.WaitFor(t, "the retry queued", pending(b))
	_ = hold.Release(nil)
	<-g.started
	close(g.release)
	if o := <-retry; o.v != "retried" || o.err != nil {
		t.Fatalf("retry: %+v", o)
	}
	if st := b.Stats(); st.Dedup.Hits != 1 || g.count() != 1 {
		t.Fatalf("dedup %+v, fn ran %d times: the retry should lead", st.Dedup, g.count())
	}
	wantIdle(t, b)
}

// TestDedupBorrowedDeadlineAtReturnSameForFollowers: when a leader's
// borrowed-slot deadline expires as its fn returns, the leader's caller
// gets either fn's value or the *BorrowedDeadlineError, and its followers
// get exactly what it got, every time. Another goroutine moves the mock
// clock past the deadline as fn returns, so the expiry lands anywhere
// around the return and the release.
func TestDedupBorrowedDeadlineAtReturnSameForFollowers(t *testing.T) {
	b, clk := mockDedup(t, 2, func(cfg *bulkhead.Config) {
		cfg.Classes = &bulkhead.Classes{Default: "a", Limits: map[string]bulkhead.ClassLimits{"a": {}}} // no floor: every slot borrowed
	})
	seen := map[bool]int{}
	for i := range 300 {
		started, release, moved := make(chan struct{}), make(chan struct{}), make(chan struct{})
		added := make(chan struct{})
		go func() { <-moved; clk.Add(time.Second); close(added) }()
		fn := func(ctx context.Context, rc *bulkhead.RunContext) (string, error) {
			close(started)
			<-release
			moved <- struct{}{}
			return "answer", nil
		}
		r := req("d", 1)
		opt := bulkhead.WithBorrowedDeadline(time.Second)
		leader := runAsync(context.Background(), b, r, fn, opt)
		<-started
		follower := runAsync(context.Background(), b, r, newGate().fn("follower's own", nil), opt)
		waitHits(t, b, int64(i+1))
		testutil.WaitFor(t, "the deadline armed", func() bool { return b.Stats().Classes.Classes["a"].Deadlines.Active == 1 })
		close(release)
		lo, fo := <-leader, <-follower
		var le, fe *bulkhead.BorrowedDeadlineError
		switch {
		case lo.err == nil:
			if fo.err != nil || fo.v != lo.v {
				t.Fatalf("run %d: the leader got %q, its follower %q, %v", i, lo.v, fo.v, fo.err)
			}
		case errors.As(lo.err, &le):
			if !errors.As(fo.err, &fe) || fe.AdmissionID != le.AdmissionID {
				t.Fatalf("run %d: the leader got %v, its follower %q, %v", i, lo.err, fo.v, fo.err)
			}
		default:
			t.Fatalf("run %d: leader %v", i, lo.err)
		}
		seen[lo.err == nil]++
		<-added
		testutil.WaitFor(t, "the release", func() bool { return b.Stats().Calls.Released == int64(i+1) })
	}
	t.Logf("value %d times, deadline error %d times", seen[true], seen[false])
	wantIdle(t, b)
}

// TestDedupSettleRacesJoin: two identical Runs started together, whose fn
// returns at once, race the first one's settlement against the second
// one's join: either both get one execution's value (the second followed,
// one hit) or each ran its own fn (the second came after the first had
// settled). Never a lost or mixed result, never a key left in flight.
func TestDedupSettleRacesJoin(t *testing.T) {
	b := newBulkhead(t, dedupConfig(4))
	var hits int64
	for i := range 500 {
		var mu sync.Mutex
		ran := 0
		fn := func(v string) func(context.Context, *bulkhead.RunContext) (string, error) {
			return func(context.Context, *bulkhead.RunContext) (string, error) {
				mu.Lock()
				ran++
				mu.Unlock()
				return v, nil
			}
		}
		r := req(fmt.Sprint("race-", i), 1)
		x := runAsync(context.Background(), b, r, fn("x"))
		y := runAsync(context.Background(), b, r, fn("y"))
		ox, oy := <-x, <-y
		if ox.err != nil || oy.err != nil {
			t.Fatalf("run %d: %v, %v", i, ox.err, oy.err)
		}
		shared := ox.v == oy.v
		if shared {
			hits++
		}
		st := b.Stats()
		if (shared && ran != 1) || (!shared && (ran != 2 || ox.v != "x" || oy.v != "y")) || st.Dedup.Hits != hits || st.Dedup.Active != 0 {
			t.Fatalf("run %d: got %q and %q with fn run %d times; dedup %+v, want %d hits", i, ox.v, oy.v, ran, st.Dedup, hits)
		}
	}
	t.Logf("shared %d of 500", hits)
	wantIdle(t, b)
}

// TestDedupQueuedLeaderClosed: Close rejects a queued leader Shutdown, and
// its follower shares that rejection, which is not one of the leader's own
// (a retry would be rejected Shutdown too). Drain then drains: nothing is
// in flight and no key is.
func TestDedupQueuedLeaderClosed(t *testing.T) {
	b := newBulkhead(t, dedupConfig(1))
	hold := mustAcquire(t, b, req("hold", 1))
	g := newGate()
	leader := runAsync(context.Background(), b, req("q", 1), g.fn("answer", nil))
	testutil.WaitFor(t, "the leader queued", pending(b))
	f := runAsync(context.Background(), b, req("q", 1), g.fn("own", nil), bulkhead.WithTag("follower"))
	waitHits(t, b, 1)
	b.Close()
	wantReason(t, (<-leader).err, bulkhead.Shutdown)
	fo := <-f
	if r := wantReason(t, fo.err, bulkhead.Shutdown); r.Tag != "follower" || errors.Is(fo.err, bulkhead.ErrLeaderRejected) {
		t.Fatalf("follower: %v", fo.err)
	}
	_ = hold.Release(nil)
	res, err := b.Drain(context.Background())
	if err != nil || res != (bulkhead.DrainResult{Drained: true}) || g.count() != 0 {
		t.Fatalf("Drain = %+v, %v; fn ran %d times", res, err, g.count())
	}
	if st := b.Stats(); st.Dedup.Active != 0 || st.Calls.Rejected != 1 {
		t.Fatalf("dedup %+v calls %+v", st.Dedup, st.Calls)
	}
}
