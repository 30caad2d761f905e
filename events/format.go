package events

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Message formats: how a message carries its event (OUTBOX_MESSAGE_FORMAT).
const (
	// FormatPlain is the message contract's own form
	// (docs/message-contract.md): the payload as the body, the event's
	// fields as properties and x-aggregate-* headers.
	FormatPlain = "plain"
	// FormatCloudEventsBinary is FormatPlain plus the CloudEvents 1.0
	// attributes as ce- headers: CloudEvents' binary content mode, as
	// AMQP 0-9-1 clients commonly write it (the spec binds only AMQP
	// 1.0). The body and content type stay as in FormatPlain.
	FormatCloudEventsBinary = "cloudevents-binary"
	// FormatCloudEventsStructured sends the CloudEvents JSON envelope,
	// content type application/cloudevents+json, with the payload as its
	// data: CloudEvents' structured content mode. Properties and headers
	// stay as in FormatPlain.
	FormatCloudEventsStructured = "cloudevents-structured"
)

// ContentTypeCloudEvents is the content type of a message in
// FormatCloudEventsStructured.
const ContentTypeCloudEvents = "application/cloudevents+json"

// CloudEventsSpecVersion is the specversion of every CloudEvent.
const CloudEventsSpecVersion = "1.0"

// The CloudEvents attributes a message carries, as ce- headers in binary
// mode and as members of the envelope in structured mode. traceparent and
// tracestate are the distributed tracing extension: the producer's stored
// trace context, the start of the event's trace.
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

// HeaderPrefixCloudEvents prefixes every CloudEvents attribute among the
// headers of a message in FormatCloudEventsBinary.
const HeaderPrefixCloudEvents = "ce-"

// ownedAttributes are the attributes the relay sets (or leaves out) in
// binary mode: an event header ce-<name>, in any case, never reaches the
// message, so that a producer cannot forge or contradict them. An event
// without an aggregateId has no subject, not one from its headers.
// datacontenttype is the content_type property in binary mode.
var ownedAttributes = [...]string{ceSpecVersion, ceID, ceSource, ceType, ceTime, ceSubject,
	ceDataContentType, ceTraceParent, ceTraceState}

// Format is how messages carry their events: FormatPlain, the message
// contract's own form, or one of the CloudEvents 1.0 content modes. The
// zero value is FormatPlain.
type Format struct {
	// Name is FormatPlain, FormatCloudEventsBinary or
	// FormatCloudEventsStructured. Defaults to FormatPlain.
	Name string
	// Source is the CloudEvents source attribute of every message: a
	// non-empty URI-reference (RFC 3986) of printable ASCII, e.g.
	// "/outbox/outbox/events". source and id identify an event, so one
	// outbox's events share one source. Required by the CloudEvents
	// formats; unused by FormatPlain.
	Source string
}

// ErrInvalidFormat is wrapped by every error Format.Validate returns.
var ErrInvalidFormat = errors.New("invalid message format")

// Validate reports a Name that is not a format, or a Source that a
// CloudEvents format cannot use.
func (f Format) Validate() error {
	switch f.Name {
	case "", FormatPlain:
		return nil
	case FormatCloudEventsBinary, FormatCloudEventsStructured:
		if err := CheckCloudEventsSource(f.Source); err != nil {
			return fmt.Errorf("%w: source %q: %v", ErrInvalidFormat, f.Source, err)
		}
		return nil
	default:
		return fmt.Errorf("%w: name %q: want %s, %s or %s", ErrInvalidFormat, f.Name,
			FormatPlain, FormatCloudEventsBinary, FormatCloudEventsStructured)
	}
}

// CheckCloudEventsSource reports why source cannot be a CloudEvents
// source attribute: it must be a non-empty URI-reference (RFC 3986), so
// only printable ASCII from the URI's character set, with every % the
// start of an escape.
func CheckCloudEventsSource(source string) error {
	if source == "" {
		return errors.New("must not be empty")
	}
	for i := 0; i < len(source); i++ {
		c := source[i]
		switch {
		case c == '%':
			if i+2 >= len(source) || !isHex(source[i+1]) || !isHex(source[i+2]) {
				return fmt.Errorf("has a %% at byte %d that does not start an escape such as %%20", i)
			}
		case c >= utf8.RuneSelf || c < ' ':
			return fmt.Errorf("has the byte 0x%02x at byte %d; a URI-reference is printable ASCII, anything else escaped (RFC 3986)", c, i)
		case !uriChar(c):
			return fmt.Errorf("has %q at byte %d, which a URI-reference must escape (RFC 3986)", c, i)
		}
	}
	if _, err := url.Parse(source); err != nil {
		return errors.New("is not a URI-reference (RFC 3986)")
	}
	return nil
}

// uriChar reports whether c may appear in a URI-reference unescaped: an
// unreserved or a reserved character of RFC 3986.
func uriChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~:/?#[]@!$&'()*+,;=", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// DefaultCloudEventsSource is the source the worker gives the events of
// collection coll in database db when none is configured:
// "/outbox/<db>/<coll>", each name escaped as a path segment.
func DefaultCloudEventsSource(db, coll string) string {
	return "/outbox/" + url.PathEscape(db) + "/" + url.PathEscape(coll)
}

