package console_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// forgedSelection is what a signed-in writer could post as a preview's
// selection before previews were held by the console: base64 BSON whose
// ids are whatever it likes, here a regular expression.
func forgedSelection(t *testing.T, ids ...any) string {
	t.Helper()
	b, err := bson.Marshal(bson.D{{Key: "ids", Value: bson.A(ids)}})
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestPostedSelectionIsNotBelieved: an action acts on a preview the
// console holds, never on a selection the client posts. A selection
// whose element is a regular expression skipped every FAILED event with
// a string _id at once, past ActionMax.
func TestPostedSelectionIsNotBelieved(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	var docs []bson.D
	for i := range 5 {
		docs = append(docs, noRoute(fmt.Sprintf("f-%d", i), at.Add(time.Duration(i)*time.Second)))
	}
	mongotest.Insert(t, store.Collection(), docs...)
	c, err := console.New(console.Config{
		Store: store, Samples: samples{}, Writer: store, Token: token, ActionMax: 2,
		Archetype: service.Archetype{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/skip", "/requeue"} {
		form := url.Values{
			"selection": {forgedSelection(t, bson.Regex{Pattern: ".*"})},
			"target":    {"chosen by nobody"},
			"reason":    {"forged"},
		}
		if rec := serve(t.Context(), c, http.MethodPost, path, form); rec.Code == http.StatusSeeOther {
			t.Errorf("POST %s with a forged selection = %d, want it refused", path, rec.Code)
		}
	}
	n, err := store.Collection().CountDocuments(t.Context(), bson.D{{Key: events.FieldSkippedAt, Value: bson.D{{Key: "$exists", Value: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d events skipped by a posted regular expression (ActionMax 2), want 0", n)
	}
	for id, st := range mongotest.Statuses(t, store.Collection()) {
		if st != events.StatusFailed {
			t.Errorf("%s is %s after a forged requeue, want FAILED", id, st)
		}
	}
}

// TestPreviewIDsAreCappedBeforeAnyQuery: a preview of more ids than one
// action may touch is refused before the store is asked anything.
func TestPreviewIDsAreCappedBeforeAnyQuery(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	store.matching = 3
	srv := serveFake(t, store, console.Config{Token: token, ActionMax: 5}, true)
	q := url.Values{}
	for i := range 6 {
		q.Add("id", fmt.Sprintf("e-%d", i))
	}
	code, body, _ := request(t, srv, http.MethodGet, "/skip?"+q.Encode(), "ana", token, nil, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "ActionMax") {
		t.Errorf("a preview of 6 ids with ActionMax 5 = %d, want 400 naming ActionMax:\n%s", code, body)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.selections) != 0 {
		t.Errorf("the store was asked %+v for a preview past ActionMax, want nothing", store.selections)
	}
}

// TestPreviewWritesNothing: a preview of a failure group is a GET: it
// stores no cause on an event (the sampler or the failures page does).
func TestPreviewWritesNothing(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	mongotest.Insert(t, store.Collection(), noRoute("unclassified", at))
	c := realConsole(t, store, nil, 100)
	if rec := serve(t.Context(), c, http.MethodGet, "/requeue?"+groupQuery, nil); rec.Code != http.StatusOK {
		t.Fatalf("preview = %d:\n%s", rec.Code, rec.Body)
	}
	n, err := store.Collection().CountDocuments(t.Context(), bson.D{{Key: events.FieldFailureCause, Value: bson.D{{Key: "$exists", Value: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the preview GET stored the cause of %d events, want no write", n)
	}
}

// TestPreviewIsHeldForItsUserActionAndTime: the id a preview page
// carries is good for the user who previewed, for that action, once,
// until it expires; nothing else is.
func TestPreviewIsHeldForItsUserActionAndTime(t *testing.T) {
	t.Parallel()
	const anaToken, boToken = "ana-token-0123456789", "bo-token-0123456789"
	store := newFakeStore(t)
	store.matching = 3
	var mu sync.Mutex
	local := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return local }
	srv := startConsole(t, console.Config{
		Store: store, Samples: samples{}, Writer: store,
		Users:     map[string]string{"ana": digest(anaToken), "bo": digest(boToken)},
		Archetype: service.Archetype{Now: func() time.Time { return now }, Local: clock},
	})
	preview := func() string {
		t.Helper()
		code, body, _ := request(t, srv, http.MethodGet, "/skip?cause=x&reason=", "ana", anaToken, nil, nil)
		if code != http.StatusOK {
			t.Fatalf("preview = %d:\n%s", code, body)
		}
		return previewIn(t, body)
	}
	post := func(path, user, pass, id string) int {
		t.Helper()
		code, _, _ := request(t, srv, http.MethodPost, path, user, pass, url.Values{"preview": {id}, "reason": {"r"}}, nil)
		return code
	}
	id := preview()
	if code := post("/skip", "bo", boToken, id); code != http.StatusBadRequest {
		t.Errorf("bo confirming ana's preview = %d, want 400", code)
	}
	if code := post("/requeue", "ana", anaToken, id); code != http.StatusBadRequest {
		t.Errorf("ana confirming her skip preview as a requeue = %d, want 400", code)
	}
	if code := post("/skip", "ana", anaToken, id+"x"); code != http.StatusBadRequest {
		t.Errorf("ana naming a preview that does not exist = %d, want 400", code)
	}
	if code := post("/skip", "ana", anaToken, id); code != http.StatusSeeOther {
		t.Errorf("ana confirming her own preview = %d, want 303", code)
	}
	if code := post("/skip", "ana", anaToken, id); code != http.StatusBadRequest {
		t.Errorf("ana confirming the same preview twice = %d, want 400", code)
	}
	late := preview()
	mu.Lock()
	local = local.Add(console.PreviewTTLDefault)
	mu.Unlock()
	if code := post("/skip", "ana", anaToken, late); code != http.StatusBadRequest {
		t.Errorf("ana confirming a preview past its expiry = %d, want 400", code)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.actions) != 1 || len(store.skips) != 3 {
		t.Errorf("%d actions, %d events skipped; want the one confirmed skip of 3", len(store.actions), len(store.skips))
	}
}

// partlyApplied is a Writer whose skip changes the first 3 events it is
// given and then answers an error with a count of 0, as an UpdateMany
// cut short by a timeout does after the server applied part of it.
type partlyApplied struct{ *mongo.Store }

func (p partlyApplied) SkipSelected(ctx context.Context, ids []any, by, reason string, at time.Time, action bson.ObjectID) (int, error) {
	if _, err := p.Store.SkipSelected(ctx, ids[:3], by, reason, at, action); err != nil {
		return 0, err
	}
	return 0, errors.New("skip events: incomplete read of message header: context deadline exceeded")
}

// TestEveryTouchedEventIsStampedAndRecounted: every event a bulk action
// changes carries its audit record's id; the record keeps every id it
// set out to change and says who chose them, from what the console
// held; an action whose write failed half way is recorded with the
// count its stamp finds, not the 0 its write answered; the action's page
// lists every event it changed.
func TestEveryTouchedEventIsStampedAndRecounted(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	var docs []bson.D
	q := url.Values{}
	for i := range 30 {
		id := fmt.Sprintf("s-%02d", i)
		docs = append(docs, noRoute(id, at.Add(time.Duration(i)*time.Second)))
		q.Add("id", id)
	}
	mongotest.Insert(t, store.Collection(), docs...)
	c := realConsole(t, store, nil, 100)
	body := serve(t.Context(), c, http.MethodGet, "/skip?"+q.Encode(), nil).Body.String()
	form := url.Values{"preview": {previewIn(t, body)}, "reason": {"compensated"}, "target": {"chosen by a form field"}}
	if rec := serve(t.Context(), c, http.MethodPost, "/skip", form); rec.Code != http.StatusSeeOther {
		t.Fatalf("skip = %d:\n%s", rec.Code, rec.Body)
	}
	actions, err := store.Actions(t.Context(), 10)
	if err != nil || len(actions) != 1 {
		t.Fatalf("audit = %+v, %v", actions, err)
	}
	a := actions[0]
	stamped, err := store.Collection().CountDocuments(t.Context(), bson.D{{Key: mongo.FieldActions, Value: a.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if stamped != 30 || a.Count != 30 || a.Planned != 30 || strings.Contains(a.Target, "form field") || !strings.Contains(a.Target, "chosen by ids: s-00") {
		t.Errorf("%d events stamped; record %+v: want all 30, chosen by the preview's ids", stamped, a)
	}
	page := serve(t.Context(), c, http.MethodGet, "/audit/"+a.ID.Hex(), nil).Body.String()
	for i := range 30 {
		if id := fmt.Sprintf("s-%02d", i); !strings.Contains(page, ">"+id+"<") {
			t.Errorf("the action's page does not list %s, which it skipped", id)
		}
	}

	// A second store of the same outbox fails half way.
	more := url.Values{}
	for i := range 5 {
		id := fmt.Sprintf("p-%d", i)
		mongotest.Insert(t, store.Collection(), noRoute(id, at.Add(time.Duration(100+i)*time.Second)))
		more.Add("id", id)
	}
	half := realConsole(t, store, partlyApplied{store}, 100)
	body = serve(t.Context(), half, http.MethodGet, "/skip?"+more.Encode(), nil).Body.String()
	rec := serve(t.Context(), half, http.MethodPost, "/skip", url.Values{"preview": {previewIn(t, body)}, "reason": {"compensated"}})
	if rec.Code == http.StatusSeeOther {
		t.Fatalf("a skip that failed half way answered %d as if done", rec.Code)
	}
	actions, err = store.Actions(t.Context(), 10)
	if err != nil || len(actions) != 2 {
		t.Fatalf("audit = %+v, %v", actions, err)
	}
	if a := actions[0]; a.Count != 3 || a.Planned != 5 || a.State != mongo.ActionFailed || !strings.Contains(a.Error, "recounted") {
		t.Errorf("record of the skip applied to 3 of 5 = %+v, want a count of 3 of 5, failed, recounted", a)
	}
}
