package console_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/service"
)

// oidcSetup is a console that signs in through a real OpenID provider.
type oidcSetup struct {
	url   string // the console's
	store *fakeStore
	mu    sync.Mutex
	local time.Time // the console's local clock
}

func (s *oidcSetup) advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.local = s.local.Add(d)
}

// startOIDC serves a console with its actions on, over a fakeStore,
// behind the in-process provider.
func startOIDC(t *testing.T, cfg console.Config) *oidcSetup {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &oidcSetup{url: "http://" + lis.Addr().String(), store: newFakeStore(t), local: time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)}
	s.store.matching = 5
	issuer := startProvider(t, s.url+"/auth/callback")
	o, err := console.NewOIDC(t.Context(), console.OIDCConfig{
		IssuerURL: issuer, ClientID: opClientID, ClientSecret: opClientSecret, RedirectURL: s.url + "/auth/callback",
		RolesClaim: opRolesClaim,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Samples, cfg.Writer, cfg.OIDC = s.store, samples{}, s.store, o
	cfg.Archetype = service.Archetype{Logger: quiet, Now: func() time.Time { return now }, Local: func() time.Time {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.local
	}}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(c)
	_ = srv.Listener.Close()
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)
	return s
}

// agent follows redirects by hand and keeps cookies per host, sending
// Secure ones over plain HTTP as a agent does to localhost: Go's
// cookie jar sends them over HTTPS only.
type agent struct {
	t       *testing.T
	cookies map[string]map[string]*http.Cookie // by host, by name
	// set are the cookies the last response set, by name.
	set map[string]*http.Cookie
}

func newAgent(t *testing.T) *agent {
	return &agent{t: t, cookies: map[string]map[string]*http.Cookie{}}
}

// do sends one request, without following a redirect.
func (b *agent) do(method, target string, form url.Values) (int, string, http.Header) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.t.Context(), method, target, body)
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/html")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+req.URL.Host)
	}
	for _, ck := range b.cookies[req.URL.Host] {
		req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
	}
	client := http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	b.set = map[string]*http.Cookie{}
	for _, ck := range resp.Cookies() {
		b.set[ck.Name] = ck
		if b.cookies[req.URL.Host] == nil {
			b.cookies[req.URL.Host] = map[string]*http.Cookie{}
		}
		if ck.MaxAge < 0 {
			delete(b.cookies[req.URL.Host], ck.Name)
			continue
		}
		b.cookies[req.URL.Host][ck.Name] = ck
	}
	return resp.StatusCode, string(page), resp.Header
}

