package actor

import (
	"math"
	"time"

	"github.com/llmbulkhead/bulkhead/actor/adaptive"
	"github.com/llmbulkhead/bulkhead/actor/admission"
)

// Adaptive is the engine's form of bulkhead.Adaptive, validated and with
// its defaults filled in by the facade.
type Adaptive struct {
	Params adaptive.Params
	// With a token budget, the budget moves with the concurrency limit,
	// in proportion, within MinBudget and MaxBudget.
	HasBudget            bool
	MinBudget, MaxBudget int64
}

// adaptiveStage is the adaptive limit: its controller is state of the state
// machine, fed by feedback messages, and every change it makes is a new
// limits revision, applied in the same step.
type adaptiveStage struct {
	cfg                           Adaptive
	ctl                           *adaptive.Controller
	samples, increases, decreases int64
	lastChange                    time.Time
}

func newAdaptiveStage(cfg *Adaptive) *adaptiveStage {
	if cfg == nil {
		return nil
	}
	return &adaptiveStage{cfg: *cfg, ctl: adaptive.New(cfg.Params)}
}

// epoch numbers the controller's decreases: feedback from a call admitted
// before the last decrease says nothing of the new limit.
func (a *adaptiveStage) epoch() uint64 { return 1 + a.ctl.Decreases() }

// budgetFor is the budget that goes with concurrency limit n.
func (a *adaptiveStage) budgetFor(n int) int64 {
	maxN := a.ctl.Params().Max
	return max(a.cfg.MinBudget, min(a.cfg.MaxBudget, adaptive.Scale(a.cfg.MaxBudget, min(n, maxN), maxN)))
}

// learn feeds sample smp to the controller and applies the limit it
// decides, at the next revision. A kill switch (a limit of 0, a zero
// budget) is the caller's to lift: the controller leaves it alone.
func (s *state) learn(smp adaptive.Sample) {
	a := s.adapt
	a.samples++
	move := a.ctl.Observe(s.limits.MaxConcurrent, smp)
	if move.Kind == adaptive.Hold {
		return
	}
	cur := s.limits
	if cur.MaxConcurrent == 0 || (cur.TokenBudget != nil && cur.TokenBudget.Budget == 0) || cur.Revision == math.MaxInt64 {
		return
	}
	n := a.ctl.Next(cur.MaxConcurrent, move)
	if n == cur.MaxConcurrent {
		return
	}
	next := cur.Clone()
	next.Revision++
	next.MaxConcurrent = n
	if a.cfg.HasBudget && next.TokenBudget != nil {
		next.TokenBudget.Budget = a.budgetFor(n)
	}
	res, err := s.applyLimits(&applyRequest{next: next})
	if err != nil || !res.Applied {
		return
	}
	if n > cur.MaxConcurrent {
		a.increases++
	} else {
		a.decreases++
	}
	a.lastChange = smp.At
}

func (s *state) adaptiveStats() *admission.AdaptiveStats {
	a := s.adapt
	if a == nil {
		return nil
	}
	p := a.ctl.Params()
	st := &admission.AdaptiveStats{
		Rule: uint8(p.Rule), MinConcurrent: p.Min, MaxConcurrentBound: p.Max,
		Samples: a.samples, Increases: a.increases, Decreases: a.decreases, LastChange: a.lastChange,
	}
	if s.limits.TokenBudget != nil && a.cfg.HasBudget {
		st.MinBudget, st.MaxBudget = a.cfg.MinBudget, a.cfg.MaxBudget
	}
	return st
}

// Feedback is what a provider answered one call, for the engine's
// cool-downs, headroom and adaptive limit; the facade validates it.
type Feedback struct {
	// Model is the call's model ("" for the bulkhead's own).
	Model   string
	Outcome adaptive.Outcome
	// Latency is the call's latency, for a Feedback not tied to an
	// admission (with one, the engine measures it from the admission).
	Latency    time.Duration
	RetryAfter time.Duration
	Headroom   *admission.Headroom
	// Lease is the admission the feedback is about, nil for none.
	Lease *Lease
}

// feedbackRequest carries Feedback to the state machine.
type feedbackRequest struct {
	f    Feedback
	done chan struct{}
}

func (q *feedbackRequest) fail(error) chan struct{} { return q.done }

// feedback takes in what a provider answered: a Retry-After starts (or
// extends) a cool-down of the model, a headroom report replaces the
// model's, and the adaptive limit learns from the outcome.
func (s *state) feedback(f *Feedback) {
	now := s.fx.now()
	model := f.Model
	if model == "" {
		model = s.model
	}
	if f.RetryAfter > 0 {
		s.cool.start(model, now.Add(f.RetryAfter), now)
		if until, ok := s.cool.until[model]; ok {
			s.coolTurns(model, until, now)
		}
	}
	if f.Headroom != nil {
		s.cool.head.report(model, f.Headroom, now)
	}
	if s.adapt == nil {
		return
	}
	smp := adaptive.Sample{At: now, Outcome: f.Outcome, Latency: f.Latency}
	if l := f.Lease; l != nil {
		smp.InFlight, smp.Epoch = l.inFlight, l.epoch
		if !l.admittedAt.IsZero() {
			smp.Latency = max(0, now.Sub(l.admittedAt))
		}
	}
	s.learn(smp)
}
