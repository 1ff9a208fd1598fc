package demo

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/llmbulkhead/bulkhead/stream"
)

// The simulated call a chat completion stands for travels in headers, so
// the HTTP pass runs exactly the calls of the other passes.
const (
	hdrID     = "X-Sim-Id"
	hdrInput  = "X-Sim-Input-Tokens"
	hdrOutput = "X-Sim-Output-Tokens"
)

// gatewayRig is the simulated provider served as an OpenAI-compatible API
// on loopback, and the gateway in front of it.
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
		provider: &http.Server{Handler: providerHandler(prov)},
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

// providerHandler answers chat completions with the simulated provider:
// 200 with the usage, or a provider 429 in OpenAI's dialect.
func providerHandler(prov *simprovider.Provider) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req := simprovider.Request{MaxTokens: body.MaxTokens}
		req.ID, _ = strconv.ParseUint(r.Header.Get(hdrID), 10, 64)
		req.InputTokens, _ = strconv.ParseInt(r.Header.Get(hdrInput), 10, 64)
		req.OutputTokens, _ = strconv.ParseInt(r.Header.Get(hdrOutput), 10, 64)
		resp, err := prov.Complete(r.Context(), req)
		w.Header().Set("Content-Type", "application/json")
		if errors.Is(err, simprovider.ErrRateLimited) {
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, `{"error":{"message":%q,"type":"requests","param":null,"code":"rate_limit_exceeded"}}`, err.Error())
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, `{"id":"c%d","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			resp.ID, resp.Usage.Input, resp.Usage.Output, resp.Usage.Input+resp.Usage.Output)
	})
}

// shedError is a call the gateway shed (its X-Bulkhead-Reason).
type shedError struct{ reason string }

func (e *shedError) Error() string { return "shed by the gateway: " + e.reason }

// call posts one chat completion to the gateway, retrying a provider 429
// like an SDK (a shed call is not retried, as in the in-process pass).
func (g *gatewayRig) call(ctx context.Context, cl *client, req simprovider.Request, breq *bulkhead.Request) error {
	body, _ := json.Marshal(map[string]any{"model": breq.Model, "max_tokens": breq.MaxTokens,
		"messages": []map[string]string{{"role": "user", "content": breq.Messages[0].Content}}})
	return cl.retry(ctx, req.ID, func() error {
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, strings.NewReader(string(body)))
		if err != nil {
			return err
		}
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set(hdrID, strconv.FormatUint(req.ID, 10))
		hreq.Header.Set(hdrInput, strconv.FormatInt(req.InputTokens, 10))
		hreq.Header.Set(hdrOutput, strconv.FormatInt(req.OutputTokens, 10))
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
		case res.StatusCode == http.StatusTooManyRequests:
			return simprovider.ErrRateLimited
		}
		return fmt.Errorf("gateway answered %s", res.Status)
	})
}
