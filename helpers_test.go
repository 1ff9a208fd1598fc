package bulkhead_test

import (
	"context"
	"testing"
	"time"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// newBulkhead builds a bulkhead and closes and drains it when the test ends,
// failing the test if it does not drain.
func newBulkhead(t *testing.T, cfg bulkhead.Config) *bulkhead.Bulkhead {
	t.Helper()
	b, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if res, err := b.Drain(ctx); err != nil || !res.Drained {
			t.Errorf("Drain at cleanup: %+v, %v", res, err)
		}
	})
	return b
}

// req is a request with one user message of text and the given max tokens.
func req(text string, maxTokens int64) *bulkhead.Request {
	return &bulkhead.Request{Messages: []bulkhead.Message{{Role: "user", Content: text}}, MaxTokens: maxTokens}
}

// acquireAsync starts an Acquire on its own goroutine.
type result struct {
	tok *bulkhead.Permit
	err error
}

func acquireAsync(ctx context.Context, b *bulkhead.Bulkhead, r *bulkhead.Request, opts ...bulkhead.Option) <-chan result {
	ch := make(chan result, 1)
	go func() {
		tok, err := b.Acquire(ctx, r, opts...)
		ch <- result{tok, err}
	}()
	return ch
}

// mustAcquire acquires or fails the test.
func mustAcquire(t *testing.T, b *bulkhead.Bulkhead, r *bulkhead.Request, opts ...bulkhead.Option) *bulkhead.Permit {
	t.Helper()
	tok, err := b.Acquire(context.Background(), r, opts...)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return tok
}

// wantReason checks that err is a rejection for reason why.
func wantReason(t *testing.T, err error, why bulkhead.Reason) *bulkhead.RejectedError {
	t.Helper()
	return testutil.WantReason(t, err, why)
}

// sentinel is each reason's sentinel error.
var sentinel = testutil.Sentinel

func pending(b *bulkhead.Bulkhead) func() bool {
	return func() bool { return b.Stats().Gate.Pending > 0 }
}

// estimatorFunc adapts a function to bulkhead.Estimator; a nil one reserves
// 1 input token and the request's MaxTokens.
type estimatorFunc func(*bulkhead.Request) (bulkhead.Reservation, error)

func (f estimatorFunc) Estimate(r *bulkhead.Request) (bulkhead.Reservation, error) {
	if f == nil {
		return bulkhead.Reservation{Input: 1, MaxOutput: r.MaxTokens}, nil
	}
	return f(r)
}

// drainNow is a Drain that gives up at once.
func drainNow(b *bulkhead.Bulkhead) bulkhead.DrainResult {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, _ := b.Drain(ctx)
	return res
}
