package main

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
	"github.com/outboxrelay/outbox/mongo"
)

// TestContainerConsoleBehindDex runs `worker console` behind Dex,
// configured only through its OUTBOX_CONSOLE_OIDC_* variables as
// docs/console.md shows (the groups scope, the groups claim): an operator
// signs in at Dex's form and requeues, and is refused a discard, which an
// admin does; the audit names both. Dex runs from its image (the
// container suite: it skips without Docker) or from
// OUTBOX_TEST_DEX_BINARY.
func TestContainerConsoleBehindDex(t *testing.T) {
	t.Parallel()
	addr, err := workerproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr
	issuer := testenv.Dex(t, base+"/auth/callback", []testenv.DexUser{
		{Email: "otto@example.com", Name: "otto", Groups: []string{"operator", "payments-team"}},
		{Email: "ada@example.com", Name: "ada", Groups: []string{"admin"}},
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var docs []any
	for _, id := range []string{"to-requeue", "to-discard"} {
		docs = append(docs, draftDoc(t, events.Draft{ID: id, Type: "order.created", Payload: bson.D{{Key: "n", Value: 1}}}, time.Now().UTC(),
			bson.E{Key: events.FieldStatus, Value: events.StatusFailed}, bson.E{Key: events.FieldLastError, Value: "nacked"}))
	}
	db := testenv.Database(t)
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), db, docs)
	for k, v := range map[string]string{
		"OUTBOX_CONSOLE_ADDR":               addr,
		"OUTBOX_CONSOLE_WRITES":             "true",
		"OUTBOX_CONSOLE_OIDC_ISSUER":        issuer,
		"OUTBOX_CONSOLE_OIDC_CLIENT_ID":     testenv.DexClientID,
		"OUTBOX_CONSOLE_OIDC_CLIENT_SECRET": testenv.DexClientSecret,
		"OUTBOX_CONSOLE_OIDC_REDIRECT_URL":  base + "/auth/callback",
		"OUTBOX_CONSOLE_OIDC_SCOPES":        "profile,email,groups",
		"OUTBOX_CONSOLE_OIDC_ROLES_CLAIM":   "groups",
		"OUTBOX_AMQP_URL":                   "amqp://nobody@127.0.0.1:1/", // never dialled
	} {
		env[k] = v
	}
	p := startConsole(t, env)
	testenv.Eventually(t, time.Minute, func() (bool, string) {
		code, body := consoleGet(ctx, base+"/api/overview")
		return code == http.StatusUnauthorized, "the console asking for a session: " + body
	})
	waitConsoleOutboxes(t, p, 1)

	otto := dexBrowser(ctx, t, base, "otto@example.com", "(operator)")
	if code, body := otto.act(ctx, t, "/events/to-requeue/requeue", nil); code != http.StatusSeeOther {
		t.Errorf("the operator's requeue = %d, want 303:\n%s", code, body)
	}
	if code, body := otto.act(ctx, t, "/events/to-discard/discard", url.Values{"confirm": {"discard"}}); code != http.StatusForbidden || !strings.Contains(body, "admin") {
		t.Errorf("the operator's discard = %d, want 403 naming the admin role:\n%s", code, body)
	}
	ada := dexBrowser(ctx, t, base, "ada@example.com", "(admin)")
	if code, body := ada.act(ctx, t, "/events/to-discard/discard", url.Values{"confirm": {"discard"}}); code != http.StatusSeeOther {
		t.Errorf("the admin's discard = %d, want 303:\n%s", code, body)
	}

	for id, want := range map[string]events.Status{"to-requeue": events.StatusNew, "to-discard": events.StatusFailed} {
		var e events.Event
		if err := coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: id}}).Decode(&e); err != nil || e.Status != want || (id == "to-discard") != (e.DiscardedBy == "ada@example.com") {
			t.Errorf("%s = %s discarded by %q, %v; want %s, discarded by ada only if to-discard", id, e.Status, e.DiscardedBy, err, want)
		}
	}
	actions, err := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: coll.Name()}).Actions(ctx, 10)
	if err != nil || len(actions) != 2 || actions[0].Name != "discard" || actions[0].By != "ada@example.com" ||
		actions[1].Name != "requeue" || actions[1].By != "otto@example.com" {
		t.Errorf("audit = %+v, %v; want otto's requeue, then ada's discard", actions, err)
	}
	stopWorkers(t, p)
}

// dexSession is a browser signed in to the console through Dex.
type dexSession struct {
	base, csrf string
	jar        *plainJar
}

// dexBrowser signs email in at Dex's password form, from the console's
// overview, and checks that the console names the user with role.
func dexBrowser(ctx context.Context, t *testing.T, base, email, role string) *dexSession {
	t.Helper()
	jar := &plainJar{}
	client := &http.Client{Jar: jar}
	page, at := fetch(ctx, t, client, http.MethodGet, base+"/", nil)
	form := regexp.MustCompile(`<form[^>]*method="post"[^>]*action="([^"]+)"`).FindStringSubmatch(page)
	if form == nil || !strings.Contains(page, `name="login"`) {
		t.Fatalf("the overview without a session led to %s, want Dex's password form:\n%s", at, page)
	}
	post := at.ResolveReference(mustURL(t, html.UnescapeString(form[1]))).String()
	page, _ = fetch(ctx, t, client, http.MethodPost, post, url.Values{"login": {email}, "password": {testenv.DexPassword}})
	if !strings.Contains(page, email+" "+role) {
		t.Fatalf("after Dex's sign-in of %s, the page does not name %s:\n%s", email, role, page)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	if csrf == nil {
		t.Fatalf("no CSRF token on the overview:\n%s", page)
	}
	return &dexSession{base: base, csrf: csrf[1], jar: jar}
}

// act posts an action's form with the session's CSRF token, a reason
// and extra, without following the answer's redirect.
func (s *dexSession) act(ctx context.Context, t *testing.T, path string, extra url.Values) (int, string) {
	t.Helper()
	form := url.Values{"reason": {"checked with the payments team"}, "csrf": {s.csrf}}
	for k, v := range extra {
		form[k] = v
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", s.base)
	client := &http.Client{Jar: s.jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// fetch sends a page's request, following redirects, and returns the
// last page and its URL.
func fetch(ctx context.Context, t *testing.T, client *http.Client, method, target string, form url.Values) (string, *url.URL) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/html")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	return string(page), resp.Request.URL
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// plainJar keeps cookies by host and sends Secure ones over plain HTTP
// too, as a browser does to a console on loopback: net/http/cookiejar
// sends them over HTTPS only, and the console's session cookie is
// Secure.
type plainJar struct {
	mu     sync.Mutex
	byHost map[string]map[string]string
}

func (j *plainJar) SetCookies(u *url.URL, cookies []*http.Cookie) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.byHost == nil {
		j.byHost = map[string]map[string]string{}
	}
	if j.byHost[u.Host] == nil {
		j.byHost[u.Host] = map[string]string{}
	}
	for _, c := range cookies {
		if c.MaxAge < 0 {
			delete(j.byHost[u.Host], c.Name)
			continue
		}
		j.byHost[u.Host][c.Name] = c.Value
	}
}

func (j *plainJar) Cookies(u *url.URL) []*http.Cookie {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []*http.Cookie
	for name, value := range j.byHost[u.Host] {
		out = append(out, &http.Cookie{Name: name, Value: value})
	}
	return out
}
