// Package semconv names the OpenTelemetry attributes that package
// otelbulkhead and the gateway both set, and the version of the semantic
// conventions they follow, so that the two say the same.
package semconv

import "go.opentelemetry.io/otel/attribute"

// Version is the version of the OpenTelemetry semantic conventions whose
// generative AI names (gen_ai.*) the spans and metrics follow, and
// SchemaURL its schema.
const (
	Version   = "1.44.0"
	SchemaURL = "https://opentelemetry.io/schemas/" + Version
)

// The attributes both set: the conventions' and the bulkhead's own.
const (
	GenAIOperation        = attribute.Key("gen_ai.operation.name")
	GenAIProvider         = attribute.Key("gen_ai.provider.name")
	GenAIRequestModel     = attribute.Key("gen_ai.request.model")
	GenAIRequestMaxTokens = attribute.Key("gen_ai.request.max_tokens")
	ErrorType             = attribute.Key("error.type")
	BulkheadName          = attribute.Key("bulkhead.name")
	BulkheadReason        = attribute.Key("bulkhead.reason")
	BulkheadClass         = attribute.Key("bulkhead.class")
	BulkheadPriority      = attribute.Key("bulkhead.priority")
	BulkheadAdmissionID   = attribute.Key("bulkhead.admission.id")
)
