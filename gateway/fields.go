package gateway

import (
	"regexp"
	"strconv"
	"strings"
)

// goKeys maps the Go fields that the errors of bulkhead.New, fleet.New and
// New name (a *bulkhead.ConfigError's or *fleet.ConfigError's Field) to
// the keys of the file that set them, so that an error names what the
// user wrote. A field is written with its package ("bulkhead.Config.X"),
// its map keys and list indices as [*]; in a key each * stands for a name
// or an index, in order: for the fields of bulkhead.Config and
// fleet.Config the bulkhead's name first, then the field's own. A test
// checks that every field a bulkhead's section sets is here.
var goKeys = map[string]string{
	"bulkhead.Config.Model":                           "bulkheads.*.model",
	"bulkhead.Config.MaxConcurrent":                   "bulkheads.*.max_concurrent",
	"bulkhead.Config.MaxQueue":                        "bulkheads.*.max_queue",
	"bulkhead.Config.QueueTimeout":                    "bulkheads.*.queue_timeout",
	"bulkhead.Config.TokenBudget":                     "bulkheads.*.token_budget",
	"bulkhead.Config.TokenBudget.Budget":              "bulkheads.*.token_budget",
	"bulkhead.Config.TokenBudget.HighPriorityReserve": "bulkheads.*.high_priority_reserve",
	"bulkhead.Config.TokenBudget.OutputCap":           "bulkheads.*.output_cap",

	"bulkhead.Config.Classes":                                   "bulkheads.*.classes",
	"bulkhead.Config.Classes.Default":                           "bulkheads.*.classes.default",
	"bulkhead.Config.Classes.Limits":                            "bulkheads.*.classes.limits",
	"bulkhead.Config.Classes.Limits[*]":                         "bulkheads.*.classes.limits.*",
	"bulkhead.Config.Classes.Limits[*].ProtectedConcurrent":     "bulkheads.*.classes.limits.*.protected_concurrent",
	"bulkhead.Config.Classes.Limits[*].MaxConcurrent":           "bulkheads.*.classes.limits.*.max_concurrent",
	"bulkhead.Config.Classes.Limits[*].ProtectedInFlightTokens": "bulkheads.*.classes.limits.*.protected_tokens",
	"bulkhead.Config.Classes.Limits[*].MaxInFlightTokens":       "bulkheads.*.classes.limits.*.max_tokens",

	"bulkhead.Config.Queue":                 "bulkheads.*.queue",
	"bulkhead.Config.Queue.Fair":            "bulkheads.*.queue.fair",
	"bulkhead.Config.Queue.Weights":         "bulkheads.*.queue.weights",
	"bulkhead.Config.Queue.WaitForCapacity": "bulkheads.*.queue.wait_for_capacity",
	"bulkhead.Config.Queue.RetryAging":      "bulkheads.*.queue.retry_aging",

	"bulkhead.Config.RetryBudgets":                        "bulkheads.*.retry_budget",
	"bulkhead.Config.RetryBudgets.Window":                 "bulkheads.*.retry_budget.window",
	"bulkhead.Config.RetryBudgets.Bulkhead":               "bulkheads.*.retry_budget",
	"bulkhead.Config.RetryBudgets.Bulkhead.Ratio":         "bulkheads.*.retry_budget.ratio",
	"bulkhead.Config.RetryBudgets.Bulkhead.MinRetries":    "bulkheads.*.retry_budget.min_retries",
	"bulkhead.Config.RetryBudgets.PerClass":               "bulkheads.*.retry_budget.per_class",
	"bulkhead.Config.RetryBudgets.PerClass[*]":            "bulkheads.*.retry_budget.per_class.*",
	"bulkhead.Config.RetryBudgets.PerClass[*].Ratio":      "bulkheads.*.retry_budget.per_class.*.ratio",
	"bulkhead.Config.RetryBudgets.PerClass[*].MinRetries": "bulkheads.*.retry_budget.per_class.*.min_retries",

	"bulkhead.Config.RateLimits":                                   "bulkheads.*.rate_limits",
	"bulkhead.Config.RateLimits.Store":                             "bulkheads.*.rate_limits.redis",
	"bulkhead.Config.RateLimits.Pace":                              "bulkheads.*.rate_limits.pace",
	"bulkhead.Config.RateLimits.PerModel":                          "bulkheads.*.rate_limits",
	"bulkhead.Config.RateLimits.PerModel.RequestsPerMinute":        "bulkheads.*.rate_limits.requests_per_minute",
	"bulkhead.Config.RateLimits.PerModel.TokensPerMinute":          "bulkheads.*.rate_limits.tokens_per_minute",
	"bulkhead.Config.RateLimits.PerModel.RequestBurst":             "bulkheads.*.rate_limits.request_burst",
	"bulkhead.Config.RateLimits.PerModel.TokenBurst":               "bulkheads.*.rate_limits.token_burst",
	"bulkhead.Config.RateLimits.PerModel.InputTokensPerMinute":     "bulkheads.*.rate_limits.input_tokens_per_minute",
	"bulkhead.Config.RateLimits.PerModel.OutputTokensPerMinute":    "bulkheads.*.rate_limits.output_tokens_per_minute",
	"bulkhead.Config.RateLimits.PerModel.InputTokenBurst":          "bulkheads.*.rate_limits.input_token_burst",
	"bulkhead.Config.RateLimits.PerModel.OutputTokenBurst":         "bulkheads.*.rate_limits.output_token_burst",
	"bulkhead.Config.RateLimits.TokenWeight":                       "bulkheads.*.rate_limits.token_weight",
	"bulkhead.Config.RateLimits.PerClass":                          "bulkheads.*.rate_limits.per_class",
	"bulkhead.Config.RateLimits.PerClass[*]":                       "bulkheads.*.rate_limits.per_class.*",
	"bulkhead.Config.RateLimits.PerClass[*].RequestsPerMinute":     "bulkheads.*.rate_limits.per_class.*.requests_per_minute",
	"bulkhead.Config.RateLimits.PerClass[*].TokensPerMinute":       "bulkheads.*.rate_limits.per_class.*.tokens_per_minute",
	"bulkhead.Config.RateLimits.PerClass[*].RequestBurst":          "bulkheads.*.rate_limits.per_class.*.request_burst",
	"bulkhead.Config.RateLimits.PerClass[*].TokenBurst":            "bulkheads.*.rate_limits.per_class.*.token_burst",
	"bulkhead.Config.RateLimits.PerClass[*].InputTokensPerMinute":  "bulkheads.*.rate_limits.per_class.*.input_tokens_per_minute",
	"bulkhead.Config.RateLimits.PerClass[*].OutputTokensPerMinute": "bulkheads.*.rate_limits.per_class.*.output_tokens_per_minute",
	"bulkhead.Config.RateLimits.PerClass[*].InputTokenBurst":       "bulkheads.*.rate_limits.per_class.*.input_token_burst",
	"bulkhead.Config.RateLimits.PerClass[*].OutputTokenBurst":      "bulkheads.*.rate_limits.per_class.*.output_token_burst",

	"bulkhead.Config.Fleet": "bulkheads.*.fleet",

	"bulkhead.Config.Adaptive":               "bulkheads.*.adaptive",
	"bulkhead.Config.Adaptive.Rule":          "bulkheads.*.adaptive.rule",
	"bulkhead.Config.Adaptive.Cooldown":      "bulkheads.*.adaptive.cooldown",
	"bulkhead.Config.Adaptive.MinConcurrent": "bulkheads.*.adaptive.min_concurrent",
	"bulkhead.Config.Adaptive.MaxConcurrent": "bulkheads.*.adaptive.max_concurrent",
	"bulkhead.Config.Adaptive.MinBudget":     "bulkheads.*.adaptive.min_budget",
	"bulkhead.Config.Adaptive.MaxBudget":     "bulkheads.*.adaptive.max_budget",

	"fleet.Config":                   "bulkheads.*.fleet",
	"fleet.Config.Client":            "bulkheads.*.fleet.redis",
	"fleet.Config.Pool":              "bulkheads.*.fleet.pool",
	"fleet.Config.MaxConcurrent":     "bulkheads.*.fleet.max_concurrent",
	"fleet.Config.TokenBudget":       "bulkheads.*.fleet.token_budget",
	"fleet.Config.OnFailure":         "bulkheads.*.fleet.on_failure",
	"fleet.Config.LocalShare":        "bulkheads.*.fleet.local_share",
	"fleet.Config.LocalShare.Slots":  "bulkheads.*.fleet.local_share.slots",
	"fleet.Config.LocalShare.Tokens": "bulkheads.*.fleet.local_share.tokens",
	"fleet.Config.LeaseTTL":          "bulkheads.*.fleet.lease_ttl",

	"gateway.routes[*]":              "routes.*",
	"gateway.routes[*].Format":       "routes.*.api",
	"gateway.routes[*].Models[*]":    "routes.*.models.*",
	"gateway.routes[*].Upstream":     "routes.*.upstream",
	"gateway.routes[*].Bulkhead":     "routes.*.bulkhead",
	"gateway.routes[*].MaxBodyBytes": "routes.*.max_body_bytes",
}

