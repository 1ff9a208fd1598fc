package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/gateway"
	"github.com/llmbulkhead/bulkhead/stream"
)

// This example puts an OpenAI-compatible upstream behind a bulkhead that
// admits no call (MaxConcurrent 0, a kill switch), so the client is told,
// in OpenAI's own dialect, to retry later.
func ExampleNew() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[]}`)
	}))
	defer upstream.Close()

	b, err := bulkhead.New(bulkhead.Config{Model: "gpt-4o", MaxConcurrent: 0})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	u, _ := url.Parse(upstream.URL)
	h, err := gateway.New(gateway.Route{Format: stream.OpenAIChat, Upstream: u, Bulkhead: b})
	if err != nil {
		log.Fatal(err)
	}
	gw := httptest.NewServer(h) // or http.ListenAndServe(":8080", h)
	defer gw.Close()

	res, err := http.Post(gw.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	fmt.Println(res.StatusCode, res.Header.Get("X-Should-Retry"))
	// Output:
	// 503 true
}

// This example builds a gateway whose one client is known by its key's
// SHA-256 digest: a call without the key is answered 401 in OpenAI's
// dialect and never reaches the upstream; with it the call goes through,
// carrying the upstream's key instead.
func ExampleBuild() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("upstream saw", r.Header.Get("Authorization"))
		fmt.Fprint(w, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	defer upstream.Close()

	key := "example-client-key-0123456789"
	digest := sha256.Sum256([]byte(key))
	cfg, err := gateway.ParseConfig("gateway.yaml", []byte(`
clients:
  app: {key_sha256: "`+hex.EncodeToString(digest[:])+`"}
upstreams:
  openai: {base_url: "`+upstream.URL+`", api_key_env: OPENAI_API_KEY}
bulkheads:
  main: {max_concurrent: 8}
routes:
  - {api: openai-chat, upstream: openai, bulkhead: main}
`))
	if err != nil {
		log.Fatal(err)
	}
	env := map[string]string{"OPENAI_API_KEY": "sk-upstream"}
	lookupEnv := func(k string) (string, bool) { v, ok := env[k]; return v, ok } // a program passes os.LookupEnv
	g, err := gateway.Build(cfg, "gateway.yaml", lookupEnv, slog.New(slog.DiscardHandler))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	srv := httptest.NewServer(g.Handler) // or an http.Server on g.Listen
	defer srv.Close()

	for _, auth := range []string{"", "Bearer " + key} {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", auth)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Println(res.StatusCode)
	}
	// Output:
	// 401
	// upstream saw Bearer sk-upstream
	// 200
}

// This example reloads a gateway's configuration: a changed limit is
// applied to the bulkhead at once; a changed listen address needs a
// restart, and changes nothing.
func ExampleGateway_Reload() {
	file := func(listen string, limit int) *gateway.Config {
		cfg, err := gateway.ParseConfig("gateway.yaml", []byte(fmt.Sprintf(`
listen: %q
upstreams: {openai: {base_url: "https://api.openai.com"}}
bulkheads: {main: {max_concurrent: %d}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`, listen, limit)))
		if err != nil {
			log.Fatal(err)
		}
		return cfg
	}
	g, err := gateway.Build(file("127.0.0.1:8080", 8), "gateway.yaml", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Shutdown(context.Background())

	res, err := g.Reload(file("127.0.0.1:8080", 16)) // on SIGHUP, the command's ReloadFile
	fmt.Println(res.Outcome, res.Revision, res.Changes, err)
	fmt.Println(g.Bulkheads["main"].Limits().MaxConcurrent)

	res, err = g.Reload(file("127.0.0.1:9090", 4))
	var restart *gateway.RestartError
	fmt.Println(res.Outcome, res.Revision, errors.As(err, &restart), restart.Changes[0])
	fmt.Println(g.Bulkheads["main"].Limits().MaxConcurrent)
	// Output:
	// applied 2 [bulkheads.main.max_concurrent: 8 -> 16] <nil>
	// 16
	// refused 2 true listen: "127.0.0.1:8080" -> "127.0.0.1:9090"
	// 16
}

// This example traces a gateway's calls with a program's own
// TracerProvider (here an in-memory recorder; in production the SDK with
// an OTLP exporter, which the telemetry section makes for you): each call
// is a span "chat <model>" with its admission and its upstream call.
func ExampleWithTracerProvider() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	defer upstream.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	cfg, err := gateway.ParseConfig("gateway.yaml", []byte(`
upstreams: {openai: {base_url: "`+upstream.URL+`"}}
bulkheads: {main: {max_concurrent: 8}}
routes: [{api: openai-chat, upstream: openai, bulkhead: main}]
`))
	if err != nil {
		log.Fatal(err)
	}
	g, err := gateway.Build(cfg, "gateway.yaml", nil, slog.New(slog.DiscardHandler), gateway.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler)
	res, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	srv.Close()
	g.Shutdown(context.Background()) // the admission's span ends with its release

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	slices.Sort(names)
	fmt.Println(names)
	// Output: [POST bulkhead.admission chat gpt-4o]
}
