package events

import (
	"encoding/base64"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ownedAttributes are the attributes the relay sets (or leaves out) in
// binary mode. An event header that the binding's readers take for one of
// them never reaches the message, so that a producer cannot forge or
// contradict them: an event without an aggregateId has no subject, not
// one from its headers. datacontenttype is the content_type property.
var ownedAttributes = [...]string{ceSpecVersion, ceID, ceSource, ceType, ceTime, ceSubject,
	ceDataContentType, ceTraceParent, ceTraceState, ceSequence}

// withBinaryMode turns m, a plain message, into CloudEvents' binary
// content mode: the attributes join its headers, each named prefix plus
// the attribute. Every value is the attribute's canonical string, which
// the AMQP binding allows besides its native types (and the time needs:
// an AMQP 0-9-1 timestamp holds whole seconds), and Knative's RabbitMQ
// binding takes as RabbitMQ carries it, without the HTTP binding's
// percent-encoding. The event's own headers are checked as the prefix's
// readers will read them (checkExtension). With the AMQP binding's
// prefixes the attributes also go in HeaderAMQP10AppProperties, for AMQP
// 1.0 consumers of RabbitMQ 3.x.
func withBinaryMode(doc bson.Raw, m Message, source, prefix string) (Message, error) {
	ce, err := newCloudEvent(doc, m, source)
	if err != nil {
		return Message{}, err
	}
	if m.Headers == nil {
		m.Headers = make(map[string]any, 8)
	}
	var bad *InvalidError // the first by name, so that every attempt names the same
	for name, v := range m.Headers {
		attr, ok := readAs(prefix, name)
		switch {
		case !ok:
		case owned(attr):
			delete(m.Headers, name)
		default:
			if err := checkExtension(prefix, name, attr, v); err != nil && (bad == nil || err.Field < bad.Field) {
				bad = err
				continue
			}
			m.Headers[name] = canonical(v)
		}
	}
	if bad != nil {
		return Message{}, bad
	}
	m.Headers[prefix+ceSpecVersion] = CloudEventsSpecVersion
	m.Headers[prefix+ceID] = ce.id
	m.Headers[prefix+ceSource] = ce.source
	m.Headers[prefix+ceType] = ce.typ
	m.Headers[prefix+ceTime] = ce.time.Format(ceTimeLayout)
	if ce.subject != "" {
		m.Headers[prefix+ceSubject] = ce.subject
	}
	if ce.sequence != "" {
		m.Headers[prefix+ceSequence] = ce.sequence
	}
	if ce.trace.Parent != "" {
		m.Headers[prefix+ceTraceParent] = ce.trace.Parent
		if ce.trace.State != "" {
			m.Headers[prefix+ceTraceState] = ce.trace.State
		}
	}
	if prefix != PrefixKnative {
		m.Headers[HeaderAMQP10AppProperties] = amqp10AppProperties(m.Headers, prefix)
	}
	return m, nil
}

// canonical is an extension's value as the message carries it: a Binary
// and a Timestamp as their canonical strings (Base64, RFC 3339), which
// CloudEvents allows for every type, because AMQP 0-9-1 has neither (a
// header's byte array is no AMQP 1.0 binary to RabbitMQ's plugins, and its
// timestamp holds whole seconds); other values as they are.
func canonical(v any) any {
	switch v := v.(type) {
	case []byte:
		return base64.StdEncoding.EncodeToString(v)
	case time.Time:
		return v.UTC().Format(ceTimeLayout)
	default:
		return v
	}
}

// readAs returns the attribute name that the readers of prefix take the
// header name for, and false when they take it for no attribute.
//
// The AMQP binding's readers take the names that start with either of its
// prefixes: the Java SDK's Spring AMQP reader takes both, in any case,
// and the binding asks consumers to understand both. Knative's RabbitMQ
// binding reads every header but those starting with "x-" and the
// traceparent and tracestate headers, lower-cased and without "ce-": to
// it, "Type", "ce-type" and "CE-TYPE" all name the type, and "tenant" an
// extension.
func readAs(prefix, name string) (string, bool) {
	if prefix != PrefixKnative {
		for _, p := range [...]string{PrefixAMQP, PrefixAMQPColon} {
			if len(name) > len(p) && strings.EqualFold(name[:len(p)], p) {
				return name[len(p):], true
			}
		}
		return "", false
	}
	if name == FieldTraceParent || name == FieldTraceState {
		return "", false
	}
	lower := strings.ToLower(name)
	if strings.HasPrefix(lower, "x-") {
		return "", false
	}
	if lower == "content-type" {
		return ceDataContentType, true
	}
	return strings.TrimPrefix(lower, PrefixKnative), true
}

// owned reports whether attr names an attribute the relay owns, in any
// case.
func owned(attr string) bool {
	for _, a := range ownedAttributes {
		if strings.EqualFold(attr, a) {
			return true
		}
	}
	return false
}

// checkExtension reports, as poison, the event header name that the
// readers of prefix take for the extension attr when no reader can take
// it: CloudEvents 1.0.2 names are lower-case letters and digits (sdk-go
// rejects the whole event over "tenant_id"), and through the AMQP
// binding the value keeps its type, which must be one of CloudEvents'.
// Knative's readers take any value as the string it prints as.
func checkExtension(prefix, name, attr string, v any) *InvalidError {
	path := FieldHeaders + "." + name
	if prefix != PrefixKnative && !strings.HasPrefix(name, prefix) {
		return invalid(path, "is read as the CloudEvents extension %q, but spells the prefix otherwise than %q: the AMQP binding has a message name all its attributes with one prefix",
			attr, prefix)
	}
	if !isAttributeName(attr) {
		return invalid(path, "is read as the CloudEvents extension %q (prefix %q), but CloudEvents names are lower-case letters and digits only, and readers reject the whole event; rename the header, or use another prefix",
			attr, prefix)
	}
	switch attr {
	case ceData:
		return invalid(path, `is read as the CloudEvents attribute "data" (prefix %q), but "data" is the event's data, which no attribute may name; rename the header`, prefix)
	case ceDataSchema:
		s, ok := v.(string)
		if !ok {
			return invalid(path, "is a %s, but the CloudEvents attribute dataschema is an absolute URI (RFC 3986), a string", headerKind(v))
		}
		if err := checkAbsoluteURI(s); err != nil {
			return invalid(path, "is read as the CloudEvents attribute dataschema, an absolute URI (RFC 3986), but %v", err)
		}
	}
	if s, ok := v.(string); ok {
		return cloudEventsStringError(path, attr, s)
	}
	if prefix == PrefixKnative {
		return nil
	}
	switch v := v.(type) {
	case bool, int32, []byte, time.Time:
		return nil
	case int64:
		if math.MinInt32 <= v && v <= math.MaxInt32 {
			return nil
		}
		return invalid(path, "is %d, which the CloudEvents extension %s cannot hold: a CloudEvents integer is 32 bits", v, attr)
	default:
		return invalid(path, "is a %s, which the CloudEvents extension %s cannot hold: its types are strings, booleans, 32-bit integers, binary and timestamps",
			headerKind(v), attr)
	}
}

// checkAbsoluteURI reports why s is not an absolute URI (RFC 3986): a
// URI-reference with a scheme.
func checkAbsoluteURI(s string) error {
	if err := CheckCloudEventsSource(s); err != nil {
		return err
	}
	if u, err := url.Parse(s); err != nil || u.Scheme == "" {
		return fmt.Errorf("%q has no scheme", s)
	}
	return nil
}

// isAttributeName reports whether s is a CloudEvents attribute name:
// lower-case ASCII letters and digits, at least one.
func isAttributeName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// headerKind names the kind of a header value as headerValue made it.
func headerKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case float64:
		return "double"
	case map[string]any:
		return "document"
	case []any:
		return "array"
	default:
		return fmt.Sprintf("%T", v)
	}
}
