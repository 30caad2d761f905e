package console_test

// A console of a fleet serves each outbox it can: one whose database has
// not answered yet is unavailable on its own (503 naming it), and each
// outbox's ages go by its own cluster's clock.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/mongo"
)

// TestFleetUnavailableOutbox: while outbox b's Ready says its database
// is unreachable, its API and pages answer 503 naming b, the selector
// marks it, a page asked for without an outbox opens a (b is listed
// first), and a is served; once b is ready, b is served as well.
func TestFleetUnavailableOutbox(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a, b := fleetStore(ctx, t, mongo.CollectionDefault), fleetStore(ctx, t, "other_outbox")
	var down atomic.Bool
	down.Store(true)
	ready := func() error {
		if down.Load() {
			return errors.New("its database is unreachable")
		}
		return nil
	}
	srv := startConsole(t, console.Config{
		Outboxes: []console.Outbox{
			{Name: "b", Store: b, Samples: samples{}, Ready: ready},
			{Name: "a", Store: a, Samples: samples{}},
		},
		Token: token,
	})
	html := map[string]string{"Accept": "text/html"}
	if code, body, _ := request(t, srv, http.MethodGet, "/o/b/api/events?status=FAILED", "ana", token, nil, nil); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, `outbox \"b\" is unavailable: its database is unreachable`) || strings.Contains(body, "e-1") {
		t.Errorf("GET b's API while b is down = %d %s, want 503 naming b and no event", code, body)
	}
	code, page, _ := request(t, srv, http.MethodGet, "/o/b/events?status=FAILED", "ana", token, nil, html)
	if code != http.StatusServiceUnavailable || !strings.Contains(page, "outbox &#34;b&#34; is unavailable") || strings.Contains(page, "/o/b/events/e-1") ||
		!strings.Contains(page, `data-refresh="5"`) {
		t.Errorf("GET b's page while b is down = %d, want 503 naming b and no event, refreshed to show b once it is back:\n%s", code, page)
	}
	code, page, _ = request(t, srv, http.MethodGet, "/o/a/events?status=FAILED", "ana", token, nil, html)
	if code != http.StatusOK || !strings.Contains(page, `href="/o/a/events/e-1"`) || !strings.Contains(page, `<option value="b">b (unavailable)</option>`) {
		t.Errorf("GET a's page while b is down = %d, want a's events and b marked unavailable:\n%s", code, page)
	}
	if code, _, h := request(t, srv, http.MethodGet, "/events?status=FAILED", "ana", token, nil, html); code != http.StatusSeeOther || h.Get("Location") != "/o/a/events?status=FAILED" {
		t.Errorf("GET /events while b is down = %d to %q, want 303 to a's", code, h.Get("Location"))
	}
	down.Store(false)
	code, body, _ := request(t, srv, http.MethodGet, "/o/b/api/events?status=FAILED", "ana", token, nil, nil)
	var list console.EventList
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Events) != len(fleetIDs) {
		t.Errorf("GET b's API once b is ready = %d %s, want its %d events", code, body, len(fleetIDs))
	}
}

// TestFleetClockPerOutbox: outbox b's clock, two hours behind a's (a
// cluster whose server's time differs), decides b's ages: its events,
// an hour old by a's clock, are not yet 30 minutes old by b's.
func TestFleetClockPerOutbox(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a, b := fleetStore(ctx, t, mongo.CollectionDefault), fleetStore(ctx, t, "other_outbox")
	srv := startConsole(t, console.Config{
		Outboxes: []console.Outbox{
			{Name: "a", Store: a, Samples: samples{}},
			{Name: "b", Store: b, Samples: samples{}, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }},
		},
		Token: token,
	})
	for name, want := range map[string]int{"a": len(fleetIDs), "b": 0} {
		code, body, _ := request(t, srv, http.MethodGet, "/o/"+name+"/api/events?status=FAILED&olderThan=30m", "ana", token, nil, nil)
		var list console.EventList
		if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Events) != want {
			t.Errorf("outbox %s lists %d events older than 30m (%d, %v), want %d", name, len(list.Events), code, err, want)
		}
	}
}

// TestFleetSelectorKeepsFilters: the selector of a filtered events list
// carries its filters, and opens the same list of the other outbox,
// without the cursor, which points into this outbox's list.
func TestFleetSelectorKeepsFilters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	srv := fleetConsole(t, fleetStore(ctx, t, mongo.CollectionDefault), fleetStore(ctx, t, "other_outbox"))
	html := map[string]string{"Accept": "text/html"}
	_, page, _ := request(t, srv, http.MethodGet, "/o/a/events?status=FAILED&type=order.created&error=refused", "ana", token, nil, html)
	for _, want := range []string{`<input type="hidden" name="type" value="order.created">`, `<input type="hidden" name="error" value="refused">`} {
		if !strings.Contains(page, want) {
			t.Errorf("a's filtered list's selector lacks %s", want)
		}
	}
	path := "/o/a/outbox?outbox=b&page=events&status=NEW&type=order.created&olderThan=10m&after=cursor"
	code, _, h := request(t, srv, http.MethodGet, path, "ana", token, nil, html)
	if want := "/o/b/events?olderThan=10m&status=NEW&type=order.created"; code != http.StatusSeeOther || h.Get("Location") != want {
		t.Errorf("GET %s = %d to %q, want 303 to %s", path, code, h.Get("Location"), want)
	}
}
