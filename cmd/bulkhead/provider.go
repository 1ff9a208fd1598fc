package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/llmbulkhead/bulkhead/internal/simprovider"
	"github.com/llmbulkhead/bulkhead/internal/simprovider/httpapi"
)

// providerStopTimeout bounds the wait, on SIGINT or SIGTERM, for the
// requests in flight to end once they have been cut.
const providerStopTimeout = 10 * time.Second

// runProvider is the provider subcommand: it serves a simulated provider
// account over HTTP until ctx ends (SIGINT, SIGTERM), then cuts the
// requests in flight and stops.
func runProvider(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bulkhead provider", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8081", "the address to serve on")
	cfg := simprovider.DefaultConfig()
	fs.Int64Var(&cfg.RequestsPerMinute, "rpm", 500, "the account's requests per minute (0: no limit)")
	fs.Int64Var(&cfg.TokensPerMinute, "tpm", 300_000, "the account's tokens per minute, each request's input + max tokens counted when it starts (0: no limit)")
	fs.Int64Var(&cfg.InputTokensPerMinute, "itpm", 0, "the account's input tokens per minute (0: no limit)")
	fs.Int64Var(&cfg.OutputTokensPerMinute, "otpm", 0, "the account's output tokens per minute, each request's max tokens reserved when it starts and corrected\nto the tokens it wrote when it ends (0: no limit)")
	fs.IntVar(&cfg.MaxConcurrent, "concurrency", 50, "the requests the account serves at once; one more is an overload, 503 (Anthropic: 529) (0: no limit)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "real seconds per simulated second: 0.1 answers 10 times faster, and the per-minute windows last 6s")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "the seed of the output lengths and latency noise")
	defaultMax := fs.Int64("default-max-tokens", 2048, "the output cap of a request that sets none: what the token limits count for it, and the most it writes")
	quiet := fs.Bool("quiet", false, "log no request (else one line a request goes to stderr)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: bulkhead provider [flags]\n\n")
		fmt.Fprintf(w, "Serves a simulated LLM provider account over HTTP, to try the gateway and the SDKs without an\n")
		fmt.Fprintf(w, "account: OpenAI chat completions (/v1/chat/completions) and responses (/v1/responses), Anthropic\n")
		fmt.Fprintf(w, "messages (/v1/messages) and Gemini (/v1beta/models/{model}:generateContent and\n")
		fmt.Fprintf(w, ":streamGenerateContent), streamed and not, with usage. Answers take as long as a hosted model's\n")
		fmt.Fprintf(w, "(about 0.5s to the first token, then about 65 tokens a second, slower near the limits), carry the\n")
		fmt.Fprintf(w, "providers' rate-limit headers, and past the account's limits are 429s with Retry-After (past its\n")
		fmt.Fprintf(w, "concurrency, overloads). Any API key is accepted, and none is needed. Point an OpenAI SDK at\n")
		fmt.Fprintf(w, "http://127.0.0.1:8081/v1, an Anthropic SDK or a Gemini client at http://127.0.0.1:8081, or the\n")
		fmt.Fprintf(w, "gateway at it with examples/provider.yaml. Stops on SIGINT or SIGTERM, cutting what is in flight.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "bulkhead provider: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"rpm", cfg.RequestsPerMinute}, {"tpm", cfg.TokensPerMinute}, {"itpm", cfg.InputTokensPerMinute}, {"otpm", cfg.OutputTokensPerMinute}, {"concurrency", int64(cfg.MaxConcurrent)}} {
		if f.v < 0 {
			return usageErr("-%s must be >= 0, got %d", f.name, f.v)
		}
	}
	if !(cfg.TimeScale > 0) || math.IsInf(cfg.TimeScale, 0) {
		return usageErr("-time-scale must be > 0, got %v", cfg.TimeScale)
	}
	if *defaultMax < 1 || *defaultMax > httpapi.MaxOutputTokens {
		return usageErr("-default-max-tokens must be from 1 to %d, got %d", httpapi.MaxOutputTokens, *defaultMax)
	}
	prov, err := simprovider.New(cfg)
	if err != nil {
		return usageErr("%v", err)
	}
	opts := httpapi.Options{DefaultMaxTokens: *defaultMax}
	if !*quiet {
		opts.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "bulkhead provider: %v\n", err)
		return 1
	}
	// Requests run under cut's context: cancelling it on a signal ends them
	// at once (a stream stops where it is), so the server can stop.
	base, cut := context.WithCancel(context.Background())
	defer cut()
	srv := &http.Server{Handler: httpapi.NewHandler(prov, opts), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base }, ErrorLog: log.New(stderr, "bulkhead provider: ", 0)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "bulkhead provider: listening on http://%s\n", ln.Addr())
	fmt.Fprintf(stdout, "bulkhead provider: %s; any API key is accepted\n", describeAccount(cfg))
	select {
	case err := <-done:
		fmt.Fprintf(stderr, "bulkhead provider: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	cut()
	stop, cancel := context.WithTimeout(context.Background(), providerStopTimeout)
	defer cancel()
	if err := srv.Shutdown(stop); err != nil {
		_ = srv.Close()
	}
	<-done
	st := prov.Stats()
	fmt.Fprintf(stdout, "bulkhead provider: stopped: %d %s, %d answered, %d over a limit\n",
		st.Requests, plural(st.Requests, "request"), st.Completed, st.RateLimited)
	return 0
}

// describeAccount says what an account's limits and speed are, in one
// line.
func describeAccount(cfg simprovider.Config) string {
	var parts []string
	for _, l := range []struct {
		v    int64
		what string
	}{{int64(cfg.MaxConcurrent), "concurrent requests"}, {cfg.RequestsPerMinute, "requests/min"}, {cfg.TokensPerMinute, "tokens/min"},
		{cfg.InputTokensPerMinute, "input tokens/min"}, {cfg.OutputTokensPerMinute, "output tokens/min"}} {
		if l.v > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", l.v, l.what))
		}
	}
	limits := "no limits"
	if len(parts) > 0 {
		limits = strings.Join(parts, ", ")
	}
	speed := ""
	if cfg.TimeScale != 1 {
		speed = fmt.Sprintf(", time scale %v (a minute lasts %v)", cfg.TimeScale, time.Duration(float64(time.Minute)*cfg.TimeScale))
	}
	return "an account of " + limits + speed
}

func plural(n int64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
