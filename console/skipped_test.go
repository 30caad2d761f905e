package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// TestRequeueOfASkippedEventIsConfirmed: the page of a skipped event
// says it is skipped and how many later events of its aggregate are
// already published (a requeue publishes it after them), and its
// requeue needs an explicit confirmation.
func TestRequeueOfASkippedEventIsConfirmed(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	agg := []bson.E{{Key: events.FieldAggregateType, Value: "order"}, {Key: events.FieldAggregateID, Value: "o-1"}}
	mongotest.Insert(t, store.Collection(),
		noRoute("skipped-1", at, append(agg, bson.E{Key: events.FieldSkippedAt, Value: at}, bson.E{Key: events.FieldSkippedBy, Value: "bo"})...),
		mongotest.Event("later-1", events.StatusPublished, at.Add(time.Minute), agg...),
		mongotest.Event("later-2", events.StatusPublished, at.Add(2*time.Minute), agg...),
		mongotest.Event("earlier", events.StatusPublished, at.Add(-time.Minute), agg...),
		mongotest.Event("other-aggregate", events.StatusPublished, at.Add(time.Minute)),
	)
	c := realConsole(t, store, nil, 100)
	page := serve(t.Context(), c, http.MethodGet, "/events/skipped-1", nil).Body.String()
	if !strings.Contains(page, "2 later events of its aggregate") || !strings.Contains(page, `name="confirm"`) {
		t.Errorf("the skipped event's page does not say 2 later events of its aggregate are published, or asks no confirmation:\n%s", page)
	}
	if rec := serve(t.Context(), c, http.MethodPost, "/events/skipped-1/requeue", url.Values{"reason": {"fixed"}}); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "skipped") {
		t.Errorf("a requeue of a skipped event without confirmation = %d, want 400 saying it is skipped", rec.Code)
	}
	if st := mongotest.Statuses(t, store.Collection())["skipped-1"]; st != events.StatusFailed {
		t.Fatalf("an unconfirmed requeue moved the skipped event to %s", st)
	}
	if rec := serve(t.Context(), c, http.MethodPost, "/events/skipped-1/requeue", url.Values{"reason": {"fixed"}, "confirm": {"skipped"}}); rec.Code != http.StatusSeeOther {
		t.Errorf("a confirmed requeue of a skipped event = %d, want 303", rec.Code)
	}
	if st := mongotest.Statuses(t, store.Collection())["skipped-1"]; st != events.StatusNew {
		t.Errorf("the confirmed requeue left the event %s, want NEW", st)
	}
	actions, err := store.Actions(t.Context(), 10)
	if err != nil || len(actions) != 1 || !strings.Contains(actions[0].Target, "skipped") {
		t.Errorf("audit = %+v, %v; want the requeue recorded as of a skipped event", actions, err)
	}
}
