// Package sdktest proves that the official OpenAI and Anthropic Go SDKs work
// behind stream.Transport, against a fake provider on loopback. It is a
// module of its own so that the SDKs (and the Go version they need) never
// enter the module graph of the bulkhead's users.
package sdktest
