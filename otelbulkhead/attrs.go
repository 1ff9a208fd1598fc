package otelbulkhead

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/llmbulkhead/bulkhead"
	"github.com/llmbulkhead/bulkhead/internal/semconv"
)

// SemConvVersion is the version of the OpenTelemetry semantic conventions
// whose generative AI names (gen_ai.*) the package follows.
const SemConvVersion = semconv.Version

// schemaURL is the schema of that version.
const schemaURL = semconv.SchemaURL

// instrumentation is the instrumentation scope's name: the package's path.
const instrumentation = "github.com/llmbulkhead/bulkhead/otelbulkhead"

// The generative AI conventions' attributes.
const (
	genAIOperation          = semconv.GenAIOperation
	genAIProvider           = semconv.GenAIProvider
	genAIRequestModel       = semconv.GenAIRequestModel
	genAIRequestMaxTokens   = semconv.GenAIRequestMaxTokens
	genAIUsageInput         = attribute.Key("gen_ai.usage.input_tokens")
	genAIUsageOutput        = attribute.Key("gen_ai.usage.output_tokens")
	genAIUsageCacheRead     = attribute.Key("gen_ai.usage.cache_read.input_tokens")
	genAIUsageCacheCreation = attribute.Key("gen_ai.usage.cache_creation.input_tokens")
	genAIUsageReasoning     = attribute.Key("gen_ai.usage.reasoning.output_tokens")
	genAITokenType          = attribute.Key("gen_ai.token.type")
	errorType               = semconv.ErrorType
	defaultOperation        = "chat"
	tokenTypeInput          = "input"
	tokenTypeOutput         = "output"
	genAITokenUsage         = "gen_ai.client.token.usage"
	genAIOperationDuration  = "gen_ai.client.operation.duration"
	spanName                = "bulkhead.admission"
	eventAdmitted           = "bulkhead.admitted"
	eventRejected           = "bulkhead.rejected"
	eventBypassed           = "bulkhead.bypassed"
	eventDeduplicated       = "bulkhead.deduplicated"
	eventAbandoned          = "bulkhead.abandoned"
	eventReleased           = "bulkhead.released"
	outcomeAdmitted         = "admitted"
	outcomeRejected         = "rejected"
	outcomeBypassed         = "bypassed"
	outcomeDeduplicated     = "deduplicated"
	outcomeFailed           = "error"
	rejectionPrefix         = "bulkhead.rejection"
	bypassPrefix            = "bulkhead.bypass"
)

// The bulkhead's own attributes.
const (
	keyName             = semconv.BulkheadName
	keyOutcome          = attribute.Key("bulkhead.outcome")
	keyReason           = semconv.BulkheadReason
	keyClass            = semconv.BulkheadClass
	keyPriority         = semconv.BulkheadPriority
	keyTag              = attribute.Key("bulkhead.tag")
	keyAdmissionID      = semconv.BulkheadAdmissionID
	keyLimitRevision    = attribute.Key("bulkhead.limit_revision")
	keyReservedInput    = attribute.Key("bulkhead.reservation.input_tokens")
	keyReservedOutput   = attribute.Key("bulkhead.reservation.max_output_tokens")
	keyReserved         = attribute.Key("bulkhead.reservation.tokens")
	keyBorrowedSlot     = attribute.Key("bulkhead.borrowed.slot")
	keyBorrowedTokens   = attribute.Key("bulkhead.borrowed.tokens")
	keyWaitTotal        = attribute.Key("bulkhead.wait.total")
	keyWaitQueue        = attribute.Key("bulkhead.wait.queue")
	keyWaitRate         = attribute.Key("bulkhead.wait.rate")
	keyDecisionDuration = attribute.Key("bulkhead.decision_duration")
	keyRetryAfter       = attribute.Key("bulkhead.retry_after")
	keyHeld             = attribute.Key("bulkhead.release.held_tokens")
	keyRefunded         = attribute.Key("bulkhead.release.refunded_tokens")
	keyAbandonCause     = attribute.Key("bulkhead.abandon.cause")
	keyError            = attribute.Key("bulkhead.error")
)

// UsageAttributes returns u in the generative AI conventions' names, for a
// span of your own: gen_ai.usage.input_tokens and
// gen_ai.usage.output_tokens, and the parts of them that are cache reads,
// cache writes and reasoning (gen_ai.usage.cache_read.input_tokens,
// gen_ai.usage.cache_creation.input_tokens,
// gen_ai.usage.reasoning.output_tokens) when not zero. A nil u has none.
func UsageAttributes(u *bulkhead.Usage) []attribute.KeyValue {
	if u == nil {
		return nil
	}
	attrs := []attribute.KeyValue{genAIUsageInput.Int64(u.Input), genAIUsageOutput.Int64(u.Output)}
	if u.CachedInput > 0 {
		attrs = append(attrs, genAIUsageCacheRead.Int64(u.CachedInput))
	}
	if u.CacheCreation > 0 {
		attrs = append(attrs, genAIUsageCacheCreation.Int64(u.CacheCreation))
	}
	if u.Reasoning > 0 {
		attrs = append(attrs, genAIUsageReasoning.Int64(u.Reasoning))
	}
	return attrs
}

// timingAttributes returns a decision's waits and the bulkhead's own time
// on it, in seconds.
func timingAttributes(t bulkhead.Timing) []attribute.KeyValue {
	return []attribute.KeyValue{
		keyWaitQueue.Float64(t.QueueWait.Seconds()),
		keyWaitRate.Float64(t.RateWait.Seconds()),
		keyDecisionDuration.Float64(t.DecisionDuration.Seconds()),
	}
}

// appendLogValue appends v, a value as the bulkhead logs it, as attributes
// named key and, for a group, key.<member>...: numbers and booleans as
// such, durations in seconds, times in RFC 3339 form.
func appendLogValue(attrs []attribute.KeyValue, key string, v slog.Value) []attribute.KeyValue {
	v = v.Resolve()
	k := attribute.Key(key)
	switch v.Kind() {
	case slog.KindGroup:
		for _, a := range v.Group() {
			attrs = appendLogValue(attrs, key+"."+a.Key, a.Value)
		}
		return attrs
	case slog.KindInt64:
		return append(attrs, k.Int64(v.Int64()))
	case slog.KindUint64:
		return append(attrs, k.Int64(int64(v.Uint64())))
	case slog.KindFloat64:
		return append(attrs, k.Float64(v.Float64()))
	case slog.KindBool:
		return append(attrs, k.Bool(v.Bool()))
	case slog.KindDuration:
		return append(attrs, k.Float64(v.Duration().Seconds()))
	case slog.KindTime:
		return append(attrs, k.String(v.Time().Format(time.RFC3339Nano)))
	}
	return append(attrs, k.String(v.String()))
}
