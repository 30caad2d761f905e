package events

import (
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// CloudEventsSpecVersion is the specversion of every CloudEvent.
const CloudEventsSpecVersion = "1.0"

// The CloudEvents attributes a message carries, as headers in binary
// mode and as members of the envelope in structured mode. traceparent and
// tracestate are the distributed tracing extension: the trace context
// the message carries, the producer's.
const (
	ceSpecVersion     = "specversion"
	ceID              = "id"
	ceSource          = "source"
	ceType            = "type"
	ceTime            = "time"
	ceSubject         = "subject"
	ceDataContentType = "datacontenttype"
	ceTraceParent     = "traceparent"
	ceTraceState      = "tracestate"
)

// Names a header cannot give an extension: data is the event's data
// (structured mode's member, which no attribute may be named), and
// dataschema, an optional attribute of the core, is an absolute URI.
const (
	ceData       = "data"
	ceDataSchema = "dataschema"
)

// The sequence extension (ceSequence, in sequence.go) is the event's
// sequence, where it has one.

// ceTimeLayout writes a CloudEvents time: RFC 3339 in UTC, with the
// milliseconds of createdAt when it has any.
const ceTimeLayout = time.RFC3339Nano

// cloudEvent holds the attributes of the CloudEvent a message carries.
type cloudEvent struct {
	id, source, typ, subject string
	time                     time.Time
	sequence                 string       // the sequence extension; "": none
	trace                    TraceContext // the distributed tracing extension; zero: none
}

// newCloudEvent reads the attributes of the CloudEvent that m, a plain
// message, carries: those of m, the aggregateId as subject (an event
// without one has no subject, not one from its headers) and m's trace
// context, checked against the CloudEvents rules.
func newCloudEvent(doc bson.Raw, m Message, source string) (cloudEvent, error) {
	ce := cloudEvent{id: m.ID, source: source, typ: m.Type, time: m.Timestamp, trace: messageTrace(m.Headers)}
	if err := checkCloudEventsString(FieldID, "id", ce.id); err != nil {
		return cloudEvent{}, err
	}
	if err := checkCloudEventsString(FieldType, "type", ce.typ); err != nil {
		return cloudEvent{}, err
	}
	if y := ce.time.Year(); y < 0 || y > 9999 {
		return cloudEvent{}, invalid(FieldCreatedAt, "is in the year %d; a CloudEvents time (RFC 3339) holds the years 0 to 9999", y)
	}
	// NewMessage has checked the field's type.
	if s, _ := doc.Lookup(FieldAggregateID).StringValueOK(); s != "" {
		if err := checkCloudEventsString(FieldAggregateID, "subject", s); err != nil {
			return cloudEvent{}, err
		}
		ce.subject = s
	}
	if n, ok := m.Headers[HeaderSequence].(int64); ok {
		ce.sequence = sequenceString(n)
	}
	return ce, nil
}

// messageTrace is the trace context among a plain message's headers,
// which NewMessage has checked.
func messageTrace(headers map[string]any) TraceContext {
	parent, _ := headers[FieldTraceParent].(string)
	state, _ := headers[FieldTraceState].(string)
	return TraceContext{Parent: parent, State: state}
}

// checkCloudEventsString reports, as poison, a value of field that the
// CloudEvents attribute attr cannot hold (cloudEventsStringError).
func checkCloudEventsString(field, attr, s string) error {
	if err := cloudEventsStringError(field, attr, s); err != nil {
		return err
	}
	return nil
}

// cloudEventsStringError says why the CloudEvents attribute attr cannot
// hold s, the value of field, or is nil: the spec's String is valid
// Unicode without control characters (U+0000 to U+001F, U+007F to
// U+009F) and noncharacters.
func cloudEventsStringError(field, attr, s string) *InvalidError {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return invalid(field, "is not valid UTF-8 at byte %d; the CloudEvents attribute %s must be a Unicode string", i, attr)
		case r <= 0x1F || (0x7F <= r && r <= 0x9F):
			return invalid(field, "holds the control character %U at byte %d, which the CloudEvents attribute %s must not hold", r, i, attr)
		case (0xFDD0 <= r && r <= 0xFDEF) || r&0xFFFE == 0xFFFE:
			return invalid(field, "holds the Unicode noncharacter %U at byte %d, which the CloudEvents attribute %s must not hold", r, i, attr)
		}
	}
	return nil
}
