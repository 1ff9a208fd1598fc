package simprovider_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/testutil"

	"go.uber.org/goleak"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixed is a provider config without noise or slowdown: every accepted
// request takes 100ms + 10ms per output token, and a 429 takes 0.
func fixed(clk clock.Clock) simprovider.Config {
	return simprovider.Config{
		TimeToFirstToken: 100 * time.Millisecond,
		PerOutputToken:   10 * time.Millisecond,
		OutputMedian:     50,
		Clock:            clk,
	}
}

func newProvider(t *testing.T, cfg simprovider.Config) *simprovider.Provider {
	t.Helper()
	p, err := simprovider.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

type result struct {
	resp simprovider.Response
	err  error
}

func completeAsync(ctx context.Context, p *simprovider.Provider, req simprovider.Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := p.Complete(ctx, req)
		ch <- result{resp, err}
	}()
	return ch
}

func wantRateLimit(t *testing.T, err error, limit simprovider.Limit) *simprovider.RateLimitError {
	t.Helper()
	var rl *simprovider.RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, simprovider.ErrRateLimited) {
		t.Fatalf("error = %v, want a 429", err)
	}
	if rl.Limit != limit {
		t.Fatalf("429 for %v, want %v", rl.Limit, limit)
	}
	if rl.StatusCode() != 429 {
		t.Fatalf("StatusCode = %d", rl.StatusCode())
	}
	return rl
}

func TestConcurrencyLimit(t *testing.T) {
	clk := clock.NewMock()
	cfg := fixed(clk)
	cfg.MaxConcurrent = 2
	p := newProvider(t, cfg)
	req := simprovider.Request{ID: 1, InputTokens: 100, MaxTokens: 200, OutputTokens: 10}

	a := completeAsync(context.Background(), p, req)
	b := completeAsync(context.Background(), p, req)
	testutil.WaitFor(t, "two requests in flight", func() bool { return p.Stats().InFlight == 2 })

	_, err := p.Complete(context.Background(), req)
	rl := wantRateLimit(t, err, simprovider.ConcurrencyLimit)
	if rl.Used != 2 || rl.Max != 2 || rl.RetryAfter != time.Second {
		t.Fatalf("429 = %+v", rl)
	}

	clk.Add(200 * time.Millisecond) // 100ms to first token + 10 tokens
	for _, ch := range []<-chan result{a, b} {
		r := <-ch
		if r.err != nil {
			t.Fatalf("Complete: %v", r.err)
		}
		if r.resp.Usage != (simprovider.Usage{Input: 100, Output: 10}) || r.resp.StopReason != "end_turn" {
			t.Fatalf("response = %+v", r.resp)
		}
		if r.resp.Latency != 200*time.Millisecond {
			t.Fatalf("latency = %v, want 200ms", r.resp.Latency)
		}
	}

	// The slots are back.
	c := completeAsync(context.Background(), p, req)
	testutil.WaitFor(t, "a request in flight", func() bool { return p.Stats().InFlight == 1 })
	clk.Add(time.Second)
	if r := <-c; r.err != nil {
		t.Fatalf("Complete after the slots freed: %v", r.err)
	}
	s := p.Stats()
	want := simprovider.Stats{
		Requests: 4, Completed: 3, RateLimited: 1, RateLimitedConcurrency: 1,
		PeakInFlight: 2, PeakInFlightTokens: 600, InputTokens: 300, OutputTokens: 30,
	}
	if s != want {
		t.Fatalf("stats = %+v\nwant    %+v", s, want)
	}
}

