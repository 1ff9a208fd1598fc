package bulkhead

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead/actor"
	"github.com/llmbulkhead/bulkhead/actor/adaptive"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// This file turns the configuration into the engine's: the limits, the
// rate limits and the adaptive limit, validated, with their defaults filled
// in. The type files hold the types; convert.go converts what the engine
// answers.

// engineLimits is l in the engine's form, sharing no memory with l.
func engineLimits(l Limits) admission.Limits {
	out := admission.Limits{Revision: l.Revision, MaxConcurrent: l.MaxConcurrent, MaxQueue: l.MaxQueue}
	if l.TokenBudget != nil {
		out.TokenBudget = &admission.BudgetLimits{Budget: l.TokenBudget.Budget, HighPriorityReserve: l.TokenBudget.HighPriorityReserve}
	}
	if l.Classes != nil {
		c := admission.Classes{Default: l.Classes.Default}
		if l.Classes.Limits != nil {
			c.Limits = make(map[string]admission.ClassLimits, len(l.Classes.Limits))
			for k, v := range l.Classes.Limits {
				c.Limits[k] = admission.ClassLimits(v.clone())
			}
		}
		out.Classes = &c
	}
	return out
}

// rateConfig validates cfg.RateLimits and returns the engine's form of
// them, nil when there are none.
func rateConfig(cfg *Config) (*actor.Rates, error) {
	rl := cfg.RateLimits
	if rl == nil {
		return nil, nil
	}
	name := rl.Name
	if name == "" {
		name = "bulkhead"
	}
	if strings.ContainsAny(name, "{}") {
		return nil, invalidf("Config.RateLimits.Name", "must not contain '{' or '}', got %q", name)
	}
	hasBudget := cfg.TokenBudget != nil
	if rl.TokenWeight > WeightInput {
		return nil, invalidf("Config.RateLimits.TokenWeight", "must be WeightReservation, WeightLarger or WeightInput, got %v", rl.TokenWeight)
	}
	if err := validateRate("Config.RateLimits.PerModel", rl.PerModel, hasBudget); err != nil {
		return nil, err
	}
	if len(rl.PerClass) > 0 && cfg.Classes == nil {
		return nil, invalidf("Config.RateLimits.PerClass", "needs Config.Classes")
	}
	perClass := make(map[string]Rate, len(rl.PerClass))
	for c, r := range rl.PerClass {
		field := fmt.Sprintf("Config.RateLimits.PerClass[%q]", c)
		if c == "" {
			return nil, invalidf(field, "must name a class")
		}
		if _, ok := cfg.Classes.Limits[c]; !ok {
			return nil, invalidf(field, "is not one of Config.Classes")
		}
		if err := validateRate(field, r, hasBudget); err != nil {
			return nil, err
		}
		if !r.zero() {
			perClass[c] = r
		}
	}
	if rl.PerModel.zero() && len(perClass) == 0 {
		return nil, invalidf("Config.RateLimits", "sets no rate: set PerModel or PerClass")
	}
	rates := &actor.Rates{Store: rl.Store, Name: name, Pace: rl.Pace, Model: cfg.Model, Weight: actor.TokenWeight(rl.TokenWeight),
		PerModel: rl.PerModel.engine()}
	if len(perClass) > 0 {
		rates.PerClass = make(map[string]actor.Rate, len(perClass))
		for c, r := range perClass {
			rates.PerClass[c] = r.engine()
		}
	}
	return rates, nil
}

func validateRate(field string, r Rate, hasBudget bool) error {
	for _, l := range []struct {
		rate, burst           string
		perMinute, burstValue float64
		tokens                bool
	}{
		{"RequestsPerMinute", "RequestBurst", r.RequestsPerMinute, r.RequestBurst, false},
		{"TokensPerMinute", "TokenBurst", r.TokensPerMinute, r.TokenBurst, true},
		{"InputTokensPerMinute", "InputTokenBurst", r.InputTokensPerMinute, r.InputTokenBurst, true},
		{"OutputTokensPerMinute", "OutputTokenBurst", r.OutputTokensPerMinute, r.OutputTokenBurst, true},
	} {
		if v := l.perMinute; !(v >= 0 && v <= MaxPerMinute) {
			return invalidf(field+"."+l.rate, "must be in [0, %g], got %v", float64(MaxPerMinute), v)
		}
		if v := l.burstValue; v != NoBurst && !(v >= 0 && v <= math.MaxFloat64) {
			return invalidf(field+"."+l.burst, "must be >= 0 and finite (0: a minute of the rate), or NoBurst (-1), got %v", v)
		}
		if l.burstValue != 0 && l.perMinute == 0 {
			return invalidf(field+"."+l.burst, "applies only with %s set", l.rate)
		}
		if l.tokens && l.perMinute > 0 && !hasBudget {
			return invalidf(field+"."+l.rate, "needs Config.TokenBudget: its estimator makes the reservations that tokens per minute count")
		}
	}
	return nil
}

