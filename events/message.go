package events

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Headers set from the event's aggregate fields. They win over an event
// header of the same name.
const (
	HeaderAggregateType = "x-aggregate-type"
	HeaderAggregateID   = "x-aggregate-id"
)

// ContentType is the content type of a message body in FormatPlain and
// FormatCloudEventsBinary, and the datacontenttype of the envelope's data
// in FormatCloudEventsStructured.
const ContentType = "application/json"

// maxShortString is AMQP's limit for a short string: a routing key, a
// header name, or the message_id property.
const maxShortString = 255

// maxHeaderDepth bounds nested header tables.
const maxHeaderDepth = 16

// Message is an event as the broker carries it; see docs/message-contract.md.
type Message struct {
	// ID is the event _id as a string (an ObjectID as 24 hex digits): the
	// AMQP message_id, and the key consumers deduplicate on.
	ID string
	// Type is the event type: the routing key and the AMQP type property.
	Type string
	// Timestamp is the event's createdAt.
	Timestamp time.Time
	// Headers are the AMQP headers: x-aggregate-type, x-aggregate-id and
	// x-aggregate-sequence when set, and the event's own headers.
	Headers map[string]any
	// Body is the payload as relaxed Extended JSON, or in
	// FormatCloudEventsStructured the CloudEvents envelope holding it.
	Body []byte
	// ContentType is the AMQP content type: ContentType, or
	// ContentTypeCloudEvents in FormatCloudEventsStructured. Empty means
	// ContentType.
	ContentType string
	// TraceDropped says that the event's trace context was not valid and
	// was left out, so the message is sent without one, or that its
	// tracestate alone was not valid, or too long, and was left out or
	// cut.
	TraceDropped bool
}

// InvalidError says why a stored document cannot become a message. Such an
// event is poison: retrying cannot help, so it goes to FAILED at once.
type InvalidError struct {
	// Field is what is at fault: a top-level field ("payload"), a path
	// into the headers ("headers.tenant", "headers.tags[1]"), or
	// FieldDocument when the bytes are not a BSON document.
	Field string
	// Reason completes the sentence "field <Field> ...".
	Reason string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid event: field %q %s", e.Field, e.Reason)
}

// FieldDocument is the InvalidError.Field of a document that is not valid
// BSON at all (truncated, bad lengths, garbage), so no one field is to blame.
const FieldDocument = "_document"

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// NewMessage turns a stored event document into the message that carries
// it, in FormatPlain. A document that breaks the contract gets an
// *InvalidError naming the field, or FieldDocument when doc is not valid
// BSON. maxBodyBytes bounds the body; zero means no bound. NewMessage
// never panics, whatever doc holds. Format.NewMessage makes the messages
// of the other formats from this one.
func NewMessage(doc bson.Raw, maxBodyBytes int) (Message, error) {
	// The driver's value accessors panic on malformed bytes, and a corrupt
	// document would otherwise be reported as a missing _id. Validate is
	// shallow, so the code below still reads every value with an OK accessor.
	if err := doc.Validate(); err != nil {
		return Message{}, invalid(FieldDocument, "is not valid BSON: %v", err)
	}
	var m Message
	var err error
	if m.ID, err = messageID(doc); err != nil {
		return Message{}, err
	}
	if m.Type, err = eventType(doc); err != nil {
		return Message{}, err
	}
	if m.Timestamp, err = createdAt(doc); err != nil {
		return Message{}, err
	}
	if m.Headers, err = messageHeaders(doc); err != nil {
		return Message{}, err
	}
	m.Headers, m.TraceDropped = withTraceContext(m.Headers, doc)
	m.ContentType = ContentType
	if m.Body, err = body(doc, maxBodyBytes); err != nil {
		return Message{}, err
	}
	return m, nil
}