func TestTokensPerMinuteLimit(t *testing.T) {
	clk := clock.NewMock()
	cfg := simprovider.Config{TokensPerMinute: 10_000, OutputMedian: 10, Clock: clk} // instant answers
	p := newProvider(t, cfg)
	req := simprovider.Request{ID: 7, InputTokens: 1_000, MaxTokens: 3_000}
	ctx := context.Background()

	for i := range 2 {
		if _, err := p.Complete(ctx, req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		clk.Add(10 * time.Second)
	}
	// 8,000 tokens in the window: input + max_tokens counts on entry, and
	// nothing comes back when the requests finish with fewer tokens.
	_, err := p.Complete(ctx, req)
	rl := wantRateLimit(t, err, simprovider.TokenLimit)
	if rl.Used != 8_000 || rl.Requested != 4_000 || rl.Max != 10_000 {
		t.Fatalf("429 = %+v", rl)
	}
	if rl.RetryAfter != 40*time.Second { // the first request leaves the window at 60s
		t.Fatalf("RetryAfter = %v, want 40s", rl.RetryAfter)
	}
	// A smaller request still fits.
	if _, err := p.Complete(ctx, simprovider.Request{ID: 8, InputTokens: 1_000, MaxTokens: 1_000}); err != nil {
		t.Fatalf("small request: %v", err)
	}
	clk.Add(39 * time.Second)
	_, err = p.Complete(ctx, req)
	wantRateLimit(t, err, simprovider.TokenLimit)
	clk.Add(time.Second) // the window slides past the first request
	if _, err := p.Complete(ctx, req); err != nil {
		t.Fatalf("after the window slid: %v", err)
	}
	s := p.Stats()
	if s.RateLimitedTokens != 2 || s.Completed != 4 || s.WindowTokens != 10_000 || s.PeakWindowTokens != 10_000 {
		t.Fatalf("stats = %+v", s)
	}

	// A request bigger than the whole limit never fits.
	_, err = p.Complete(ctx, simprovider.Request{ID: 9, InputTokens: 9_000, MaxTokens: 2_000})
	if rl := wantRateLimit(t, err, simprovider.TokenLimit); rl.RetryAfter != time.Minute {
		t.Fatalf("RetryAfter = %v, want the window", rl.RetryAfter)
	}
}

func TestRateLimitAnswerTakesARoundTrip(t *testing.T) {
	clk := clock.NewMock()
	cfg := fixed(clk)
	cfg.MaxConcurrent = 1
	cfg.RoundTrip = 80 * time.Millisecond
	p := newProvider(t, cfg)
	req := simprovider.Request{ID: 1, InputTokens: 10, MaxTokens: 10}
	held := completeAsync(context.Background(), p, req)
	testutil.WaitFor(t, "a request in flight", func() bool { return p.Stats().InFlight == 1 })
	rejected := completeAsync(context.Background(), p, req)
	testutil.WaitFor(t, "the 429", func() bool { return p.Stats().RateLimited == 1 })
	select {
	case r := <-rejected:
		t.Fatalf("429 answered before its round trip: %v", r.err)
	default:
	}
	clk.Add(80 * time.Millisecond)
	wantRateLimit(t, (<-rejected).err, simprovider.ConcurrencyLimit)
	clk.Add(time.Second)
	if r := <-held; r.err != nil {
		t.Fatal(r.err)
	}
}

func TestSlowdownNearSaturation(t *testing.T) {
	clk := clock.NewMock()
	cfg := fixed(clk)
	cfg.MaxConcurrent = 2
	cfg.Degradation = 1
	p := newProvider(t, cfg)
	req := simprovider.Request{ID: 1, InputTokens: 10, MaxTokens: 100, OutputTokens: 10}
	a := completeAsync(context.Background(), p, req)
	testutil.WaitFor(t, "a request in flight", func() bool { return p.Stats().InFlight == 1 })
	b := completeAsync(context.Background(), p, req)
	testutil.WaitFor(t, "two requests in flight", func() bool { return p.Stats().InFlight == 2 })
	clk.Add(time.Second)
	ra, rb := <-a, <-b
	if ra.err != nil || rb.err != nil {
		t.Fatal(ra.err, rb.err)
	}
	// Half load: 1 + 0.5³; full load: 1 + 1³.
	if ra.resp.Slowdown != 1.125 || rb.resp.Slowdown != 2 {
		t.Fatalf("slowdowns %v and %v, want 1.125 and 2", ra.resp.Slowdown, rb.resp.Slowdown)
	}
	if ra.resp.Latency != 225*time.Millisecond || rb.resp.Latency != 400*time.Millisecond {
		t.Fatalf("latencies %v and %v, want 225ms and 400ms", ra.resp.Latency, rb.resp.Latency)
	}
}

func TestCancelReleasesTheSlotButNotTheTokens(t *testing.T) {
	clk := clock.NewMock()
	cfg := fixed(clk)
	cfg.MaxConcurrent = 1
	cfg.TokensPerMinute = 1_000
	p := newProvider(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	ch := completeAsync(ctx, p, simprovider.Request{ID: 1, InputTokens: 100, MaxTokens: 100})
	testutil.WaitFor(t, "a request in flight", func() bool { return p.Stats().InFlight == 1 })
	cancel()
	if r := <-ch; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", r.err)
	}
	s := p.Stats()
	if s.InFlight != 0 || s.InFlightTokens != 0 || s.Canceled != 1 || s.WindowTokens != 200 || s.OutputTokens != 0 {
		t.Fatalf("stats after cancel = %+v", s)
	}
	// A context that is already done counts nothing.
	if _, err := p.Complete(ctx, simprovider.Request{ID: 2, InputTokens: 1, MaxTokens: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v", err)
	}
	if got := p.Stats().Requests; got != 1 {
		t.Fatalf("Requests = %d, want 1", got)
	}
}

func TestStream(t *testing.T) {
	clk := clock.NewMock()
	cfg := fixed(clk)
	cfg.ChunkTokens = 4
	p := newProvider(t, cfg)
	req := simprovider.Request{ID: 3, InputTokens: 20, MaxTokens: 10, OutputTokens: 50}
	var chunks []simprovider.Chunk
	done := make(chan result, 1)
	go func() {
		resp, err := p.Stream(context.Background(), req, func(c simprovider.Chunk) error {
			chunks = append(chunks, c)
			return nil
		})
		done <- result{resp, err}
	}()
	testutil.WaitFor(t, "the stream in flight", func() bool { return p.Stats().InFlight == 1 })
	clk.Add(time.Second)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.StopReason != "max_tokens" || r.resp.Usage.Output != 10 {
		t.Fatalf("response = %+v", r.resp)
	}
	if r.resp.TimeToFirstToken != 100*time.Millisecond {
		t.Fatalf("TimeToFirstToken = %v", r.resp.TimeToFirstToken)
	}
	want := []int64{4, 8, 10}
	if len(chunks) != len(want) {
		t.Fatalf("chunks = %+v", chunks)
	}
	for i, c := range chunks {
		if c.Usage.Output != want[i] || c.Usage.Input != 20 {
			t.Fatalf("chunk %d = %+v, want cumulative output %d", i, c, want[i])
		}
	}

}

func TestStreamEmitError(t *testing.T) {
	clk := clock.NewMock()
	p := newProvider(t, fixed(clk))
	boom := errors.New("client went away")
	done := make(chan error, 1)
	go func() {
		_, err := p.Stream(context.Background(), simprovider.Request{ID: 1, InputTokens: 1, MaxTokens: 100},
			func(simprovider.Chunk) error { return boom })
		done <- err
	}()
	testutil.WaitFor(t, "the stream in flight", func() bool { return p.Stats().InFlight == 1 })
	clk.Add(time.Second)
	if err := <-done; !errors.Is(err, boom) {
		t.Fatalf("error = %v, want the emit error", err)
	}
	if s := p.Stats(); s.InFlight != 0 || s.Canceled != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// run completes reqs one after another on a mock clock and returns the
// responses.
func run(t *testing.T, cfg simprovider.Config, reqs []simprovider.Request) []simprovider.Response {
	t.Helper()
	clk := clock.NewMock()
	cfg.Clock = clk
	p := newProvider(t, cfg)
	out := make([]simprovider.Response, len(reqs))
	for i, req := range reqs {
		ch := completeAsync(context.Background(), p, req)
		testutil.WaitFor(t, "a request in flight", func() bool { return p.Stats().InFlight == 1 })
		clk.Add(time.Hour)
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		out[i] = r.resp
	}
	return out
}

func TestDeterministicWithSeed(t *testing.T) {
	w := simprovider.DefaultWorkload()
	reqs, err := w.Generate(42, 20)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := w.Generate(42, 20)
	other, _ := w.Generate(43, 20)
	same := true
	for i := range reqs {
		if reqs[i] != again[i] {
			t.Fatalf("workload differs with the same seed at %d: %+v vs %+v", i, reqs[i], again[i])
		}
		same = same && reqs[i] == other[i]
		if reqs[i].ID != uint64(i+1) || reqs[i].InputTokens < 20 || reqs[i].MaxTokens <= 0 {
			t.Fatalf("request %d = %+v", i, reqs[i])
		}
	}
	if same {
		t.Fatal("workload identical with another seed")
	}

	cfg := simprovider.DefaultConfig()
	cfg.Seed = 42
	a, b := run(t, cfg, reqs), run(t, cfg, reqs)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("response %d differs with the same seed: %+v vs %+v", i, a[i], b[i])
		}
		if a[i].Usage.Output < 1 || a[i].Usage.Output > reqs[i].MaxTokens {
			t.Fatalf("response %d output %d outside 1..%d", i, a[i].Usage.Output, reqs[i].MaxTokens)
		}
	}
	cfg.Seed = 43
	c := run(t, cfg, reqs)
	differ := 0
	for i := range a {
		if a[i].Latency != c[i].Latency {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("latencies identical with another seed")
	}
}

func TestPlanDependsOnlyOnSeedAndID(t *testing.T) {
	cfg := simprovider.DefaultConfig()
	cfg.Seed = 9
	p1, p2 := newProvider(t, cfg), newProvider(t, cfg)
	var mu sync.Mutex
	seen := map[uint64]int64{}
	var wg sync.WaitGroup
	for id := range uint64(200) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _ := p1.Plan(simprovider.Request{ID: id, MaxTokens: 100_000})
			mu.Lock()
			seen[id] = out
			mu.Unlock()
		}()
	}
	wg.Wait()
	var total int64
	for id := range uint64(200) {
		out, stop := p2.Plan(simprovider.Request{ID: id, MaxTokens: 100_000})
		if out != seen[id] || stop != "end_turn" {
			t.Fatalf("id %d: %d (%s), concurrently %d", id, out, stop, seen[id])
		}
		total += out
	}
	// The lognormal output distribution has median 250 and mean ~375.
	if mean := total / 200; mean < 250 || mean > 550 {
		t.Fatalf("mean output %d tokens, want about 375", mean)
	}
	if out, stop := p2.Plan(simprovider.Request{ID: 1, MaxTokens: 1}); out != 1 || stop != "max_tokens" {
		t.Fatalf("capped plan = %d, %s", out, stop)
	}
}

