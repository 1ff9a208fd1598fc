package gateway

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/fleet"
	"github.com/llmbulkhead/bulkhead/stream"
)

// Config is a gateway's configuration file. Every duration is written as
// Go writes one ("2s", "1m30s").
//
//	listen: "127.0.0.1:8080"
//	shutdown_timeout: 30s
//	log: {format: json, requests: all}
//	clients:
//	  web: {key_env: WEB_CLIENT_KEY, tenant: web, allow_high_priority: true}
//	upstreams:
//	  openai: {base_url: "https://api.openai.com", api_key_env: OPENAI_API_KEY, header_timeout: 60s}
//	bulkheads:
//	  gpt4o:
//	    model: gpt-4o
//	    max_concurrent: 32
//	    max_queue: 16
//	    queue_timeout: 2s
//	    token_budget: 200000
//	    rate_limits: {requests_per_minute: 500, tokens_per_minute: 300000}
//	routes:
//	  - {api: openai-chat, upstream: openai, bulkhead: gpt4o}
//
// A gateway with clients answers a call without a client's key 401, and
// never sends it upstream. Without clients it listens only on a loopback
// address (127.0.0.1, ::1 or localhost), unless AllowUnauthenticated says
// otherwise.
type Config struct {
	// Listen is the address to serve on; default "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// TLS, when set, serves HTTPS with this certificate.
	TLS *TLSFiles `yaml:"tls"`
	// AllowUnauthenticated lets a gateway without clients listen on an
	// address other machines can reach.
	AllowUnauthenticated bool `yaml:"allow_unauthenticated"`
	// Clients are the callers, by name (the key ID the request log
	// shows): a call must carry one of their keys.
	Clients map[string]ClientConfig `yaml:"clients"`
	// TrustHeaders says the gateway sits behind a proxy that sets the
	// class and priority headers (Class, Priority): only then do they
	// count.
	TrustHeaders bool `yaml:"trust_headers"`
	// BodyBudgetBytes bounds the request-body bytes held at once, all
	// calls together (see Handler.BodyBudget); default 256 MiB.
	BodyBudgetBytes int64 `yaml:"body_budget_bytes"`
	// BodyTimeout bounds the reading of one request body (see
	// Handler.BodyTimeout); default 30s.
	BodyTimeout Duration `yaml:"body_timeout"`
	// ShutdownDelay is how long the gateway goes on serving on SIGTERM,
	// with /readyz answering 503, before it stops accepting connections:
	// the time a load balancer takes to notice. Default 0.
	ShutdownDelay Duration `yaml:"shutdown_delay"`
	// ShutdownTimeout bounds the drain that follows; default 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// Log chooses the request log's format and which requests it logs.
	Log LogConfig `yaml:"log"`
	// Upstreams are the providers, by name.
	Upstreams map[string]UpstreamConfig `yaml:"upstreams"`
	// Redis are the Redis servers the bulkheads share rates and fleet pools
	// through, by name.
	Redis map[string]RedisConfig `yaml:"redis"`
	// Bulkheads are the bulkheads, by name: one per model or pool.
	Bulkheads map[string]BulkheadConfig `yaml:"bulkheads"`
	// Routes send each API (and model) to an upstream through a bulkhead.
	Routes []RouteConfig `yaml:"routes"`
	// Class says which header carries a call's admission class, when
	// TrustHeaders is set.
	Class ClassFrom `yaml:"class"`
	// Priority says which header carries a call's priority.
	Priority PriorityFrom `yaml:"priority"`
	// AttemptHeader names the request header that says which attempt of
	// a call a request is (0 for the first, 1 for its first retry, ...):
	// a retry counts against its bulkhead's retry budget and waits behind
	// first attempts in its queue. Empty means X-Stainless-Retry-Count,
	// which the official OpenAI and Anthropic SDKs send.
	AttemptHeader string `yaml:"attempt_header"`
	// Telemetry sends OpenTelemetry traces of the calls and the
	// bulkheads' metrics over OTLP; off by default (see TelemetryConfig).
	Telemetry TelemetryConfig `yaml:"telemetry"`

	// root is the file's nodes, for the lines of errors found later.
	root *yaml.Node
	// file is the file's name, and digest the SHA-256 of its bytes, as
	// ParseConfig read them.
	file   string
	digest [32]byte
}

// TLSFiles are a certificate and its private key, PEM-encoded files.
type TLSFiles struct {
	// CertFile is the certificate (its chain may follow it).
	CertFile string `yaml:"cert_file"`
	// KeyFile is the certificate's private key.
	KeyFile string `yaml:"key_file"`
}

