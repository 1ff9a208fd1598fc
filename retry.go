package bulkhead

import (
	"fmt"
	"math"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// RetryBudgets bound the retries a bulkhead admits: over a sliding window,
// the retries admitted (calls made with WithAttempt above 0) may be at most
// a share of the first attempts admitted, or a small floor when that share
// is smaller. A retry with no room left is rejected RetryBudget at once,
// whether or not a slot is free, and counts nothing; a retry with room is
// admitted as any call, and takes its room as it is granted its slot (a
// retry that waited in the queue is checked again then). A first attempt
// is never refused for it. Under overload the clients' retries then add at
// most that share to the load the bulkhead's capacity sheds, instead of up
// to two more attempts per call.
//
// The budget of the whole bulkhead counts the calls of every class; a
// class's own budget (PerClass) counts that class's only, so a quiet class
// keeps its floor whatever the others do. A retry must have room in each
// budget it falls under.
type RetryBudgets struct {
	// Window is how long an admission counts in the budgets: the windows
	// slide in tenths, so an admission counts from its grant for between
	// 9/10 of Window and the whole of it. Zero means DefaultRetryWindow; it
	// must be between MinRetryWindow and MaxRetryWindow.
	Window time.Duration

	// Bulkhead is the budget of all the bulkhead's retries together. The
	// zero RetryLimit means none.
	Bulkhead RetryLimit

	// PerClass gives each class it names a budget of its own, which the
	// class's retries must fit besides Bulkhead. It needs Config.Classes,
	// and every name must be one of its classes. A zero RetryLimit means
	// none.
	PerClass map[string]RetryLimit
}

// RetryLimit is one retry budget: the retries admitted over the window may
// be at most the larger of MinRetries and Ratio times the first attempts
// admitted over the same window, rounded down.
//
// Ratio 0.1 with MinRetries 3, over 10 seconds, lets a bulkhead that
// admits 100 first attempts in 10 seconds admit 10 retries, and one that
// admits 5 (a quiet class) admit 3. A ratio of the size of the error rate
// you expect from the provider when it is healthy keeps the retries of
// those errors flowing, while under overload retries stay a tenth of what
// the bulkhead admits.
type RetryLimit struct {
	// Ratio is the share of the first attempts that may be retried, from
	// 0 to 1, counted to the millionth (a ratio above 0 is at least
	// 0.000001).
	Ratio float64
	// MinRetries is the floor: the retries allowed whatever the first
	// attempts, at least 0.
	MinRetries int
}

// The bounds and default of RetryBudgets.Window.
const (
	DefaultRetryWindow = 10 * time.Second
	MinRetryWindow     = time.Second
	MaxRetryWindow     = time.Hour
)

// DefaultRetryAging is QueuePolicy.RetryAging when it is zero: a waiting
// retry lets first attempts go ahead of it for at most 10 seconds.
const DefaultRetryAging = 10 * time.Second

// zero reports whether l sets no budget.
func (l RetryLimit) zero() bool { return l == RetryLimit{} }

// RetryStats counts the retries a bulkhead (or a class) admitted, and its
// retry budget's use.
type RetryStats struct {
	// Admitted counts the retries admitted: the calls made with
	// WithAttempt above 0. The first attempts admitted are the other
	// admissions.
	Admitted int64
	// Budget is the retry budget's use now (for a class, the class's own
	// budget), nil without one.
	Budget *RetryBudgetStats
}

// RetryBudgetStats is a retry budget's use over its window now.
type RetryBudgetStats struct {
	// Ratio, MinRetries and Window are the budget's.
	Ratio      float64
	MinRetries int
	Window     time.Duration
	// FirstAttempts and Retries are the first attempts and the retries
	// admitted over the window.
	FirstAttempts int64
	Retries       int64
	// Allowed is the most retries the window allows now: the larger of
	// MinRetries and Ratio times FirstAttempts, rounded down.
	Allowed int64
	// Available is Allowed - Retries, 0 when Retries is above it (the
	// first attempts it counted left the window before the retries).
	Available int64
}

// RetryBudgetDetail is the retry budget that refused a RetryBudget
// rejection, and its use at the decision: Retries had reached Allowed.
type RetryBudgetDetail struct {
	// Class is the class whose own budget refused the retry, "" for the
	// bulkhead's budget.
	Class string
	RetryBudgetStats
}

// explain says why the budget refused the retry.
func (d *RetryBudgetDetail) explain() string {
	whose := "the bulkhead's"
	if d.Class != "" {
		whose = fmt.Sprintf("class %q's", d.Class)
	}
	return fmt.Sprintf("%s retry budget is spent: %d retries admitted over the last %v, of %d allowed (%g of %d first attempts, at least %d)",
		whose, d.Retries, d.Window, d.Allowed, d.Ratio, d.FirstAttempts, d.MinRetries)
}

// retryConfig validates cfg.RetryBudgets and returns the engine's form of
// it, nil when there is none.
func retryConfig(cfg *Config) (*admission.RetryConfig, error) {
	rb := cfg.RetryBudgets
	if rb == nil {
		return nil, nil
	}
	out := &admission.RetryConfig{Window: rb.Window}
	switch {
	case rb.Window == 0:
		out.Window = DefaultRetryWindow
	case rb.Window < MinRetryWindow || rb.Window > MaxRetryWindow:
		return nil, invalidf("Config.RetryBudgets.Window", "must be between %v and %v (or 0 for %v), got %v",
			MinRetryWindow, MaxRetryWindow, DefaultRetryWindow, rb.Window)
	}
	if !rb.Bulkhead.zero() {
		l, err := rb.Bulkhead.engine("Config.RetryBudgets.Bulkhead")
		if err != nil {
			return nil, err
		}
		out.Bulkhead = &l
	}
	if len(rb.PerClass) > 0 && cfg.Classes == nil {
		return nil, invalidf("Config.RetryBudgets.PerClass", "needs Config.Classes")
	}
	for c, l := range rb.PerClass {
		field := fmt.Sprintf("Config.RetryBudgets.PerClass[%q]", c)
		if _, ok := cfg.Classes.Limits[c]; !ok || c == "" {
			return nil, invalidf(field, "is not one of Config.Classes")
		}
		el, err := l.engine(field)
		if err != nil {
			return nil, err
		}
		if !l.zero() {
			if out.PerClass == nil {
				out.PerClass = map[string]admission.RetryLimit{}
			}
			out.PerClass[c] = el
		}
	}
	if out.Bulkhead == nil && out.PerClass == nil {
		return nil, invalidf("Config.RetryBudgets", "sets no budget: set Bulkhead.Ratio or Bulkhead.MinRetries, or PerClass")
	}
	return out, nil
}

// engine validates l, the budget at field, and returns its engine form.
func (l RetryLimit) engine(field string) (admission.RetryLimit, error) {
	if math.IsNaN(l.Ratio) || l.Ratio < 0 || l.Ratio > 1 {
		return admission.RetryLimit{}, invalidf(field+".Ratio", "must be between 0 and 1, got %v", l.Ratio)
	}
	if l.Ratio > 0 && l.Ratio < 1e-6 {
		// Counted in millionths, it would be 0: a budget of no retry at all.
		return admission.RetryLimit{}, invalidf(field+".Ratio", "must be 0 or at least 0.000001 (a millionth), got %v", l.Ratio)
	}
	if l.MinRetries < 0 {
		return admission.RetryLimit{}, invalidf(field+".MinRetries", "must be >= 0, got %d", l.MinRetries)
	}
	return admission.RetryLimit{Ratio: l.Ratio, PPM: int64(math.Round(l.Ratio * 1e6)), MinRetries: l.MinRetries}, nil
}

// retryAging is the engine's form of QueuePolicy.RetryAging: its default
// applied, and -1 for none.
func retryAging(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultRetryAging
	case d < 0:
		return -1
	}
	return d
}

// retryStats is the public view of the engine's retry statistics.
func retryStats(s admission.RetryStats) RetryStats {
	out := RetryStats{Admitted: s.Admitted}
	if b := s.Budget; b != nil {
		st := budgetStats(*b)
		out.Budget = &st
	}
	return out
}

// budgetStats is the public view of a retry budget's use.
func budgetStats(b admission.RetryBudgetStats) RetryBudgetStats {
	return RetryBudgetStats{Ratio: b.Ratio, MinRetries: b.MinRetries, Window: b.Window,
		FirstAttempts: b.FirstAttempts, Retries: b.Retries, Allowed: b.Allowed, Available: max(0, b.Allowed-b.Retries)}
}

// retryDetail is the public view of the budget that refused a retry, nil
// for nil.
func retryDetail(d *admission.RetryBudgetDetail) *RetryBudgetDetail {
	if d == nil {
		return nil
	}
	return &RetryBudgetDetail{Class: d.Class, RetryBudgetStats: budgetStats(d.RetryBudgetStats)}
}
