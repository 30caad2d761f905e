package console_test

// A console of two outboxes on two databases, each outbox's collection
// named apart, over the real store: every action on one changes that
// outbox alone, even where both hold events of the same ids.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// fleetIDs are the events of each outbox of the fleet tests: the same
// ids in both, so that an action sent to the wrong outbox would find
// its events.
var fleetIDs = []string{"e-1", "e-2", "e-3", "e-4"}

// fleetStore is an outbox of collection coll in a database of its own,
// prepared, holding fleetIDs as FAILED events.
func fleetStore(ctx context.Context, t *testing.T, coll string) *mongo.Store {
	t.Helper()
	db := testenv.Database(t)
	store := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: coll, Logger: slog.New(slog.DiscardHandler)})
	if err := store.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	var docs []any
	for _, id := range fleetIDs {
		docs = append(docs, mongotest.Event(id, events.StatusFailed, at,
			bson.E{Key: events.FieldAggregateType, Value: "order"}, bson.E{Key: events.FieldAggregateID, Value: id},
			bson.E{Key: events.FieldAttempts, Value: 10}, bson.E{Key: events.FieldFailedAt, Value: at},
			bson.E{Key: events.FieldLastError, Value: "max_attempts: broker refused"}))
	}
	if _, err := db.Collection(coll).InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	return store
}

// fleetConsole serves a console with actions of the outboxes a and b.
func fleetConsole(t *testing.T, a, b *mongo.Store) *httptest.Server {
	t.Helper()
	return startConsole(t, console.Config{
		Outboxes: []console.Outbox{
			{Name: "a", Store: a, Samples: samples{}, Writer: a},
			{Name: "b", Store: b, Samples: samples{}, Writer: b},
		},
		Token: token,
	})
}

// post posts form to path as ana, and fails the test unless the answer
// is want.
func post(t *testing.T, srv *httptest.Server, path string, form url.Values, want int) string {
	t.Helper()
	code, body, _ := request(t, srv, http.MethodPost, path, "ana", token, form, map[string]string{"Origin": srv.URL})
	if code != want {
		t.Fatalf("POST %s = %d, want %d: %s", path, code, want, body)
	}
	return body
}

// TestFleetActionsTouchTheirOutboxAlone: requeue, skip, discard, pause
// and a previewed bulk requeue, each on outbox a, change a's events,
// paused types and audit, and nothing of b, whose events have the same
// ids. A preview of a cannot be confirmed on b's page, and an action on
// an outbox the console does not serve, or on none, is refused.
func TestFleetActionsTouchTheirOutboxAlone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a, b := fleetStore(ctx, t, mongo.CollectionDefault), fleetStore(ctx, t, "other_outbox")
	srv := fleetConsole(t, a, b)
	reason := func(kv ...string) url.Values {
		f := url.Values{"reason": {"fleet test"}}
		for i := 0; i+1 < len(kv); i += 2 {
			f.Set(kv[i], kv[i+1])
		}
		return f
	}
	// Refused before anything: an unknown outbox, and no outbox at all.
	body := post(t, srv, "/o/nope/events/e-1/requeue", reason(), http.StatusNotFound)
	if !strings.Contains(body, `serves no outbox &#34;nope&#34; (it serves a, b)`) {
		t.Errorf("the refusal of outbox nope does not say which outboxes the console serves:\n%s", body)
	}
	post(t, srv, "/events/e-1/requeue", reason(), http.StatusBadRequest)

	post(t, srv, "/o/a/events/e-1/requeue", reason(), http.StatusSeeOther)
	post(t, srv, "/o/a/events/e-2/skip", reason(), http.StatusSeeOther)
	post(t, srv, "/o/a/events/e-3/discard", reason("confirm", "discard"), http.StatusSeeOther)
	post(t, srv, "/o/a/pause", reason("type", "order.created"), http.StatusSeeOther)
	preview := fleetPreview(t, srv, "/o/a/api/requeue?id=e-4")
	post(t, srv, "/o/b/requeue", reason("preview", preview), http.StatusBadRequest)
	post(t, srv, "/o/a/requeue", reason("preview", preview), http.StatusSeeOther)

	checkStatuses(ctx, t, "a", a, map[string]string{"e-1": "NEW", "e-2": "FAILED skipped", "e-3": "FAILED discarded", "e-4": "NEW"})
	checkStatuses(ctx, t, "b", b, map[string]string{"e-1": "FAILED", "e-2": "FAILED", "e-3": "FAILED", "e-4": "FAILED"})
	if paused, err := b.PausedTypes(ctx); err != nil || len(paused) != 0 {
		t.Errorf("outbox b's paused types = %v (%v), want none: the pause was a's", paused, err)
	}
	if paused, err := a.PausedTypes(ctx); err != nil || len(paused) != 1 {
		t.Errorf("outbox a's paused types = %v (%v), want t", paused, err)
	}
	if actions, err := b.Actions(ctx, 10); err != nil || len(actions) != 0 {
		t.Errorf("outbox b's audit holds %d actions (%v), want none", len(actions), err)
	}
	actions, err := a.Actions(ctx, 10)
	if err != nil || len(actions) != 5 {
		t.Fatalf("outbox a's audit holds %d actions (%v), want 5", len(actions), err)
	}
	for _, act := range actions {
		if act.Outbox != "a" {
			t.Errorf("a's audit record of the %s names outbox %q, want a", act.Name, act.Outbox)
		}
	}
}

