package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/llmbulkhead/bulkhead/stream"
)

// minClientKeyLen is the shortest client key a gateway takes from the
// environment: a shorter one could be guessed.
const minClientKeyLen = 16

// client is one caller of a gateway.
type client struct {
	name   string // the client's name in the configuration: its key ID in the log
	digest [sha256.Size]byte
	tenant string // its admission class; "" for the bulkheads' default
	high   bool   // whether it may ask for high priority
}

// clientSet is the callers of a gateway, known by the SHA-256 digests of
// their keys.
type clientSet struct{ list []client }

// find returns the client whose key is key, nil for none. It compares the
// key's digest with every client's in constant time.
func (s *clientSet) find(key string) *client {
	d := sha256.Sum256([]byte(key))
	var found *client
	for i := range s.list {
		if subtle.ConstantTimeCompare(d[:], s.list[i].digest[:]) == 1 {
			found = &s.list[i]
		}
	}
	return found
}

// presentedKey is the key a client sent, in whichever place its API puts
// it: x-api-key (Anthropic), x-goog-api-key or ?key= (Gemini), or
// Authorization: Bearer (OpenAI, and Anthropic's auth tokens).
func presentedKey(r *http.Request) string {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	if k := r.Header.Get("X-Goog-Api-Key"); k != "" {
		return k
	}
	if a := r.Header.Get("Authorization"); len(a) > len("Bearer ") && strings.EqualFold(a[:len("Bearer ")], "Bearer ") {
		return a[len("Bearer "):]
	}
	return r.URL.Query().Get("key")
}

// unauthorized is the 401 answer, in format's dialect, to a request
// without a client key (missing) or with one no client has.
func unauthorized(format stream.Format, missing bool) Rejection {
	r := Rejection{Status: http.StatusUnauthorized, Message: "gateway: the API key is not one of this gateway's client keys"}
	if missing {
		r.Message = "gateway: no API key: send the client key this gateway gave you (Authorization: Bearer, x-api-key, x-goog-api-key or ?key=)"
	}
	switch format {
	case stream.AnthropicMessages:
		r.Type = "authentication_error"
	case stream.Gemini:
		r.Type = "UNAUTHENTICATED"
	default:
		r.Type, r.Code = "invalid_request_error", "invalid_api_key"
	}
	return r
}

// parseDigest reads a key's SHA-256 digest written as 64 hex digits.
func parseDigest(s string) ([sha256.Size]byte, bool) {
	var d [sha256.Size]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != sha256.Size {
		return d, false
	}
	copy(d[:], b)
	return d, true
}