// ClientConfig is one caller of the gateway. Its key is never written in
// the file: it comes from an environment variable (at least 16
// characters), or the file holds its SHA-256 digest (`printf %s "$KEY" |
// sha256sum`). The caller sends it where its API puts a key:
// Authorization: Bearer (OpenAI), x-api-key (Anthropic), x-goog-api-key or
// ?key= (Gemini).
type ClientConfig struct {
	// KeyEnv names the environment variable holding the client's key; it
	// must be set, to at least 16 characters.
	KeyEnv string `yaml:"key_env"`
	// KeySHA256 is the SHA-256 digest of the client's key, 64 hex digits.
	KeySHA256 string `yaml:"key_sha256"`
	// Tenant is the admission class of the client's calls in every
	// bulkhead with classes (each must have it); empty means the default
	// class.
	Tenant string `yaml:"tenant"`
	// AllowHighPriority lets the client's calls ask for high priority with
	// the priority header.
	AllowHighPriority bool `yaml:"allow_high_priority"`
}

// LogConfig is the request log. The bulkhead gateway command writes it to
// standard error (its own messages go to standard output); Build writes it
// to the logger it is given.
type LogConfig struct {
	// Format is "json" (the default) or "text".
	Format string `yaml:"format"`
	// Requests is "all" (the default: one line per request, however it
	// ends), "errors" (only the requests that did not end in a success:
	// shed, refused, unauthorized, cut, failed, or answered 4xx or 5xx by
	// the upstream) or "none".
	Requests string `yaml:"requests"`
}

// UpstreamConfig is one provider.
type UpstreamConfig struct {
	// BaseURL is the provider's base URL, such as https://api.openai.com,
	// without the API's version: a call's path (/v1/chat/completions) is
	// joined to it as it came, after any path the base URL has. A base URL
	// whose path ends in an API version (/v1, /v1beta) is an error.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the API key sent
	// upstream in place of the caller's. Empty passes the caller's own
	// credentials upstream; that is allowed only without clients: with
	// clients, every upstream a route uses needs one. A variable it names
	// must be set and not empty.
	APIKeyEnv string `yaml:"api_key_env"`
	// HeaderTimeout bounds the wait for the upstream's response headers;
	// zero means none.
	HeaderTimeout Duration `yaml:"header_timeout"`
}

// RedisConfig is one Redis server.
type RedisConfig struct {
	// Addr is host:port.
	Addr string `yaml:"addr"`
	// PasswordEnv names the environment variable holding the password;
	// empty means none. A variable it names must be set and not empty.
	PasswordEnv string `yaml:"password_env"`
	// DB is the database number.
	DB int `yaml:"db"`
	// Timeout bounds each command; default 50ms (an outage then costs a
	// call milliseconds, and the failure policies decide).
	Timeout Duration `yaml:"timeout"`
}

// FleetConfig shares a bulkhead's limits with the gateway's other replicas
// through a Redis pool (see package fleet).
type FleetConfig struct {
	// Redis names a server of the redis section.
	Redis string `yaml:"redis"`
	// Pool is the pool's name: every replica uses the same.
	Pool string `yaml:"pool"`
	// MaxConcurrent and TokenBudget are the fleet-wide limits; absent means
	// not enforced fleet-wide.
	MaxConcurrent *int64 `yaml:"max_concurrent"`
	TokenBudget   *int64 `yaml:"token_budget"`
	// OnFailure is "closed" (the default), "open" or "local_share".
	OnFailure string `yaml:"on_failure"`
	// LocalShare is what this replica may hold alone under local_share.
	LocalShare struct {
		Slots  int64 `yaml:"slots"`
		Tokens int64 `yaml:"tokens"`
	} `yaml:"local_share"`
	// LeaseTTL is the holds' lease; default 30s.
	LeaseTTL Duration `yaml:"lease_ttl"`
}

// RouteConfig is one route.
type RouteConfig struct {
	// API is "openai-chat", "openai-responses", "anthropic-messages" or
	// "gemini".
	API string `yaml:"api"`
	// Models narrows the route to these models (see Route.Models). A
	// route without Models takes the calls of every model that no other
	// route of its API names; an API has at most one such route.
	Models []string `yaml:"models"`
	// Upstream and Bulkhead name an upstream and a bulkhead.
	Upstream string `yaml:"upstream"`
	Bulkhead string `yaml:"bulkhead"`
	// MaxBodyBytes bounds the route's request bodies; default 32 MiB, and
	// at most the body budget.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
}

