// Command bulkhead shows what the bulkhead library does, and runs it as a
// gateway.
//
// Usage:
//
//	bulkhead [command] [flags]
//
// The commands are:
//
//	demo     run scenarios of LLM calls against a simulated provider account,
//	         bare, through a static bulkhead and through the adaptive + fair
//	         one, and print one table with a verdict (the default)
//	gateway  serve an admission proxy in front of LLM providers, from a
//	         configuration file: bulkhead gateway -config FILE [-check]
//	provider serve a simulated LLM provider account over HTTP, to try the
//	         gateway and the SDKs without an account
//
// The demo needs no network and no API key: its provider is simulated, with
// realistic latency and token counts and an account that answers 429 above
// its concurrency and tokens-per-minute limits, and its clients retry a 429
// and a bulkhead rejection alike. It runs on simulated time, so the same
// seed prints the same table on any machine, in well under a second: bursts
// of 50 to 1,000 calls, a provider whose capacity halves, and a quiet
// tenant beside a bursting one. Run it with
//
//	go run ./cmd/bulkhead demo
//
// and see 'bulkhead demo -h' for its flags: one scenario, one burst of your
// own, the provider's limits, the static bulkhead's limits, the clients'
// attempts and the seed. 'bulkhead demo -gateway' is the older comparison
// over real HTTP through the gateway, on the wall clock. With no command,
// or with only flags, bulkhead runs the demo.
//
// 'bulkhead provider' serves the demo's simulated provider over HTTP on
// 127.0.0.1:8081, as OpenAI chat completions and responses, Anthropic
// messages and Gemini generateContent, streamed and not: realistic
// latency, usage, the providers' rate-limit headers, 429s with Retry-After
// past the account's limits and overloads past its concurrency. Any API
// key is accepted. With it the gateway can be tried without an account:
//
//	go run ./cmd/bulkhead provider
//	go run ./cmd/bulkhead gateway -config examples/provider.yaml
//
// and see 'bulkhead provider -h' for the account's limits and speed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/llmbulkhead/bulkhead/cmd/bulkhead/internal/demo"
)

// command is one subcommand. A gateway command goes in this table too.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"demo", "run scenarios of calls against a simulated provider, bare and through bulkheads, as one table (default)", runDemo},
		{"gateway", "serve an admission proxy in front of LLM providers, from a configuration file", runGateway},
		{"provider", "serve a simulated LLM provider over HTTP (OpenAI, Anthropic, Gemini), to try the gateway without an account", runProvider},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand and returns the exit code: 0 for success
// (and for help), 1 for a failure, 2 for a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return runDemo(ctx, nil, stdout, stderr)
	}
	switch name := args[0]; name {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	default:
		for _, c := range commands() {
			if c.name == name {
				return c.run(ctx, args[1:], stdout, stderr)
			}
		}
		if strings.HasPrefix(name, "-") {
			return runDemo(ctx, args, stdout, stderr)
		}
		fmt.Fprintf(stderr, "bulkhead: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "bulkhead: in-process admission control for LLM calls.\n\n")
	fmt.Fprintf(w, "Usage:\n  bulkhead [command] [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'bulkhead <command> -h' for a command's flags.\n")
}

// runDemo is the demo subcommand.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := demo.DefaultConfig()
	fs := flag.NewFlagSet("bulkhead demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: bulkhead demo [flags]\n\n")
		fmt.Fprintf(fs.Output(), "Runs scenarios of LLM calls against a simulated provider account, bare, through a\n")
		fmt.Fprintf(fs.Output(), "static bulkhead and through the adaptive + fair one, on simulated time, and prints one\n")
		fmt.Fprintf(fs.Output(), "table with a verdict. With -gateway: one burst bare and through the gateway, over real\n")
		fmt.Fprintf(fs.Output(), "HTTP on the wall clock, run faster by -time-scale. Durations are simulated time.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bulkhead demo: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		fs.Usage()
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "bulkhead demo: %v\n", err)
		return 2
	}
	if _, err := demo.Run(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "bulkhead demo: %v\n", err)
		return 1
	}
	return 0
}