// NewMessage turns a stored event document into the message that carries
// it in format f; see the package function NewMessage, which is
// FormatPlain. In the CloudEvents formats a document is also poison when
// an attribute made of it breaks the CloudEvents rules for strings
// (control characters, Unicode noncharacters, invalid UTF-8) or times
// (years 0 to 9999), and maxBodyBytes bounds the whole envelope in
// FormatCloudEventsStructured. f must be valid (Validate).
func (f Format) NewMessage(doc bson.Raw, maxBodyBytes int) (Message, error) {
	return newMessage(doc, maxBodyBytes, f.Name, f.Source)
}

// cloudEvent holds the attributes of the CloudEvent a message carries.
type cloudEvent struct {
	id, source, typ, subject string
	time                     time.Time
	trace                    TraceContext // the distributed tracing extension; zero: none
}

// newCloudEvent reads the attributes of m's CloudEvent: those of m, the
// aggregateId as subject and the stored trace context, checked against
// the CloudEvents rules.
func newCloudEvent(doc bson.Raw, m *Message, source string) (cloudEvent, error) {
	ce := cloudEvent{id: m.ID, source: source, typ: m.Type, time: m.Timestamp}
	if id, err := doc.LookupErr(FieldID); err == nil && id.Type == bson.TypeString {
		if err := checkCloudEventsString(FieldID, "id", ce.id); err != nil {
			return cloudEvent{}, err
		}
	}
	if err := checkCloudEventsString(FieldType, "type", ce.typ); err != nil {
		return cloudEvent{}, err
	}
	if y := ce.time.Year(); y < 0 || y > 9999 {
		return cloudEvent{}, invalid(FieldCreatedAt, "is in the year %d; a CloudEvents time (RFC 3339) holds the years 0 to 9999", y)
	}
	// messageHeaders has checked the field's type.
	if v, err := doc.LookupErr(FieldAggregateID); err == nil {
		if s, ok := v.StringValueOK(); ok && s != "" {
			if err := checkCloudEventsString(FieldAggregateID, "subject", s); err != nil {
				return cloudEvent{}, err
			}
			ce.subject = s
		}
	}
	ce.trace, _ = storedTraceContext(doc)
	return ce, nil
}

// checkCloudEventsString reports, as poison, a value of field that the
// CloudEvents attribute attr cannot hold: the spec's String is valid
// Unicode without control characters (U+0000 to U+001F, U+007F to
// U+009F) and noncharacters.
func checkCloudEventsString(field, attr, s string) error {
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

// ceTimeLayout writes a CloudEvents time: RFC 3339 in UTC, with the
// milliseconds of createdAt when it has any.
const ceTimeLayout = time.RFC3339Nano

// withCloudEventsHeaders adds ce's attributes to headers as ce- headers
// (binary mode), after removing any event header of an attribute the
// relay owns.
func withCloudEventsHeaders(headers map[string]any, ce cloudEvent) map[string]any {
	if headers == nil {
		headers = make(map[string]any, 8)
	}
	for k := range headers {
		if ownedAttribute(k) {
			delete(headers, k)
		}
	}
	headers[HeaderPrefixCloudEvents+ceSpecVersion] = CloudEventsSpecVersion
	headers[HeaderPrefixCloudEvents+ceID] = ce.id
	headers[HeaderPrefixCloudEvents+ceSource] = ce.source
	headers[HeaderPrefixCloudEvents+ceType] = ce.typ
	headers[HeaderPrefixCloudEvents+ceTime] = ce.time.Format(ceTimeLayout)
	if ce.subject != "" {
		headers[HeaderPrefixCloudEvents+ceSubject] = ce.subject
	}
	if ce.trace.Parent != "" {
		headers[HeaderPrefixCloudEvents+ceTraceParent] = ce.trace.Parent
		if ce.trace.State != "" {
			headers[HeaderPrefixCloudEvents+ceTraceState] = ce.trace.State
		}
	}
	return headers
}

// ownedAttribute reports whether name is "ce-" and an attribute the relay
// owns, in any case.
func ownedAttribute(name string) bool {
	if len(name) <= len(HeaderPrefixCloudEvents) || !strings.EqualFold(name[:len(HeaderPrefixCloudEvents)], HeaderPrefixCloudEvents) {
		return false
	}
	attr := name[len(HeaderPrefixCloudEvents):]
	for _, a := range ownedAttributes {
		if strings.EqualFold(attr, a) {
			return true
		}
	}
	return false
}

// envelope returns the CloudEvents JSON envelope of ce (structured mode)
// with payload, the payload document, as its data, or an *InvalidError
// when the envelope is longer than maxBytes (0: no bound).
func envelope(ce cloudEvent, payload bson.Raw, maxBytes int) ([]byte, error) {
	b := make([]byte, 0, 256+len(ce.id)+len(ce.source)+len(ce.typ)+len(ce.subject)+
		len(ce.trace.Parent)+len(ce.trace.State)+jsonSizeHint(len(payload)))
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
	b = appendMember(b, ',', ceDataContentType, ContentType)
	if ce.trace.Parent != "" {
		b = appendMember(b, ',', ceTraceParent, ce.trace.Parent)
		if ce.trace.State != "" {
			b = appendMember(b, ',', ceTraceState, ce.trace.State)
		}
	}
	b = append(b, `,"data":`...)
	head := len(b)
	b, err := appendPayloadJSON(b, payload)
	if err != nil {
		return nil, err
	}
	b = append(b, '}')
	if maxBytes > 0 && len(b) > maxBytes {
		return nil, invalid(FieldPayload, "is %d bytes as JSON, in a CloudEvents envelope of %d bytes; the broker takes at most %d",
			len(b)-head-1, len(b), maxBytes)
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
