package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Field names of the event document. Producers write the first group; the
// worker manages the second.
const (
	FieldID            = "_id"
	FieldType          = "type"
	FieldAggregateType = "aggregateType"
	FieldAggregateID   = "aggregateId"
	FieldPayload       = "payload"
	FieldHeaders       = "headers"
	FieldStatus        = "status"
	FieldCreatedAt     = "createdAt"

	FieldWorkerID     = "workerId"
	FieldProcessingAt = "processingAt"
	FieldClaimToken   = "claimToken"
	FieldAttempts     = "attempts"
	FieldPublishedAt  = "publishedAt"
	FieldLastError    = "lastError"
	FieldRetryAt      = "retryAt"
	FieldFailedAt     = "failedAt"
	// The event's recent failed attempts, oldest first (AttemptError).
	FieldAttemptErrors = "attemptErrors"
	// An operator's skip of a FAILED event, so that later events of its
	// aggregate flow (worker skip).
	FieldSkippedBy  = "skippedBy"
	FieldSkippedAt  = "skippedAt"
	FieldSkipReason = "skipReason"
	// FieldSkipped is true beside skippedAt: an equality FerretDB pushes
	// down to PostgreSQL, so that a claim's read of the FAILED events that
	// hold their aggregates never decodes the skipped ones, which pile up
	// until an operator acts.
	FieldSkipped = "skipped"
	// An operator's discard of a FAILED event: a decision that it is never
	// to be published (worker discard). The event is kept, skipped, and
	// no requeue takes it back.
	FieldDiscardedBy   = "discardedBy"
	FieldDiscardedAt   = "discardedAt"
	FieldDiscardReason = "discardReason"
)

// Event is the stored outbox document, as the worker and its tools read it.
type Event struct {
	ID            any       `bson:"_id"` // bson.ObjectID or string
	Type          string    `bson:"type"`
	AggregateType string    `bson:"aggregateType,omitempty"`
	AggregateID   string    `bson:"aggregateId,omitempty"`
	Payload       bson.Raw  `bson:"payload"`
	Headers       bson.Raw  `bson:"headers,omitempty"`
	Status        Status    `bson:"status"`
	CreatedAt     time.Time `bson:"createdAt"`
	Delivery      `bson:",inline"`
}

// Delivery is what the worker records in an event of its delivery: which
// claim holds it, how many claims it has used, and how it ended. Producers
// never write these fields.
type Delivery struct {
	WorkerID     string    `bson:"workerId,omitempty"`
	ProcessingAt time.Time `bson:"processingAt,omitempty"`
	ClaimToken   string    `bson:"claimToken,omitempty"`
	Attempts     int       `bson:"attempts,omitempty"`
	PublishedAt  time.Time `bson:"publishedAt,omitempty"`
	LastError    string    `bson:"lastError,omitempty"`
	RetryAt      time.Time `bson:"retryAt,omitempty"`
	FailedAt     time.Time `bson:"failedAt,omitempty"`
	// AttemptErrors are the last AttemptErrorsKept failed attempts,
	// oldest first: why each failed, not only the last.
	AttemptErrors []AttemptError `bson:"attemptErrors,omitempty"`
	SkippedBy     string         `bson:"skippedBy,omitempty"`
	SkippedAt     time.Time      `bson:"skippedAt,omitempty"`
	SkipReason    string         `bson:"skipReason,omitempty"`
	DiscardedBy   string         `bson:"discardedBy,omitempty"`
	DiscardedAt   time.Time      `bson:"discardedAt,omitempty"`
	DiscardReason string         `bson:"discardReason,omitempty"`
}

// Draft is an event a producer wants to publish.
type Draft struct {
	// ID is the event's _id: a bson.ObjectID or a string. Defaults to a new
	// ObjectID. Consumers see it as the message_id, so a stable business
	// key here makes their deduplication simple.
	ID any
	// Type is the event type, e.g. "order.created". It is the routing key.
	Type string
	// AggregateType and AggregateID name the entity the event is about.
	// Optional; sent as the x-aggregate-type and x-aggregate-id headers.
	AggregateType string
	AggregateID   string
	// Payload is the message body: anything that marshals to a BSON
	// document (a struct, a map, bson.D). Required.
	Payload any
	// Headers are extra message headers. Optional.
	Headers map[string]any
	// Sequence is the aggregate's version after this change (0 or more),
	// written as the event's sequence: the events of an aggregate that
	// carry one are published in its order, whatever the clocks of the
	// producers that wrote them (docs/ordering.md). Optional; nil writes
	// none, and the event is ordered by createdAt.
	Sequence *int64
	// Trace is the W3C trace context the message carries on, so that its
	// consumers continue the producer's trace. Insert takes it from its
	// context when it is unset; one that is not Valid is left out.
	Trace TraceContext
}