// withTraceContext sets the traceparent and tracestate headers to the
// trace context the message carries: the event's stored one when the
// event has one, or else the one its own headers hold, checked alike
// (TraceContext.Clean). The two are never mixed: with a stored context,
// the headers' values go, even when the stored one is not valid. A
// context that is not valid (or not strings) is left out, and a bad
// tracestate alone, never fatal: dropped reports either.
func withTraceContext(headers map[string]any, doc bson.Raw) (_ map[string]any, dropped bool) {
	tc, present, ok := storedTraceContext(doc)
	if !present {
		tc, present, ok = headerTraceContext(headers)
	}
	if !present {
		return headers, false
	}
	delete(headers, FieldTraceParent)
	delete(headers, FieldTraceState)
	clean, valid := tc.Clean()
	if !ok || !valid {
		return headers, true
	}
	if headers == nil {
		headers = map[string]any{}
	}
	headers[FieldTraceParent] = clean.Parent
	if clean.State != "" {
		headers[FieldTraceState] = clean.State
	}
	return headers, clean.State != tc.State
}

// storedTraceContext returns the event's trace context fields: present
// when it has either, ok when those it has are strings.
func storedTraceContext(doc bson.Raw) (tc TraceContext, present, ok bool) {
	parent, errParent := doc.LookupErr(FieldTraceParent)
	state, errState := doc.LookupErr(FieldTraceState)
	if errParent != nil && errState != nil {
		return TraceContext{}, false, false
	}
	var okParent, okState bool
	tc.Parent, okParent = parent.StringValueOK()
	tc.State, okState = state.StringValueOK()
	return tc, true, okParent && (errState != nil || okState)
}

// headerTraceContext returns the trace context among the event's own
// headers, like storedTraceContext.
func headerTraceContext(headers map[string]any) (tc TraceContext, present, ok bool) {
	parent, hasParent := headers[FieldTraceParent]
	state, hasState := headers[FieldTraceState]
	if !hasParent && !hasState {
		return TraceContext{}, false, false
	}
	var okParent, okState bool
	tc.Parent, okParent = parent.(string)
	tc.State, okState = state.(string)
	return tc, true, okParent && (!hasState || okState)
}

func messageID(doc bson.Raw) (string, error) {
	v, err := doc.LookupErr(FieldID)
	if err != nil {
		return "", invalid(FieldID, "is missing")
	}
	switch v.Type {
	case bson.TypeObjectID:
		id, ok := v.ObjectIDOK()
		if !ok {
			return "", malformed(FieldID, v)
		}
		return id.Hex(), nil
	case bson.TypeString:
		s, ok := v.StringValueOK()
		switch {
		case !ok:
			return "", malformed(FieldID, v)
		case s == "":
			return "", invalid(FieldID, "is an empty string")
		case len(s) > maxShortString:
			return "", invalid(FieldID, "is %d bytes; an AMQP message_id holds at most %d", len(s), maxShortString)
		}
		return s, nil
	default:
		return "", invalid(FieldID, "must be an ObjectId or a string, got %s", v.Type)
	}
}

func eventType(doc bson.Raw) (string, error) {
	v, err := doc.LookupErr(FieldType)
	if err != nil {
		return "", invalid(FieldType, "is missing")
	}
	s, ok := v.StringValueOK()
	switch {
	case !ok && v.Type == bson.TypeString:
		return "", malformed(FieldType, v)
	case !ok:
		return "", invalid(FieldType, "must be a string, got %s", v.Type)
	case s == "":
		return "", invalid(FieldType, "is empty")
	case len(s) > maxShortString:
		return "", invalid(FieldType, "is %d bytes; a routing key holds at most %d", len(s), maxShortString)
	}
	return s, nil
}

func createdAt(doc bson.Raw) (time.Time, error) {
	v, err := doc.LookupErr(FieldCreatedAt)
	if err != nil {
		return time.Time{}, invalid(FieldCreatedAt, "is missing")
	}
	dt, ok := v.DateTimeOK()
	if !ok && v.Type == bson.TypeDateTime {
		return time.Time{}, malformed(FieldCreatedAt, v)
	}
	if !ok {
		return time.Time{}, invalid(FieldCreatedAt, "must be a date, got %s", v.Type)
	}
	return time.UnixMilli(dt).UTC(), nil
}