// fleetPreview reads the preview at path and returns the id its form
// posts.
func fleetPreview(t *testing.T, srv *httptest.Server, path string) string {
	t.Helper()
	code, body, _ := request(t, srv, http.MethodGet, path, "ana", token, nil, nil)
	var p console.Preview
	if err := json.Unmarshal([]byte(body), &p); code != http.StatusOK || err != nil || p.ID == "" {
		t.Fatalf("GET %s = %d %s (%v), want a preview", path, code, body, err)
	}
	return p.ID
}

// checkStatuses checks each event of store: its status, and "skipped"
// or "discarded" after it when an operator did so.
func checkStatuses(ctx context.Context, t *testing.T, name string, store *mongo.Store, want map[string]string) {
	t.Helper()
	for id, w := range want {
		raw, err := store.Find(ctx, id)
		if err != nil {
			t.Fatalf("outbox %s: find %s: %v", name, id, err)
		}
		var e events.Event
		if err := bson.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		got := string(e.Status)
		switch {
		case e.DiscardedBy != "":
			got += " discarded"
		case e.SkippedBy != "":
			got += " skipped"
		}
		if got != w {
			t.Errorf("outbox %s: event %s is %s, want %s", name, id, got, w)
		}
	}
}

// TestFleetPagesShowTheirOutbox: each outbox's pages list its own
// events, name it in the selector, and link within it; a page without
// an outbox opens the first one's, an API read without one is refused,
// and the selector sends the browser to the same list of the outbox
// chosen.
func TestFleetPagesShowTheirOutbox(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a, b := fleetStore(ctx, t, mongo.CollectionDefault), fleetStore(ctx, t, "other_outbox")
	if _, err := b.Requeue(ctx, mongo.RequeueFilter{IDs: []string{"e-1", "e-2"}}, false); err != nil {
		t.Fatal(err)
	}
	srv := fleetConsole(t, a, b)
	for name, want := range map[string]int{"a": 4, "b": 2} {
		code, body, _ := request(t, srv, http.MethodGet, "/o/"+name+"/api/events?status=FAILED", "ana", token, nil, nil)
		var list console.EventList
		if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Events) != want {
			t.Errorf("outbox %s lists %d FAILED events (%d, %v), want %d", name, len(list.Events), code, err, want)
		}
	}
	_, page, _ := request(t, srv, http.MethodGet, "/o/b/events?status=FAILED", "ana", token, nil, nil)
	for _, want := range []string{`<option value="b" selected>b</option>`, `<option value="a">a</option>`, `href="/o/b/events/e-3"`, `action="/o/b/outbox"`} {
		if !strings.Contains(page, want) {
			t.Errorf("outbox b's FAILED list lacks %s", want)
		}
	}
	for _, c := range []struct{ path, location string }{
		{"/events?status=FAILED", "/o/a/events?status=FAILED"},
		{"/o/a/outbox?outbox=b&page=failures", "/o/b/failures"},
		{"/o/a/outbox?outbox=b&page=event", "/o/b/"},
	} {
		code, _, h := request(t, srv, http.MethodGet, c.path, "ana", token, nil, map[string]string{"Accept": "text/html"})
		if code != http.StatusSeeOther || h.Get("Location") != c.location {
			t.Errorf("GET %s = %d to %q, want 303 to %s", c.path, code, h.Get("Location"), c.location)
		}
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/api/events?status=FAILED", "ana", token, nil, nil); code != http.StatusBadRequest {
		t.Errorf("GET /api/events without an outbox = %d, want 400", code)
	}
}