// TestConcurrentRealClock hammers a provider on the wall clock at a tiny
// time scale: the counters stay consistent and the limits hold.
func TestConcurrentRealClock(t *testing.T) {
	cfg := simprovider.DefaultConfig()
	cfg.MaxConcurrent = 8
	cfg.TokensPerMinute = 100_000
	cfg.TimeScale = 0.0005 // a 5s call takes 2.5ms
	p := newProvider(t, cfg)
	reqs, err := simprovider.DefaultWorkload().Generate(1, 200)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Complete(context.Background(), req)
			if err != nil && !errors.Is(err, simprovider.ErrRateLimited) {
				t.Errorf("Complete: %v", err)
			}
		}()
	}
	wg.Wait()
	s := p.Stats()
	if s.Requests != 200 || s.Completed+s.RateLimited != 200 || s.RateLimited != s.RateLimitedConcurrency+s.RateLimitedTokens {
		t.Fatalf("inconsistent stats %+v", s)
	}
	if s.RateLimited == 0 || s.Completed == 0 {
		t.Fatalf("want both completions and 429s: %+v", s)
	}
	if s.InFlight != 0 || s.InFlightTokens != 0 || s.PeakInFlight > 8 || s.PeakWindowTokens > 100_000 {
		t.Fatalf("limits broken: %+v", s)
	}
}