func body(doc bson.Raw, maxBytes int) ([]byte, error) {
	payload, err := payloadDocument(doc)
	if err != nil {
		return nil, err
	}
	b, err := appendPayloadJSON(make([]byte, 0, jsonSizeHint(len(payload))), payload)
	if err != nil {
		return nil, err
	}
	if maxBytes > 0 && len(b) > maxBytes {
		return nil, invalid(FieldPayload, "is %d bytes as JSON; the broker takes at most %d", len(b), maxBytes)
	}
	return b, nil
}

// payloadDocument returns the event's payload, which must be a document.
func payloadDocument(doc bson.Raw) (bson.Raw, error) {
	v, err := doc.LookupErr(FieldPayload)
	if err != nil {
		return nil, invalid(FieldPayload, "is missing")
	}
	payload, ok := v.DocumentOK()
	if !ok && v.Type == bson.TypeEmbeddedDocument {
		return nil, malformed(FieldPayload, v)
	}
	if !ok {
		return nil, invalid(FieldPayload, "must be a document, got %s", v.Type)
	}
	return payload, nil
}

// appendPayloadJSON appends payload, a document, as relaxed Extended JSON.
func appendPayloadJSON(dst []byte, payload bson.Raw) ([]byte, error) {
	if b, ok := appendJSON(dst, payload); ok {
		return b, nil
	}
	// appendJSON left dst[:len(dst)] as it was.
	b, err := bson.MarshalExtJSON(payload, false, false)
	if err != nil {
		return nil, invalid(FieldPayload, "cannot be written as JSON: %v", err)
	}
	if len(dst) == 0 {
		return b, nil
	}
	return append(dst, b...), nil
}

// jsonSizeHint is room for the JSON of a BSON document of n bytes: JSON
// drops the lengths and type bytes and adds quotes, colons and commas, so
// a document of strings comes out a little smaller than its BSON.
func jsonSizeHint(n int) int { return n + n/8 + 16 }

func messageHeaders(doc bson.Raw) (map[string]any, error) {
	headers := map[string]any{}
	if v, err := doc.LookupErr(FieldHeaders); err == nil && v.Type != bson.TypeNull {
		d, ok := v.DocumentOK()
		if !ok && v.Type == bson.TypeEmbeddedDocument {
			return nil, malformed(FieldHeaders, v)
		}
		if !ok {
			return nil, invalid(FieldHeaders, "must be a document, got %s", v.Type)
		}
		t, err := headerTable(FieldHeaders, d, 0)
		if err != nil {
			return nil, err
		}
		headers = t
	}
	// A slice, not a map: a document with both fields wrong must name the
	// same field on every attempt.
	for _, f := range []struct{ field, header string }{
		{FieldAggregateType, HeaderAggregateType},
		{FieldAggregateID, HeaderAggregateID},
	} {
		field, header := f.field, f.header
		v, err := doc.LookupErr(field)
		if err != nil || v.Type == bson.TypeNull {
			continue
		}
		s, ok := v.StringValueOK()
		if !ok && v.Type == bson.TypeString {
			return nil, malformed(field, v)
		}
		if !ok {
			return nil, invalid(field, "must be a string, got %s", v.Type)
		}
		if s != "" {
			headers[header] = s
		}
	}
	n, ok, err := Sequence(doc)
	if err != nil {
		return nil, err
	}
	if ok {
		headers[HeaderSequence] = n
	}
	if len(headers) == 0 {
		return nil, nil
	}
	return headers, nil
}

