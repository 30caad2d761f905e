package console_test

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/console"
)

// serveConfig serves a console of cfg over a fakeStore with one FAILED
// event, its Writer the store unless cfg says read-only.
func serveConfig(t *testing.T, cfg console.Config, writes bool) (*httptest.Server, *fakeStore) {
	t.Helper()
	store := newFakeStore(t)
	store.matching = 1
	return serveFake(t, store, cfg, writes), store
}

// hostRequest sends a GET of path with Host host.
func hostRequest(t *testing.T, srv *httptest.Server, path, host string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestRebindingIsRefused: a request whose Host the console does not
// answer to, as a page of another site rebound to its address sends, is
// refused before any data is read.
func TestRebindingIsRefused(t *testing.T) {
	t.Parallel()
	srv, store := serveConfig(t, console.Config{AllowedHosts: []string{"127.0.0.1:8090", "localhost", "::1"}}, false)
	for host, want := range map[string]int{
		"evil.example":       http.StatusMisdirectedRequest,
		"evil.example:8090":  http.StatusMisdirectedRequest,
		"127.0.0.1:9999":     http.StatusMisdirectedRequest,
		"127.0.0.1:8090":     http.StatusOK,
		"LOCALHOST:1234":     http.StatusOK,
		"[::1]:8090":         http.StatusOK,
		"localhost.evil.com": http.StatusMisdirectedRequest,
	} {
		if got := hostRequest(t, srv, "/api/events", host); got != want {
			t.Errorf("GET /api/events with Host %s = %d, want %d", host, got, want)
		}
	}
	_ = store
	srv, store = serveConfig(t, console.Config{AllowedHosts: []string{"localhost"}}, false)
	hostRequest(t, srv, "/api/events", "evil.example")
	if store.query.Status != "" {
		t.Errorf("a request for a refused host read the events: %+v", store.query)
	}
}

// TestTokenProtectsReads: read-only, a token is asked of every read.
func TestTokenProtectsReads(t *testing.T) {
	t.Parallel()
	srv, _ := serveConfig(t, console.Config{Token: token}, false)
	if code, _, h := request(t, srv, http.MethodGet, "/api/events", "", "", nil, nil); code != http.StatusUnauthorized || h.Get("WWW-Authenticate") == "" {
		t.Errorf("a read without the token = %d, want 401 asking for it", code)
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/api/events", "ana", token, nil, nil); code != http.StatusOK {
		t.Errorf("a read with the token = %d, want 200", code)
	}
	if code, body, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", token, url.Values{"reason": {"x"}}, nil); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("a POST to a read-only console with the token = %d, want 403", code)
	}
}

func digest(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

// TestUsersSignInAsThemselves: with per-user credentials each operator
// gives their own token, and the audit names them; another's token or a
// name not listed is refused.
func TestUsersSignInAsThemselves(t *testing.T) {
	t.Parallel()
	const anaToken, boToken = "ana-token-0123456789", "bo-token-0123456789"
	srv, store := serveConfig(t, console.Config{Users: map[string]string{"ana": digest(anaToken), "bo": digest(boToken)}}, true)
	for _, tt := range []struct{ user, pass string }{{"ana", boToken}, {"eve", anaToken}, {"", anaToken}} {
		if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", tt.user, tt.pass, url.Values{"reason": {"x"}}, nil); code != http.StatusUnauthorized {
			t.Errorf("POST as %q with another's token = %d, want 401", tt.user, code)
		}
	}
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", anaToken, url.Values{"reason": {"route added"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("POST as ana = %d, want 303", code)
	}
	if a := store.actions; len(a) != 1 || a[0].By != "ana" || !strings.HasPrefix(a[0].From, "127.0.0.1:") {
		t.Errorf("audit = %+v, want ana from the client's address", a)
	}
	if _, err := console.New(console.Config{Store: store, Samples: samples{}, Users: map[string]string{"ana": "not-hex"}}); err == nil || !strings.Contains(err.Error(), "Users") {
		t.Errorf("a user whose digest is not hex: %v, want an error naming Users", err)
	}
}

