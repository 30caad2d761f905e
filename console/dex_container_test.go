package console_test

// The console behind Dex, a well-known OpenID provider, as an operator
// would configure it (docs/console.md): the issuer's discovery, a
// confidential client with its secret, and the roles from the provider's
// groups claim. Dex runs from its published image where Docker exists
// (the container suite: it skips, saying so, where there is none), or
// from a binary OUTBOX_TEST_DEX_BINARY names, which needs no Docker
// (testenv.Dex).
// Each user signs in at Dex's own password form, through the
// authorization code flow with PKCE the console starts.

import (
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/service"
)

// dexUsers are Dex's static users: the console's roles are groups of
// the same names, beside groups that are none.
var dexUsers = []testenv.DexUser{
	{Email: "vera@example.com", Name: "vera", Groups: []string{"viewer"}},
	{Email: "otto@example.com", Name: "otto", Groups: []string{"operator", "payments-team"}},
	{Email: "ada@example.com", Name: "ada", Groups: []string{"admin"}},
	{Email: "nora@example.com", Name: "nora", Groups: []string{"payments-team"}},
}

// dexSignIn signs email in from the console's overview at Dex's
// password form, and returns the page the console ends on.
func dexSignIn(t *testing.T, b *agent, consoleURL, email string) (int, string) {
	t.Helper()
	code, page, at := b.follow(consoleURL + "/")
	form := regexp.MustCompile(`<form[^>]*method="post"[^>]*action="([^"]+)"`).FindStringSubmatch(page)
	if code != http.StatusOK || form == nil || !strings.Contains(page, `name="login"`) {
		t.Fatalf("the overview without a session led to %s (%d), want Dex's password form:\n%s", at, code, page)
	}
	post := mustParse(t, at).ResolveReference(mustParse(t, html.UnescapeString(form[1]))).String()
	code, page, h := b.do(http.MethodPost, post, url.Values{"login": {email}, "password": {testenv.DexPassword}})
	if code < 300 || code >= 400 {
		t.Fatalf("Dex's sign-in of %s = %d, want a redirect:\n%s", email, code, page)
	}
	code, page, _ = b.follow(mustParse(t, post).ResolveReference(mustParse(t, h.Get("Location"))).String())
	return code, page
}

