package admission

import (
	"context"
	"errors"
	"math"
	"testing"
)

func TestIDString(t *testing.T) {
	id := ID{0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x41, 0xd2, 0x88, 0x3f, 0x00, 0x16, 0xd3, 0xcc, 0xa4, 0x27}
	if got := id.String(); got != "1b4e28ba-2fa1-41d2-883f-0016d3cca427" {
		t.Fatalf("String = %q", got)
	}
	if (ID{}).String() != "" {
		t.Fatal("the zero ID is not empty")
	}
	b, _ := id.MarshalText()
	if string(b) != id.String() {
		t.Fatalf("MarshalText = %q", b)
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := Reason(1); r < numReasons; r++ {
		name := r.String()
		if name == "" || seen[name] {
			t.Fatalf("reason %d has name %q", r, name)
		}
		seen[name] = true
	}
	if len(seen) != NumReasons-1 || NoReason.String() != "" || Reason(200).String() != "reason(200)" {
		t.Fatal("reason table is inconsistent")
	}
}

func TestAbortedUnwrapsItsCause(t *testing.T) {
	err := error(&RejectedError{Reason: Aborted, Cause: context.DeadlineExceeded})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
	if err.Error() != "bulkhead: rejected: aborted: context deadline exceeded" {
		t.Fatalf("message %q", err.Error())
	}
}

func TestCloneIsDeep(t *testing.T) {
	ceiling := 3
	l := Limits{
		Revision:    1,
		TokenBudget: &BudgetLimits{Budget: 10},
		Classes:     &Classes{Default: "a", Limits: map[string]ClassLimits{"a": {MaxConcurrent: &ceiling}}},
	}
	c := l.Clone()
	c.TokenBudget.Budget = 99
	c.Classes.Limits["a"] = ClassLimits{}
	*l.Classes.Limits["a"].MaxConcurrent = 4
	if l.TokenBudget.Budget != 10 || c.Classes.Limits["a"].MaxConcurrent != nil {
		t.Fatalf("clone shares memory: %+v %+v", l, c)
	}
	c2 := l.Clone()
	*c2.Classes.Limits["a"].MaxConcurrent = 7
	if *l.Classes.Limits["a"].MaxConcurrent != 4 {
		t.Fatal("clone shares a ceiling pointer")
	}
}

func TestConfigError(t *testing.T) {
	err := Invalidf("Config.MaxQueue", "must be >= 0, got %d", -1)
	if err.Error() != "bulkhead: invalid Config.MaxQueue: must be >= 0, got -1" || !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v", err)
	}
	if CheckNonNegative("x", 0) != nil || CheckNonNegative("x", -1) == nil {
		t.Fatal("CheckNonNegative")
	}
}

func TestArithmetic(t *testing.T) {
	const top = math.MaxInt64
	tests := []struct {
		a, b, sum int64
		ok        bool
	}{
		{0, 0, 0, true},
		{1, 2, 3, true},
		{top, 0, top, true},
		{top - 1, 1, top, true},
		{top, 1, top, false},
		{top, top, top, false},
		{1, top, top, false},
	}
	for _, tt := range tests {
		if s, ok := Add(tt.a, tt.b); s != tt.sum || ok != tt.ok {
			t.Errorf("Add(%d, %d) = %d, %v; want %d, %v", tt.a, tt.b, s, ok, tt.sum, tt.ok)
		}
		if s := AddSat(tt.a, tt.b); s != tt.sum {
			t.Errorf("AddSat(%d, %d) = %d, want %d", tt.a, tt.b, s, tt.sum)
		}
		if got, want := Exceeds(tt.a, tt.b, top), !tt.ok; got != want {
			t.Errorf("Exceeds(%d, %d, max) = %v, want %v", tt.a, tt.b, got, want)
		}
	}
	for _, tt := range []struct {
		used, add, limit int64
		want             bool
	}{
		{0, 0, 0, false}, {0, 1, 0, true}, {5, 5, 10, false}, {5, 6, 10, true},
		{11, 0, 10, true}, {10, top, top, true}, {0, top, top, false}, {top, 0, 10, true},
	} {
		if got := Exceeds(tt.used, tt.add, tt.limit); got != tt.want {
			t.Errorf("Exceeds(%d, %d, %d) = %v, want %v", tt.used, tt.add, tt.limit, got, tt.want)
		}
	}
}