// TestIdentityFromTheApplication: an application that mounts the console
// tells who each request is from; the console asks for nothing else.
func TestIdentityFromTheApplication(t *testing.T) {
	t.Parallel()
	identity := func(r *http.Request) (string, bool) {
		u := r.Header.Get("X-Test-Session")
		return u, u != ""
	}
	srv, store := serveConfig(t, console.Config{Identity: identity}, true)
	if code, _, _ := request(t, srv, http.MethodGet, "/", "", "", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("a request the application does not know = %d, want 401", code)
	}
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/skip", "", "", url.Values{"reason": {"obsolete"}}, map[string]string{"X-Test-Session": "carla@example.com"}); code != http.StatusSeeOther {
		t.Fatalf("POST with the application's identity = %d, want 303", code)
	}
	if a := store.actions; len(a) != 1 || a[0].By != "carla@example.com" {
		t.Errorf("audit = %+v, want carla", a)
	}
}

// TestBehindATrustedProxy: from a trusted proxy that sends the proxy
// secret, its identity header and X-Forwarded-* are believed, so a POST
// whose Origin is the public name passes and the audit names the user
// and the client's address (the first hop, from the right, that is not
// a trusted proxy: never what the client wrote left of it); without the
// secret, or from any other address, they are not.
func TestBehindATrustedProxy(t *testing.T) {
	t.Parallel()
	const secret = "proxy-secret-0123456789"
	proxied := map[string]string{
		"X-Forwarded-User": "dana@example.com", "X-Forwarded-For": "198.51.100.66, 203.0.113.9, 127.0.0.1",
		"X-Forwarded-Host": "console.example.com", "X-Forwarded-Proto": "https",
		"Origin": "https://console.example.com", "Sec-Fetch-Site": "same-origin",
	}
	cfg := console.Config{
		IdentityHeader: "X-Forwarded-User", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		AllowedHosts: []string{"console.example.com"}, ProxySecret: secret,
	}
	srv, store := serveConfig(t, cfg, true)
	for name, value := range map[string]string{"no": "", "a wrong": "proxy-secret-0123456780"} {
		headers := maps.Clone(proxied)
		if value != "" {
			headers[console.ProxySecretHeaderDefault] = value
		}
		if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "", "", url.Values{"reason": {"x"}}, headers); code != http.StatusMisdirectedRequest && code != http.StatusUnauthorized {
			t.Errorf("the identity header from loopback with %s proxy secret = %d, want it refused", name, code)
		}
	}
	if len(store.actions) != 0 {
		t.Fatalf("an identity header without the proxy secret acted: %+v", store.actions)
	}
	proxied[console.ProxySecretHeaderDefault] = secret
	if code, body, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "", "", url.Values{"reason": {"route added"}}, proxied); code != http.StatusSeeOther {
		t.Fatalf("POST through the proxy = %d, want 303: %s", code, body)
	}
	if a := store.actions; len(a) != 1 || a[0].By != "dana@example.com" || a[0].From != "203.0.113.9" {
		t.Errorf("audit = %+v, want dana from 203.0.113.9", a)
	}
	cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	cfg.AllowedHosts = nil
	srv, store = serveConfig(t, cfg, true)
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "", "", url.Values{"reason": {"x"}}, proxied); code != http.StatusUnauthorized {
		t.Errorf("the identity header from an untrusted address = %d, want 401", code)
	}
	if len(store.actions) != 0 {
		t.Errorf("an untrusted identity header acted: %+v", store.actions)
	}
}

// TestAuthSettingsAreChecked: actions need some authentication, and an
// identity header is believed only with trusted proxies.
func TestAuthSettingsAreChecked(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	for want, cfg := range map[string]console.Config{
		"Writer":         {Store: store, Samples: samples{}, Writer: store},
		"IdentityHeader": {Store: store, Samples: samples{}, IdentityHeader: "X-Forwarded-User", ProxySecret: "proxy-secret-0123456789"},
		"Token":          {Store: store, Samples: samples{}, Token: "short"},
	} {
		if _, err := console.New(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v, want an error naming %s", err, want)
		}
	}
}
