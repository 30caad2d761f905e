package mongo

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// The reads of the operator console: pages of events, newest first, the
// FAILED events to group by cause, the held aggregates with their holders
// and the publish rate of the last hour. Each is a find or an aggregate
// with an equality on status, bounded by a limit, and carries a
// server-side time limit from ctx's deadline (see timedFind).

// EventQuery selects a page of events of one status, newest first.
type EventQuery struct {
	// Status is required; events.StatusUnknown lists the events whose
	// status is none of events.Statuses.
	Status events.Status
	// Type, AggregateID and ErrorText narrow the page: an equality on
	// type and on aggregateId, and a case-insensitive substring of
	// lastError. Empty: no condition.
	Type, AggregateID, ErrorText string
	// Group, when set, keeps the events of a failure group: their stored
	// cause and reason equal its own (Store.ClassifyFailed), and they are
	// not skipped.
	Group *Group
	// CreatedBefore keeps events created before it; zero: no bound.
	CreatedBefore time.Time
	// After is the last event of the previous page; nil for the first.
	After *PageMark
	// Limit is the most events of the page.
	Limit int
}

// PageMark is where a page of events ended: its last event's createdAt
// and _id.
type PageMark struct {
	CreatedAt time.Time
	ID        any
}

// ListEvents returns a page of events as stored (a document that does not
// decode as an events.Event is still listed), and the mark of the next
// page, nil on the last.
func (s *Store) ListEvents(ctx context.Context, q EventQuery) ([]bson.Raw, *PageMark, error) {
	if q.Status == "" || q.Limit <= 0 {
		return nil, nil, fmt.Errorf("list events: a status and a limit are required")
	}
	filter := bson.D{{Key: events.FieldStatus, Value: q.Status}}
	if q.Status == events.StatusUnknown {
		// The events counted as unknown: a status that is none of the
		// four, or none at all.
		filter = bson.D{{Key: events.FieldStatus, Value: bson.D{{Key: "$nin", Value: events.Statuses}}}}
	}
	if q.Type != "" {
		filter = append(filter, bson.E{Key: events.FieldType, Value: q.Type})
	}
	if q.AggregateID != "" {
		filter = append(filter, bson.E{Key: events.FieldAggregateID, Value: q.AggregateID})
	}
	if g := q.Group; g != nil {
		filter = append(filter, bson.E{Key: events.FieldFailureCause, Value: g.Cause},
			bson.E{Key: events.FieldFailureReason, Value: g.Reason}, bson.E{Key: events.FieldSkippedAt, Value: nil})
	}
	var and bson.A
	if q.ErrorText != "" {
		and = append(and, bson.D{{Key: events.FieldLastError, Value: bson.Regex{Pattern: regexp.QuoteMeta(q.ErrorText), Options: "i"}}})
	}
	if !q.CreatedBefore.IsZero() {
		and = append(and, bson.D{{Key: events.FieldCreatedAt, Value: bson.D{{Key: "$lt", Value: q.CreatedBefore}}}})
	}
	if q.After != nil {
		and = append(and, bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: events.FieldCreatedAt, Value: bson.D{{Key: "$lt", Value: q.After.CreatedAt}}}},
			bson.D{{Key: events.FieldCreatedAt, Value: q.After.CreatedAt}, {Key: events.FieldID, Value: bson.D{{Key: "$lt", Value: q.After.ID}}}},
		}}})
	}
	if len(and) > 0 {
		filter = append(filter, bson.E{Key: "$and", Value: and})
	}
	cur, err := s.timedFind(ctx, findCommand{
		filter: filter,
		sort:   bson.D{{Key: events.FieldCreatedAt, Value: -1}, {Key: events.FieldID, Value: -1}},
		limit:  q.Limit + 1,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list %s events: %w", q.Status, err)
	}
	docs, err := rawAll(ctx, cur)
	if err != nil {
		return nil, nil, fmt.Errorf("list %s events: %w", q.Status, err)
	}
	if len(docs) <= q.Limit {
		return docs, nil, nil
	}
	docs = docs[:q.Limit]
	last := docs[len(docs)-1]
	at, _ := last.Lookup(events.FieldCreatedAt).TimeOK()
	var id any
	if err := last.Lookup(events.FieldID).Unmarshal(&id); err != nil {
		return nil, nil, fmt.Errorf("list %s events: read the last _id: %w", q.Status, err)
	}
	return docs, &PageMark{CreatedAt: at, ID: id}, nil
}

