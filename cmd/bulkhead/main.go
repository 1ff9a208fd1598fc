// Command bulkhead shows what the bulkhead library does, and runs it as a
// gateway.
//
// Usage:
//
//	bulkhead [command] [flags]
//
// The commands are:
//
//	demo    fire a burst of LLM calls at a simulated provider account, once
//	        bare and once through a bulkhead, and compare (the default)
//	gateway serve an admission proxy in front of LLM providers, from a
//	        configuration file: bulkhead gateway -config FILE [-check]
//
// The demo needs no network and no API key: its provider is simulated, with
// realistic latency and token counts and an account that answers 429 above
// its concurrency and tokens-per-minute limits. Bare, the burst turns into a
// storm of 429s; through a bulkhead sized just under those limits, the
// excess is shed in microseconds with typed reasons (concurrency_limit,
// queue_limit, timeout, budget_limit) and the provider sees (close to) no
// 429s. Run it with
//
//	go run ./cmd/bulkhead demo
//
// and see 'bulkhead demo -h' for its flags: the burst, the provider's
// limits, the bulkhead's limits, the seed and the time scale. With no
// command, or with only flags, bulkhead runs the demo.
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
		{"demo", "fire a burst of calls at a simulated provider, bare and through a bulkhead, and compare (default)", runDemo},
		{"gateway", "serve an admission proxy in front of LLM providers, from a configuration file", runGateway},
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
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
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
		fmt.Fprintf(fs.Output(), "Fires a burst of LLM calls at a simulated provider account, once bare and once\n")
		fmt.Fprintf(fs.Output(), "through a bulkhead, and prints a side-by-side comparison. Durations are simulated\n")
		fmt.Fprintf(fs.Output(), "time, run faster by -time-scale.\n\nFlags:\n")
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
