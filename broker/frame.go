package broker

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/events"
)

// frameOverhead is what a frame adds to its payload: type, channel and
// size before it, the frame-end octet after. frame_max counts it.
const frameOverhead = 8

// checkContentHeader reports, as poison, a message whose content header
// frame (its properties, headers table included) would not fit one frame
// of the connection's negotiated frame size. amqp091-go splits only the
// body into frames; it would send such a header as is, and the broker
// would close the whole connection with a FRAME_ERROR. frameMax 0 means
// unlimited.
func checkContentHeader(pub amqp.Publishing, frameMax int) error {
	size, err := contentHeaderSize(pub)
	if err != nil {
		return &events.InvalidError{Field: events.FieldHeaders, Reason: err.Error()}
	}
	if frameMax <= 0 {
		return nil
	}
	if limit := frameMax - frameOverhead; size > limit {
		return &events.InvalidError{Field: events.FieldHeaders, Reason: fmt.Sprintf(
			"with the message's other properties make an AMQP content header of %d bytes; "+
				"the broker's negotiated frame size of %d bytes holds at most %d", size, frameMax, limit)}
	}
	return nil
}

// contentHeaderSize returns the payload size of the content header frame
// amqp091-go writes for pub (write.go, headerFrame.write): class id,
// weight, body size and property flags, then each property that is set.
func contentHeaderSize(pub amqp.Publishing) (int, error) {
	n := 2 + 2 + 8 + 2
	for _, s := range [...]string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s) // shortstr
		}
	}
	if len(pub.Headers) > 0 {
		t, bad := tableSize(pub.Headers)
		if bad != nil {
			return 0, fmt.Errorf("hold a Go %T at %q, which an AMQP table cannot carry", bad.value, "headers"+bad.path)
		}
		n += t
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	return n, nil
}

// badField is a header value amqp091-go cannot encode, and where it is;
// the path is built only on the way out of an error, so that measuring
// costs no allocation.
type badField struct {
	path  string
	value any
}

// tableSize is a field table's encoded size: a 4-byte length, then per
// entry a shortstr name and a field value.
func tableSize(t amqp.Table) (int, *badField) {
	n := 4
	for k, v := range t {
		f, bad := fieldSize(v)
		if bad != nil {
			bad.path = "." + k + bad.path
			return 0, bad
		}
		n += 1 + len(k) + f
	}
	return n, nil
}

// fieldSize is a field value's encoded size, its type octet included,
// following amqp091-go's writeField.
func fieldSize(v any) (int, *badField) {
	switch v := v.(type) {
	case nil: // 'V'
		return 1, nil
	case bool, byte, int8: // 't', 'B', 'b'
		return 2, nil
	case int16, uint16: // 's', 'u'
		return 3, nil
	case int, int32, uint32, float32: // 'I' (an int is written as 32 bits), 'i', 'f'
		return 5, nil
	case amqp.Decimal: // 'D'
		return 6, nil
	case int64, float64, time.Time: // 'l', 'd', 'T'
		return 9, nil
	case string: // 'S' longstr
		return 5 + len(v), nil
	case []byte: // 'x'
		return 5 + len(v), nil
	case []any: // 'A': a 4-byte length, then the values
		n := 5
		for i, e := range v {
			f, bad := fieldSize(e)
			if bad != nil {
				bad.path = fmt.Sprintf("[%d]", i) + bad.path
				return 0, bad
			}
			n += f
		}
		return n, nil
	case amqp.Table: // 'F'
		t, bad := tableSize(v)
		return 1 + t, bad
	}
	return 0, &badField{value: v}
}
