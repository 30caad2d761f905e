package console_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/service"
)

// signInFrom sends GET / over TLS from remote with HTTP Basic user and
// pass straight to c, and returns its status.
func signInFrom(c *console.Console, remote, user, pass string) int {
	req := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
	req.RemoteAddr = remote
	req.TLS = &tls.ConnectionState{}
	req.SetBasicAuth(user, pass)
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	return rec.Code
}

// TestSignInThrottleKeysOnPrefixAndUser: failed sign-ins count against
// the client's network (an IPv6 /64, which one host may hold whole) and
// against the user name tried, so that neither new addresses of one
// network nor many networks guessing one user's token escape the limit.
func TestSignInThrottleKeysOnPrefixAndUser(t *testing.T) {
	t.Parallel()
	newConsole := func() *console.Console {
		c, err := console.New(console.Config{
			Store: newFakeStore(t), Samples: samples{}, SignInFailuresPerMinute: 3,
			Users:     map[string]string{"ana": digest("ana-token-0123456789"), "bo": digest("bo-token-0123456789")},
			Archetype: service.Archetype{Logger: quiet},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := newConsole()
	for i := range 3 {
		remote := "[2001:db8:1:2::" + string(rune('a'+i)) + "]:4000"
		if code := signInFrom(c, remote, "bo", "guess-guess-guess"); code != http.StatusUnauthorized {
			t.Fatalf("guess %d = %d, want 401", i+1, code)
		}
	}
	if code := signInFrom(c, "[2001:db8:1:2:ffff::9]:4000", "ana", "ana-token-0123456789"); code != http.StatusTooManyRequests {
		t.Errorf("another address of the same /64 after 3 failures = %d, want 429", code)
	}
	if code := signInFrom(c, "[2001:db8:1:3::1]:4000", "ana", "ana-token-0123456789"); code != http.StatusOK {
		t.Errorf("another /64 with the right token = %d, want 200", code)
	}

	c = newConsole()
	for i := range 3 {
		remote := "198.51.100." + string(rune('1'+i)) + ":4000"
		if code := signInFrom(c, remote, "bo", "guess-guess-guess"); code != http.StatusUnauthorized {
			t.Fatalf("guess %d = %d, want 401", i+1, code)
		}
	}
	if code := signInFrom(c, "203.0.113.50:4000", "bo", "guess-guess-guess"); code != http.StatusTooManyRequests {
		t.Errorf("a fourth guess of bo's token from a fourth address = %d, want 429", code)
	}
	if code := signInFrom(c, "203.0.113.50:4000", "ana", "ana-token-0123456789"); code != http.StatusOK {
		t.Errorf("ana from that address = %d, want 200: only bo's name is throttled", code)
	}
}

// TestSharedTokenActionsAreLimitedPerCredential: with the shared token
// the user name is whatever was typed, so the action limit counts the
// token, not the name.
func TestSharedTokenActionsAreLimitedPerCredential(t *testing.T) {
	t.Parallel()
	srv, store := serveConfig(t, console.Config{Token: token, ActionsPerMinute: 2}, true)
	for i, user := range []string{"ana", "bo", "carla"} {
		want := http.StatusSeeOther
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", user, token, url.Values{"reason": {"x"}}, nil); code != want {
			t.Errorf("action %d, typed as %s = %d, want %d", i+1, user, code, want)
		}
	}
	if len(store.requeues) != 2 {
		t.Errorf("%d requeues with the shared token, want 2", len(store.requeues))
	}
}

// TestErrorSearchIsBounded: the search of lastError, a pattern the
// database runs over every event of a status, is only on FAILED events
// and only so long; a filtered list is not refreshed.
func TestErrorSearchIsBounded(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	if code, body, _ := get(t, srv, "/outbox/api/events?status=PUBLISHED&error=timeout"); code != http.StatusBadRequest || !strings.Contains(body, "FAILED") {
		t.Errorf("an error search of PUBLISHED events = %d, want 400 naming FAILED: %s", code, body)
	}
	if code, _, _ := get(t, srv, "/outbox/api/events?status=FAILED&error="+strings.Repeat("x", 201)); code != http.StatusBadRequest {
		t.Errorf("an error search of 201 characters = %d, want 400", code)
	}
	if store.query.ErrorText != "" {
		t.Errorf("a refused search reached the store: %+v", store.query)
	}
	code, body, _ := get(t, srv, "/outbox/events?status=FAILED&error=timeout")
	if code != http.StatusOK || store.query.ErrorText != "timeout" {
		t.Fatalf("an error search of FAILED events = %d (query %+v), want it read", code, store.query)
	}
	if m := regexp.MustCompile(`data-refresh="(\d+)"`).FindStringSubmatch(body); m == nil || m[1] != "0" {
		t.Errorf("a filtered list refreshes itself (data-refresh %v), want 0", m)
	}
}

// blocking is a store whose event lists wait until released.
type blocking struct {
	*fakeStore
	entered chan struct{}
	release chan struct{}
}

func (b blocking) ListEvents(ctx context.Context, q mongo.EventQuery) ([]bson.Raw, *mongo.PageMark, error) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return b.fakeStore.ListEvents(ctx, q)
}

// TestReadsPerUserAreBounded: one user's requests read at most
// ReadsPerUser at once; another user is not held up by them.
func TestReadsPerUserAreBounded(t *testing.T) {
	t.Parallel()
	const anaToken, boToken = "ana-token-0123456789", "bo-token-0123456789"
	store := blocking{fakeStore: newFakeStore(t), entered: make(chan struct{}, 10), release: make(chan struct{})}
	srv := startConsole(t, console.Config{
		Store: store, Samples: samples{}, ReadsPerUser: 2,
		Users:     map[string]string{"ana": digest(anaToken), "bo": digest(boToken)},
		Archetype: service.Archetype{Logger: quiet},
	})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { request(t, srv, http.MethodGet, "/api/events?status=NEW&type=a", "ana", anaToken, nil, nil) })
	}
	for range 2 {
		<-store.entered
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/api/events?status=NEW&type=b", "ana", anaToken, nil, nil); code != http.StatusTooManyRequests {
		t.Errorf("ana's third read at once = %d, want 429", code)
	}
	wg.Go(func() {
		if code, _, _ := request(t, srv, http.MethodGet, "/api/events?status=NEW&type=c", "bo", boToken, nil, nil); code != http.StatusOK {
			t.Errorf("bo's read while ana has 2 = %d, want 200", code)
		}
	})
	<-store.entered
	close(store.release)
	wg.Wait()
	if code, _, _ := request(t, srv, http.MethodGet, "/api/events?status=NEW&type=d", "ana", anaToken, nil, nil); code != http.StatusOK {
		t.Errorf("ana's read once hers are done = %d, want 200", code)
	}
}