// FailedSample returns up to limit FAILED events, skipped ones too,
// newest first, projected to what grouping them by cause needs (their
// stored cause and reason, and for one not classified yet its lastError
// and last attempt, or on FerretDB the whole history) and what a row of
// the FAILED list shows, and whether there were more.
func (s *Store) FailedSample(ctx context.Context, limit int) ([]bson.Raw, bool, error) {
	cur, err := s.timedFind(ctx, findCommand{
		filter: bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}},
		sort:   bson.D{{Key: events.FieldCreatedAt, Value: -1}, {Key: events.FieldID, Value: -1}},
		projection: bson.D{
			{Key: events.FieldFailureCause, Value: 1}, {Key: events.FieldFailureReason, Value: 1},
			{Key: events.FieldLastError, Value: 1}, {Key: events.FieldCreatedAt, Value: 1},
			{Key: events.FieldAttemptErrors, Value: lastAttemptProjection(s.ferret)},
			{Key: events.FieldType, Value: 1}, {Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
			{Key: events.FieldStatus, Value: 1}, {Key: events.FieldAttempts, Value: 1}, {Key: events.FieldRetryAt, Value: 1},
			{Key: events.FieldFailedAt, Value: 1}, {Key: events.FieldSkippedAt, Value: 1},
		},
		limit: limit + 1,
	})
	if err != nil {
		return nil, false, fmt.Errorf("read FAILED events: %w", err)
	}
	docs, err := rawAll(ctx, cur)
	if err != nil {
		return nil, false, fmt.Errorf("read FAILED events: %w", err)
	}
	if len(docs) > limit {
		return docs[:limit], true, nil
	}
	return docs, false, nil
}

// Holder is an event that holds its aggregate (events.Holder).
type Holder = events.Holder

// Holders returns up to limit events that hold their aggregates at now,
// FAILED ones first, then those backing off, then those of paused types,
// and whether there were more. Each aggregate is listed once, under its
// oldest holder. The events of paused types are found among the oldest
// NEW events, within the held count's window (heldWindow).
func (s *Store) Holders(ctx context.Context, now time.Time, failedHolds bool, limit int) ([]Holder, bool, error) {
	proj := bson.D{
		{Key: events.FieldType, Value: 1}, {Key: events.FieldAggregateType, Value: 1}, {Key: events.FieldAggregateID, Value: 1},
		{Key: events.FieldStatus, Value: 1}, {Key: events.FieldLastError, Value: 1}, {Key: events.FieldRetryAt, Value: 1},
		{Key: events.FieldFailedAt, Value: 1}, {Key: events.FieldCreatedAt, Value: 1}, {Key: events.FieldAttempts, Value: 1},
	}
	finds := holderFinds(now, failedHolds)
	for i := range finds {
		finds[i].sort = bson.D{{Key: events.FieldCreatedAt, Value: 1}}
		if finds[i].hint != "" {
			finds[i].sort = nil // the index's order; FerretDB sorts nothing it need not
		}
	}
	pauses, err := s.PausedTypes(ctx)
	if err != nil {
		return nil, false, err
	}
	paused := make(map[string]bool, len(pauses))
	for _, p := range pauses {
		paused[p.Type] = true
	}
	var out []Holder
	seen := map[string]bool{}
	more := false
	// add lists an aggregate once, under the first holder met.
	add := func(key string, doc bson.Raw) {
		switch {
		case seen[key]:
		case len(out) == limit:
			more = true
		default:
			seen[key] = true
			out = append(out, Holder{Key: key, Doc: doc})
		}
	}
	for _, q := range finds {
		q.projection, q.limit = proj, limit+1
		if _, err := s.eachKey(ctx, q, add); err != nil {
			return nil, false, err
		}
	}
	if len(paused) == 0 {
		return out, more, nil
	}
	// The events of paused types among the oldest NEW events, within the
	// window the held count reads too (heldWindow): a find filtered on the
	// type would walk every NEW event of the index to find a rare type's.
	_, err = s.eachKey(ctx, findCommand{
		filter: bson.D{{Key: events.FieldStatus, Value: events.StatusNew}},
		sort:   bson.D{{Key: events.FieldCreatedAt, Value: 1}}, hint: newByAgeIndex,
		projection: proj, limit: s.heldWindow,
	}, func(key string, doc bson.Raw) {
		if paused[typeOf(doc)] {
			add(key, doc)
		}
	})
	if err != nil {
		return nil, false, err
	}
	return out, more, nil
}

// rawAll reads every document of cur, each copied out of the cursor's
// buffer, and closes it.
func rawAll(ctx context.Context, cur *mongo.Cursor) ([]bson.Raw, error) {
	defer closeCursor(ctx, cur)
	var docs []bson.Raw
	for cur.Next(ctx) {
		docs = append(docs, append(bson.Raw(nil), cur.Current...))
	}
	return docs, cur.Err()
}

// LaterPublished counts, up to limit, the PUBLISHED events of an
// aggregate created after at: those a skipped event of it, requeued now,
// would be published after. Read through the console's
// outbox_browse_aggregate index ({status, aggregateId, createdAt}).
func (s *Store) LaterPublished(ctx context.Context, aggregateType, aggregateID string, at time.Time, limit int) (int, error) {
	q := bson.D{
		{Key: events.FieldStatus, Value: events.StatusPublished},
		{Key: events.FieldAggregateID, Value: aggregateID},
		{Key: events.FieldCreatedAt, Value: bson.D{{Key: "$gt", Value: at}}},
	}
	if aggregateType != "" {
		q = append(q, bson.E{Key: events.FieldAggregateType, Value: aggregateType})
	}
	n, err := s.coll.CountDocuments(ctx, q, options.Count().SetLimit(int64(limit)))
	if err != nil {
		return 0, fmt.Errorf("count the later published events of aggregate %q: %w", aggregateID, err)
	}
	return int(n), nil
}
