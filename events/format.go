package events

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
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
	// attributes as headers named with Format.Prefix: CloudEvents' binary
	// content mode. The body and content type stay as in FormatPlain.
	FormatCloudEventsBinary = "cloudevents-binary"
	// FormatCloudEventsStructured sends the CloudEvents JSON envelope,
	// content type application/cloudevents+json, with the plain body as
	// its data: CloudEvents' structured content mode. Properties and
	// headers stay as in FormatPlain.
	FormatCloudEventsStructured = "cloudevents-structured"
)

// Prefixes of the CloudEvents attributes among the headers of a message
// in FormatCloudEventsBinary (OUTBOX_CLOUDEVENTS_PREFIX); each is the one
// a binding names, so that the readers of that binding find them.
const (
	// PrefixAMQP is the AMQP protocol binding's prefix in its working
	// draft after 1.0.2, which prefers it to PrefixAMQPColon for JMS
	// clients and selectors. The CloudEvents Java SDK's Spring AMQP
	// support (RabbitMQ over AMQP 0-9-1) reads and writes it. The default.
	PrefixAMQP = "cloudEvents_"
	// PrefixAMQPColon is the AMQP protocol binding 1.0.2's prefix, the one
	// sdk-go's AMQP binding reads.
	PrefixAMQPColon = "cloudEvents:"
	// PrefixKnative is the prefix of Knative's RabbitMQ protocol binding
	// (eventing-rabbitmq), the one its broker and source read. It is the
	// HTTP binding's prefix, but the values are not percent-encoded: the
	// RabbitMQ binding takes header values as RabbitMQ carries them.
	PrefixKnative = "ce-"
)

// ContentTypeCloudEvents is the content type of a message in
// FormatCloudEventsStructured.
const ContentTypeCloudEvents = "application/cloudevents+json"

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
	// Prefix names the attribute headers in FormatCloudEventsBinary:
	// PrefixAMQP, PrefixAMQPColon or PrefixKnative. Defaults to
	// PrefixAMQP; unused by the other formats.
	Prefix string
}

// ErrInvalidFormat is wrapped by every error Format.Validate returns.
var ErrInvalidFormat = errors.New("invalid message format")

// Validate reports a Name that is not a format, a Source that a
// CloudEvents format cannot use, or a Prefix that is not one of the
// bindings'.
func (f Format) Validate() error {
	switch f.Name {
	case "", FormatPlain:
		return nil
	case FormatCloudEventsBinary, FormatCloudEventsStructured:
		if err := CheckCloudEventsSource(f.Source); err != nil {
			return fmt.Errorf("%w: source %q: %v", ErrInvalidFormat, f.Source, err)
		}
		switch f.Prefix {
		case "", PrefixAMQP, PrefixAMQPColon, PrefixKnative:
			return nil
		}
		return fmt.Errorf("%w: prefix %q: want %s, %s or %s", ErrInvalidFormat, f.Prefix,
			PrefixAMQP, PrefixAMQPColon, PrefixKnative)
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
// it in format f, in layers: the plain message first (the package
// function NewMessage, with all of the contract's checks), then what the
// CloudEvents mode adds to it: headers in binary mode (binary.go), the
// envelope around the body in structured mode (structured.go). In those
// modes a document is also poison when an attribute made of it breaks
// the CloudEvents rules (cloudevent.go), and maxBodyBytes bounds the
// whole envelope in structured mode. f must be valid (Validate).
func (f Format) NewMessage(doc bson.Raw, maxBodyBytes int) (Message, error) {
	switch f.Name {
	case FormatCloudEventsBinary:
		m, err := NewMessage(doc, maxBodyBytes)
		if err != nil {
			return Message{}, err
		}
		return withBinaryMode(doc, m, f.Source, f.prefix())
	case FormatCloudEventsStructured:
		// The envelope, not the payload alone, must fit the bound.
		m, err := NewMessage(doc, 0)
		if err != nil {
			return Message{}, err
		}
		return withStructuredMode(doc, m, f.Source, maxBodyBytes)
	default:
		return NewMessage(doc, maxBodyBytes)
	}
}

// prefix is f.Prefix or its default.
func (f Format) prefix() string {
	if f.Prefix == "" {
		return PrefixAMQP
	}
	return f.Prefix
}