// ErrInvalidDraft is wrapped by every error Draft.Document returns.
var ErrInvalidDraft = errors.New("invalid event draft")

// Document returns the NEW event document for d, created at now. It
// refuses a draft the worker could only mark FAILED, such as a header AMQP
// cannot carry; only the body size is left for the worker to check.
func (d Draft) Document(now time.Time) (bson.D, error) {
	if d.Type == "" {
		return nil, fmt.Errorf("%w: type is empty", ErrInvalidDraft)
	}
	if len(d.Type) > maxShortString {
		return nil, fmt.Errorf("%w: type is %d bytes; a routing key holds at most %d", ErrInvalidDraft, len(d.Type), maxShortString)
	}
	if d.Payload == nil {
		return nil, fmt.Errorf("%w: payload is missing", ErrInvalidDraft)
	}
	payload, err := bson.Marshal(d.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload must marshal to a document: %v", ErrInvalidDraft, err)
	}
	id := d.ID
	switch v := id.(type) {
	case nil:
		id = bson.NewObjectID()
	case string:
		if v == "" {
			return nil, fmt.Errorf("%w: id is an empty string", ErrInvalidDraft)
		}
		if len(v) > maxShortString {
			return nil, fmt.Errorf("%w: id is %d bytes; an AMQP message_id holds at most %d", ErrInvalidDraft, len(v), maxShortString)
		}
	case bson.ObjectID:
	default:
		return nil, fmt.Errorf("%w: id must be a bson.ObjectID or a string, got %T", ErrInvalidDraft, d.ID)
	}
	doc := bson.D{
		{Key: FieldID, Value: id},
		{Key: FieldType, Value: d.Type},
		{Key: FieldPayload, Value: bson.Raw(payload)},
		{Key: FieldStatus, Value: StatusNew},
		{Key: FieldCreatedAt, Value: now.UTC()},
	}
	if d.AggregateType != "" {
		doc = append(doc, bson.E{Key: FieldAggregateType, Value: d.AggregateType})
	}
	if d.AggregateID != "" {
		doc = append(doc, bson.E{Key: FieldAggregateID, Value: d.AggregateID})
	}
	if d.Sequence != nil {
		if *d.Sequence < 0 {
			return nil, fmt.Errorf("%w: sequence is %d; it must be 0 or more", ErrInvalidDraft, *d.Sequence)
		}
		doc = append(doc, bson.E{Key: FieldSequence, Value: *d.Sequence})
	}
	// The partition too, so that no claim has to store it (see FieldPartition).
	doc = append(doc, bson.E{Key: FieldPartition, Value: partitionValue(draftPartition(id, d.AggregateType, d.AggregateID))})
	if tc, ok := d.Trace.Clean(); ok {
		doc = append(doc, bson.E{Key: FieldTraceParent, Value: tc.Parent})
		if tc.State != "" {
			doc = append(doc, bson.E{Key: FieldTraceState, Value: tc.State})
		}
	}
	if len(d.Headers) > 0 {
		headers, err := bson.Marshal(d.Headers)
		if err != nil {
			return nil, fmt.Errorf("%w: headers must marshal to a document: %v", ErrInvalidDraft, err)
		}
		if _, err := headerTable(FieldHeaders, headers, 0); err != nil {
			var ie *InvalidError
			if errors.As(err, &ie) {
				return nil, fmt.Errorf("%w: %s %s", ErrInvalidDraft, ie.Field, ie.Reason)
			}
			return nil, fmt.Errorf("%w: %v", ErrInvalidDraft, err)
		}
		doc = append(doc, bson.E{Key: FieldHeaders, Value: bson.Raw(headers)})
	}
	return doc, nil
}

// Insert writes d to the outbox collection as a NEW event and returns its
// _id. Call it with the context of your own transaction (the one
// session.WithTransaction hands its callback) so the event commits or rolls
// back with your business data: that is the whole point of an outbox.
// Unless d.Trace is set, the event carries the trace context of ctx's span
// (OpenTelemetry), if any.
func Insert(ctx context.Context, coll *mongo.Collection, d Draft) (any, error) {
	if d.Trace == (TraceContext{}) {
		d.Trace = TraceContextFrom(ctx)
	}
	doc, err := d.Document(time.Now())
	if err != nil {
		return nil, err
	}
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		return nil, fmt.Errorf("insert event %q: %w", d.Type, err)
	}
	return doc[0].Value, nil
}