func TestInvalid(t *testing.T) {
	bad := []simprovider.Config{
		{MaxConcurrent: -1, OutputMedian: 1},
		{TokensPerMinute: -1, OutputMedian: 1},
		{OutputMedian: 0},
		{OutputMedian: 1, LatencySpread: -1},
		{OutputMedian: 1, Degradation: -1},
		{OutputMedian: 1, TimeScale: -1},
		{OutputMedian: 1, RoundTrip: -1},
	}
	for _, cfg := range bad {
		if _, err := simprovider.New(cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		}
	}
	p := newProvider(t, simprovider.Config{OutputMedian: 1})
	for _, req := range []simprovider.Request{{MaxTokens: 0}, {InputTokens: -1, MaxTokens: 1}, {MaxTokens: 1, OutputTokens: -1}} {
		if _, err := p.Complete(context.Background(), req); err == nil || errors.Is(err, simprovider.ErrRateLimited) {
			t.Errorf("Complete(%+v) = %v, want a validation error", req, err)
		}
	}
	if p.Stats().Requests != 0 {
		t.Fatal("invalid requests were counted")
	}
	w := simprovider.DefaultWorkload()
	w.MaxTokensWeights = w.MaxTokensWeights[:1]
	if _, err := w.Generate(1, 1); err == nil {
		t.Error("Generate with mismatched weights = nil error")
	}
}

