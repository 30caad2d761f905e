package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

var now = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

// hostile is what an event may carry that a page must show as text.
const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>`

// fakeStore is an outbox of a few events, one of them hostile.
type fakeStore struct {
	docs  []bson.Raw
	query mongo.EventQuery // the last ListEvents query
	err   error

	mu          sync.Mutex
	matching    int                   // the events a requeue filter matches
	requeues    []mongo.RequeueFilter // the requeues done (not dry runs)
	selections  []mongo.Selection
	skips       []string
	discards    []string
	actions     []mongo.Action
	paused      []events.Pause
	holders     []mongo.Holder          // Holders' answer, when set
	groupReads  int                     // the reads of the failure groups
	holderReads int                     // the reads of the held aggregates' holders
	chartErr    error                   // PublishedPerMinute's error, when set
	stamped     map[bson.ObjectID][]any // the ids each action stamped
}

// stamp records the ids action changed. f.mu is held.
func (f *fakeStore) stamp(action bson.ObjectID, ids []any) {
	if action.IsZero() {
		return
	}
	if f.stamped == nil {
		f.stamped = map[bson.ObjectID][]any{}
	}
	f.stamped[action] = append(f.stamped[action], ids...)
}

// Touched returns those of ids the fake's action stamped.
func (f *fakeStore) Touched(_ context.Context, action bson.ObjectID, ids []any) ([]any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []any
	for _, id := range ids {
		if slices.Contains(f.stamped[action], id) {
			out = append(out, id)
		}
	}
	return out, nil
}

// LaterPublished counts nothing: the fake's events are not PUBLISHED.
func (f *fakeStore) LaterPublished(context.Context, string, string, time.Time, int) (int, error) {
	return 0, f.err
}

// ActionByID returns the fake's record of id.
func (f *fakeStore) ActionByID(_ context.Context, id bson.ObjectID) (mongo.Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.actions {
		if a.ID == id {
			return a, nil
		}
	}
	return mongo.Action{}, fmt.Errorf("%w: %s", mongo.ErrNoAction, id.Hex())
}

func (f *fakeStore) Actions(context.Context, int) ([]mongo.Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.actions), f.err
}

func (f *fakeStore) Requeue(_ context.Context, rf mongo.RequeueFilter, dryRun bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !dryRun {
		f.requeues = append(f.requeues, rf)
	}
	if len(rf.Selected) > 0 {
		f.stamp(rf.Action, rf.Selected)
		return len(rf.Selected), f.err
	}
	for _, id := range rf.IDs {
		f.stamp(rf.Action, []any{id})
	}
	return f.matching, f.err
}

func (f *fakeStore) StartAction(_ context.Context, a mongo.Action) (bson.ObjectID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a.ID, a.State = bson.NewObjectID(), mongo.ActionStarted
	a.Count = 0
	f.actions = append([]mongo.Action{a}, f.actions...)
	return a.ID, f.err
}

func (f *fakeStore) ProgressAction(_ context.Context, id bson.ObjectID, count int) error {
	return f.finish(id, func(a *mongo.Action) { a.Count = count })
}

func (f *fakeStore) FinishAction(_ context.Context, id bson.ObjectID, state string, count int, errText string, at time.Time) error {
	return f.finish(id, func(a *mongo.Action) { a.State, a.Count, a.Error, a.Ended = state, count, errText, at })
}

func (f *fakeStore) finish(id bson.ObjectID, change func(a *mongo.Action)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.actions {
		if f.actions[i].ID == id {
			change(&f.actions[i])
			return f.err
		}
	}
	return fmt.Errorf("no action %s", id.Hex())
}

func (f *fakeStore) SkipSelected(_ context.Context, ids []any, _, _ string, _ time.Time, action bson.ObjectID) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stamp(action, ids)
	for _, id := range ids {
		f.skips = append(f.skips, fmt.Sprint(id))
	}
	return len(ids), f.err
}

func (f *fakeStore) DiscardSelected(_ context.Context, ids []any, _, _ string, _ time.Time, action bson.ObjectID) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stamp(action, ids)
	for _, id := range ids {
		f.discards = append(f.discards, fmt.Sprint(id))
	}
	return 1, f.err
}

// Select selects the first matching events of the fake's documents.
func (f *fakeStore) Select(_ context.Context, sel mongo.Selection, limit int) ([]any, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.selections = append(f.selections, sel)
	ids := make([]any, 0, f.matching)
	for i := range min(f.matching, limit) {
		ids = append(ids, fmt.Sprintf("e-%d", i))
	}
	return ids, f.matching, f.err
}

func newFakeStore(t *testing.T) *fakeStore {
	t.Helper()
	doc := func(d bson.D) bson.Raw {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return &fakeStore{docs: []bson.Raw{
		doc(bson.D{
			{Key: "_id", Value: "evil-1"}, {Key: "type", Value: hostile}, {Key: "status", Value: "FAILED"},
			{Key: "aggregateType", Value: "order"}, {Key: "aggregateId", Value: hostile},
			{Key: "payload", Value: bson.D{{Key: "note", Value: hostile}}},
			{Key: "createdAt", Value: now.Add(-time.Hour)}, {Key: "attempts", Value: 3},
			{Key: "lastError", Value: "broker returned 312 NO_ROUTE for " + hostile},
			{Key: "attemptErrors", Value: bson.A{
				bson.D{{Key: "at", Value: now.Add(-2 * time.Minute)}, {Key: "workerId", Value: "w-1"}, {Key: "reason", Value: "returned"}, {Key: "error", Value: "first " + hostile}},
				bson.D{{Key: "at", Value: now.Add(-time.Minute)}, {Key: "workerId", Value: "w-2"}, {Key: "reason", Value: "max_attempts"}, {Key: "error", Value: "second"}},
			}},
		}),
		doc(bson.D{
			{Key: "_id", Value: "ok-2"}, {Key: "type", Value: "order.paid"}, {Key: "status", Value: "FAILED"},
			{Key: "createdAt", Value: now.Add(-2 * time.Hour)}, {Key: "attempts", Value: "not a number"},
			{Key: "lastError", Value: "broker returned 312 NO_ROUTE for \"order.paid\""},
		}),
	}}
}

func (f *fakeStore) ListEvents(_ context.Context, q mongo.EventQuery) ([]bson.Raw, *mongo.PageMark, error) {
	f.query = q
	if f.err != nil {
		return nil, nil, f.err
	}
	return f.docs[:1], &mongo.PageMark{CreatedAt: now.Add(-time.Hour), ID: "evil-1"}, nil
}

func (f *fakeStore) Find(_ context.Context, id string) (bson.Raw, error) {
	for _, d := range f.docs {
		if s, _ := d.Lookup("_id").StringValueOK(); s == id {
			return d, nil
		}
	}
	return nil, fmt.Errorf("%w: no event with _id %q", mongo.ErrNoEvent, id)
}

// FailureGroups groups the fake's documents as the store groups what it
// reads.
func (f *fakeStore) FailureGroups(_ context.Context, at time.Time, _ int) (events.FailureGroups, error) {
	f.mu.Lock()
	f.groupReads++
	f.mu.Unlock()
	return events.FailureGroups{At: at, Groups: mongo.GroupFailed(f.docs), Read: len(f.docs)}, f.err
}

func (f *fakeStore) Holders(context.Context, time.Time, bool, int) ([]mongo.Holder, bool, error) {
	f.mu.Lock()
	f.holderReads++
	f.mu.Unlock()
	if f.holders != nil {
		return f.holders, false, f.err
	}
	return []mongo.Holder{{Key: "order/" + hostile, Doc: f.docs[0]}}, false, f.err
}

func (f *fakeStore) PublishedPerMinute(_ context.Context, since, to time.Time) ([]int64, error) {
	if f.chartErr != nil {
		return nil, f.chartErr
	}
	counts := make([]int64, int(to.Sub(since)/time.Minute)+1)
	counts[len(counts)-1] = 42
	return counts, f.err
}

type samples struct{}

func (samples) Latest() (ops.Sample, bool) {
	held := events.HeldStats{Aggregates: 1}
	return ops.Sample{At: now, Stats: events.Stats{
		Counts:    map[events.Status]int64{events.StatusNew: 7, events.StatusFailed: 2},
		OldestNew: now.Add(-90 * time.Second),
	}, Held: &held}, true
}

type owners struct{}

func (owners) Read(context.Context) ([]ownership.Term, []ownership.Member, error) {
	var terms []ownership.Term
	for p := range events.Partitions {
		owner := "replica-a"
		if p%2 == 1 {
			owner = "replica-b"
		}
		terms = append(terms, ownership.Term{Partition: p, Term: 1, Owner: owner, ExpiresAt: now.Add(time.Second)})
	}
	return terms, []ownership.Member{{WorkerID: "replica-a", SeenAt: now}, {WorkerID: "replica-gone", SeenAt: now.Add(-time.Hour)}}, nil
}

// startConsole serves the console cfg makes at the root of a test
// server that closes with the test.
func startConsole(t *testing.T, cfg console.Config) *httptest.Server {
	t.Helper()
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return srv
}

// serveFake serves a console of cfg over store, whose events' ages
// count from the tests' time now; store is its Writer too when writes.
func serveFake(t *testing.T, store *fakeStore, cfg console.Config, writes bool) *httptest.Server {
	t.Helper()
	cfg.Store, cfg.Samples = store, samples{}
	cfg.Archetype = service.Archetype{Now: func() time.Time { return now }}
	if writes {
		cfg.Writer = store
	}
	return startConsole(t, cfg)
}

// setup returns a console over a fakeStore, mounted under /outbox.
func setup(t *testing.T) (*httptest.Server, *fakeStore) {
	t.Helper()
	store := newFakeStore(t)
	c, err := console.New(console.Config{
		Store: store, Samples: samples{}, Owners: owners{}, TermLength: 30 * time.Second, FailedHolds: true,
		BasePath: "/outbox/", Archetype: service.Archetype{Now: func() time.Time { return now }},
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", http.StripPrefix("/outbox", c))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, store
}

func get(t *testing.T, srv *httptest.Server, path string) (int, string, http.Header) {
	t.Helper()
	return do(t, srv, http.MethodGet, path)
}

func do(t *testing.T, srv *httptest.Server, method, path string) (int, string, http.Header) {
	t.Helper()
	return request(t, srv, method, path, "", "", nil, nil)
}

// TestPages: every page and its API answer under the mount path, with
// what they are for, and links that stay under it.
func TestPages(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t)
	for _, tt := range []struct {
		path string
		want []string
	}{
		{"/outbox/", []string{"Overview", ">7<", "1m", "replica-a", "leader", "replica-gone", "gone", `data-src="/outbox/api/published"`, `href="/outbox/events?status=FAILED"`}},
		{"/outbox/api/published", []string{`"publishedPerMinute":[0,`, `,42]`}},
		{"/outbox/events?status=FAILED", []string{"evil-1", `href="/outbox/events/evil-1"`, "Older events", "after="}},
		{"/outbox/events/evil-1", []string{"Failed attempts", "w-1", "returned", "max_attempts", "w-2", "worker requeue --id evil-1"}},
		{"/outbox/failures", []string{"NO_ROUTE", "max_attempts", `status=FAILED`}},
		{"/outbox/held", []string{"FAILED: later events wait", "evil-1"}},
		{"/outbox/static/console.css", []string{"--failed"}},
	} {
		code, body, h := get(t, srv, tt.path)
		if code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200: %s", tt.path, code, body)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: no %q in the page", tt.path, w)
			}
		}
		if strings.HasSuffix(tt.path, ".css") {
			continue
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tt.path, csp)
		}
		if strings.Contains(body, `href="/events`) || strings.Contains(body, `href="/static`) {
			t.Errorf("GET %s: a link outside the mount path /outbox", tt.path)
		}
	}
}

// TestAPI: the JSON API carries the pages' data.
func TestAPI(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	code, body, _ := get(t, srv, "/outbox/api/events?status=FAILED&type=order.paid&error=NO_ROUTE&aggregate=a-1&olderThan=10m")
	if code != http.StatusOK {
		t.Fatalf("GET /api/events = %d: %s", code, body)
	}
	var list console.EventList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Events) != 1 || list.Events[0].ID != "evil-1" || list.Next == "" {
		t.Errorf("events = %+v", list)
	}
	q := store.query
	if q.Status != events.StatusFailed || q.Type != "order.paid" || q.ErrorText != "NO_ROUTE" || q.AggregateID != "a-1" ||
		!q.CreatedBefore.Equal(now.Add(-10*time.Minute)) || q.After != nil {
		t.Errorf("query = %+v", q)
	}
	// The next page's cursor comes back as the mark it was made from.
	if code, body, _ := get(t, srv, "/outbox/api/events?status=FAILED&after="+list.Next); code != http.StatusOK {
		t.Fatalf("next page = %d: %s", code, body)
	}
	if m := store.query.After; m == nil || m.ID != "evil-1" || !m.CreatedAt.Equal(now.Add(-time.Hour)) {
		t.Errorf("next page's mark = %+v, want evil-1 at %s", m, now.Add(-time.Hour))
	}

	var ov console.Overview
	_, body, _ = get(t, srv, "/outbox/api/overview")
	if err := json.Unmarshal([]byte(body), &ov); err != nil {
		t.Fatal(err)
	}
	if ov.Counts["NEW"] != 7 || ov.Leader != "replica-a" || ov.Unowned != 0 || ov.OldestNewAgeSeconds != 90 {
		t.Errorf("overview = %+v", ov)
	}

	var d console.EventDetail
	_, body, _ = get(t, srv, "/outbox/api/events/ok-2")
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.ID != "ok-2" || d.Attempts != 0 || !strings.Contains(d.Document, `"not a number"`) {
		t.Errorf("an event whose attempts is no number: %+v", d)
	}
}

// TestFailuresGroupByCause: events that failed the same way, but for
// other values, share a group.
func TestFailuresGroupByCause(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t)
	var f console.Failures
	_, body, _ := get(t, srv, "/outbox/api/failures")
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		t.Fatal(err)
	}
	// The two NO_ROUTE errors differ in a quoted value and in the
	// hostile text, so they are two causes: the quoted one normalizes.
	if f.Read != 2 || len(f.Groups) != 2 {
		t.Fatalf("failures = %+v", f)
	}
	for _, g := range f.Groups {
		if !strings.Contains(g.Cause, "<n> NO_ROUTE") {
			t.Errorf("group %+v: want the code normalized", g)
		}
	}
}

// TestCauseLinkFindsItsGroup: the events page's cause and reason choose
// a failure group by equality, the text as given: a cause that reads as
// a regular expression is no pattern.
func TestCauseLinkFindsItsGroup(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	const cause = `broker returned <n> NO_ROUTE for "…" (a+)+$`
	q := url.Values{"status": {"FAILED"}, "cause": {cause}, "reason": {"max_attempts"}}
	if code, body, _ := get(t, srv, "/outbox/api/events?"+q.Encode()); code != http.StatusOK {
		t.Fatalf("GET events of a cause = %d: %s", code, body)
	}
	if g := store.query.Group; g == nil || g.Cause != cause || g.Reason != "max_attempts" {
		t.Errorf("query's group = %+v, want cause %q and reason max_attempts as given", g, cause)
	}
	_, body, _ := get(t, srv, "/outbox/failures")
	if !strings.Contains(body, "reason=max_attempts") || !strings.Contains(body, "cause=broker&#43;returned") {
		t.Errorf("the failures page does not link its groups by cause and reason")
	}
}

// TestReadOnly: nothing but GET and HEAD is served, whatever the path.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, path := range []string{"/outbox/", "/outbox/events/evil-1", "/outbox/api/events"} {
			if code, body, _ := do(t, srv, m, path); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
				t.Errorf("%s %s = %d %s, want 403 read-only", m, path, code, body)
			}
		}
	}
}

// TestHostileDataIsEscaped: an event's values reach no page as markup.
func TestHostileDataIsEscaped(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t)
	for _, path := range []string{"/outbox/events?status=FAILED", "/outbox/events/evil-1", "/outbox/failures", "/outbox/held"} {
		_, body, _ := get(t, srv, path)
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("GET %s: the hostile value is in the page unescaped", path)
		}
		if !strings.Contains(body, "&lt;script&gt;") && !strings.Contains(body, "&lt;img") {
			t.Errorf("GET %s: the hostile value is not shown escaped", path)
		}
	}
}

// TestBadRequests: a bad filter or cursor is a 400 naming what was wrong;
// an unknown event a 404; a database that fails, a 503 page that says so.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	for _, tt := range []struct {
		path string
		code int
		want string
	}{
		{"/outbox/events?status=DONE", 400, `status &#34;DONE&#34;`},
		{"/outbox/api/events?olderThan=yesterday", 400, "olderThan"},
		{"/outbox/api/events?after=not-a-cursor", 400, "not a cursor"},
		{"/outbox/events/nope", 404, "no event with _id"},
		{"/outbox/nope", 404, ""},
	} {
		if code, body, _ := get(t, srv, tt.path); code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("GET %s = %d %q, want %d with %q", tt.path, code, body, tt.code, tt.want)
		}
	}
	store.err = fmt.Errorf("server selection timeout")
	if code, body, _ := get(t, srv, "/outbox/events"); code != http.StatusServiceUnavailable || !strings.Contains(body, "server selection timeout") {
		t.Errorf("a failing database: %d %s", code, body)
	}
}

