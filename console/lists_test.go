package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// fakeLists is a console.ListSource of fixed lists, which counts the
// triggers; ready false answers as before a first read.
type fakeLists struct {
	groups  events.FailureGroups
	holders events.Holders
	ready   bool

	mu       sync.Mutex
	triggers int
}

func (l *fakeLists) LatestGroups() (events.FailureGroups, bool) { return l.groups, l.ready }
func (l *fakeLists) LatestHolders() (events.Holders, bool)      { return l.holders, l.ready }
func (l *fakeLists) Trigger() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.triggers++
}

// setupLists returns a console with its actions on, over a fakeStore,
// whose failures and held pages come from lists.
func setupLists(t *testing.T, lists *fakeLists) (*httptest.Server, *fakeStore) {
	t.Helper()
	store := newFakeStore(t)
	return serveFake(t, store, console.Config{Lists: lists, Token: token, FailedHolds: true}, true), store
}

// TestListsServeTheIncidentPages: where a source keeps the failure
// groups and the holders (the console's sampler), the failures and held
// pages show what it last read, say when, and read no event; a holder
// read while it backed off, whose retry is due since, says so.
func TestListsServeTheIncidentPages(t *testing.T) {
	t.Parallel()
	holder, err := bson.Marshal(bson.D{{Key: "_id", Value: "kept-2"}, {Key: "type", Value: "order.paid"}, {Key: "status", Value: "NEW"},
		{Key: "aggregateType", Value: "order"}, {Key: "aggregateId", Value: "kept"}, {Key: "retryAt", Value: now.Add(-time.Minute)}})
	if err != nil {
		t.Fatal(err)
	}
	lists := &fakeLists{ready: true,
		groups: events.FailureGroups{At: now.Add(-10 * time.Second), Read: 7, Groups: []events.FailureGroup{{Reason: "max_attempts", Cause: "kept cause <n>", Count: 7, Example: "kept-1"}},
			Newest: []bson.Raw{holder, holder}, NewestAll: true},
		holders: events.Holders{At: now.Add(-10 * time.Second), List: []events.Holder{{Key: "order/kept", Doc: holder}}},
	}
	srv, store := setupLists(t, lists)

	// The FAILED list's first page, from the groups' read.
	var list console.EventList
	_, body, _ := request(t, srv, http.MethodGet, "/api/events?status=FAILED", "ana", token, nil, nil)
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Events) != 2 || list.Events[0].ID != "kept-2" || list.Next != "" || !list.At.Equal(lists.groups.At) {
		t.Errorf("FAILED list = %+v, want the 2 kept events, no next page", list)
	}
	if store.query.Status != "" {
		t.Errorf("the FAILED list's first page read the store (%+v)", store.query)
	}
	// A filter, or a page past the first, is read now.
	if _, body, _ := request(t, srv, http.MethodGet, "/api/events?status=FAILED&type=order.paid", "ana", token, nil, nil); store.query.Type != "order.paid" {
		t.Errorf("a filtered FAILED list did not read the store: %s", body)
	}

	var f console.Failures
	_, body, _ = request(t, srv, http.MethodGet, "/api/failures", "ana", token, nil, nil)
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Groups) != 1 || f.Groups[0].Cause != "kept cause <n>" || f.Read != 7 || !f.At.Equal(lists.groups.At) {
		t.Errorf("failures = %+v, want the kept groups", f)
	}
	var h console.Held
	_, body, _ = request(t, srv, http.MethodGet, "/api/held", "ana", token, nil, nil)
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Aggregates) != 1 || h.Aggregates[0].Key != "order/kept" || !strings.Contains(h.Aggregates[0].Why, "backed off until") || !h.At.Equal(lists.holders.At) {
		t.Errorf("held = %+v, want the kept holder, its retry due", h)
	}
	for _, page := range []string{"/failures", "/held", "/events?status=FAILED"} {
		if _, body, _ := request(t, srv, http.MethodGet, page, "ana", token, nil, nil); !strings.Contains(body, "on a schedule, not at each view") {
			t.Errorf("%s does not say its list is read on a schedule", page)
		}
	}
	store.mu.Lock()
	reads := store.groupReads + store.holderReads
	store.mu.Unlock()
	if reads != 0 {
		t.Errorf("the pages read the store %d times, want none: the source keeps the lists", reads)
	}

	// An action that changed FAILED events has the lists read again.
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/skip", "bo", token, url.Values{"reason": {"obsolete"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("skip = %d, want 303", code)
	}
	lists.mu.Lock()
	if lists.triggers != 1 {
		t.Errorf("triggers after a skip = %d, want 1", lists.triggers)
	}
	lists.mu.Unlock()
	// Until the source reads them again, the lists it read before the
	// skip are not shown: each view reads them.
	for _, page := range []string{"/api/failures", "/api/held", "/api/events?status=FAILED"} {
		if code, _, _ := request(t, srv, http.MethodGet, page, "ana", token, nil, nil); code != http.StatusOK {
			t.Errorf("%s after the skip = %d", page, code)
		}
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.groupReads != 1 || store.holderReads != 1 || store.query.Status != "FAILED" || store.query.Type != "" {
		t.Errorf("after the skip: %d group reads, %d holder reads, last list query %+v; want each read once",
			store.groupReads, store.holderReads, store.query)
	}
}