// BulkheadConfig is one bulkhead's limits (see bulkhead.Config).
type BulkheadConfig struct {
	Model         string   `yaml:"model"`
	MaxConcurrent int      `yaml:"max_concurrent"`
	MaxQueue      int      `yaml:"max_queue"`
	QueueTimeout  Duration `yaml:"queue_timeout"`
	// TokenBudget, when set, turns on token admission with this budget.
	TokenBudget         *int64 `yaml:"token_budget"`
	HighPriorityReserve int64  `yaml:"high_priority_reserve"`
	OutputCap           int64  `yaml:"output_cap"`
	// Classes, when set, partitions the bulkhead between classes.
	Classes *ClassesConfig `yaml:"classes"`
	// RateLimits, when set, caps the calls and tokens per minute.
	RateLimits *RateConfig `yaml:"rate_limits"`
	// Fleet, when set, shares the limits across the gateway's replicas.
	Fleet *FleetConfig `yaml:"fleet"`
	// Adaptive, when set, moves max_concurrent and token_budget from the
	// upstream's answers (429s, overloads, timeouts, latency).
	Adaptive *AdaptiveConfig `yaml:"adaptive"`
	// Queue is how waiting calls are served (see bulkhead.QueuePolicy).
	Queue QueueConfig `yaml:"queue"`
	// RetryBudget, when set, bounds the retries the bulkhead admits (see
	// RetryBudgetConfig).
	RetryBudget *RetryBudgetConfig `yaml:"retry_budget"`
}

// QueueConfig is a bulkhead's queue policy (see bulkhead.QueuePolicy):
// fair queuing across its classes, with weights, waiting for capacity,
// and how long first attempts go ahead of a waiting retry (retry_aging;
// left out, bulkhead.DefaultRetryAging; 0s keeps retries in arrival
// order).
type QueueConfig struct {
	Fair            bool           `yaml:"fair"`
	Weights         map[string]int `yaml:"weights"`
	WaitForCapacity bool           `yaml:"wait_for_capacity"`
	RetryAging      *Duration      `yaml:"retry_aging"`
}

// policy is q as the bulkhead takes it.
func (q QueueConfig) policy() bulkhead.QueuePolicy {
	p := bulkhead.QueuePolicy{Fair: q.Fair, Weights: q.Weights, WaitForCapacity: q.WaitForCapacity}
	if a := q.RetryAging; a != nil {
		p.RetryAging = time.Duration(*a)
		if *a == 0 {
			p.RetryAging = -1 // in arrival order
		}
	}
	return p
}

// RetryBudgetConfig is a bulkhead's retry budget (see
// bulkhead.RetryBudgets): over the window, the retries admitted may be at
// most ratio times the first attempts admitted, or min_retries when that
// is more; per_class gives classes budgets of their own, which their
// retries must fit too. A retry over budget is answered at once with
// x-should-retry: false, so the SDK raises instead of trying again.
//
//	retry_budget: {ratio: 0.1, min_retries: 3, window: 10s, per_class: {batch: {ratio: 0.05, min_retries: 1}}}
type RetryBudgetConfig struct {
	// Window is how long an admission counts; left out, 10s.
	Window Duration `yaml:"window"`
	// RetryLimit is the bulkhead's own budget, inline: ratio and
	// min_retries. Both left out means none (per_class only).
	RetryLimit `yaml:",inline"`
	// PerClass are budgets of their own for the classes it names.
	PerClass map[string]RetryLimit `yaml:"per_class"`
}

// RetryLimit is one retry budget (see bulkhead.RetryLimit).
type RetryLimit struct {
	Ratio      float64 `yaml:"ratio"`
	MinRetries int     `yaml:"min_retries"`
}

// budgets is r as the bulkhead takes it.
func (r *RetryBudgetConfig) budgets() *bulkhead.RetryBudgets {
	out := &bulkhead.RetryBudgets{Window: time.Duration(r.Window), Bulkhead: bulkhead.RetryLimit(r.RetryLimit)}
	if len(r.PerClass) > 0 {
		out.PerClass = make(map[string]bulkhead.RetryLimit, len(r.PerClass))
		for name, l := range r.PerClass {
			out.PerClass[name] = bulkhead.RetryLimit(l)
		}
	}
	return out
}

// AdaptiveConfig is a bulkhead's adaptive limits (see bulkhead.Adaptive).
// The gateway reports every upstream answer to them; a 429 with a
// retry-after cools its model down whether or not this section is set.
//
//	adaptive: {rule: aimd, min_concurrent: 4, max_concurrent: 64, cooldown: shed}
type AdaptiveConfig struct {
	// Rule is "aimd" (the default) or "gradient".
	Rule string `yaml:"rule"`
	// MinConcurrent and MaxConcurrent bound max_concurrent; zero means 1
	// and the bulkhead's max_concurrent.
	MinConcurrent int `yaml:"min_concurrent"`
	MaxConcurrent int `yaml:"max_concurrent"`
	// MinBudget and MaxBudget bound token_budget; zero means in
	// proportion to min_concurrent, and the bulkhead's token_budget.
	MinBudget int64 `yaml:"min_budget"`
	MaxBudget int64 `yaml:"max_budget"`
	// Cooldown is what a call does while its model cools down after a
	// 429: "hold" (wait, the default) or "shed" (answer 429 at once).
	Cooldown string `yaml:"cooldown"`
}