func headerTable(path string, d bson.Raw, depth int) (map[string]any, error) {
	if depth > maxHeaderDepth {
		return nil, invalid(path, "nests deeper than %d levels", maxHeaderDepth)
	}
	elems, err := d.Elements()
	if err != nil {
		return nil, invalid(path, "is not a valid document: %v", err)
	}
	t := make(map[string]any, len(elems))
	for _, e := range elems {
		key := e.Key()
		if len(key) > maxShortString {
			return nil, invalid(path, "has a key of %d bytes; AMQP allows %d", len(key), maxShortString)
		}
		if owner, ok := BrokerHeader(key); ok && depth == 0 {
			// Consumers take these as the broker's own word (a delivery
			// count, a death record): a producer must not be able to forge
			// them. See brokerheaders.go.
			return nil, invalid(path+"."+key, "is a header RabbitMQ sets itself (%s); an event must not carry it", owner)
		}
		if depth == 0 && routingHeaders[key] && e.Value().Type != bson.TypeArray {
			// RabbitMQ reads CC and BCC as extra routing keys and closes the
			// channel over any other type: refuse it here rather than cost a
			// reconnect and an isolation to find it.
			return nil, invalid(path+"."+key, "must be an array of routing keys, got %s; RabbitMQ closes the channel over any other type", e.Value().Type)
		}
		v, err := headerValue(path+"."+key, e.Value(), depth)
		if err != nil {
			return nil, err
		}
		t[key] = v
	}
	return t, nil
}

// routingHeaders are the top-level headers RabbitMQ routes by (sender-selected
// distribution): they must be arrays.
var routingHeaders = map[string]bool{"CC": true, "BCC": true}

// headerValue maps a BSON value to a Go value an AMQP table can carry, or
// says which header RabbitMQ could not carry.
func headerValue(path string, v bson.RawValue, depth int) (any, error) {
	var (
		out any
		ok  bool
	)
	switch v.Type {
	case bson.TypeString:
		out, ok = v.StringValueOK()
	case bson.TypeInt32:
		out, ok = v.Int32OK()
	case bson.TypeInt64:
		out, ok = v.Int64OK()
	case bson.TypeDouble:
		out, ok = v.DoubleOK()
	case bson.TypeBoolean:
		out, ok = v.BooleanOK()
	case bson.TypeDateTime:
		var ms int64
		ms, ok = v.DateTimeOK()
		out = time.UnixMilli(ms).UTC()
	case bson.TypeNull:
		out, ok = nil, true
	case bson.TypeObjectID:
		var id bson.ObjectID
		id, ok = v.ObjectIDOK()
		out = id.Hex()
	case bson.TypeDecimal128:
		var d bson.Decimal128
		d, ok = v.Decimal128OK()
		out = d.String()
	case bson.TypeBinary:
		_, out, ok = v.BinaryOK()
	case bson.TypeEmbeddedDocument:
		d, ok := v.DocumentOK()
		if !ok {
			return nil, malformed(path, v)
		}
		return headerTable(path, d, depth+1)
	case bson.TypeArray:
		a, ok := v.ArrayOK()
		if !ok {
			return nil, malformed(path, v)
		}
		return headerArray(path, a, depth+1)
	default:
		return nil, invalid(path, "is a %s, which an AMQP header cannot carry", v.Type)
	}
	if !ok {
		return nil, malformed(path, v)
	}
	return out, nil
}

// malformed reports a value whose type is right but whose bytes are not,
// which the shallow Validate in NewMessage lets through.
func malformed(field string, v bson.RawValue) *InvalidError {
	return invalid(field, "is a malformed %s", v.Type)
}

func headerArray(path string, a bson.RawArray, depth int) ([]any, error) {
	if depth > maxHeaderDepth {
		return nil, invalid(path, "nests deeper than %d levels", maxHeaderDepth)
	}
	vals, err := a.Values()
	if err != nil {
		return nil, invalid(path, "is not a valid array: %v", err)
	}
	out := make([]any, len(vals))
	for i, v := range vals {
		if out[i], err = headerValue(fmt.Sprintf("%s[%d]", path, i), v, depth); err != nil {
			return nil, err
		}
	}
	return out, nil
}
