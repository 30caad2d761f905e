package events

import (
	"encoding/binary"
	"slices"
	"strings"
	"time"
)

// HeaderAMQP10AppProperties is the header that RabbitMQ 3.x's AMQP 1.0
// plugin (rabbitmq_amqp1_0) turns into the application-properties of a
// message an AMQP 1.0 client receives: it holds that section, encoded as
// AMQP 1.0 writes it. The plugin maps no other AMQP 0-9-1 header there
// (3.10's rabbit_amqp1_0_message:annotated_message reads only this one),
// so without it an AMQP 1.0 consumer, such as sdk-go's AMQP binding, sees
// none of the binary mode's attributes. RabbitMQ 4 maps the headers
// themselves; this one it leaves aside.
const HeaderAMQP10AppProperties = "x-amqp-1.0-app-properties"

// AMQP 1.0 type codes (OASIS AMQP 1.0, part 1, section 1.6) of the values
// the section holds.
const (
	amqpDescribed     = 0x00
	amqpSmallULong    = 0x53
	amqpAppProperties = 0x74 // the descriptor of application-properties
	amqpMap32         = 0xd1
	amqpStr32         = 0xb1
	amqpVBin32        = 0xb0
	amqpTrue          = 0x41
	amqpFalse         = 0x42
	amqpLong          = 0x81
	amqpTimestamp     = 0x83
)

// amqp10AppProperties encodes the headers named with prefix, whose values
// checkExtension has let through and withBinaryMode has made strings,
// booleans or integers, as an AMQP 1.0 application-properties section,
// in the order of their names. An integer is an AMQP long, as the AMQP
// format of CloudEvents maps its Integer.
func amqp10AppProperties(headers map[string]any, prefix string) []byte {
	var names []string
	for name := range headers {
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	b := []byte{amqpDescribed, amqpSmallULong, amqpAppProperties, amqpMap32, 0, 0, 0, 0, 0, 0, 0, 0}
	for _, name := range names {
		b = appendAMQPString(b, name)
		b = appendAMQPValue(b, headers[name])
	}
	// map32: the size counts the count and the elements; the count, keys
	// and values both.
	binary.BigEndian.PutUint32(b[4:], uint32(len(b)-8))
	binary.BigEndian.PutUint32(b[8:], uint32(2*len(names)))
	return b
}

func appendAMQPString(b []byte, s string) []byte {
	b = append(b, amqpStr32)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendAMQPValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case string:
		return appendAMQPString(b, v)
	case bool:
		if v {
			return append(b, amqpTrue)
		}
		return append(b, amqpFalse)
	case int32:
		// The AMQP format of CloudEvents maps an Integer to an AMQP long,
		// whatever its size.
		return binary.BigEndian.AppendUint64(append(b, amqpLong), uint64(int64(v)))
	case int64:
		return binary.BigEndian.AppendUint64(append(b, amqpLong), uint64(v))
	case []byte:
		b = binary.BigEndian.AppendUint32(append(b, amqpVBin32), uint32(len(v)))
		return append(b, v...)
	case time.Time:
		return binary.BigEndian.AppendUint64(append(b, amqpTimestamp), uint64(v.UnixMilli()))
	default:
		// checkExtension lets no other type through; a string keeps the
		// section well formed should one slip by.
		return appendAMQPString(b, "")
	}
}