// TestKeptFailedPageHasANextPage: a first page shorter than the kept
// newest events links to the next page, which is read from the mark of
// its last event.
func TestKeptFailedPageHasANextPage(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	lists := &fakeLists{ready: true, groups: events.FailureGroups{At: now, Newest: store.docs}}
	srv := serveFake(t, store, console.Config{Lists: lists, PageSize: 1}, false)
	var list console.EventList
	_, body, _ := request(t, srv, http.MethodGet, "/api/events?status=FAILED", "", "", nil, nil)
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Events) != 1 || list.Events[0].ID != "evil-1" || list.Next == "" {
		t.Fatalf("first page = %+v, want evil-1 and a next page", list)
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/api/events?status=FAILED&after="+list.Next, "", "", nil, nil); code != http.StatusOK {
		t.Fatalf("next page = %d", code)
	}
	if m := store.query.After; m == nil || m.ID != "evil-1" || !m.CreatedAt.Equal(now.Add(-time.Hour)) {
		t.Errorf("next page read after %+v, want evil-1's mark", m)
	}
}

// TestListsBeforeTheirFirstRead: until the source has read its lists,
// each view reads them from the store.
func TestListsBeforeTheirFirstRead(t *testing.T) {
	t.Parallel()
	srv, store := setupLists(t, &fakeLists{})
	for _, page := range []string{"/api/failures", "/api/held"} {
		if code, body, _ := request(t, srv, http.MethodGet, page, "ana", token, nil, nil); code != http.StatusOK || !strings.Contains(body, "NO_ROUTE") {
			t.Errorf("%s = %d %s, want the store's events", page, code, body)
		}
	}
	if _, body, _ := request(t, srv, http.MethodGet, "/failures", "ana", token, nil, nil); strings.Contains(body, "on a schedule") {
		t.Error("groups read for the view say they were read on a schedule")
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.groupReads != 2 || store.holderReads != 1 {
		t.Errorf("store reads: groups %d, holders %d; want one per view", store.groupReads, store.holderReads)
	}
}

// TestPublishChartUnavailable: where the database would read the whole
// PUBLISHED history for the chart (mongo.ErrNoPublishChart), the
// overview's chart request answers at once and says why.
func TestPublishChartUnavailable(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	store.chartErr = fmt.Errorf("%w: the outbox holds about 200000 events", mongo.ErrNoPublishChart)
	code, body, _ := get(t, srv, "/outbox/api/published")
	var p console.Published
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || len(p.PerMinute) != 0 || !strings.Contains(p.Unavailable, "200000 events") {
		t.Errorf("published = %d %s, want 200 with why there is no chart", code, body)
	}
	if _, body, _ := get(t, srv, "/outbox/"); !strings.Contains(body, `id="chart-note"`) {
		t.Error("the overview has no place to say why there is no chart")
	}
}