// adaptiveRules, cooldownModes and failurePolicies map the file's names.
var (
	adaptiveRules   = map[string]bulkhead.AdaptiveRule{"": bulkhead.AIMD, "aimd": bulkhead.AIMD, "gradient": bulkhead.Gradient}
	cooldownModes   = map[string]bulkhead.CooldownMode{"": bulkhead.HoldCooldown, "hold": bulkhead.HoldCooldown, "shed": bulkhead.ShedCooldown}
	failurePolicies = map[string]fleet.FailurePolicy{"": fleet.FailClosed, "closed": fleet.FailClosed, "open": fleet.FailOpen, "local_share": fleet.FailLocalShare}
)

// ClassesConfig is an admission class table.
type ClassesConfig struct {
	Default string                 `yaml:"default"`
	Limits  map[string]ClassLimits `yaml:"limits"`
}

// ClassLimits is one class's floors and ceilings (see bulkhead.ClassLimits).
type ClassLimits struct {
	ProtectedConcurrent     int    `yaml:"protected_concurrent"`
	MaxConcurrent           *int   `yaml:"max_concurrent"`
	ProtectedInFlightTokens int64  `yaml:"protected_tokens"`
	MaxInFlightTokens       *int64 `yaml:"max_tokens"`
}

// RateConfig is a bulkhead's rate limits (see bulkhead.RateLimits), counted
// per model: a bulkhead that serves several models gives each its own.
//
//	rate_limits: {requests_per_minute: 500, tokens_per_minute: 300000}
//
// Each rate is a bucket that holds a minute of it by default, refilled
// continuously, as the providers describe their own limits (see Rate).
type RateConfig struct {
	// Redis, when set, names a server of the redis section on which the
	// rates are kept, shared by every replica; empty keeps them in this
	// process, so that each replica enforces them on its own.
	Redis string `yaml:"redis"`
	// Pace makes a call over the rate wait for its turn (within its queue
	// timeout) instead of being answered 429.
	Pace bool `yaml:"pace"`
	// TokenWeight is what a call weighs in tokens_per_minute: "larger"
	// (the larger of its input estimate and its max output, as OpenAI
	// counts), "input" (its input estimate, as Gemini counts) or
	// "reservation" (input estimate plus max output). Empty means the rule
	// of the API of the bulkhead's routes: larger for openai-chat and
	// openai-responses, input for gemini, reservation for
	// anthropic-messages (whose own limits count input and output apart:
	// input_tokens_per_minute and output_tokens_per_minute). Routes of
	// APIs with different rules that share a bulkhead with
	// tokens_per_minute must say which.
	TokenWeight string `yaml:"token_weight"`
	// Rate is the per-model rate, inline: requests_per_minute,
	// tokens_per_minute, input_tokens_per_minute,
	// output_tokens_per_minute and their bursts.
	Rate `yaml:",inline"`
	// PerClass are rates of their own for the classes it names.
	PerClass map[string]Rate `yaml:"per_class"`
}

// setsRate reports whether r sets a rate, per model or for a class (a
// burst alone counts: the library says what it lacks).
func (r *RateConfig) setsRate() bool {
	if r.Rate != (Rate{}) {
		return true
	}
	for _, cr := range r.PerClass {
		if cr != (Rate{}) {
			return true
		}
	}
	return false
}

// Rate is one rate (see bulkhead.Rate). A burst left out is a minute of
// its rate, the bucket a provider's per-minute limit describes: after a
// quiet spell requests_per_minute calls go at once, and a token rate lets
// its whole minute through (and the call that overflows it); then calls
// go at the rate. request_burst N lets N+1 calls through at once, then one
// per 60/requests_per_minute seconds; 0 means no burst, every call spaced.
// The token bursts are the same in tokens. tokens_per_minute weighs a call
// as token_weight says; input_tokens_per_minute its input estimate and
// output_tokens_per_minute its max output (max_tokens, or the output
// cap), both settled at the end of the call to what it used, as Anthropic
// counts its ITPM and OTPM. Token rates need token_budget.
type Rate struct {
	RequestsPerMinute     float64  `yaml:"requests_per_minute"`
	TokensPerMinute       float64  `yaml:"tokens_per_minute"`
	InputTokensPerMinute  float64  `yaml:"input_tokens_per_minute"`
	OutputTokensPerMinute float64  `yaml:"output_tokens_per_minute"`
	RequestBurst          *float64 `yaml:"request_burst"`
	TokenBurst            *float64 `yaml:"token_burst"`
	InputTokenBurst       *float64 `yaml:"input_token_burst"`
	OutputTokenBurst      *float64 `yaml:"output_token_burst"`
}

// tokenWeights maps token_weight's names.
var tokenWeights = map[string]bulkhead.TokenWeight{
	"reservation": bulkhead.WeightReservation,
	"larger":      bulkhead.WeightLarger,
	"input":       bulkhead.WeightInput,
}

