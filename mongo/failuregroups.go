package mongo

import (
	"cmp"
	"context"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
)

// FailedPageMax is how many of the newest FAILED events FailureGroups
// keeps as they were read, for the first page of the FAILED list (a
// console's page is at most 500 events).
const FailedPageMax = 501

// FailureGroups groups the FAILED events that are not skipped, among the
// newest limit FAILED events, by their stored cause and reason, largest
// group first, as of now, storing first the cause of those that have
// none yet; it keeps the newest FailedPageMax as read, skipped ones
// too, for the first page of the FAILED list. It is the read the console
// keeps the failures page from, on a schedule (ops.SamplerConfig.Failures),
// not at each view: on MongoDB it reads the range of FAILED events it
// groups, on FerretDB it decodes every FAILED event once (and once more
// for each write of new causes). A cause that cannot be stored
// (read-only credentials) is computed here instead, and its group counts
// the event as unclassified.
func (s *Store) FailureGroups(ctx context.Context, now time.Time, limit int) (events.FailureGroups, error) {
	docs, capped, err := s.FailedSample(ctx, limit)
	if err != nil {
		return events.FailureGroups{}, err
	}
	var missing, grouped []bson.Raw
	for _, d := range docs {
		if _, skipped := d.Lookup(events.FieldSkippedAt).TimeOK(); skipped {
			continue
		}
		grouped = append(grouped, d)
		if _, ok := storedCause(d); !ok {
			missing = append(missing, d)
		}
	}
	stored := false
	if len(missing) > 0 {
		if _, err := s.storeCauses(ctx, missing); err != nil {
			if ctx.Err() != nil {
				return events.FailureGroups{}, err
			}
			s.logger.Warn("could not store the causes of FAILED events; they are grouped by the cause computed for them", "error", err)
		} else {
			stored = true
		}
	}
	newest := docs[:min(len(docs), FailedPageMax)]
	return events.FailureGroups{
		At: now, Groups: groupFailed(grouped, stored), Read: len(grouped), Capped: capped,
		Newest: newest, NewestAll: len(newest) == len(docs) && !capped,
	}, nil
}

// GroupFailed groups FAILED events (as FailedSample projects them) by
// their stored cause and reason, largest group first; an event not
// classified yet is grouped by the cause computed here, and its group
// counts it as unclassified.
func GroupFailed(docs []bson.Raw) []events.FailureGroup { return groupFailed(docs, false) }

// groupFailed is GroupFailed; with stored, the causes computed here were
// just stored, and their events count as classified.
func groupFailed(docs []bson.Raw, stored bool) []events.FailureGroup {
	groups := map[failureKey]*events.FailureGroup{}
	for _, d := range docs {
		k, classified := storedCause(d)
		if !classified {
			lastError, _ := d.Lookup(events.FieldLastError).StringValueOK()
			k = failureKey{reason: LastAttemptReason(d), cause: truncateError(events.Cause(lastError))}
			classified = stored
		}
		at, _ := d.Lookup(events.FieldCreatedAt).TimeOK()
		g := groups[k]
		if g == nil {
			g = &events.FailureGroup{Reason: k.reason, Cause: k.cause, Example: IDText(d.Lookup(events.FieldID)), Latest: at}
			groups[k] = g
		}
		g.Count++
		if !classified {
			g.Unclassified++
		}
		if at.After(g.Latest) {
			g.Latest, g.Example = at, IDText(d.Lookup(events.FieldID))
		}
	}
	out := make([]events.FailureGroup, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b events.FailureGroup) int {
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

// IDText is an _id as `worker show --id` and the message id take it:
// an ObjectID's hex, a string as it is, anything else as Extended JSON.
func IDText(v bson.RawValue) string {
	if oid, ok := v.ObjectIDOK(); ok {
		return oid.Hex()
	}
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	return v.String()
}
