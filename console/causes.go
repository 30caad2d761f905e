package console

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// groupFailures groups FAILED events by their stored cause and reason
// (mongo.Store.ClassifyFailed), largest group first; an event not
// classified yet is grouped by the cause computed here, and its group says
// so: its events are not selected by the group's link or action until
// they are classified.
func groupFailures(docs []bson.Raw) []FailureGroup {
	type key struct{ reason, cause string }
	groups := map[key]*FailureGroup{}
	for _, d := range docs {
		row := rowOf(d)
		k, classified := storedCause(d)
		if !classified {
			k = failureKey{reason: mongo.LastAttemptReason(d), cause: events.Cause(row.LastError)}
		}
		g := groups[key(k)]
		if g == nil {
			g = &FailureGroup{Reason: k.reason, Cause: k.cause, Example: row.ID, Latest: row.CreatedAt}
			groups[key(k)] = g
		}
		g.Count++
		if !classified {
			g.Unclassified++
		}
		if row.CreatedAt.After(g.Latest) {
			g.Latest, g.Example = row.CreatedAt, row.ID
		}
	}
	out := make([]FailureGroup, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b FailureGroup) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Cause, b.Cause))
	})
	return out
}

// failureKey is a failure group's reason and cause.
type failureKey struct{ reason, cause string }

// storedCause is an event's stored reason and cause, and whether it has
// them.
func storedCause(d bson.Raw) (failureKey, bool) {
	cause, ok := d.Lookup(events.FieldFailureCause).StringValueOK()
	if !ok {
		return failureKey{}, false
	}
	reason, _ := d.Lookup(events.FieldFailureReason).StringValueOK()
	return failureKey{reason: reason, cause: cause}, true
}

// pageMark is a mongo.PageMark as the events page's cursor carries it.
type pageMark struct {
	CreatedAt time.Time `bson:"c"`
	ID        any       `bson:"i"`
}

// encodeMark is the cursor of the page after mark: URL-safe, and opaque
// to the operator, who follows the page's link.
func encodeMark(mark mongo.PageMark) (string, error) {
	b, err := bson.Marshal(pageMark(mark))
	if err != nil {
		return "", fmt.Errorf("encode the next page's cursor: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeMark reads a cursor encodeMark wrote.
func decodeMark(s string) (*mongo.PageMark, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || bson.Raw(b).Validate() != nil {
		return nil, errors.New("not a cursor of this console; start from the first page")
	}
	var m pageMark
	if err := bson.Unmarshal(b, &m); err != nil || m.ID == nil {
		return nil, errors.New("not a cursor of this console; start from the first page")
	}
	return &mongo.PageMark{CreatedAt: m.CreatedAt, ID: m.ID}, nil
}
