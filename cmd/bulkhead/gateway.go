package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/llmbulkhead/bulkhead/clock"
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
		fmt.Fprintf(fs.Output(), "On SIGTERM /readyz answers 503 at once; the gateway goes on serving for\n")
		fmt.Fprintf(fs.Output(), "shutdown_delay, then stops accepting, drains the calls in flight for up to\n")
		fmt.Fprintf(fs.Output(), "shutdown_timeout, cuts what is left and reports it. On SIGHUP it reads FILE again\n")
		fmt.Fprintf(fs.Output(), "and applies it, or nothing of it (an invalid file, or a change that needs a restart).\n\nFlags:\n")
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
	logger := gateway.NewLogger(stderr, cfg.Log.Format) // the request log
	if *check {
		logger = slog.New(slog.DiscardHandler)
	} else {
		// What the OpenTelemetry exporters fail at (a collector out of
		// reach) goes to the request log, as warnings.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("opentelemetry", "error", err.Error()) }))
	}
	g, err := gateway.Build(cfg, *config, os.LookupEnv, logger)
	if err != nil {
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	}
	if *check {
		g.Shutdown(context.Background())
		scheme := "http"
		if g.TLSConfig != nil {
			scheme = "https"
		}
		fmt.Fprintf(stdout, "bulkhead gateway: %s is valid: %s, %s, listen %s://%s\n", *config, count(len(g.Bulkheads), "bulkhead"), count(len(cfg.Clients), "client"), scheme, g.Listen)
		return 0
	}
	return serve(ctx, g, *config, stdout, stderr)
}

// count is n and noun, plural unless n is 1: "1 bulkhead", "2 clients".
func count(n int, noun string) string {
	if n != 1 {
		noun += "s"
	}
	return fmt.Sprintf("%d %s", n, noun)
}

// gatewayClock times the gateway's shutdown delay and deadline; tests
// set a mock.
var gatewayClock = clock.New()

// serve runs g's server until ctx ends, then shuts it down: /readyz
// answers 503 at once, the server goes on serving for the shutdown delay,
// then stops accepting connections while the calls in flight drain, up to
// the shutdown timeout; it cuts what is left then, and reports it. On
// SIGHUP, until then, it reloads the configuration file at path.
func serve(ctx context.Context, g *gateway.Gateway, path string, stdout, stderr io.Writer) int {
	hangups := make(chan os.Signal, 1)
	signal.Notify(hangups, syscall.SIGHUP) // never sent on Windows
	defer signal.Stop(hangups)
	ln, err := net.Listen("tcp", g.Listen)
	if err != nil {
		g.Shutdown(context.Background())
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: g.Handler, TLSConfig: g.TLSConfig, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: log.New(stderr, "bulkhead gateway: ", 0)}
	done := make(chan error, 1)
	scheme := "http"
	if g.TLSConfig != nil {
		scheme = "https"
		go func() { done <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { done <- srv.Serve(ln) }()
	}
	fmt.Fprintf(stdout, "bulkhead gateway: listening on %s://%s\n", scheme, ln.Addr())
	failed := func(err error) int {
		g.Shutdown(context.Background())
		fmt.Fprintf(stderr, "bulkhead gateway: %v\n", err)
		return 1
	}
	for running := true; running; {
		select {
		case err := <-done:
			return failed(err)
		case <-hangups:
			reload(g, path, stdout, stderr)
		case <-ctx.Done():
			running = false
		}
	}
	delay := gatewayClock.NewTimer(g.ShutdownDelay)
	g.SetReady(false)
	fmt.Fprintf(stdout, "bulkhead gateway: shutting down: not ready; serving for %v, then draining for up to %v\n", g.ShutdownDelay, g.ShutdownTimeout)
	select {
	case err := <-done:
		delay.Stop()
		return failed(err)
	case <-delay.C():
	}
	drain, cut := context.WithCancel(context.Background())
	defer cut()
	deadline := gatewayClock.AfterFunc(g.ShutdownTimeout, cut)
	defer deadline.Stop()
	listenerClosed := make(chan struct{})
	srv.RegisterOnShutdown(func() { close(listenerClosed) }) // called once the listener is closed
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Shutdown(drain) }()
	<-listenerClosed // no new connection: no call arrives to be turned away by a closed bulkhead
	left := g.Shutdown(drain)
	if err := <-stopped; err != nil {
		_ = srv.Close() // connections still open at the deadline
	}
	<-done
	if len(left) == 0 {
		fmt.Fprintf(stdout, "bulkhead gateway: drained\n")
		return 0
	}
	names := make([]string, 0, len(left))
	for name := range left {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		res := left[name]
		fmt.Fprintf(stdout, "bulkhead gateway: bulkhead %s: %d in flight, %d queued at the deadline\n", name, res.InFlight, res.Pending)
	}
	return 1
}

// reload reloads the configuration file at path into g, and says what it
// did: on standard output when it applied or found nothing to change, on
// standard error when it changed nothing for a reason (the request log has
// a line either way).
func reload(g *gateway.Gateway, path string, stdout, stderr io.Writer) {
	res, err := g.ReloadFile(path)
	switch {
	case err != nil && res != nil:
		fmt.Fprintf(stderr, "bulkhead gateway: reload %s: %s, revision %d stays: %v\n", res.Outcome, path, res.Revision, err)
	case err != nil:
		fmt.Fprintf(stderr, "bulkhead gateway: reload: %v\n", err)
	case res.Outcome == gateway.ReloadUnchanged:
		fmt.Fprintf(stdout, "bulkhead gateway: reload: %s is unchanged, revision %d\n", path, res.Revision)
	default:
		changes := make([]string, len(res.Changes))
		for i, c := range res.Changes {
			changes[i] = c.String()
		}
		fmt.Fprintf(stdout, "bulkhead gateway: reloaded %s: revision %d: %s\n", path, res.Revision, strings.Join(changes, "; "))
	}
}
