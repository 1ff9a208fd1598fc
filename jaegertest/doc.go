// Package jaegertest runs the gateway with its OpenTelemetry exporter
// pointed at a real Jaeger (built from the Go module proxy as a tool of
// this module) and reads the traces back through Jaeger's query API. It
// is a module of its own so that Jaeger, the official SDK and the
// newer OpenTelemetry they bring never enter the module graph of the
// bulkhead's users.
package jaegertest
