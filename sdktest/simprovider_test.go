package sdktest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmbulkhead/bulkhead/clock"
	"github.com/llmbulkhead/bulkhead/internal/simprovider"
	"github.com/llmbulkhead/bulkhead/internal/simprovider/httpapi"
	"github.com/llmbulkhead/bulkhead/internal/testutil"
)

// simRig is the simulated provider of 'bulkhead provider' on loopback,
// and the official SDKs pointed straight at it.
type simRig struct {
	srv  *httptest.Server
	prov *simprovider.Provider
}

// newSimRig serves an account of cfg, which answers at once unless cfg
// sets latencies.
func newSimRig(t *testing.T, cfg simprovider.Config) *simRig {
	t.Helper()
	if cfg.OutputMedian == 0 {
		cfg.OutputMedian, cfg.ChunkTokens = 30, 8
	}
	p, err := simprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &simRig{prov: p, srv: httptest.NewServer(httpapi.NewHandler(p, httpapi.Options{}))}
	t.Cleanup(r.srv.Close)
	return r
}

func (r *simRig) openai(opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(r.srv.URL + "/v1"), option.WithAPIKey("any key")}, opts...)...)
}

func (r *simRig) anthropic(opts ...aoption.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]aoption.RequestOption{aoption.WithBaseURL(r.srv.URL), aoption.WithAPIKey("any key")}, opts...)...)
}

// outputs fixes how many tokens the provider writes for a call.
func outputs(n string) option.RequestOption { return option.WithHeader(httpapi.HeaderOutputTokens, n) }

func aoutputs(n string) aoption.RequestOption {
	return aoption.WithHeader(httpapi.HeaderOutputTokens, n)
}

// wellFormed fails the test if the SDK found, anywhere in v, a field it
// does not know (the JSON metadata's ExtraFields) or a known field of an
// unexpected type (present, not null, and not valid), so that the
// provider's answers are in the exact shape the SDK models.
func wellFormed(t *testing.T, v any) {
	t.Helper()
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !v.IsNil() {
				walk(path, v.Elem())
			}
		case reflect.Slice, reflect.Array:
			for i := 0; i < v.Len(); i++ {
				walk(path+"[]", v.Index(i))
			}
		case reflect.Struct:
			ty := v.Type()
			for i := 0; i < ty.NumField(); i++ {
				f := ty.Field(i)
				if !f.IsExported() {
					continue
				}
				if f.Name != "JSON" {
					walk(path+"."+f.Name, v.Field(i))
					continue
				}
				meta := v.Field(i)
				for j := 0; j < meta.NumField(); j++ {
					mf, name := meta.Field(j), meta.Type().Field(j).Name
					if !meta.Type().Field(j).IsExported() {
						continue
					}
					if name == "ExtraFields" {
						for _, k := range mf.MapKeys() {
							t.Errorf("%s: a field the SDK does not know: %q", path, k.String())
						}
						continue
					}
					raw, valid := mf.MethodByName("Raw"), mf.MethodByName("Valid")
					if !raw.IsValid() || !valid.IsValid() {
						continue
					}
					if r := raw.Call(nil)[0].String(); r != "" && r != "null" && !valid.Call(nil)[0].Bool() {
						t.Errorf("%s.%s: the SDK cannot read %s", path, name, r)
					}
				}
			}
		}
	}
	walk(reflect.TypeOf(v).String(), reflect.ValueOf(v))
}

func words(s string) int { return len(strings.Fields(s)) }

