package mongo_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestPublishChartNotDrawnOnALargeFerretDB: on FerretDB, which would
// decode every PUBLISHED event to count the last hour's, the chart is
// drawn only while the outbox is small; past the bound PublishedPerMinute
// says why instead of reading the history.
func TestPublishChartNotDrawnOnALargeFerretDB(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, id := range []string{"a", "b", "c"} {
		insert(t, coll, ev(id, events.StatusPublished, now.Add(-time.Minute), field(events.FieldPublishedAt, now.Add(-time.Minute))))
	}
	if !mongo.IsFerretDB(s) {
		t.Skip("the bound is FerretDB's: MongoDB counts from its index")
	}
	mongo.SetPublishChartMax(s, 2)
	if _, err := s.PublishedPerMinute(t.Context(), now.Add(-5*time.Minute), now); !errors.Is(err, mongo.ErrNoPublishChart) {
		t.Errorf("PublishedPerMinute over 3 events, bound 2 = %v, want ErrNoPublishChart", err)
	}
	other, coll2 := setup(t)
	insert(t, coll2, ev("a", events.StatusPublished, now.Add(-time.Minute), field(events.FieldPublishedAt, now.Add(-time.Minute))))
	mongo.SetPublishChartMax(other, 2)
	counts, err := other.PublishedPerMinute(t.Context(), now.Add(-5*time.Minute), now)
	if err != nil || counts[4] != 1 {
		t.Errorf("PublishedPerMinute over 1 event, bound 2 = %v, %v; want it drawn", counts, err)
	}
}
