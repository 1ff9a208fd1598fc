package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
	"github.com/llmbulkhead/bulkhead/internal/simprovider/httpapi"
	"github.com/llmbulkhead/bulkhead/stream"
)

// gatewayRig is the simulated provider served on loopback as 'bulkhead
// provider' serves it, and the gateway in front of it. The simulated call
// a chat completion stands for travels in the provider's simulation
// headers (its ID, input and output tokens), so the HTTP pass runs exactly
// the calls of the other passes.
type gatewayRig struct {
	provider, gateway *http.Server
	url               string
	client            *http.Client
}

// startGateway serves prov on loopback and puts a gateway admitting
// through b in front of it.
func startGateway(prov *simprovider.Provider, b *bulkhead.Bulkhead) (*gatewayRig, error) {
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pl.Close()
		return nil, err
	}
	u, _ := url.Parse("http://" + pl.Addr().String())
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1024}})
	if err != nil {
		pl.Close()
		gl.Close()
		return nil, err
	}
	g := &gatewayRig{
		provider: &http.Server{Handler: httpapi.NewHandler(prov, httpapi.Options{})},
		gateway:  &http.Server{Handler: h},
		url:      "http://" + gl.Addr().String() + "/v1/chat/completions",
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}},
	}
	go func() { _ = g.provider.Serve(pl) }()
	go func() { _ = g.gateway.Serve(gl) }()
	return g, nil
}

func (g *gatewayRig) close() {
	g.client.CloseIdleConnections()
	_ = g.gateway.Close()
	_ = g.provider.Close()
}

// shedError is a call the gateway shed (its X-Bulkhead-Reason).
type shedError struct{ reason string }

func (e *shedError) Error() string { return "shed by the gateway: " + e.reason }

// call posts one chat completion to the gateway, retrying a provider 429
// like an SDK (a shed call is not retried, as in the in-process pass). The
// provider answers a call over its concurrency as an overload (503): that
// counts as its 429, as the in-process passes count it.
func (g *gatewayRig) call(ctx context.Context, cl *client, req simprovider.Request, breq *bulkhead.Request) error {
	body, _ := json.Marshal(map[string]any{"model": breq.Model, "max_tokens": breq.MaxTokens,
		"messages": []map[string]string{{"role": "user", "content": breq.Messages[0].Content}}})
	return cl.retry(ctx, req.ID, func() error {
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, strings.NewReader(string(body)))
		if err != nil {
			return err
		}
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set(httpapi.HeaderID, strconv.FormatUint(req.ID, 10))
		hreq.Header.Set(httpapi.HeaderInputTokens, strconv.FormatInt(req.InputTokens, 10))
		hreq.Header.Set(httpapi.HeaderOutputTokens, strconv.FormatInt(req.OutputTokens, 10))
		res, err := g.client.Do(hreq)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		switch {
		case res.StatusCode == http.StatusOK:
			return nil
		case res.Header.Get("X-Bulkhead-Reason") != "":
			return &shedError{reason: res.Header.Get("X-Bulkhead-Reason")}
		case res.StatusCode == http.StatusTooManyRequests || res.StatusCode == http.StatusServiceUnavailable:
			return simprovider.ErrRateLimited
		}
		return fmt.Errorf("gateway answered %s", res.Status)
	})
}