func TestSimProviderOpenAIChat(t *testing.T) {
	cfg := simprovider.Config{RequestsPerMinute: 100, TokensPerMinute: 100_000}
	r := newSimRig(t, cfg)
	c := r.openai()
	var hr *http.Response
	res, err := c.Chat.Completions.New(context.Background(), chatParams, outputs("12"), option.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, res)
	if res.Object != "chat.completion" || !strings.HasPrefix(res.ID, "chatcmpl-") || res.Model != "gpt-4o" || !res.JSON.Created.Valid() {
		t.Errorf("completion %+v", res)
	}
	ch := res.Choices[0]
	if words(ch.Message.Content) != 12 || ch.FinishReason != "stop" || ch.Message.Role != "assistant" {
		t.Errorf("choice %+v", ch)
	}
	if u := res.Usage; u.PromptTokens <= 0 || u.CompletionTokens != 12 || u.TotalTokens != u.PromptTokens+12 {
		t.Errorf("usage %+v", u)
	}
	if hr.Header.Get("X-Ratelimit-Remaining-Requests") != "99" || hr.Header.Get("X-Ratelimit-Limit-Tokens") != "100000" {
		t.Errorf("rate-limit headers %v", hr.Header)
	}
	// Over the output cap: finish_reason "length".
	res, err = c.Chat.Completions.New(context.Background(), chatParams, outputs("500"))
	if err != nil || res.Choices[0].FinishReason != "length" || res.Usage.CompletionTokens != 100 {
		t.Fatalf("over the cap: %+v, %v", res, err)
	}
}

func TestSimProviderOpenAIChatStream(t *testing.T) {
	r := newSimRig(t, simprovider.Config{})
	c := r.openai()
	params := chatParams
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(context.Background(), params, outputs("20"))
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for s.Next() {
		chunk := s.Current()
		wellFormed(t, chunk)
		if !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused chunk %d: %s", chunks, chunk.RawJSON())
		}
		chunks++
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if words(acc.Choices[0].Message.Content) != 20 || acc.Choices[0].FinishReason != "stop" {
		t.Errorf("accumulated %+v", acc.Choices)
	}
	if u := acc.Usage; u.PromptTokens <= 0 || u.CompletionTokens != 20 || u.TotalTokens != u.PromptTokens+20 {
		t.Errorf("usage %+v", u)
	}
	if chunks != 1+3+1+1 { // the role, 20 tokens in chunks of 8, the finish, the usage
		t.Errorf("%d chunks", chunks)
	}
}

var responsesParams = responses.ResponseNewParams{
	Model:        "gpt-4o",
	Instructions: openai.String("Be brief."),
	Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("What is a quaternion?")},
}

func TestSimProviderOpenAIResponses(t *testing.T) {
	r := newSimRig(t, simprovider.Config{})
	c := r.openai()
	res, err := c.Responses.New(context.Background(), responsesParams, outputs("9"))
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, res)
	if res.Status != "completed" || !strings.HasPrefix(res.ID, "resp_") || words(res.OutputText()) != 9 {
		t.Errorf("response %s", res.RawJSON())
	}
	if u := res.Usage; u.InputTokens <= 0 || u.OutputTokens != 9 || u.TotalTokens != u.InputTokens+9 {
		t.Errorf("usage %+v", u)
	}
	params := responsesParams
	params.MaxOutputTokens = openai.Int(16)
	res, err = c.Responses.New(context.Background(), params, outputs("40"))
	if err != nil || res.Status != "incomplete" || res.IncompleteDetails.Reason != "max_output_tokens" || res.Usage.OutputTokens != 16 {
		t.Fatalf("over max_output_tokens: %s, %v", res.RawJSON(), err)
	}
}

