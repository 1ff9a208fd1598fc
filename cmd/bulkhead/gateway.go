package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/llmbulkhead/bulkhead/gateway"
)

// runGateway is the gateway subcommand: it serves the gateway a
// configuration file describes until ctx ends (SIGINT, SIGTERM), then shuts
// it down gracefully; with -check it only validates the file.
func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bulkhead gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "the gateway's configuration file (YAML); required")
	check := fs.Bool("check", false, "validate the configuration file and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: bulkhead gateway -config FILE [-check]\n\n")
		fmt.Fprintf(fs.Output(), "Serves an admission proxy in front of LLM providers, as FILE describes.\n")
		fmt.Fprintf(fs.Output(), "On SIGTERM it stops accepting, drains the calls in flight (shutdown_timeout)\n")
		fmt.Fprintf(fs.Output(), "and reports what was still in flight.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *config == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	cfg, err := gateway.LoadConfig(*config)
	if err != nil {
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	}
	var logger *slog.Logger
	if *check {
		logger = slog.New(slog.DiscardHandler)
	}
	g, err := gateway.Build(cfg, *config, os.Getenv, logger)
	if err != nil {
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	}
	if *check {
		g.Shutdown(context.Background())
		fmt.Fprintf(stdout, "bulkhead gateway: %s is valid: %d bulkheads, listen %s\n", *config, len(g.Bulkheads), g.Listen)
		return 0
	}
	return serve(ctx, g, stdout, stderr)
}

// serve runs g's server until ctx ends, then shuts it down: it stops
// accepting, waits up to the shutdown timeout for calls in flight, and
// reports what was left.
func serve(ctx context.Context, g *gateway.Gateway, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", g.Listen)
	if err != nil {
		g.Shutdown(context.Background())
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: g.Handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "bulkhead gateway: listening on %s\n", ln.Addr())
	select {
	case err := <-done:
		g.Shutdown(context.Background())
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	fmt.Fprintf(stdout, "bulkhead gateway: shutting down (up to %v)\n", g.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), g.ShutdownTimeout)
	defer cancel()
	left := g.Shutdown(sctx) // new calls are shed while the server drains
	_ = srv.Shutdown(sctx)
	<-done
	if len(left) == 0 {
		fmt.Fprintf(stdout, "bulkhead gateway: drained\n")
		return 0
	}
	for name, res := range left {
		fmt.Fprintf(stdout, "bulkhead gateway: bulkhead %s: %d in flight, %d queued at the deadline\n", name, res.InFlight, res.Pending)
	}
	return 1
}
