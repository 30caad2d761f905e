package console_test

import (
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// oddID is an event id a producer may write: a slash, a query, a
// fragment and a shell command.
const oddID = `a/b?c#d'; touch /tmp/pwned #`

// TestIDsAreEscaped: an id reaches a link and a form's action as one path
// segment, the page of that path shows the event, and the CLI command
// the page prints takes it as one argument.
func TestIDsAreEscaped(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	doc, err := bson.Marshal(bson.D{{Key: "_id", Value: oddID}, {Key: "type", Value: "t"}, {Key: "status", Value: "FAILED"}, {Key: "createdAt", Value: now}})
	if err != nil {
		t.Fatal(err)
	}
	store.docs = []bson.Raw{doc}
	escaped := url.PathEscape(oddID)
	_, body, _ := get(t, srv, "/outbox/events?status=FAILED")
	if !strings.Contains(body, `href="/outbox/events/`+escaped+`"`) {
		t.Errorf("the events list does not link %q as one path segment %q", oddID, escaped)
	}
	code, body, _ := get(t, srv, "/outbox/events/"+escaped)
	if code != http.StatusOK {
		t.Fatalf("GET the event's own link = %d", code)
	}
	quoted := template.HTMLEscapeString(`worker requeue --id 'a/b?c#d'\''; touch /tmp/pwned #'`)
	if !strings.Contains(body, quoted) {
		t.Errorf("the printed command does not quote the id as one shell word; want %s in the page", quoted)
	}
	wsrv, wstore := setupWrites(t)
	wstore.docs = []bson.Raw{doc}
	_, body, _ = request(t, wsrv, http.MethodGet, "/events/"+escaped, "ana", token, nil, nil)
	if !strings.Contains(body, `action="/events/`+escaped+`/requeue"`) || !strings.Contains(body, `action="/events/`+escaped+`/skip"`) {
		t.Errorf("the forms' actions do not carry the id as one path segment")
	}
}

// TestUnknownIsListed: the overview's unknown count links to a page that
// lists the events counted so.
func TestUnknownIsListed(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	_, body, _ := get(t, srv, "/outbox/")
	if !strings.Contains(body, `href="/outbox/events?status=unknown"`) {
		t.Fatal("the overview does not link the unknown count")
	}
	if code, body, _ := get(t, srv, "/outbox/events?status=unknown"); code != http.StatusOK {
		t.Errorf("the unknown events' page = %d: %s", code, body)
	}
	if store.query.Status != events.StatusUnknown {
		t.Errorf("query status = %q, want unknown", store.query.Status)
	}
}

// TestUnknownEventsAreRead: the store lists the events whose status is
// none of the four, and no other.
func TestUnknownEventsAreRead(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond)
	noStatus := mongotest.Event("none", events.StatusNew, at)
	noStatus = append(noStatus[:3], noStatus[4:]...)
	mongotest.Insert(t, store.Collection(), noStatus,
		mongotest.Event("lower", "new", at.Add(-time.Second)),
		mongotest.Event("ok", events.StatusNew, at), mongotest.Event("done", events.StatusPublished, at))
	docs, _, err := store.ListEvents(t.Context(), mongo.EventQuery{Status: events.StatusUnknown, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range docs {
		id, _ := d.Lookup("_id").StringValueOK()
		ids = append(ids, id)
	}
	if strings.Join(ids, ",") != "none,lower" {
		t.Errorf("unknown events = %v, want none and lower, newest first", ids)
	}
}