// apiWeights is the token weight of each API's provider.
var apiWeights = map[string]string{
	"openai-chat":        "larger",
	"openai-responses":   "larger",
	"anthropic-messages": "reservation",
	"gemini":             "input",
}

// ClassFrom finds a call's admission class: from a header when the
// configuration trusts headers (TrustHeaders) and the call has it, else
// its client's tenant, else the bulkhead's default class.
type ClassFrom struct {
	Header string `yaml:"header"`
}

// PriorityFrom finds a call's priority: a header whose value "high" makes
// it High, when the configuration trusts headers (TrustHeaders) or the
// call's client may ask for high priority (AllowHighPriority).
type PriorityFrom struct {
	Header string `yaml:"header"`
}

// Duration is a time.Duration written as "2s" in the file.
type Duration time.Duration

// UnmarshalYAML reads a duration such as "1m30s".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return &valueError{line: n.Line, column: n.Column, problem: fmt.Sprintf("want a duration such as 2s or 1m30s, got %q", n.Value)}
	}
	*d = Duration(v)
	return nil
}

// valueError is a value that its own UnmarshalYAML refused, at its line
// and column.
type valueError struct {
	line, column int
	problem      string
}

func (e *valueError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.problem) }

// ConfigError reports a problem in a configuration file, with the line and
// the key. It matches bulkhead.ErrInvalid.
type ConfigError struct {
	// File is the file's name, Line the line of the key (0 when the key is
	// missing), and Key its path, such as "bulkheads.gpt4o.max_concurrent".
	File string
	Line int
	Key  string
	// Problem says what is wrong.
	Problem string
}

// Error returns "gateway: <file>:<line>: <key>: <problem>".
func (e *ConfigError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
	}
	if e.Key == "" {
		return "gateway: " + loc + ": " + e.Problem
	}
	return "gateway: " + loc + ": " + e.Key + ": " + e.Problem
}

// Is reports whether target is bulkhead.ErrInvalid.
func (e *ConfigError) Is(target error) bool { return target == bulkhead.ErrInvalid }

// LoadConfig reads and checks the configuration file at path: its syntax,
// unknown keys (a misspelt key is an error naming its line, its section
// and the key it may have meant, not ignored), and every value (see
// ParseConfig).
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(path, data)
}

var yamlLine = regexp.MustCompile(`line (\d+): (.*)`)

// ParseConfig reads and checks a configuration; name is the file's name,
// for errors.
func ParseConfig(name string, data []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, yamlError(name, err)
	}
	v := &validator{file: name, root: &root}
	if v.unknownKey(&root, reflect.TypeFor[Config](), nil) {
		return nil, v.err
	}
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, v.decodeError(err)
	}
	cfg.root, cfg.file, cfg.digest = &root, name, sha256.Sum256(data)
	v.check(&cfg)
	if v.err != nil {
		return nil, v.err
	}
	return &cfg, nil
}

// yamlError is the ConfigError of err, an error of the YAML decoder, with
// the line it names.
func yamlError(name string, err error) *ConfigError {
	ce := &ConfigError{File: name, Problem: strings.TrimPrefix(err.Error(), "yaml: ")}
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		ce.Problem = te.Errors[0]
	}
	if m := yamlLine.FindStringSubmatch(ce.Problem); m != nil {
		ce.Line, _ = strconv.Atoi(m[1])
		ce.Problem = m[2]
	}
	return ce
}

// typeError is the text of a yaml.TypeError's error: the line, the YAML
// tag and value of what the file has (the value's first 7 bytes and "..."
// when it is longer than 10), and the Go type it did not fit.
var typeError = regexp.MustCompile("^line ([0-9]+): cannot unmarshal !!([a-z]+)(?: `(.*)`)? into (.+)$")

// decodeError is the ConfigError of err, an error of the YAML decoder
// after the file parsed, with the line and the key of the value it is
// about, and what the key wants in words rather than a Go type.
func (v *validator) decodeError(err error) *ConfigError {
	var ve *valueError
	if errors.As(err, &ve) {
		path := v.valueKey(func(n *yaml.Node) bool { return n.Line == ve.line && n.Column == ve.column })
		return &ConfigError{File: v.file, Line: ve.line, Key: strings.Join(path, "."), Problem: ve.problem}
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) == 0 {
		return yamlError(v.file, err)
	}
	m := typeError.FindStringSubmatch(te.Errors[0])
	if m == nil {
		return yamlError(v.file, err)
	}
	line, _ := strconv.Atoi(m[1])
	tag, value, into := m[2], m[3], m[4]
	got := strconv.Quote(value)
	kind := yaml.ScalarNode
	switch tag {
	case "seq":
		got, kind = "a list", yaml.SequenceNode
	case "map":
		got, kind = "a mapping", yaml.MappingNode
	}
	path := v.valueKey(func(n *yaml.Node) bool {
		if n.Line != line || n.Kind != kind {
			return false
		}
		prefix, cut := strings.CutSuffix(value, "...")
		return kind != yaml.ScalarNode || n.Value == value || cut && strings.HasPrefix(n.Value, prefix)
	})
	return &ConfigError{File: v.file, Line: line, Key: strings.Join(path, "."), Problem: "want " + goTypeWords(into) + ", got " + got}
}