// TestBasicNeedsTLSOffLoopback: HTTP Basic credentials from another
// host over plain HTTP are refused (they travelled in clear); over TLS,
// or behind a trusted proxy that says the client used https, they pass
// and the answer asks for HTTPS from then on (HSTS).
func TestBasicNeedsTLSOffLoopback(t *testing.T) {
	t.Parallel()
	c, err := console.New(console.Config{
		Store: newFakeStore(t), Samples: samples{}, Token: token,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")},
		Archetype:      service.Archetype{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	send := func(remote string, tlsOn bool, headers map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/api/events", nil)
		req.RemoteAddr = remote
		req.SetBasicAuth("ana", token)
		if tlsOn {
			req.TLS = &tls.ConnectionState{}
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		return rec
	}
	if rec := send("198.51.100.7:4000", false, nil); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "TLS") {
		t.Errorf("Basic from another host over plain HTTP = %d, want 403 naming TLS: %s", rec.Code, rec.Body)
	}
	if rec := send("127.0.0.1:4000", false, nil); rec.Code != http.StatusOK || rec.Header().Get("Strict-Transport-Security") != "" {
		t.Errorf("Basic from loopback over plain HTTP = %d (HSTS %q), want 200 without HSTS", rec.Code, rec.Header().Get("Strict-Transport-Security"))
	}
	if rec := send("198.51.100.7:4000", true, nil); rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Strict-Transport-Security"), "max-age=") {
		t.Errorf("Basic over TLS = %d (HSTS %q), want 200 with HSTS", rec.Code, rec.Header().Get("Strict-Transport-Security"))
	}
	proxied := map[string]string{"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7"}
	if rec := send("10.0.0.1:4000", false, proxied); rec.Code != http.StatusOK || rec.Header().Get("Strict-Transport-Security") == "" {
		t.Errorf("Basic through a trusted proxy that terminated TLS = %d, want 200 with HSTS", rec.Code)
	}
	if rec := send("10.0.0.2:4000", false, proxied); rec.Code != http.StatusForbidden {
		t.Errorf("Basic with X-Forwarded-Proto https from an untrusted address = %d, want 403", rec.Code)
	}
}