// fieldIndex is a map key or a list index in a field path: ["web"], [2].
var fieldIndex = regexp.MustCompile(`\[("(?:[^"\\]|\\.)*"|[0-9]+)\]`)

// pattern returns field with its map keys and list indices written [*],
// and those keys and indices.
func pattern(field string) (string, []string) {
	var names []string
	p := fieldIndex.ReplaceAllStringFunc(field, func(m string) string {
		name := m[1 : len(m)-1]
		if s, err := strconv.Unquote(name); err == nil {
			name = s
		}
		names = append(names, name)
		return "[*]"
	})
	return p, names
}

// parentField returns the field that encloses p, "" for none:
// Config.Classes for Config.Classes.Limits, Config.Classes.Limits for
// Config.Classes.Limits[*].
func parentField(p string) string {
	if strings.HasSuffix(p, "[*]") {
		return strings.TrimSuffix(p, "[*]")
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// keyOf returns the file's key of field, a Go field path of package pkg
// ("bulkhead", "fleet", "gateway") such as Config.Classes.Limits["web"];
// names are the names its key starts with (the bulkhead's). A field that
// goKeys lacks has the key of the nearest field enclosing it that goKeys
// has; nil when none.
func keyOf(pkg, field string, names ...string) []string {
	p, own := pattern(field)
	names = append(names, own...)
	for ; p != ""; p = parentField(p) {
		if key, ok := goKeys[pkg+"."+p]; ok {
			path := strings.Split(key, ".")
			for i := range path {
				if path[i] == "*" && len(names) > 0 {
					path[i], names = names[0], names[1:]
				}
			}
			return path
		}
	}
	return nil
}

// goIdent is a Go identifier or a path of them: MaxConcurrent,
// Config.TokenBudget, Queue.Fair.
var goIdent = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*(?:\.[A-Z][A-Za-z0-9]*)*\b`)

// keyProblem rewrites problem, the Problem of an error about field of
// package pkg (see keyOf), with the file's keys in place of the Go fields
// it mentions: a field of the same struct as field, or of field's own, by
// its key's last name (MinConcurrent: min_concurrent), and a path from the
// Config (Config.TokenBudget, Queue.Fair) by its key in the bulkhead's
// section (token_budget, queue.fair). Words that name no field are kept.
func keyProblem(pkg, field, problem string) string {
	p, _ := pattern(field)
	return goIdent.ReplaceAllStringFunc(problem, func(id string) string {
		for _, f := range []string{parentField(p) + "." + id, p + "." + id, p + "[*]." + id} {
			if key, ok := goKeys[pkg+"."+f]; ok {
				return key[strings.LastIndexByte(key, '.')+1:]
			}
		}
		for _, f := range []string{id, "Config." + id} {
			if key, ok := goKeys[pkg+"."+f]; ok {
				return strings.TrimPrefix(key, "bulkheads.*.")
			}
		}
		return id
	})
}