// goTypeWords says what a value of the Go type named t is, in words.
func goTypeWords(t string) string {
	t = strings.TrimLeft(t, "*")
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "struct"), strings.Contains(t, "."):
		return "a mapping"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool":
		return "true or false"
	case t == "string":
		return "a string"
	}
	return "another kind of value"
}

// valueKey returns the key of the deepest value in the file that match
// reports, nil for none.
func (v *validator) valueKey(match func(*yaml.Node) bool) []string {
	var best []string
	var walk func(n *yaml.Node, path []string)
	walk = func(n *yaml.Node, path []string) {
		if n == nil {
			return
		}
		if match(n) && len(path) >= len(best) {
			best = slices.Clone(path)
		}
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, append(path, strconv.Itoa(i)))
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], append(path, n.Content[i].Value))
			}
		}
	}
	walk(v.root, nil)
	return best
}

// validator checks a decoded configuration and reports the first problem
// with the line of its key.
type validator struct {
	file string
	root *yaml.Node
	err  *ConfigError
}

func (v *validator) failf(path []string, format string, args ...any) {
	if v.err == nil {
		v.err = &ConfigError{File: v.file, Line: v.line(path), Key: strings.Join(path, "."), Problem: fmt.Sprintf(format, args...)}
	}
}

// line returns the line of the key at path (a list index as a number), or
// of the deepest part of it that exists.
func (v *validator) line(path []string) int {
	n := v.root
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, p := range path {
		if n == nil {
			break
		}
		var next *yaml.Node
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == p {
					line, next = n.Content[i].Line, n.Content[i+1]
				}
			}
		case yaml.SequenceNode:
			if i, err := strconv.Atoi(p); err == nil && i < len(n.Content) {
				line, next = n.Content[i].Line, n.Content[i]
			}
		}
		n = next
	}
	return line
}

// checkRate checks the bursts of the rate at path: a burst is a number of
// calls or tokens, never negative.
func (v *validator) checkRate(path []string, r Rate) {
	for _, b := range []struct {
		key string
		v   *float64
	}{{"request_burst", r.RequestBurst}, {"token_burst", r.TokenBurst}, {"input_token_burst", r.InputTokenBurst}, {"output_token_burst", r.OutputTokenBurst}} {
		if b.v != nil && !(*b.v >= 0 && *b.v <= math.MaxFloat64) {
			v.failf(append(path, b.key), "want a number >= 0 (0: no burst), or leave it out for a minute of the rate; got %v", *b.v)
		}
	}
}

// tokenWeight is the token weight of bulkhead name's rate limits: the
// file's token_weight, else the rule of the APIs of its routes (an error
// when they differ and tokens_per_minute counts), else reservation.
func (c *Config) tokenWeight(name string) (bulkhead.TokenWeight, error) {
	r := c.Bulkheads[name].RateLimits
	if r == nil {
		return bulkhead.WeightReservation, nil
	}
	if r.TokenWeight != "" {
		return tokenWeights[r.TokenWeight], nil
	}
	rule, api := "", ""
	for _, route := range c.Routes {
		w, ok := apiWeights[route.API]
		if route.Bulkhead != name || !ok {
			continue
		}
		tokens := r.TokensPerMinute > 0
		for _, cr := range r.PerClass {
			tokens = tokens || cr.TokensPerMinute > 0
		}
		if rule != "" && w != rule && tokens {
			return 0, fmt.Errorf("routes of %s and %s share this bulkhead, and their providers count tokens per minute differently: set token_weight (larger, input or reservation)", api, route.API)
		}
		if rule == "" {
			rule, api = w, route.API
		}
	}
	return tokenWeights[rule], nil // reservation when no route names it
}

// apis maps the file's API names to formats.
var apis = map[string]stream.Format{
	"openai-chat":        stream.OpenAIChat,
	"openai-responses":   stream.OpenAIResponses,
	"anthropic-messages": stream.AnthropicMessages,
	"gemini":             stream.Gemini,
}