func (r Rate) zero() bool {
	return r.RequestsPerMinute == 0 && r.TokensPerMinute == 0 && r.InputTokensPerMinute == 0 && r.OutputTokensPerMinute == 0
}

// engine is r in the engine's form, its bursts resolved.
func (r Rate) engine() actor.Rate {
	return actor.Rate{
		RequestsPerMinute: r.RequestsPerMinute, RequestBurst: burst(r.RequestsPerMinute, r.RequestBurst, true),
		TokensPerMinute: r.TokensPerMinute, TokenBurst: burst(r.TokensPerMinute, r.TokenBurst, false),
		InputTokensPerMinute: r.InputTokensPerMinute, InputTokenBurst: burst(r.InputTokensPerMinute, r.InputTokenBurst, false),
		OutputTokensPerMinute: r.OutputTokensPerMinute, OutputTokenBurst: burst(r.OutputTokensPerMinute, r.OutputTokenBurst, false),
	}
}

// burst is the burst of a limit of perMinute given as burst: the default
// for zero (a minute, less the call that overflows it for requests), none
// for NoBurst.
func burst(perMinute, burst float64, requests bool) float64 {
	switch {
	case perMinute == 0 || burst == NoBurst:
		return 0
	case burst != 0:
		return burst
	case requests:
		return max(0, perMinute-1)
	}
	return perMinute
}

// adaptiveConfig validates cfg.Adaptive and returns the engine's form of
// it, with its defaults filled in; nil without one.
func adaptiveConfig(cfg *Config) (*actor.Adaptive, error) {
	a := cfg.Adaptive
	if a == nil {
		return nil, nil
	}
	const f = "Config.Adaptive."
	p := adaptive.Params{Rule: adaptive.Rule(a.Rule), Min: a.MinConcurrent, Max: a.MaxConcurrent,
		Backoff: a.Backoff, Step: a.Increase, Tolerance: a.Tolerance, Smoothing: a.Smoothing, Window: a.Window}
	switch {
	case a.Rule > Gradient:
		return nil, invalidf(f+"Rule", "must be AIMD or Gradient, got %d", a.Rule)
	case a.Cooldown > ShedCooldown:
		return nil, invalidf(f+"Cooldown", "must be HoldCooldown or ShedCooldown, got %d", a.Cooldown)
	case p.Min < 0:
		return nil, invalidf(f+"MinConcurrent", "must be >= 0, got %d", p.Min)
	case p.Max < 0:
		return nil, invalidf(f+"MaxConcurrent", "must be >= 0, got %d", p.Max)
	}
	p.Min = max(p.Min, 1)
	if p.Max == 0 {
		p.Max = cfg.MaxConcurrent
	}
	if p.Max < p.Min {
		return nil, invalidf(f+"MaxConcurrent", "must be >= MinConcurrent (%d), got %d (zero means Config.MaxConcurrent)", p.Min, p.Max)
	}
	for _, t := range []struct {
		field    string
		v        *float64
		zero     float64
		ok       bool
		interval string
	}{
		{"Backoff", &p.Backoff, 0.75, p.Backoff >= 0.5 && p.Backoff < 1, "[0.5, 1)"},
		{"Tolerance", &p.Tolerance, 1.5, p.Tolerance >= 1 && p.Tolerance <= math.MaxFloat64, "[1, +Inf)"},
		{"Smoothing", &p.Smoothing, 0.2, p.Smoothing > 0 && p.Smoothing <= 1, "(0, 1]"},
	} {
		if *t.v == 0 {
			*t.v = t.zero
		} else if !t.ok {
			return nil, invalidf(f+t.field, "must be in %s, got %v", t.interval, *t.v)
		}
	}
	switch {
	case p.Step < 0:
		return nil, invalidf(f+"Increase", "must be >= 0, got %d", p.Step)
	case p.Window < 0:
		return nil, invalidf(f+"Window", "must be >= 0, got %v", p.Window)
	}
	p.Step = max(p.Step, 1)
	if p.Window == 0 {
		p.Window = time.Second
	}
	ac := &actor.Adaptive{Params: p}
	tb := cfg.TokenBudget
	if tb == nil {
		if a.MinBudget != 0 || a.MaxBudget != 0 {
			return nil, invalidf(f+"MinBudget", "applies only with Config.TokenBudget")
		}
		return ac, nil
	}
	if err := checkNonNegative(f+"MinBudget", a.MinBudget); err != nil {
		return nil, err
	}
	if err := checkNonNegative(f+"MaxBudget", a.MaxBudget); err != nil {
		return nil, err
	}
	ac.HasBudget, ac.MaxBudget, ac.MinBudget = true, a.MaxBudget, a.MinBudget
	if ac.MaxBudget == 0 {
		ac.MaxBudget = tb.Budget
	}
	if ac.MinBudget == 0 {
		ac.MinBudget = adaptive.Scale(ac.MaxBudget, p.Min, p.Max)
	}
	if ac.MinBudget > ac.MaxBudget {
		return nil, invalidf(f+"MinBudget", "must not exceed MaxBudget (%d), got %d", ac.MaxBudget, ac.MinBudget)
	}
	return ac, nil
}
