package console_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// noRoute is the lastError of the events of one failure group, and the
// last attempt that gave up on them.
func noRoute(id string, createdAt time.Time, extra ...bson.E) bson.D {
	return mongotest.Event(id, events.StatusFailed, createdAt, append([]bson.E{
		{Key: events.FieldLastError, Value: `broker returned 312 NO_ROUTE for "` + id + `"`},
		{Key: events.FieldAttemptErrors, Value: bson.A{bson.D{{Key: "at", Value: createdAt}, {Key: "reason", Value: "returned"}, {Key: "error", Value: "312"}}}},
	}, extra...)...)
}

// realConsole is a console with its actions on over a store of the
// test's own, with writer as its Writer (the store when nil).
func realConsole(t *testing.T, store *mongo.Store, writer console.Writer, perSecond int) *console.Console {
	t.Helper()
	if writer == nil {
		writer = store
	}
	c, err := console.New(console.Config{
		Store: store, Samples: samples{}, Writer: writer, Token: token, RequeuePerSecond: perSecond,
		Archetype: service.Archetype{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve sends a request straight to c, with ctx as its context.
func serve(ctx context.Context, c *console.Console, method, target string, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, method, target, strings.NewReader(form.Encode()))
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.SetBasicAuth("ana", token)
	req.TLS = &tls.ConnectionState{} // from 192.0.2.1: Basic only over TLS
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	return rec
}

// groupQuery is the preview query of the NO_ROUTE group.
var groupQuery = url.Values{"cause": {`broker returned <n> NO_ROUTE for "…"`}, "reason": {"returned"}}.Encode()

// TestGroupRequeueActsOnThePreview: a group's requeue moves exactly the
// events its preview showed: not an event skipped before or since, not
// one that failed the same way after the preview, not one whose error
// only looks like the group's.
func TestGroupRequeueActsOnThePreview(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	oid := bson.NewObjectID()
	byOID := noRoute("g-oid", at.Add(3*time.Second))
	byOID[0].Value = oid // an _id stored as an ObjectID goes through the form as one
	mongotest.Insert(t, coll, byOID,
		noRoute("g1", at), noRoute("g2", at.Add(time.Second)), noRoute("g3", at.Add(2*time.Second)),
		noRoute("skipped", at, bson.E{Key: events.FieldSkippedAt, Value: at}, bson.E{Key: events.FieldSkippedBy, Value: "bo"}),
		// What the old pattern of the group, literal parts with anything
		// between them, matched too.
		mongotest.Event("lookalike", events.StatusFailed, at, bson.E{Key: events.FieldLastError, Value: "broker returned 312 NO_ROUTE for x"}),
	)
	c := realConsole(t, store, nil, 100)
	// The failures page's read stores the events' causes; the preview,
	// a GET, writes nothing.
	if rec := serve(t.Context(), c, http.MethodGet, "/failures", nil); rec.Code != http.StatusOK {
		t.Fatalf("failures page = %d", rec.Code)
	}
	rec := serve(t.Context(), c, http.MethodGet, "/requeue?"+groupQuery, nil)
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(body, "4 FAILED events") || !strings.Contains(body, "g1") || !strings.Contains(body, oid.Hex()) {
		t.Fatalf("preview = %d, want the 4 events of the group:\n%s", rec.Code, body)
	}
	// The FAILED set changes between the preview and the requeue.
	mongotest.Insert(t, coll, noRoute("late", at.Add(-time.Minute)))
	if n, err := store.Skip(t.Context(), []string{"g2"}, "bo", "compensated by hand", time.Now(), false); err != nil || n != 1 {
		t.Fatalf("skip g2 = %d, %v", n, err)
	}
	rec = serve(t.Context(), c, http.MethodPost, "/requeue", url.Values{"preview": {previewIn(t, body)}, "reason": {"route added"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("requeue = %d: %s", rec.Code, rec.Body)
	}
	want := map[string]events.Status{"g1": events.StatusNew, "g2": events.StatusFailed, "g3": events.StatusNew, oid.Hex(): events.StatusNew,
		"skipped": events.StatusFailed, "lookalike": events.StatusFailed, "late": events.StatusFailed}
	if diff := cmp.Diff(want, mongotest.Statuses(t, coll)); diff != "" {
		t.Errorf("statuses after the group's requeue (-want +got):\n%s", diff)
	}
	actions, err := store.Actions(t.Context(), 10)
	if err != nil || len(actions) != 1 || actions[0].Count != 3 || actions[0].State != mongo.ActionDone || actions[0].By != "ana (shared token)" {
		t.Errorf("audit = %+v, %v; want one requeue of 3, done", actions, err)
	}
}

// cancelling is a Writer whose requeue's request is cancelled once done
// events are requeued: an operator who closed the tab half way.
type cancelling struct {
	*mongo.Store
	done   int
	cancel context.CancelFunc
}

func (w cancelling) Requeue(ctx context.Context, f mongo.RequeueFilter, dryRun bool) (int, error) {
	progress := f.Progress
	f.Progress = func(n int) {
		progress(n)
		if n >= w.done {
			w.cancel()
		}
	}
	return w.Store.Requeue(ctx, f, dryRun)
}

// TestCancelledRequeueIsAudited: a paced requeue cancelled half way
// leaves its record, with the count it reached and how it ended.
func TestCancelledRequeueIsAudited(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	var docs []bson.D
	for i := range 10 {
		docs = append(docs, noRoute(string(rune('a'+i)), at.Add(time.Duration(i)*time.Second)))
	}
	mongotest.Insert(t, store.Collection(), docs...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := realConsole(t, store, cancelling{Store: store, done: 3, cancel: cancel}, 3)
	serve(t.Context(), c, http.MethodGet, "/failures", nil)
	body := serve(t.Context(), c, http.MethodGet, "/requeue?"+groupQuery, nil).Body.String()
	rec := serve(ctx, c, http.MethodPost, "/requeue", url.Values{"preview": {previewIn(t, body)}, "reason": {"route added"}})
	if rec.Code == http.StatusSeeOther {
		t.Fatalf("a cancelled requeue answered %d as if done", rec.Code)
	}
	requeued := 0
	for _, st := range mongotest.Statuses(t, store.Collection()) {
		if st == events.StatusNew {
			requeued++
		}
	}
	actions, err := store.Actions(t.Context(), 10)
	if err != nil || len(actions) != 1 {
		t.Fatalf("audit = %+v, %v; want the one requeue", actions, err)
	}
	a := actions[0]
	if requeued != 3 || a.Count != requeued || a.State != mongo.ActionCancelled || a.Error == "" || a.Ended.IsZero() {
		t.Errorf("%d requeued; audit record %+v: want the 3 requeued, cancelled, with why", requeued, a)
	}
	page := serve(t.Context(), c, http.MethodGet, "/audit", nil).Body.String()
	if !strings.Contains(page, "cancelled") || !strings.Contains(page, "192.0.2.1") {
		t.Errorf("the audit page does not say the requeue was cancelled, nor from where")
	}
}