func (v *validator) check(c *Config) {
	if c.Log.Format != "" && c.Log.Format != "json" && c.Log.Format != "text" {
		v.failf([]string{"log", "format"}, "want json or text, got %q", c.Log.Format)
	}
	switch c.Log.Requests {
	case "", logAll, logErrors, logNone:
	default:
		v.failf([]string{"log", "requests"}, "want all, errors or none, got %q", c.Log.Requests)
	}
	v.checkListen(c)
	if t := c.TLS; t != nil && (t.CertFile == "" || t.KeyFile == "") {
		v.failf([]string{"tls"}, "needs both cert_file and key_file")
	}
	v.checkClients(c)
	if c.BodyBudgetBytes < 0 {
		v.failf([]string{"body_budget_bytes"}, "must be >= 0, got %d", c.BodyBudgetBytes)
	}
	budget := c.BodyBudgetBytes
	if budget == 0 {
		budget = DefaultBodyBudget
	}
	for i, r := range c.Routes {
		p := []string{"routes", strconv.Itoa(i), "max_body_bytes"}
		switch {
		case r.MaxBodyBytes < 0:
			v.failf(p, "must be >= 0, got %d", r.MaxBodyBytes)
		case r.MaxBodyBytes > budget:
			v.failf(p, "%d is over the body budget (body_budget_bytes %d): such a body could never be read", r.MaxBodyBytes, budget)
		}
	}
	if len(c.Routes) == 0 {
		v.failf([]string{"routes"}, "at least one route is needed")
	}
	for _, name := range sortedKeys(c.Upstreams) {
		u := c.Upstreams[name]
		p := []string{"upstreams", name}
		pu, err := url.Parse(u.BaseURL)
		if err != nil || pu.Scheme == "" || pu.Host == "" {
			v.failf(append(p, "base_url"), "want an absolute URL such as https://api.openai.com, got %q", u.BaseURL)
		} else if version, fix := versionSuffix(pu); version != "" {
			v.failf(append(p, "base_url"), "%q ends in the API version %s, but a call's path brings its own (such as /v1/chat/completions), so every call would go to .../%s/%s/...: write %q",
				u.BaseURL, version, version, version, fix)
		}
	}
	for _, name := range sortedKeys(c.Redis) {
		if c.Redis[name].Addr == "" {
			v.failf([]string{"redis", name, "addr"}, "must be host:port")
		}
	}
	for _, name := range sortedKeys(c.Bulkheads) {
		b := c.Bulkheads[name]
		p := []string{"bulkheads", name}
		// The limits themselves are checked by bulkhead.New, in Build.
		if f := b.Fleet; f != nil {
			if _, ok := c.Redis[f.Redis]; !ok {
				v.failf(append(p, "fleet", "redis"), "no redis server %q", f.Redis)
			}
			if _, ok := failurePolicies[f.OnFailure]; !ok {
				v.failf(append(p, "fleet", "on_failure"), "want closed, open or local_share, got %q", f.OnFailure)
			}
		}
		if r := b.RateLimits; r != nil {
			rp := append(p, "rate_limits")
			if _, ok := c.Redis[r.Redis]; r.Redis != "" && !ok {
				v.failf(append(rp, "redis"), "no redis server %q", r.Redis)
			}
			v.checkRate(rp, r.Rate)
			for _, class := range sortedKeys(r.PerClass) {
				v.checkRate(append(rp, "per_class", class), r.PerClass[class])
			}
			if _, ok := tokenWeights[r.TokenWeight]; r.TokenWeight != "" && !ok {
				v.failf(append(rp, "token_weight"), "want larger, input or reservation, got %q", r.TokenWeight)
			}
			if _, err := c.tokenWeight(name); err != nil {
				v.failf(append(rp, "token_weight"), "%v", err)
			}
			if !r.setsRate() {
				v.failf(rp, "sets no rate: set a rate per minute, or per_class")
			}
		}
		if a := b.Adaptive; a != nil {
			if _, ok := adaptiveRules[a.Rule]; !ok {
				v.failf(append(p, "adaptive", "rule"), "want aimd or gradient, got %q", a.Rule)
			}
			if _, ok := cooldownModes[a.Cooldown]; !ok {
				v.failf(append(p, "adaptive", "cooldown"), "want hold or shed, got %q", a.Cooldown)
			}
		}
		if b.TokenBudget != nil && strings.TrimSpace(b.Model) == "" {
			v.failf(append(p, "model"), "is needed with token_budget: the estimator reads it")
		}
	}
	v.checkRouteModels(c)
	v.checkTelemetry(&c.Telemetry)
	for i, r := range c.Routes {
		p := []string{"routes", strconv.Itoa(i)}
		if _, ok := apis[r.API]; !ok {
			v.failf(append(p, "api"), "want openai-chat, openai-responses, anthropic-messages or gemini, got %q", r.API)
		}
		if _, ok := c.Upstreams[r.Upstream]; !ok {
			v.failf(append(p, "upstream"), "no upstream %q", r.Upstream)
		}
		if _, ok := c.Bulkheads[r.Bulkhead]; !ok {
			v.failf(append(p, "bulkhead"), "no bulkhead %q", r.Bulkhead)
		}
		if u, ok := c.Upstreams[r.Upstream]; ok && len(c.Clients) > 0 && u.APIKeyEnv == "" {
			v.failf([]string{"upstreams", r.Upstream, "api_key_env"}, "is needed with clients: a client's key is the gateway's own, never sent upstream")
		}
	}
}