// TestContainerDexSignInRoles: behind Dex, each user signs in at Dex's
// form; the roles come from Dex's groups claim. A viewer may not act; an
// operator requeues a FAILED event, and is refused a discard and an
// action on more than BulkAdminAbove events; an admin discards; a user
// in no console group is refused; the audit names each from Dex's
// e-mail.
func TestContainerDexSignInRoles(t *testing.T) {
	t.Parallel()
	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	consoleURL := "http://" + lis.Addr().String()
	issuer := testenv.Dex(t, consoleURL+"/auth/callback", dexUsers)

	store := mongotest.Store(t)
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	mongotest.Insert(t, store.Collection(),
		mongotest.Event("to-requeue", events.StatusFailed, at, bson.E{Key: events.FieldLastError, Value: "nacked"}),
		mongotest.Event("to-discard", events.StatusFailed, at.Add(time.Second), bson.E{Key: events.FieldLastError, Value: "nacked"}),
		mongotest.Event("other", events.StatusFailed, at.Add(2*time.Second), bson.E{Key: events.FieldLastError, Value: "nacked"}),
	)
	o, err := console.NewOIDC(t.Context(), console.OIDCConfig{
		IssuerURL: issuer, ClientID: testenv.DexClientID, ClientSecret: testenv.DexClientSecret, RedirectURL: consoleURL + "/auth/callback",
		Scopes: []string{"profile", "email", "groups"}, RolesClaim: "groups",
	})
	if err != nil {
		t.Fatalf("NewOIDC with Dex's issuer: %v", err)
	}
	c, err := console.New(console.Config{
		Store: store, Samples: samples{}, Writer: store, OIDC: o, BulkAdminAbove: 1,
		Archetype: service.Archetype{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(c)
	_ = srv.Listener.Close()
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)

	status := func(id string) (events.Status, bool) {
		t.Helper()
		raw, err := store.Find(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := raw.Lookup(events.FieldStatus).StringValueOK()
		_, discarded := raw.Lookup(events.FieldDiscardedAt).TimeOK()
		return events.Status(s), discarded
	}
	act := func(b *agent, page, path string, extra url.Values) (int, string) {
		t.Helper()
		form := url.Values{"reason": {"checked with the payments team"}, "csrf": {csrfIn(t, page)}}
		for k, v := range extra {
			form[k] = v
		}
		code, body, _ := b.do(http.MethodPost, consoleURL+path, form)
		return code, body
	}

	vera := newAgent(t)
	code, page := dexSignIn(t, vera, consoleURL, "vera@example.com")
	if code != http.StatusOK || !strings.Contains(page, "vera@example.com (viewer)") {
		t.Fatalf("vera after Dex's sign-in = %d, want the overview naming her a viewer:\n%s", code, page)
	}
	if code, _ := act(vera, page, "/events/to-requeue/requeue", nil); code != http.StatusForbidden {
		t.Errorf("a viewer's requeue = %d, want 403", code)
	}

	otto := newAgent(t)
	code, page = dexSignIn(t, otto, consoleURL, "otto@example.com")
	if code != http.StatusOK || !strings.Contains(page, "otto@example.com (operator)") {
		t.Fatalf("otto after Dex's sign-in = %d, want the overview naming him an operator:\n%s", code, page)
	}
	if code, body := act(otto, page, "/events/to-requeue/requeue", nil); code != http.StatusSeeOther {
		t.Errorf("an operator's requeue = %d, want 303:\n%s", code, body)
	}
	if code, body := act(otto, page, "/events/to-discard/discard", url.Values{"confirm": {"discard"}}); code != http.StatusForbidden || !strings.Contains(body, "admin") {
		t.Errorf("an operator's discard = %d, want 403 naming the admin role:\n%s", code, body)
	}
	if code, body, _ := otto.do(http.MethodGet, consoleURL+"/requeue?id=to-discard&id=other", nil); code != http.StatusForbidden || !strings.Contains(body, "admin") {
		t.Errorf("an operator's preview of 2 events (BulkAdminAbove 1) = %d, want 403 naming the admin role:\n%s", code, body)
	}

	ada := newAgent(t)
	code, page = dexSignIn(t, ada, consoleURL, "ada@example.com")
	if code != http.StatusOK || !strings.Contains(page, "ada@example.com (admin)") {
		t.Fatalf("ada after Dex's sign-in = %d, want the overview naming her an admin:\n%s", code, page)
	}
	if code, body := act(ada, page, "/events/to-discard/discard", url.Values{"confirm": {"discard"}}); code != http.StatusSeeOther {
		t.Errorf("an admin's discard = %d, want 303:\n%s", code, body)
	}

	if code, page := dexSignIn(t, newAgent(t), consoleURL, "nora@example.com"); code != http.StatusForbidden || !strings.Contains(page, "no role") {
		t.Errorf("a user in no console group = %d, want 403 saying so:\n%s", code, page)
	}

	for id, want := range map[string]struct {
		status    events.Status
		discarded bool
	}{"to-requeue": {events.StatusNew, false}, "to-discard": {events.StatusFailed, true}, "other": {events.StatusFailed, false}} {
		if s, d := status(id); s != want.status || d != want.discarded {
			t.Errorf("%s is %s, discarded %v; want %s, discarded %v", id, s, d, want.status, want.discarded)
		}
	}
	actions, err := store.Actions(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var done []string
	for _, a := range actions {
		done = append(done, fmt.Sprintf("%s %s %d %s", a.By, a.Name, a.Count, a.State))
	}
	want := []string{"ada@example.com discard 1 " + mongo.ActionDone, "otto@example.com requeue 1 " + mongo.ActionDone}
	if strings.Join(done, "; ") != strings.Join(want, "; ") {
		t.Errorf("audit = %q, want %q (newest first)", done, want)
	}
}
