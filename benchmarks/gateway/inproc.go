package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/llmbulkhead/bulkhead/gateway"
)

// serveGatewayInProcess serves the gateway that the configuration file at
// path describes, as the bulkhead command does (the same server
// timeouts), built from this checkout into the benchmark's binary, with
// net/http/pprof's endpoints on pprofAddr: the profiles of the gateway at
// load, without a debug endpoint in the command itself.
func serveGatewayInProcess(path, pprofAddr string) error {
	cfg, err := gateway.LoadConfig(path)
	if err != nil {
		return err
	}
	g, err := gateway.Build(cfg, path, os.LookupEnv, gateway.NewLogger(os.Stderr, cfg.Log.Format))
	if err != nil {
		return err
	}
	defer g.Shutdown(context.Background())
	servePprof(pprofAddr)
	ln, err := net.Listen("tcp", g.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: g.Handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	return fmt.Errorf("gateway-inproc: %w", srv.Serve(ln))
}

// servePprof serves net/http/pprof's endpoints on addr, in the
// background.
func servePprof(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pprof:", err)
		return
	}
	go func() { _ = http.Serve(ln, mux) }()
}

// fetchProfile saves the profile name (such as "heap?gc=1") of the
// endpoint at addr into file.
func fetchProfile(addr, name, file string) error {
	resp, err := http.Get("http://" + addr + "/debug/pprof/" + name)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