// checkRouteModels checks that each API has at most one route without
// models, and each model of an API at most one route.
func (v *validator) checkRouteModels(c *Config) {
	other := map[string]int{}      // API: its route without models
	routeOf := map[[2]string]int{} // API and model: its route
	for i, r := range c.Routes {
		p := []string{"routes", strconv.Itoa(i)}
		if len(r.Models) == 0 {
			if j, dup := other[r.API]; dup {
				v.failf(p, "%s has a route without models already (routes.%d): a call whose model no route lists goes there", r.API, j)
			}
			other[r.API] = i
		}
		for k, m := range r.Models {
			switch j, dup := routeOf[[2]string{r.API, m}]; {
			case dup && j == i:
				v.failf(append(p, "models", strconv.Itoa(k)), "%q is listed twice", m)
			case dup:
				v.failf(append(p, "models", strconv.Itoa(k)), "%s model %q has a route already (routes.%d)", r.API, m, j)
			}
			routeOf[[2]string{r.API, m}] = i
		}
	}
}

// apiVersion matches a path segment that names an API version: v1, v2,
// v1beta, v1alpha2.
var apiVersion = regexp.MustCompile(`^[vV][0-9]+((alpha|beta)[0-9]*)?$`)

// versionSuffix returns the API version u's path ends in, and u without it;
// "" when its path ends otherwise. A call's path is joined to the base URL
// with its own version, so a base URL must not end in one.
func versionSuffix(u *url.URL) (version, fix string) {
	path := strings.TrimSuffix(u.Path, "/")
	i := strings.LastIndexByte(path, '/')
	if i < 0 || !apiVersion.MatchString(path[i+1:]) {
		return "", ""
	}
	v := *u
	v.Path, v.RawPath = path[:i], ""
	return path[i+1:], v.String()
}

// checkListen checks that a gateway without clients listens only on
// loopback, unless the file allows otherwise.
func (v *validator) checkListen(c *Config) {
	listen := c.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		v.failf([]string{"listen"}, "want host:port, such as 127.0.0.1:8080, got %q", c.Listen)
		return
	}
	if len(c.Clients) > 0 || c.AllowUnauthenticated {
		return
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		v.failf([]string{"listen"}, "%q is reachable beyond this machine and no clients are set: add clients (the callers' keys), listen on 127.0.0.1, or set allow_unauthenticated: true", listen)
	}
}

// checkClients checks the clients' keys and what they may ask for, and
// the headers the configuration reads.
func (v *validator) checkClients(c *Config) {
	high := false
	digests := map[[32]byte]string{}
	for _, name := range sortedKeys(c.Clients) {
		cl := c.Clients[name]
		p := []string{"clients", name}
		switch {
		case (cl.KeyEnv == "") == (cl.KeySHA256 == ""):
			v.failf(p, "needs one of key_env and key_sha256")
		case cl.KeySHA256 != "":
			d, ok := parseDigest(cl.KeySHA256)
			if !ok {
				v.failf(append(p, "key_sha256"), "want 64 hex digits (a SHA-256 digest), got %d characters", len(cl.KeySHA256))
			} else if other, dup := digests[d]; dup {
				v.failf(append(p, "key_sha256"), "is client %s's key too", other)
			}
			digests[d] = name
		}
		if cl.Tenant != "" {
			for _, bname := range sortedKeys(c.Bulkheads) {
				if k := c.Bulkheads[bname].Classes; k != nil {
					if _, ok := k.Limits[cl.Tenant]; !ok && k.Default != cl.Tenant {
						v.failf(append(p, "tenant"), "%q is not a class of bulkhead %s", cl.Tenant, bname)
					}
				}
			}
		}
		high = high || cl.AllowHighPriority
	}
	if c.Class.Header != "" && !c.TrustHeaders {
		v.failf([]string{"class", "header"}, "counts only with trust_headers: true (a proxy in front sets it); without, any client could pick its class")
	}
	if c.Priority.Header != "" && !c.TrustHeaders && !high {
		v.failf([]string{"priority", "header"}, "counts only with trust_headers: true, or for clients with allow_high_priority")
	}
	if h := c.AttemptHeader; h != "" && !validHeaderName(h) {
		v.failf([]string{"attempt_header"}, "want a header name, such as X-Retry-Attempt, got %q", h)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// validHeaderName reports whether h is a valid HTTP header name (a token).
func validHeaderName(h string) bool {
	for i := range len(h) {
		c := h[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return h != ""
}
