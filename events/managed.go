package events

import (
	"fmt"
	"math"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// MaxDocumentBytes is MongoDB's limit on one stored document.
const MaxDocumentBytes = 16 << 20

// ManagedReserveBytes is the room a document must leave under
// MaxDocumentBytes for what the worker adds to it over its life, besides
// the worker id itself: the claim's status, processingAt, claimToken and
// attempts (about 90 bytes), then publishedAt, or a lastError (which the
// store cuts to 1 KiB), retryAt and failedAt, rounded up to 2 KiB; and
// the attempt history, AttemptErrorsKept entries of at most
// attemptMaxBytes each.
const ManagedReserveBytes = 2<<10 + AttemptErrorsKept*attemptMaxBytes

// Managed is what CheckManaged read of the fields the worker manages.
type Managed struct {
	// Attempts is the stored attempt count; 0 when absent or null.
	Attempts int
	// AttemptsNull reports attempts stored as null: absent for every
	// purpose, but a $inc cannot apply to it, so the claim sets it instead.
	AttemptsNull bool
}

// CheckManaged checks the fields the worker manages on a stored event
// before a claim writes to them: attempts must be a whole number of 0 or
// more (a 32- or 64-bit integer, or a double without a fraction),
// processingAt and retryAt dates, claimToken and workerId strings, and a
// partition, where stored, the one the event's key hashes to, and
// parked and aggregateType as CheckLane says. A field stored as null
// counts as absent: the claim overwrites it. Any other type
// gets an *InvalidError naming the field, the type found and the type
// expected; the event cannot be claimed, since the claim's own update
// would fail on it, and goes to FAILED. CheckManaged never panics.
func CheckManaged(doc bson.Raw) (Managed, error) {
	var m Managed
	if err := doc.Validate(); err != nil {
		return m, invalid(FieldDocument, "is not valid BSON: %v", err)
	}
	for _, f := range []struct {
		name string
		want bson.Type
		desc string
	}{
		{FieldProcessingAt, bson.TypeDateTime, "a date"},
		{FieldRetryAt, bson.TypeDateTime, "a date"},
		{FieldClaimToken, bson.TypeString, "a string"},
		{FieldWorkerID, bson.TypeString, "a string"},
	} {
		v, err := doc.LookupErr(f.name)
		if err != nil || v.Type == bson.TypeNull || v.Type == f.want {
			continue
		}
		return m, managedInvalid(f.name, f.desc, typeName(v.Type))
	}
	if err := CheckLane(doc); err != nil {
		return m, err
	}
	v, err := doc.LookupErr(FieldAttempts)
	if err != nil {
		return m, nil
	}
	const want = "a whole number of 0 or more"
	switch v.Type {
	case bson.TypeNull:
		m.AttemptsNull = true
		return m, nil
	case bson.TypeInt32, bson.TypeInt64:
		n, ok := v.AsInt64OK()
		if !ok {
			return m, managedInvalid(FieldAttempts, want, "an unreadable "+typeName(v.Type))
		}
		if n < 0 {
			return m, managedInvalid(FieldAttempts, want, fmt.Sprint(n))
		}
		m.Attempts = int(min(n, math.MaxInt32))
		return m, nil
	case bson.TypeDouble:
		f, ok := v.DoubleOK()
		if !ok {
			return m, managedInvalid(FieldAttempts, want, "an unreadable double")
		}
		// 2^53 bounds the doubles that hold every whole number exactly.
		if math.IsNaN(f) || f < 0 || f != math.Trunc(f) || f > 1<<53 {
			return m, managedInvalid(FieldAttempts, want, fmt.Sprintf("double %v", f))
		}
		m.Attempts = int(min(f, math.MaxInt32))
		return m, nil
	default:
		return m, managedInvalid(FieldAttempts, want, typeName(v.Type))
	}
}

func managedInvalid(field, want, got string) *InvalidError {
	return invalid(field, "must be %s, got %s; the worker manages this field", want, got)
}

// typeName names a BSON type as an operator would search for it.
func typeName(t bson.Type) string {
	switch t {
	case bson.TypeDouble:
		return "double"
	case bson.TypeString:
		return "string"
	case bson.TypeEmbeddedDocument:
		return "object"
	case bson.TypeArray:
		return "array"
	case bson.TypeBinary:
		return "binary"
	case bson.TypeObjectID:
		return "objectId"
	case bson.TypeBoolean:
		return "bool"
	case bson.TypeDateTime:
		return "date"
	case bson.TypeNull:
		return "null"
	case bson.TypeRegex:
		return "regex"
	case bson.TypeInt32:
		return "int"
	case bson.TypeTimestamp:
		return "timestamp"
	case bson.TypeInt64:
		return "long"
	case bson.TypeDecimal128:
		return "decimal"
	default:
		return fmt.Sprintf("BSON type 0x%02x", byte(t))
	}
}

// CheckSize reports a document of size bytes that leaves less than reserve
// bytes under MaxDocumentBytes: the worker's own writes to it would push
// it over the limit and fail. reserve is ManagedReserveBytes plus the
// worker id's length.
func CheckSize(size, reserve int) error {
	if size+reserve <= MaxDocumentBytes {
		return nil
	}
	return invalid(FieldDocument, "is %d bytes: with the %d bytes the worker adds it would pass the %d-byte document limit",
		size, reserve, MaxDocumentBytes)
}

// CheckLane checks the fields that place an event in a claim's lane and
// in the parked aggregates: a stored partition the one its key hashes to
// (StoredPartition); parked, where stored, true (the worker writes it,
// and takes it out by removing it: any other value would leave the event
// outside every lane and never unparked); and an aggregateType without a
// NUL byte (the ordering key joins aggregateType and aggregateId with
// one, and a parked aggregate is found again by cutting the key there).
// A claim takes an event that fails it whatever holds its key, and fails
// it with the *InvalidError (CheckManaged), never parks it.
func CheckLane(doc bson.Raw) error {
	if _, _, err := StoredPartition(doc); err != nil {
		return err
	}
	if v, err := doc.LookupErr(FieldParked); err == nil && v.Type != bson.TypeNull {
		if b, ok := v.BooleanOK(); !ok || !b {
			got := typeName(v.Type)
			if ok {
				got = "false"
			}
			return managedInvalid(FieldParked, "true or absent", got)
		}
	}
	if typ, ok := stringBytes(doc.Lookup(FieldAggregateType)); ok && slices.Contains(typ, 0) {
		return invalid(FieldAggregateType, "must not contain a NUL byte: the ordering key joins aggregateType and aggregateId with one")
	}
	return nil
}