func TestSimProviderOpenAIResponsesStream(t *testing.T) {
	r := newSimRig(t, simprovider.Config{})
	c := r.openai()
	s := c.Responses.NewStreaming(context.Background(), responsesParams, outputs("10"))
	var text strings.Builder
	var final responses.Response
	var types []string
	for s.Next() {
		ev := s.Current()
		wellFormed(t, ev)
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.completed":
			final = ev.AsResponseCompleted().Response
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if types[0] != "response.created" || types[len(types)-1] != "response.completed" || words(text.String()) != 10 {
		t.Fatalf("events %v, text %q", types, text.String())
	}
	if final.OutputText() != text.String() || final.Usage.OutputTokens != 10 || final.Usage.InputTokens <= 0 {
		t.Errorf("final response %s", final.RawJSON())
	}
}

func TestSimProviderAnthropicMessages(t *testing.T) {
	r := newSimRig(t, simprovider.Config{RequestsPerMinute: 50, InputTokensPerMinute: 40_000, OutputTokensPerMinute: 8_000})
	c := r.anthropic()
	var hr *http.Response
	msg, err := c.Messages.New(context.Background(), messageParams, aoutputs("7"), aoption.WithResponseInto(&hr))
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, msg)
	if !strings.HasPrefix(msg.ID, "msg_") || msg.Role != "assistant" || msg.StopReason != "end_turn" || len(msg.Content) != 1 || words(msg.Content[0].Text) != 7 {
		t.Errorf("message %s", msg.RawJSON())
	}
	if msg.Usage.InputTokens <= 0 || msg.Usage.OutputTokens != 7 {
		t.Errorf("usage %+v", msg.Usage)
	}
	for _, h := range []string{"Requests", "Tokens", "Input-Tokens", "Output-Tokens"} {
		reset, err := time.Parse(time.RFC3339, hr.Header.Get("Anthropic-Ratelimit-"+h+"-Reset"))
		if hr.Header.Get("Anthropic-Ratelimit-"+h+"-Remaining") == "" || err != nil || reset.Before(time.Now().Add(-time.Second)) {
			t.Errorf("anthropic-ratelimit-%s-*: %v", strings.ToLower(h), hr.Header)
		}
	}
	// The output cap: stop_reason max_tokens.
	params := messageParams
	params.MaxTokens = 5
	if msg, err := c.Messages.New(context.Background(), params, aoutputs("7")); err != nil || msg.StopReason != "max_tokens" || msg.Usage.OutputTokens != 5 {
		t.Fatalf("over max_tokens: %+v, %v", msg, err)
	}
}

