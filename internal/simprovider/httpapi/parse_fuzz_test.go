package httpapi

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// FuzzParse: whatever the path and body, the handler's parsing never
// panics; a request it refuses gets a 400 with a message, and one it
// takes has a model, a prompt size >= 0 and an output cap within bounds.
func FuzzParse(f *testing.F) {
	for _, seed := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:x"}}]}],"max_completion_tokens":7.0}`},
		{"/v1/responses", responsesBody},
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1e3}`},
		{"/v1/messages", messagesBody},
		{"/v1/messages", `{"model":"c","max_tokens":-1,"messages":{}}`},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent", geminiBody},
		{"/v1beta/models/g:generateContent", `{"contents":[{"parts":[{"inlineData":{"data":"AAAA"}}]}],"generation_config":{"max_output_tokens":99999999999}}`},
		{"/models/a/b:generateContent", `{}`},
		{"/x", `[`},
	} {
		f.Add(seed.path, []byte(seed.body), "alt=sse")
	}
	f.Fuzz(func(t *testing.T, path string, body []byte, query string) {
		a, model, method := route(path)
		if a == 0 {
			return
		}
		if a == geminiAPI && (strings.Contains(model, "/") || method != "generateContent" && method != "streamGenerateContent") {
			t.Fatalf("route(%q) = %v %q %q", path, a, model, method)
		}
		q, _ := url.ParseQuery(query)
		c, err := parse(a, model, method, q, body)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || ae.kind != badRequest || ae.msg == "" || ae.status(a) != 400 || c != nil {
				t.Fatalf("parse(%q) = %+v, %v: want a 400 with a message", body, c, err)
			}
			if len(dialects[a].errorBody(400, ae, "req")) == 0 {
				t.Fatal("empty error body")
			}
			return
		}
		if c.api != a || c.model == "" || c.input < 0 || c.maxTokens < 0 || c.maxTokens > MaxOutputTokens {
			t.Fatalf("parse(%q) = %+v", body, c)
		}
		if c.includeUsage && !c.stream {
			t.Fatalf("include_usage without stream: %+v", c)
		}
	})
}
