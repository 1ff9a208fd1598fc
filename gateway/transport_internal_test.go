package gateway

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/llmbulkhead/bulkhead/stream"
)

// A route without a Transport keeps enough idle connections to its
// upstream for the calls in flight (http.DefaultTransport keeps 2).
func TestDefaultTransportKeepsConnections(t *testing.T) {
	u, _ := url.Parse("http://upstream.test")
	rp := proxy(Route{Format: stream.OpenAIChat, Upstream: u}, 0, newGate(nil))
	tr := rp.Transport.(*stream.Transport)
	base, ok := tr.Base.(*http.Transport)
	if !ok || base != defaultTransport || base.MaxIdleConnsPerHost != DefaultMaxIdleConnsPerHost || base.MaxIdleConns != 0 {
		t.Fatalf("base transport %T %+v", tr.Base, tr.Base)
	}
	if base.Proxy == nil || base.ForceAttemptHTTP2 != http.DefaultTransport.(*http.Transport).ForceAttemptHTTP2 {
		t.Fatal("the default transport lost http.DefaultTransport's settings")
	}
	if b := copyBuffers.Get(); len(b) != 32<<10 {
		t.Fatalf("copy buffer of %d bytes", len(b))
	} else {
		copyBuffers.Put(b)
	}
}