// follow sends a GET and follows redirects, at most 10, returning the
// last answer and its URL.
func (b *agent) follow(target string) (int, string, string) {
	b.t.Helper()
	for range 10 {
		code, page, h := b.do(http.MethodGet, target, nil)
		if code < 300 || code >= 400 {
			return code, page, target
		}
		target = mustParse(b.t, target).ResolveReference(mustParse(b.t, h.Get("Location"))).String()
	}
	b.t.Fatalf("more than 10 redirects from %s", target)
	return 0, "", ""
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// signIn signs user in from the console's overview through the
// provider's form, and returns the overview's page.
func (b *agent) signIn(s *oidcSetup, user string) (int, string) {
	b.t.Helper()
	code, page, at := b.follow(s.url + "/")
	if code != http.StatusOK || !strings.Contains(page, "Provider sign-in") {
		b.t.Fatalf("the overview without a session led to %s (%d), want the provider's sign-in:\n%s", at, code, page)
	}
	id := regexp.MustCompile(`name="id" value="([^"]+)"`).FindStringSubmatch(page)
	if id == nil {
		b.t.Fatalf("no auth request id in the provider's form:\n%s", page)
	}
	provider := mustParse(b.t, at)
	code, _, h := b.do(http.MethodPost, provider.Scheme+"://"+provider.Host+"/login/username",
		url.Values{"id": {id[1]}, "username": {user}, "password": {opPassword}})
	if code != http.StatusFound {
		b.t.Fatalf("the provider's sign-in of %s = %d", user, code)
	}
	code, page, _ = b.follow(provider.ResolveReference(mustParse(b.t, h.Get("Location"))).String())
	return code, page
}

// csrfIn is the CSRF token a console page's forms carry.
func csrfIn(t *testing.T, page string) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

// TestOIDCSignIn: the console sends a agent without a session to the
// provider with a PKCE challenge, opens a session on the callback (a
// Secure, HttpOnly, SameSite=Lax cookie), and names the user and role;
// a callback whose state this agent was not given is refused, as is a
// user with no console role.
func TestOIDCSignIn(t *testing.T) {
	t.Parallel()
	s := startOIDC(t, console.Config{})
	b := newAgent(t)
	code, _, h := b.do(http.MethodGet, s.url+"/auth/signin?next=%2Fheld", nil)
	auth := mustParse(t, h.Get("Location"))
	if code != http.StatusFound || auth.Query().Get("code_challenge_method") != "S256" || auth.Query().Get("code_challenge") == "" ||
		auth.Query().Get("nonce") == "" || auth.Query().Get("state") == "" {
		t.Fatalf("sign-in = %d to %s, want the provider's authorization with a PKCE S256 challenge, a nonce and a state", code, auth)
	}
	if ck := b.set["outbox_console_signin"]; ck == nil || !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteLaxMode {
		t.Errorf("the sign-in's state cookie = %+v, want Secure, HttpOnly, SameSite=Lax", ck)
	}

	code, page := b.signIn(s, "otto@example.com")
	if code != http.StatusOK || !strings.Contains(page, "otto@example.com (operator)") || !strings.Contains(page, `action="/auth/signout"`) {
		t.Fatalf("after sign-in = %d, want the overview naming otto as operator, with a sign-out:\n%s", code, page)
	}
	session := b.cookies[mustParse(t, s.url).Host]["outbox_console_session"]
	if session == nil || !session.Secure || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode {
		t.Errorf("the session cookie = %+v, want Secure, HttpOnly, SameSite=Lax", session)
	}
	if code, _, _ := b.do(http.MethodGet, s.url+"/api/events", nil); code != http.StatusOK {
		t.Errorf("a read with the session = %d, want 200", code)
	}
	if code, _, _ := newAgent(t).do(http.MethodGet, s.url+"/api/events", nil); code != http.StatusUnauthorized {
		t.Errorf("a read of the API without a session = %d, want 401", code)
	}

	// A callback this agent did not start: a login CSRF.
	other := newAgent(t)
	if code, _, _ := other.do(http.MethodGet, s.url+"/auth/callback?code=x&state="+auth.Query().Get("state"), nil); code != http.StatusBadRequest {
		t.Errorf("a callback without this agent's state cookie = %d, want 400", code)
	}
	if code, page := newAgent(t).signIn(s, "nora@example.com"); code != http.StatusForbidden || !strings.Contains(page, "no role") {
		t.Errorf("a user without a console role = %d, want 403 saying so: %s", code, page)
	}
}

// TestOIDCRolesCSRFAndExpiry: an operator requeues through a preview
// with the session's CSRF token and is refused without it; a viewer may
// not act; a bulk action above BulkAdminAbove needs an admin; a session
// ends when idle, at its absolute age, and at sign-out.
func TestOIDCRolesCSRFAndExpiry(t *testing.T) {
	t.Parallel()
	s := startOIDC(t, console.Config{BulkAdminAbove: 3})
	s.store.matching = 2
	otto := newAgent(t)
	_, page := otto.signIn(s, "otto@example.com")
	csrf := csrfIn(t, page)
	_, preview, _ := otto.do(http.MethodGet, s.url+"/requeue?cause=x&reason=", nil)
	if csrfIn(t, preview) != csrf {
		t.Errorf("the preview's form carries another CSRF token than the session's")
	}
	form := url.Values{"preview": {previewIn(t, preview)}, "reason": {"route added"}}
	if code, _, _ := otto.do(http.MethodPost, s.url+"/requeue", form); code != http.StatusForbidden {
		t.Errorf("a requeue without the CSRF token = %d, want 403", code)
	}
	form.Set("csrf", csrf)
	if code, _, _ := otto.do(http.MethodPost, s.url+"/requeue", form); code != http.StatusSeeOther {
		t.Errorf("the operator's requeue with the CSRF token = %d, want 303", code)
	}
	if a := s.store.actions; len(a) != 1 || a[0].By != "otto@example.com" || a[0].Count != 2 {
		t.Errorf("audit = %+v, want otto's requeue of 2", a)
	}
	s.store.matching = 5
	if code, page, _ := otto.do(http.MethodGet, s.url+"/requeue?cause=x&reason=", nil); code != http.StatusForbidden || !strings.Contains(page, "admin") {
		t.Errorf("an operator's preview of 5 events (BulkAdminAbove 3) = %d, want 403 naming admin", code)
	}
	ada := newAgent(t)
	_, page = ada.signIn(s, "ada@example.com")
	_, preview, _ = ada.do(http.MethodGet, s.url+"/requeue?cause=x&reason=", nil)
	if code, _, _ := ada.do(http.MethodPost, s.url+"/requeue", url.Values{"preview": {previewIn(t, preview)}, "reason": {"r"}, "csrf": {csrfIn(t, page)}}); code != http.StatusSeeOther {
		t.Errorf("an admin's requeue of 5 = %d, want 303", code)
	}
	vera := newAgent(t)
	_, page = vera.signIn(s, "vera@example.com")
	if code, _, _ := vera.do(http.MethodPost, s.url+"/events/evil-1/requeue", url.Values{"reason": {"r"}, "csrf": {csrfIn(t, page)}}); code != http.StatusForbidden {
		t.Errorf("a viewer's requeue = %d, want 403", code)
	}
	if n := len(s.store.requeues); n != 2 {
		t.Errorf("%d requeues done, want otto's and ada's", n)
	}

	// Idle: a session unused for SessionIdle is gone.
	s.advance(console.SessionIdleDefault)
	if code, _, _ := otto.do(http.MethodGet, s.url+"/api/events", nil); code != http.StatusUnauthorized {
		t.Errorf("a read after SessionIdle unused = %d, want 401", code)
	}
	// Absolute: used every 20 minutes, a session still ends at its age.
	otto.signIn(s, "otto@example.com")
	for range int(console.SessionMaxAgeDefault / (20 * time.Minute)) {
		s.advance(20 * time.Minute)
		otto.do(http.MethodGet, s.url+"/api/events", nil)
	}
	if code, _, _ := otto.do(http.MethodGet, s.url+"/api/events", nil); code != http.StatusUnauthorized {
		t.Errorf("a read past SessionMaxAge = %d, want 401", code)
	}
	// Sign-out: the session's cookie no longer opens anything, even
	// replayed.
	_, page = otto.signIn(s, "otto@example.com")
	host := mustParse(t, s.url).Host
	stolen := *otto.cookies[host]["outbox_console_session"]
	if code, _, _ := otto.do(http.MethodPost, s.url+"/auth/signout", url.Values{"csrf": {csrfIn(t, page)}}); code != http.StatusSeeOther {
		t.Fatalf("sign-out = %d, want 303", code)
	}
	otto.cookies[host]["outbox_console_session"] = &stolen
	if code, _, _ := otto.do(http.MethodGet, s.url+"/api/events", nil); code != http.StatusUnauthorized {
		t.Errorf("a read with a signed-out session's cookie = %d, want 401", code)
	}
}

// TestOIDCDiscardNeedsAdmin: a discard of one FAILED event, from its
// page, is refused to a viewer and to an operator, whatever their
// number of events, and done for an admin, audited with the event.
func TestOIDCDiscardNeedsAdmin(t *testing.T) {
	t.Parallel()
	s := startOIDC(t, console.Config{})
	form := func(page string) url.Values {
		return url.Values{"reason": {"a duplicate of order 7's"}, "csrf": {csrfIn(t, page)}, "confirm": {"discard"}}
	}
	for _, user := range []string{"vera@example.com", "otto@example.com"} {
		b := newAgent(t)
		b.signIn(s, user)
		_, page, _ := b.do(http.MethodGet, s.url+"/events/evil-1", nil)
		if strings.Contains(page, "/discard") {
			t.Errorf("%s's page of a FAILED event offers a discard", user)
		}
		if code, page, _ := b.do(http.MethodPost, s.url+"/events/evil-1/discard", form(page)); code != http.StatusForbidden || !strings.Contains(page, "admin") {
			t.Errorf("%s's discard = %d, want 403 naming the admin role:\n%s", user, code, page)
		}
	}
	if len(s.store.discards) != 0 || len(s.store.actions) != 0 {
		t.Fatalf("after refusals, discards %v and audit %+v; want none", s.store.discards, s.store.actions)
	}
	ada := newAgent(t)
	ada.signIn(s, "ada@example.com")
	_, page, _ := ada.do(http.MethodGet, s.url+"/events/evil-1", nil)
	if !strings.Contains(page, `action="/events/evil-1/discard"`) {
		t.Errorf("an admin's page of a FAILED event offers no discard:\n%s", page)
	}
	unconfirmed := form(page)
	unconfirmed.Del("confirm")
	if code, _, _ := ada.do(http.MethodPost, s.url+"/events/evil-1/discard", unconfirmed); code != http.StatusBadRequest || len(s.store.discards) != 0 {
		t.Errorf("an admin's discard without its confirmation = %d, discarded %v; want 400 and nothing", code, s.store.discards)
	}
	if code, page, _ := ada.do(http.MethodPost, s.url+"/events/evil-1/discard", form(page)); code != http.StatusSeeOther {
		t.Fatalf("an admin's discard = %d, want 303:\n%s", code, page)
	}
	if d := s.store.discards; !slices.Contains(d, "evil-1") {
		t.Errorf("discarded %v, want evil-1", d)
	}
	a := s.store.actions
	if len(a) != 1 || a[0].Name != "discard" || a[0].By != "ada@example.com" || a[0].Count != 1 || a[0].State != mongo.ActionDone ||
		!slices.Contains(a[0].IDs, any("evil-1")) || a[0].Reason != "a duplicate of order 7's" {
		t.Errorf("audit = %+v, want ada's discard of evil-1, done, with its reason", a)
	}
}

// TestOIDCBulkDiscardNeedsAdmin: a discard of a selection is previewed
// as a skip is; the preview is refused to an operator, and an admin's is
// done once confirmed, on the previewed events alone, and audited.
func TestOIDCBulkDiscardNeedsAdmin(t *testing.T) {
	t.Parallel()
	s := startOIDC(t, console.Config{})
	s.store.matching = 2
	otto := newAgent(t)
	otto.signIn(s, "otto@example.com")
	if _, page, _ := otto.do(http.MethodGet, s.url+"/events?status=FAILED", nil); strings.Contains(page, "/discard") {
		t.Errorf("an operator's list of FAILED events offers a discard of a selection")
	}
	if code, page, _ := otto.do(http.MethodGet, s.url+"/discard?id=e-0&id=e-1", nil); code != http.StatusForbidden || !strings.Contains(page, "admin") {
		t.Errorf("an operator's preview of a discard = %d, want 403 naming the admin role:\n%s", code, page)
	}
	ada := newAgent(t)
	ada.signIn(s, "ada@example.com")
	if _, page, _ := ada.do(http.MethodGet, s.url+"/events?status=FAILED", nil); !strings.Contains(page, `formaction="/discard"`) {
		t.Errorf("an admin's list of FAILED events offers no discard of a selection:\n%s", page)
	}
	code, preview, _ := ada.do(http.MethodGet, s.url+"/discard?id=e-0&id=e-1", nil)
	if code != http.StatusOK || !strings.Contains(preview, "2 FAILED events") || !strings.Contains(preview, "never") {
		t.Fatalf("an admin's preview of a discard = %d, want 2 events that are never to be published:\n%s", code, preview)
	}
	form := url.Values{"preview": {previewIn(t, preview)}, "reason": {"duplicates"}, "csrf": {csrfIn(t, preview)}}
	if code, _, _ := ada.do(http.MethodPost, s.url+"/discard", form); code != http.StatusBadRequest || len(s.store.discards) != 0 {
		t.Errorf("a bulk discard without its confirmation = %d, discarded %v; want 400 and nothing", code, s.store.discards)
	}
	form.Set("confirm", "discard")
	if code, page, _ := ada.do(http.MethodPost, s.url+"/discard", form); code != http.StatusSeeOther {
		t.Fatalf("an admin's bulk discard = %d, want 303:\n%s", code, page)
	}
	if d := s.store.discards; !slices.Equal(d, []string{"e-0", "e-1"}) {
		t.Errorf("discarded %v, want the previewed e-0 and e-1", d)
	}
	if a := s.store.actions; len(a) != 1 || a[0].Name != "discard" || a[0].By != "ada@example.com" || len(a[0].IDs) != 2 {
		t.Errorf("audit = %+v, want ada's discard of the 2 previewed events", a)
	}
}
