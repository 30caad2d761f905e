package events

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// withStructuredMode turns m, a plain message, into CloudEvents'
// structured content mode: its body becomes the data of the JSON
// envelope that holds the event's attributes, and its content type
// ContentTypeCloudEvents. An envelope longer than maxBytes (0: no bound)
// makes the event poison.
func withStructuredMode(doc bson.Raw, m Message, source string, maxBytes int) (Message, error) {
	ce, err := newCloudEvent(doc, m, source)
	if err != nil {
		return Message{}, err
	}
	if m.Body, err = envelope(ce, m.Body, maxBytes); err != nil {
		return Message{}, err
	}
	m.ContentType = ContentTypeCloudEvents
	dropForgedAttributes(m.Headers)
	return m, nil
}

// dropForgedAttributes deletes the event headers that a binary-mode
// reader would take for an attribute the relay owns, under any of the
// bindings' prefixes and in any case, as binary mode does: some readers
// look at the headers before the content type, and a header must not
// contradict the envelope.
func dropForgedAttributes(headers map[string]any) {
	for name := range headers {
		for _, p := range [...]string{PrefixAMQP, PrefixAMQPColon, PrefixKnative} {
			if len(name) > len(p) && strings.EqualFold(name[:len(p)], p) && owned(name[len(p):]) {
				delete(headers, name)
				break
			}
		}
	}
}

// envelope returns the CloudEvents JSON envelope of ce with data, a JSON
// document, as its data, or an *InvalidError when the envelope is longer
// than maxBytes (0: no bound).
func envelope(ce cloudEvent, data []byte, maxBytes int) ([]byte, error) {
	b := make([]byte, 0, 256+len(ce.id)+len(ce.source)+len(ce.typ)+len(ce.subject)+len(ce.sequence)+
		len(ce.trace.Parent)+len(ce.trace.State)+len(data))
	b = appendMember(b, '{', ceSpecVersion, CloudEventsSpecVersion)
	b = appendMember(b, ',', ceID, ce.id)
	b = appendMember(b, ',', ceSource, ce.source)
	b = appendMember(b, ',', ceType, ce.typ)
	b = append(b, `,"`+ceTime+`":"`...)
	b = ce.time.AppendFormat(b, ceTimeLayout)
	b = append(b, '"')
	if ce.subject != "" {
		b = appendMember(b, ',', ceSubject, ce.subject)
	}
	if ce.sequence != "" {
		b = appendMember(b, ',', ceSequence, ce.sequence)
	}
	b = appendMember(b, ',', ceDataContentType, ContentType)
	if ce.trace.Parent != "" {
		b = appendMember(b, ',', ceTraceParent, ce.trace.Parent)
		if ce.trace.State != "" {
			b = appendMember(b, ',', ceTraceState, ce.trace.State)
		}
	}
	b = append(b, `,"data":`...)
	b = append(b, data...)
	b = append(b, '}')
	if maxBytes > 0 && len(b) > maxBytes {
		return nil, invalid(FieldPayload, "is %d bytes as JSON, in a CloudEvents envelope of %d bytes; the broker takes at most %d",
			len(data), len(b), maxBytes)
	}
	return b, nil
}

// appendMember appends sep and the JSON member "name":"value".
func appendMember(dst []byte, sep byte, name, value string) []byte {
	dst = append(dst, sep, '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return appendJSONString(dst, []byte(value))
}