// TestBrowserFleetSelector drives a real browser through a console of
// two outboxes: the selector opens the other outbox's FAILED list, with
// the filter of the list it was on, and a requeue from its event's page
// changes that outbox's event alone.
func TestBrowserFleetSelector(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	a, b := fleetStore(t.Context(), t, mongo.CollectionDefault), fleetStore(t.Context(), t, "other_outbox")
	srv := fleetConsole(t, a, b)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ana:"+token))
	var location, status string
	err := chromedp.Run(ctx,
		network.Enable(),
		network.SetExtraHTTPHeaders(network.Headers{"Authorization": auth}),
		chromedp.Navigate(srv.URL+"/o/a/events?status=FAILED&aggregate=e-3"),
		chromedp.WaitVisible(`a[href="/o/a/events/e-3"]`),
		chromedp.SetValue(`#outbox-select`, "b"),
		chromedp.Click(`#outbox-go`),
		chromedp.WaitVisible(`a[href="/o/b/events/e-3"]`),
		chromedp.Location(&location),
		chromedp.Click(`a[href="/o/b/events/e-3"]`),
		chromedp.WaitVisible(`form[action="/o/b/events/e-3/requeue"] input[name="reason"]`),
		chromedp.SendKeys(`form[action="/o/b/events/e-3/requeue"] input[name="reason"]`, "broker fixed"),
		chromedp.Click(`form[action="/o/b/events/e-3/requeue"] button`),
		chromedp.WaitVisible(`dd.st-new`),
		chromedp.Text(`dd.st-new`, &status),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if location != srv.URL+"/o/b/events?aggregate=e-3&status=FAILED" {
		t.Errorf("the selector opened %s, want outbox b's FAILED list of aggregate e-3", location)
	}
	checkStatuses(t.Context(), t, "b", b, map[string]string{"e-3": "NEW"})
	checkStatuses(t.Context(), t, "a", a, map[string]string{"e-1": "FAILED", "e-2": "FAILED", "e-3": "FAILED", "e-4": "FAILED"})
}

// TestFleetConfigIsChecked: the outboxes of a console are named, apart,
// path-safe, each with its store and samples, and all with a Writer or
// none.
func TestFleetConfigIsChecked(t *testing.T) {
	t.Parallel()
	one := func(name string, w console.Writer) console.Outbox {
		return console.Outbox{Name: name, Store: &fakeStore{}, Samples: samples{}, Writer: w}
	}
	for _, tt := range []struct {
		outboxes []console.Outbox
		want     string
	}{
		{[]console.Outbox{one("a", nil), one("", nil)}, "Outboxes[1].Name"},
		{[]console.Outbox{one("a", nil), one("a", nil)}, "Outboxes[1].Name"},
		{[]console.Outbox{one("a/b", nil)}, "Outboxes[0].Name"},
		{[]console.Outbox{one("a", &fakeStore{}), one("b", nil)}, "Outboxes[1].Writer"},
		{[]console.Outbox{{Name: "a", Store: &fakeStore{}}}, "Outboxes[0].Samples"},
	} {
		if _, err := console.New(console.Config{Outboxes: tt.outboxes, Token: token}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New with outboxes %+v = %v, want an error naming %s", tt.outboxes, err, tt.want)
		}
	}
	for _, cfg := range []console.Config{
		{Outboxes: []console.Outbox{one("a", nil)}, Store: &fakeStore{}, Samples: samples{}},
		{Outboxes: []console.Outbox{one("a", nil)}, Writer: &fakeStore{}, Token: token},
	} {
		if _, err := console.New(cfg); err == nil || !strings.Contains(err.Error(), "Store") || !strings.Contains(err.Error(), "Outboxes") {
			t.Errorf("New with Outboxes and a field of one outbox = %v, want an error saying each outbox has its own", err)
		}
	}
}
