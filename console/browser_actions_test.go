package console_test

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// TestBrowserPreviewThenAct drives a real browser through a group's
// requeue and a selection's skip: the preview lists what the action will
// touch, a refresh keeps the reason typed, the action moves the previewed
// events and no event that failed since, and a request for a host the
// console does not answer to (DNS rebinding) is refused.
func TestBrowserPreviewThenAct(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	mongotest.Insert(t, store.Collection(),
		noRoute("g1", at), noRoute("g2", at.Add(time.Second)),
		noRoute("skipped", at, bson.E{Key: events.FieldSkippedAt, Value: at}),
		mongotest.Event("other", events.StatusFailed, at, bson.E{Key: events.FieldLastError, Value: "nacked"}),
	)
	const token = "browser-test-token-0123"
	srv := startConsole(t, console.Config{
		Store: store, Samples: samples{}, Writer: store, Token: token, AllowedHosts: []string{"127.0.0.1"},
		Archetype: service.Archetype{Logger: quiet}, Refresh: time.Hour,
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ana:"+token))
	var preview, reason, refreshed, audit, skipPreview, rebound string
	shots := screenshots(t)
	err = chromedp.Run(ctx,
		scheme("light"),
		network.Enable(),
		network.SetExtraHTTPHeaders(network.Headers{"Authorization": auth}),
		chromedp.Navigate(srv.URL+"/failures"),
		chromedp.WaitVisible(`a[href^="/requeue?"]`),
		chromedp.Click(`a[href^="/requeue?"]`),
		chromedp.WaitVisible(`form.action input[name="reason"]`),
		chromedp.Text(`main`, &preview),
		chromedp.SendKeys(`form.action input[name="reason"]`, "route added"),
		// Refresh now (key r, once the field is left): the page holds a
		// form, which a refresh keeps, typed reason and all.
		chromedp.Click(`h1`),
		chromedp.KeyEvent("r"),
		chromedp.WaitVisible(`#refreshed:not(:empty)`),
		chromedp.Text(`#refreshed`, &refreshed),
		chromedp.Value(`form.action input[name="reason"]`, &reason),
		shots.take("console-preview.png"),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	// An event fails the same way after the preview.
	mongotest.Insert(t, store.Collection(), noRoute("late", at.Add(-time.Minute)))
	err = chromedp.Run(ctx,
		chromedp.Click(`form.action button[type=submit]`),
		chromedp.WaitVisible(`main table`),
		chromedp.Text(`main table`, &audit),
		chromedp.Navigate(srv.URL+"/events?status=FAILED"),
		chromedp.WaitVisible(`input[type=checkbox][value="late"]`),
		chromedp.Click(`input[type=checkbox][value="late"]`),
		chromedp.Click(`input[type=checkbox][value="other"]`),
		shots.take("console-selection.png"),
		chromedp.Click(`#skip-selected`),
		chromedp.WaitVisible(`form.action input[name="reason"]`),
		chromedp.Text(`main`, &skipPreview),
		chromedp.SendKeys(`form.action input[name="reason"]`, "compensated by hand"),
		chromedp.Click(`form.action button[type=submit]`),
		chromedp.WaitVisible(`main table`),
		chromedp.Navigate("http://rebound.localhost:"+u.Port()+"/api/events?status=FAILED"),
		chromedp.Text(`body`, &rebound),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if !strings.Contains(preview, "2 FAILED events") || !strings.Contains(preview, "g1") || !strings.Contains(preview, "g2") {
		t.Errorf("the preview does not list the group's 2 events:\n%s", preview)
	}
	if reason != "route added" || !strings.Contains(refreshed, "refreshed") {
		t.Errorf("after a refresh (%q) the reason reads %q, want it kept", refreshed, reason)
	}
	if !strings.Contains(audit, "route added") || !strings.Contains(audit, "done") {
		t.Errorf("the audit does not list the requeue, done:\n%s", audit)
	}
	if !strings.Contains(skipPreview, "2 FAILED events") || !strings.Contains(skipPreview, "skipped") {
		t.Errorf("the skip's preview does not list the 2 selected events:\n%s", skipPreview)
	}
	if !strings.Contains(rebound, "does not answer to the host") {
		t.Errorf("a request for rebound.localhost was not refused:\n%s", rebound)
	}
	want := map[string]events.Status{"g1": events.StatusNew, "g2": events.StatusNew, "skipped": events.StatusFailed, "other": events.StatusFailed, "late": events.StatusFailed}
	got := mongotest.Statuses(t, store.Collection())
	for id, st := range want {
		if got[id] != st {
			t.Errorf("%s is %s, want %s", id, got[id], st)
		}
	}
	for _, id := range []string{"late", "other"} {
		if e, err := store.Find(t.Context(), id); err != nil || e.Lookup(events.FieldSkipReason).StringValue() != "compensated by hand" {
			t.Errorf("%s was not skipped by the selection: %v", id, err)
		}
	}
	if actions, err := store.Actions(t.Context(), 10); err != nil || len(actions) != 2 || actions[0].Name != "skip" || actions[0].Count != 2 || actions[1].Count != 2 {
		t.Errorf("audit = %+v, %v; want the requeue of 2 and the skip of 2", actions, err)
	}
}