func TestSimProviderAnthropicStream(t *testing.T) {
	r := newSimRig(t, simprovider.Config{})
	c := r.anthropic()
	s := c.Messages.NewStreaming(context.Background(), messageParams, aoutputs("12"))
	msg := anthropic.Message{}
	for s.Next() {
		ev := s.Current()
		wellFormed(t, ev)
		if err := msg.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if len(msg.Content) != 1 || words(msg.Content[0].Text) != 12 || msg.StopReason != "end_turn" {
		t.Errorf("accumulated %+v", msg)
	}
	if msg.Usage.InputTokens <= 0 || msg.Usage.OutputTokens != 12 {
		t.Errorf("usage %+v", msg.Usage)
	}
}

// TestSimProviderOverloadReachesTheSDKs: past the account's concurrency a
// call is an overload: OpenAI's 503 server_is_overloaded, Anthropic's 529
// overloaded_error.
func TestSimProviderOverloadReachesTheSDKs(t *testing.T) {
	clk := clock.NewMock()
	r := newSimRig(t, simprovider.Config{MaxConcurrent: 1, TimeToFirstToken: time.Second, OutputMedian: 5, Clock: clk})
	oc, ac := r.openai(option.WithMaxRetries(0)), r.anthropic(aoption.WithMaxRetries(0))
	held := make(chan error, 1)
	go func() {
		_, err := oc.Chat.Completions.New(context.Background(), chatParams)
		held <- err
	}()
	testutil.WaitFor(t, "a call in flight", func() bool { return r.prov.Stats().InFlight == 1 })
	_, err := oc.Chat.Completions.New(context.Background(), chatParams)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 503 || oe.Code != "server_is_overloaded" || oe.Response.Header.Get("Retry-After") != "1" {
		t.Errorf("OpenAI over the concurrency: %v", err)
	}
	_, err = ac.Messages.New(context.Background(), messageParams)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 529 || !strings.Contains(ae.RawJSON(), `"type":"overloaded_error"`) {
		t.Errorf("Anthropic over the concurrency: %v", err)
	}
	clk.Add(time.Second)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
}

// TestSimProviderRateLimitReachesTheSDKs: past the account's requests per
// minute each SDK gets its own 429 error, with the time until the call
// fits.
func TestSimProviderRateLimitReachesTheSDKs(t *testing.T) {
	r := newSimRig(t, simprovider.Config{RequestsPerMinute: 1})
	oc, ac := r.openai(option.WithMaxRetries(0)), r.anthropic(aoption.WithMaxRetries(0))
	if _, err := oc.Chat.Completions.New(context.Background(), chatParams); err != nil {
		t.Fatal(err)
	}
	_, err := oc.Chat.Completions.New(context.Background(), chatParams)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 429 || oe.Type != "requests" || oe.Code != "rate_limit_exceeded" {
		t.Fatalf("OpenAI past the RPM: %v", err)
	}
	if s := oe.Response.Header.Get("Retry-After"); s != "60" && s != "59" {
		t.Errorf("Retry-After %q, want about a minute", s)
	}
	_, err = ac.Messages.New(context.Background(), messageParams)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 429 || !strings.Contains(ae.RawJSON(), `"type":"rate_limit_error"`) {
		t.Fatalf("Anthropic past the RPM: %v", err)
	}
}

// TestSimProviderSDKRetriesAfterRetryAfter: an SDK with its default
// retries waits the 429's retry-after-ms and then gets through. The
// account's minute lasts 60 ms on a mock clock, which the test moves by
// the time each 429 says, as the SDK waits it.
func TestSimProviderSDKRetriesAfterRetryAfter(t *testing.T) {
	clk := clock.NewMock()
	r := newSimRig(t, simprovider.Config{RequestsPerMinute: 1, TimeScale: 0.001, OutputMedian: 5, Clock: clk})
	var attempts []string
	oc := r.openai(option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		if err == nil {
			attempts = append(attempts, res.Status[:3]+" "+res.Header.Get("Retry-After-Ms"))
			if ms, err := strconv.Atoi(res.Header.Get("Retry-After-Ms")); err == nil {
				clk.Add(time.Duration(ms) * time.Millisecond)
			}
		}
		return res, err
	}))
	for range 2 {
		if _, err := oc.Chat.Completions.New(context.Background(), chatParams); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(attempts, ",") != "200 ,429 60,200 " {
		t.Errorf("attempts %q: want the second call's 429 with the minute's 60 ms, then its retry through", attempts)
	}
}

// TestGatewayInFrontOfSimProvider: an SDK through the gateway to the
// simulated provider, streamed: the gateway settles the provider's usage
// and reads its rate-limit headers.
func TestGatewayInFrontOfSimProvider(t *testing.T) {
	r := newSimRig(t, simprovider.Config{RequestsPerMinute: 100, TokensPerMinute: 100_000})
	g := newGatewayRig(t, &provider{srv: r.srv}, budgetConfig("gpt-4o", 4, 10_000))
	params := chatParams
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	oc := g.openai()
	s := oc.Chat.Completions.NewStreaming(context.Background(), params, outputs("20"))
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ac := g.anthropic()
	msg := accumulate(t, ac.Messages.NewStreaming(context.Background(), messageParams, aoutputs("12")))
	g.idle(t)
	st := g.b.Stats()
	want := acc.Usage.TotalTokens + msg.Usage.InputTokens + msg.Usage.OutputTokens
	if acc.Usage.CompletionTokens != 20 || msg.Usage.OutputTokens != 12 || st.TokenBudget.TotalConsumed != want {
		t.Errorf("settled %d tokens, want the provider's %d (%+v, %+v)", st.TokenBudget.TotalConsumed, want, acc.Usage, msg.Usage)
	}
	if st.Cooldown.HeadroomReports != 2 {
		t.Errorf("%d headroom reports, want one per answer", st.Cooldown.HeadroomReports)
	}
}