func TestEnterLeave(t *testing.T) {
	clk := clock.NewMock()
	cfg := simprovider.DefaultConfig()
	cfg.MaxConcurrent, cfg.TokensPerMinute, cfg.Seed, cfg.Clock = 1, 10_000, 7, clk
	cfg.RequestsPerMinute, cfg.InputTokensPerMinute, cfg.OutputTokensPerMinute = 100, 1_000_000, 1_000_000
	cfg.CapacityChange = &simprovider.CapacityChange{After: time.Minute, Factor: 0.5}
	p, err := simprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.Now()
	req := simprovider.Request{ID: 1, InputTokens: 1000, MaxTokens: 1000}
	tk, err := p.Enter(req, now)
	if err != nil || !tk.At.After(now) || tk.Response.Usage.Output == 0 || tk.Response.Latency != tk.At.Sub(now) {
		t.Fatalf("Enter = %+v, %v", tk, err)
	}
	var rl *simprovider.RateLimitError
	tk2, err := p.Enter(simprovider.Request{ID: 2, InputTokens: 10, MaxTokens: 10}, now)
	if !errors.As(err, &rl) || rl.Limit != simprovider.ConcurrencyLimit || !tk2.At.After(now) {
		t.Fatalf("second Enter = %+v, %v: want a concurrency 429 after a round trip", tk2, err)
	}
	p.Leave(req, tk)
	if st := p.Stats(); st.InFlight != 0 || st.Completed != 1 || st.RateLimited != 1 || st.OutputTokens != tk.Response.Usage.Output {
		t.Fatalf("stats %+v", st)
	}
	// After the change the TPM limit is 5,000: 4,000 more does not fit in
	// the window that still holds 2,000, until the window has moved on.
	if a := p.Account(now.Add(time.Minute)); a != (simprovider.Account{MaxConcurrent: 1, RequestsPerMinute: 50, TokensPerMinute: 5000, InputTokensPerMinute: 500_000, OutputTokensPerMinute: 500_000}) {
		t.Fatalf("limits after the change = %+v", a)
	}
	big := simprovider.Request{ID: 3, InputTokens: 2000, MaxTokens: 2000}
	if _, err := p.Enter(big, now.Add(time.Minute-time.Second)); err != nil {
		t.Fatalf("before the change: %v", err)
	}
	if _, err := p.Enter(simprovider.Request{ID: 4, InputTokens: 2000, MaxTokens: 2000}, now.Add(time.Minute+2*time.Second)); !errors.As(err, &rl) {
		t.Fatalf("after the change: %v, want a 429", err)
	}
	if _, err := p.Enter(simprovider.Request{ID: 5, MaxTokens: 0}, now); err == nil || errors.Is(err, simprovider.ErrRateLimited) {
		t.Fatalf("invalid request: %v", err)
	}
	cfg.CapacityChange = &simprovider.CapacityChange{Factor: 2}
	if _, err := simprovider.New(cfg); err == nil {
		t.Fatal("New accepted a capacity factor of 2")
	}
}