// TestConfigIsChecked: a bad Config names its field.
func TestConfigIsChecked(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  console.Config
		want string
	}{
		{console.Config{Samples: samples{}}, "Store"},
		{console.Config{Store: &fakeStore{}}, "Samples"},
		{console.Config{Store: &fakeStore{}, Samples: samples{}, Owners: owners{}}, "TermLength"},
		{console.Config{Store: &fakeStore{}, Samples: samples{}, BasePath: "outbox"}, "BasePath"},
		{console.Config{Store: &fakeStore{}, Samples: samples{}, Refresh: time.Millisecond}, "Refresh"},
		{console.Config{Store: &fakeStore{}, Samples: samples{}, Writer: &fakeStore{}, Token: "short"}, "Token"},
	} {
		if _, err := console.New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
}

func (f *fakeStore) PausedTypes(context.Context) ([]events.Pause, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.paused), f.err
}

func (f *fakeStore) Pause(_ context.Context, p events.Pause) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.ContainsFunc(f.paused, func(q events.Pause) bool { return q.Type == p.Type }) {
		return false, f.err
	}
	f.paused = append(f.paused, p)
	return true, f.err
}

func (f *fakeStore) Resume(_ context.Context, typ string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.paused)
	f.paused = slices.DeleteFunc(f.paused, func(p events.Pause) bool { return p.Type == typ })
	return len(f.paused) < n, f.err
}
