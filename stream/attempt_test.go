package stream_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/stream"
)

// TestAttemptOfReadsTheSDKHeader: the attempt number is the header's
// whole number, 0 when it is absent or empty; anything else is a
// *ConfigError naming the header.
func TestAttemptOfReadsTheSDKHeader(t *testing.T) {
	tests := []struct {
		header, value string
		name          string // the header AttemptOf is asked for
		want          int
		bad           bool
	}{
		{header: "", want: 0},
		{header: "X-Stainless-Retry-Count", value: "0", want: 0},
		{header: "x-stainless-retry-count", value: "2", want: 2},
		{header: "X-Stainless-Retry-Count", value: "", want: 0},
		{header: "X-Attempt", value: "3", name: "X-Attempt", want: 3},
		{header: "X-Stainless-Retry-Count", value: "5", name: "X-Attempt", want: 0},
		{header: "X-Stainless-Retry-Count", value: "-1", bad: true},
		{header: "X-Stainless-Retry-Count", value: "+1", bad: true},
		{header: "X-Stainless-Retry-Count", value: "1.0", bad: true},
		{header: "X-Stainless-Retry-Count", value: " 1", bad: true},
		{header: "X-Stainless-Retry-Count", value: "one", bad: true},
		{header: "X-Stainless-Retry-Count", value: "99999999999999999999", bad: true},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.header != "" {
			h.Set(tt.header, tt.value)
		}
		got, err := stream.AttemptOf(h, tt.name)
		var ce *bulkhead.ConfigError
		switch {
		case tt.bad && (!errors.As(err, &ce) || !errors.Is(err, bulkhead.ErrInvalid) || ce.Field == ""):
			t.Errorf("%s: %q: error %v, want a *ConfigError", tt.header, tt.value, err)
		case !tt.bad && (err != nil || got != tt.want):
			t.Errorf("%s: %q: %d, %v; want %d", tt.header, tt.value, got, err, tt.want)
		}
	}
}

// FuzzAttemptOf: any value is either a number that prints back as the
// value (leading zeros aside) or an error; never a panic or a negative.
func FuzzAttemptOf(f *testing.F) {
	for _, s := range []string{"0", "1", "2", "-1", "007", "1e3", "", "99999999999999999999", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h[stream.DefaultAttemptHeader] = []string{v}
		n, err := stream.AttemptOf(h, "")
		if err != nil {
			if !errors.Is(err, bulkhead.ErrInvalid) || n != 0 {
				t.Fatalf("%q: %d, %v", v, n, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("%q: negative %d", v, n)
		}
		if v != "" {
			if m, perr := strconv.Atoi(v); perr != nil || m != n {
				t.Fatalf("%q read as %d", v, n)
			}
		}
	})
}
