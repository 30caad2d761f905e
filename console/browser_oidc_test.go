package console_test

import (
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// TestBrowserOIDCSignInActAndSignOut drives a real browser through the
// console behind an OpenID provider: sent to the provider's sign-in, an
// operator signs in, previews and runs a group's requeue, finds every
// event it moved on the action's page, is refused a bulk skip above
// BulkAdminAbove and a discard (an admin's: the event's page offers none,
// and one posted from it all the same is refused), and signs out, after
// which the console asks to sign in again.
func TestBrowserOIDCSignInActAndSignOut(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	store := mongotest.Store(t)
	at := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	var docs []bson.D
	for i := range 3 {
		docs = append(docs, noRoute(fmt.Sprintf("g%d", i), at.Add(time.Duration(i)*time.Second)))
	}
	for i := range 4 {
		docs = append(docs, mongotest.Event(fmt.Sprintf("n%d", i), events.StatusFailed, at, bson.E{Key: events.FieldLastError, Value: "nacked"}))
	}
	mongotest.Insert(t, store.Collection(), docs...)

	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// localhost, which a browser treats as a secure context: the
	// session's cookie is Secure.
	base := "http://localhost:" + fmt.Sprint(lis.Addr().(*net.TCPAddr).Port)
	issuer := startProvider(t, base+"/auth/callback")
	o, err := console.NewOIDC(t.Context(), console.OIDCConfig{
		IssuerURL: issuer, ClientID: opClientID, ClientSecret: opClientSecret, RedirectURL: base + "/auth/callback", RolesClaim: opRolesClaim,
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{
		Store: store, Samples: samples{}, Writer: store, OIDC: o, BulkAdminAbove: 3,
		Archetype: service.Archetype{Logger: quiet}, Refresh: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(c)
	_ = srv.Listener.Close()
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)

	var who, preview, audit, action, refused, eventPage, discard, signedOut, after string
	// forgeDiscard turns the event page's requeue form, its CSRF token
	// and all, into a discard and posts it: what an operator could send
	// without the page's help.
	const forgeDiscard = `(() => {
		const f = document.querySelector('form.action');
		f.action = '/events/n0/discard';
		const i = document.createElement('input');
		i.type = 'hidden'; i.name = 'confirm'; i.value = 'discard';
		f.appendChild(i);
		f.querySelector('input[name=reason]').value = 'a duplicate';
		f.submit();
		return true;
	})()`
	err = chromedp.Run(ctx,
		scheme("light"),
		chromedp.Navigate(base+"/failures"),
		chromedp.WaitVisible(`#provider-submit`),
		chromedp.SendKeys(`#username`, "otto@example.com"),
		chromedp.SendKeys(`#password`, opPassword),
		chromedp.Click(`#provider-submit`),
		chromedp.WaitVisible(`a[href^="/requeue?cause=broker"]`),
		chromedp.Text(`.who`, &who),
		chromedp.Click(`a[href^="/requeue?cause=broker"]`),
		chromedp.WaitVisible(`form.action input[name="reason"]`),
		chromedp.Text(`main`, &preview),
		chromedp.SendKeys(`form.action input[name="reason"]`, "route added"),
		chromedp.Click(`form.action button[type=submit]`),
		chromedp.WaitVisible(`main table`),
		chromedp.Text(`main table`, &audit),
		chromedp.Click(`main table tbody tr a[href^="/audit/"]`),
		chromedp.WaitVisible(`ul.touched`),
		chromedp.Text(`main`, &action),
		chromedp.Navigate(base+"/skip?id=n0&id=n1&id=n2&id=n3"),
		chromedp.WaitVisible(`main`),
		chromedp.Text(`main`, &refused),
		chromedp.Navigate(base+"/events/n0"),
		chromedp.WaitVisible(`form.action`),
		chromedp.Text(`main`, &eventPage),
		chromedp.Evaluate(forgeDiscard, nil),
		chromedp.WaitVisible(`p[role=alert]`),
		chromedp.Text(`main`, &discard),
		chromedp.Click(`#signout`),
		chromedp.WaitVisible(`body`),
		chromedp.Text(`body`, &signedOut),
		chromedp.Navigate(base+"/api/audit"),
		chromedp.WaitVisible(`body`),
		chromedp.Text(`body`, &after),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if !strings.Contains(who, "otto@example.com (operator)") {
		t.Errorf("the header names %q, want otto as operator", who)
	}
	if !strings.Contains(preview, "3 FAILED events") {
		t.Errorf("the preview does not list the group's 3 events:\n%s", preview)
	}
	if !strings.Contains(audit, "otto@example.com") || !strings.Contains(audit, "route added") || !strings.Contains(audit, "done") {
		t.Errorf("the audit does not list otto's requeue, done:\n%s", audit)
	}
	for _, id := range []string{"g0", "g1", "g2"} {
		if !strings.Contains(action, id) {
			t.Errorf("the action's page does not list %s, which it moved:\n%s", id, action)
		}
	}
	if !strings.Contains(action, "3 of the 3") {
		t.Errorf("the action's page does not say it changed 3 of 3:\n%s", action)
	}
	if !strings.Contains(refused, "admin") {
		t.Errorf("an operator's preview of a skip of 4 (BulkAdminAbove 3) was not refused for want of admin:\n%s", refused)
	}
	if strings.Contains(eventPage, "Discard") {
		t.Errorf("an operator's page of a FAILED event offers a discard:\n%s", eventPage)
	}
	if !strings.Contains(discard, "admin") {
		t.Errorf("an operator's discard was not refused for want of admin:\n%s", discard)
	}
	if e, err := store.Find(t.Context(), "n0"); err != nil || e.Lookup(events.FieldDiscardedAt).Type != 0 {
		t.Errorf("n0 was discarded by an operator: %v", err)
	}
	if !strings.Contains(signedOut, "signed out") || !strings.Contains(after, "sign in") {
		t.Errorf("after sign-out: %q, then the API says %q; want signed out, then asked to sign in", signedOut, after)
	}
	got := mongotest.Statuses(t, store.Collection())
	for _, id := range []string{"g0", "g1", "g2"} {
		if got[id] != events.StatusNew {
			t.Errorf("%s is %s after the requeue, want NEW", id, got[id])
		}
	}
	for _, id := range []string{"n0", "n1", "n2", "n3"} {
		if e, err := store.Find(t.Context(), id); err != nil || got[id] != events.StatusFailed || e.Lookup(events.FieldSkippedAt).Type != 0 {
			t.Errorf("%s was changed by a refused skip: %s, %v", id, got[id], err)
		}
	}
}