// TestHeadroom checks what the account says is left of its TPM window:
// the tokens left after every accepted request, and the time until the
// newest entry leaves the window (so it is full again), through a
// capacity change.
func TestHeadroom(t *testing.T) {
	clk := clock.NewMock()
	start := clk.Now()
	p := newProvider(t, simprovider.Config{TokensPerMinute: 10_000, OutputMedian: 10, Clock: clk,
		CapacityChange: &simprovider.CapacityChange{After: 30 * time.Second, Factor: 0.5}})
	if h := p.Headroom(start); h != (simprovider.Headroom{Tokens: simprovider.Window{Remaining: 10_000, Limit: 10_000}}) {
		t.Fatalf("empty window: %+v", h)
	}
	for i, at := range []time.Duration{0, 10 * time.Second} {
		if _, err := p.Enter(simprovider.Request{ID: uint64(i), InputTokens: 1_000, MaxTokens: 2_000}, start.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	if h := p.Headroom(start.Add(20 * time.Second)); h.Tokens != (simprovider.Window{Remaining: 4_000, Limit: 10_000, Reset: 50 * time.Second}) {
		t.Fatalf("two entries: %+v", h)
	}
	// Halved at 30s: 6,000 tokens in a window of 5,000.
	if h := p.Headroom(start.Add(40 * time.Second)); h.Tokens != (simprovider.Window{Remaining: 0, Limit: 5_000, Reset: 30 * time.Second}) {
		t.Fatalf("over the halved limit: %+v", h)
	}
	if h := p.Headroom(start.Add(65 * time.Second)); h.Tokens != (simprovider.Window{Remaining: 2_000, Limit: 5_000, Reset: 5 * time.Second}) {
		t.Fatalf("after the first entry left: %+v", h)
	}
	if h := p.Headroom(start.Add(70 * time.Second)); h.Tokens != (simprovider.Window{Remaining: 5_000, Limit: 5_000}) {
		t.Fatalf("full again: %+v", h)
	}
	if h := newProvider(t, simprovider.Config{OutputMedian: 10, Clock: clk}).Headroom(start); h != (simprovider.Headroom{}) {
		t.Fatalf("no TPM limit: %+v", h)
	}
}

// TestRequestsPerMinuteLimit: the RPM window counts accepted requests
// (429s are not counted), answers 429 with the time until its oldest
// entry leaves, and lets a request through once it has.
func TestRequestsPerMinuteLimit(t *testing.T) {
	clk := clock.NewMock()
	p := newProvider(t, simprovider.Config{RequestsPerMinute: 2, OutputMedian: 10, Clock: clk}) // instant answers
	ctx := context.Background()
	req := simprovider.Request{ID: 1, InputTokens: 10, MaxTokens: 10}
	for i := range 2 {
		if _, err := p.Complete(ctx, req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		clk.Add(15 * time.Second)
	}
	_, err := p.Complete(ctx, req)
	rl := wantRateLimit(t, err, simprovider.RequestLimit)
	if rl.Used != 2 || rl.Max != 2 || rl.Requested != 1 || rl.RetryAfter != 30*time.Second {
		t.Fatalf("429 = %+v, want 2 of 2 used and 30s until the first request leaves", rl)
	}
	if h := p.Headroom(clk.Now()); h.Requests != (simprovider.Window{Remaining: 0, Limit: 2, Reset: 45 * time.Second}) {
		t.Fatalf("requests headroom %+v", h.Requests)
	}
	clk.Add(30 * time.Second)
	if _, err := p.Complete(ctx, req); err != nil {
		t.Fatalf("after the first request left the window: %v", err)
	}
	if s := p.Stats(); s.RateLimited != 1 || s.RateLimitedRequests != 1 || s.Completed != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// TestInputAndOutputTokensPerMinute: the input window counts each
// request's input on entry; the output window reserves its max_tokens on
// entry and is corrected to the output it wrote when it ends, so the
// room a short answer did not use comes back at once.
func TestInputAndOutputTokensPerMinute(t *testing.T) {
	clk := clock.NewMock()
	p := newProvider(t, simprovider.Config{InputTokensPerMinute: 1_000, OutputTokensPerMinute: 500, OutputMedian: 10, Clock: clk})
	ctx := context.Background()
	if _, err := p.Complete(ctx, simprovider.Request{ID: 1, InputTokens: 600, MaxTokens: 400, OutputTokens: 100}); err != nil {
		t.Fatal(err)
	}
	h := p.Headroom(clk.Now())
	if h.InputTokens != (simprovider.Window{Remaining: 400, Limit: 1_000, Reset: time.Minute}) ||
		h.OutputTokens != (simprovider.Window{Remaining: 400, Limit: 500, Reset: time.Minute}) {
		t.Fatalf("headroom %+v: want 400 input tokens left and 400 output tokens (500 - the 100 written)", h)
	}
	_, err := p.Complete(ctx, simprovider.Request{ID: 2, InputTokens: 500, MaxTokens: 10})
	if rl := wantRateLimit(t, err, simprovider.InputTokenLimit); rl.Used != 600 || rl.Requested != 500 || rl.RetryAfter != time.Minute {
		t.Fatalf("429 = %+v", rl)
	}
	_, err = p.Complete(ctx, simprovider.Request{ID: 3, InputTokens: 10, MaxTokens: 450})
	if rl := wantRateLimit(t, err, simprovider.OutputTokenLimit); rl.Used != 100 || rl.Requested != 450 || rl.Max != 500 {
		t.Fatalf("429 = %+v", rl)
	}
	if s := p.Stats(); s.RateLimitedInputTokens != 1 || s.RateLimitedOutputTokens != 1 || s.RateLimited != 2 {
		t.Fatalf("stats %+v", s)
	}
	clk.Add(time.Minute)
	if h := p.Headroom(clk.Now()); h.InputTokens.Remaining != 1_000 || h.OutputTokens.Remaining != 500 || h.OutputTokens.Reset != 0 {
		t.Fatalf("after a minute: %+v", h)
	}
}

// TestOutputReservedWhileRunning: a request in flight holds its whole
// max_tokens in the output window until it ends; a request cancelled
// keeps it.
func TestOutputReservedWhileRunning(t *testing.T) {
	clk := clock.NewMock()
	cfg := fixed(clk)
	cfg.OutputTokensPerMinute = 500
	p := newProvider(t, cfg)
	held := completeAsync(context.Background(), p, simprovider.Request{ID: 4, InputTokens: 10, MaxTokens: 300, OutputTokens: 20})
	testutil.WaitFor(t, "the request in flight", func() bool { return p.Stats().InFlight == 1 })
	if h := p.Headroom(clk.Now()); h.OutputTokens.Remaining != 200 {
		t.Fatalf("in flight: %+v, want 200 output tokens left", h.OutputTokens)
	}
	clk.Add(time.Second)
	if r := <-held; r.err != nil {
		t.Fatal(r.err)
	}
	if h := p.Headroom(clk.Now()); h.OutputTokens.Remaining != 480 {
		t.Fatalf("done: %+v, want 480 output tokens left", h.OutputTokens)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := completeAsync(ctx, p, simprovider.Request{ID: 5, InputTokens: 10, MaxTokens: 100})
	testutil.WaitFor(t, "the request in flight", func() bool { return p.Stats().InFlight == 1 })
	cancel()
	<-ch
	if h := p.Headroom(clk.Now()); h.OutputTokens.Remaining != 380 {
		t.Fatalf("cancelled: %+v, want its 100 still reserved", h.OutputTokens)
	}
}
