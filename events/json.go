package events

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// jsonMaxDepth bounds the nesting appendJSON follows itself; a payload
// nested deeper goes to the driver.
const jsonMaxDepth = 64

// appendJSON appends the relaxed Extended JSON of doc, a BSON document, to
// dst: byte for byte what bson.MarshalExtJSON(doc, false, false) writes,
// for the types producers write (strings, numbers, booleans, null, dates,
// ObjectIDs, documents and arrays of them). ok is false, and dst unusable,
// when doc holds another type, is nested deeper than jsonMaxDepth, or is
// not well-formed: the caller then asks the driver, which writes every
// type and says what is wrong with a document. The driver's encoder
// spends most of a message's CPU and allocations on reflection and a
// reader per value; this costs one append per piece.
func appendJSON(dst, doc []byte) (out []byte, ok bool) {
	return appendJSONDocument(dst, doc, false, 0)
}

// appendJSONDocument appends doc, which must be exactly one BSON document
// (its length, elements, and terminator), as a JSON object, or as a JSON
// array of its values when array.
func appendJSONDocument(dst, doc []byte, array bool, depth int) ([]byte, bool) {
	if depth > jsonMaxDepth || len(doc) < 5 || int64(int32(binary.LittleEndian.Uint32(doc))) != int64(len(doc)) || doc[len(doc)-1] != 0 {
		return dst, false
	}
	open, closing := byte('{'), byte('}')
	if array {
		open, closing = '[', ']'
	}
	dst = append(dst, open)
	rest := doc[4 : len(doc)-1]
	for first := true; len(rest) > 0; first = false {
		typ := rest[0]
		end := bytes.IndexByte(rest[1:], 0)
		if end < 0 {
			return dst, false
		}
		key := rest[1 : 1+end]
		rest = rest[2+end:]
		if !first {
			dst = append(dst, ',')
		}
		if !array {
			dst = appendJSONString(dst, key)
			dst = append(dst, ':')
		}
		var ok bool
		if dst, rest, ok = appendJSONValue(dst, typ, rest, depth); !ok {
			return dst, false
		}
	}
	return append(dst, closing), true
}

// BSON element types appendJSON writes.
const (
	bsonDouble   = 0x01
	bsonString   = 0x02
	bsonDocument = 0x03
	bsonArray    = 0x04
	bsonObjectID = 0x07
	bsonBoolean  = 0x08
	bsonDateTime = 0x09
	bsonNull     = 0x0A
	bsonInt32    = 0x10
	bsonInt64    = 0x12
)

// appendJSONValue appends the value of type typ at the start of src and
// returns what follows it.
func appendJSONValue(dst []byte, typ byte, src []byte, depth int) (out, rest []byte, ok bool) {
	switch typ {
	case bsonDouble:
		if len(src) < 8 {
			return dst, nil, false
		}
		return appendJSONDouble(dst, math.Float64frombits(binary.LittleEndian.Uint64(src))), src[8:], true
	case bsonString:
		if len(src) < 4 {
			return dst, nil, false
		}
		n := int64(int32(binary.LittleEndian.Uint32(src)))
		if n < 1 || n > int64(len(src)-4) || src[4+n-1] != 0 {
			return dst, nil, false
		}
		return appendJSONString(dst, src[4:4+n-1]), src[4+n:], true
	case bsonDocument, bsonArray:
		if len(src) < 4 {
			return dst, nil, false
		}
		n := int64(int32(binary.LittleEndian.Uint32(src)))
		if n < 5 || n > int64(len(src)) {
			return dst, nil, false
		}
		dst, ok = appendJSONDocument(dst, src[:n], typ == bsonArray, depth+1)
		return dst, src[n:], ok
	case bsonObjectID:
		if len(src) < 12 {
			return dst, nil, false
		}
		dst = append(dst, `{"$oid":"`...)
		dst = hex.AppendEncode(dst, src[:12])
		return append(dst, `"}`...), src[12:], true
	case bsonBoolean:
		if len(src) < 1 || src[0] > 1 {
			return dst, nil, false
		}
		return strconv.AppendBool(dst, src[0] == 1), src[1:], true
	case bsonDateTime:
		if len(src) < 8 {
			return dst, nil, false
		}
		return appendJSONDate(dst, int64(binary.LittleEndian.Uint64(src))), src[8:], true
	case bsonNull:
		return append(dst, "null"...), src, true
	case bsonInt32:
		if len(src) < 4 {
			return dst, nil, false
		}
		return strconv.AppendInt(dst, int64(int32(binary.LittleEndian.Uint32(src))), 10), src[4:], true
	case bsonInt64:
		if len(src) < 8 {
			return dst, nil, false
		}
		return strconv.AppendInt(dst, int64(binary.LittleEndian.Uint64(src)), 10), src[8:], true
	default:
		return dst, nil, false
	}
}

// appendJSONDouble writes a double as relaxed Extended JSON does: the
// shortest decimal that reads back as the same number, with ".0" on an
// integral value so that it stays a double, and the three values JSON has
// no number for as $numberDouble strings.
func appendJSONDouble(dst []byte, f float64) []byte {
	switch {
	case math.IsInf(f, 1):
		return append(dst, `{"$numberDouble":"Infinity"}`...)
	case math.IsInf(f, -1):
		return append(dst, `{"$numberDouble":"-Infinity"}`...)
	case math.IsNaN(f):
		return append(dst, `{"$numberDouble":"NaN"}`...)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'G', -1, 64)
	if !bytes.ContainsAny(dst[start:], "E.") {
		dst = append(dst, ".0"...)
	}
	return dst
}

// jsonDateLayout is RFC 3339 with milliseconds, the trailing zeros of the
// fraction left out.
const jsonDateLayout = "2006-01-02T15:04:05.999Z07:00"

// appendJSONDate writes a BSON date (milliseconds since the epoch) as
// relaxed Extended JSON does: an RFC 3339 string in UTC for the years 1970
// to 9999, and the milliseconds as a $numberLong string otherwise.
func appendJSONDate(dst []byte, ms int64) []byte {
	t := time.Unix(ms/1e3, ms%1e3*1e6).UTC()
	if y := t.Year(); y < 1970 || y > 9999 {
		dst = append(dst, `{"$date":{"$numberLong":"`...)
		dst = strconv.AppendInt(dst, ms, 10)
		return append(dst, `"}}`...)
	}
	dst = append(dst, `{"$date":"`...)
	dst = t.AppendFormat(dst, jsonDateLayout)
	return append(dst, `"}`...)
}

// appendJSONString writes s as a JSON string the way the driver does with
// HTML escaping off: '"' and '\' behind a backslash; \n, \r, \t, \b and \f
// as such and the other control characters as \u00XX; each byte that is
// not part of valid UTF-8 as \ufffd; U+2028 and U+2029 escaped, as
// JavaScript reads them as line ends; everything else as it is.
func appendJSONString(dst, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	from := 0 // s[from:i] is still to be copied as it is
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[from:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			from = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[from:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[from:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		from = i
	}
	dst = append(dst, s[from:]...)
	return append(dst, '"')
}
