package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/outboxrelay/outbox/internal/rule"
)

// Sign-in through the company's identity provider: OpenID Connect's
// authorization code flow with PKCE, then a session of this console in
// a cookie (Secure, HttpOnly, SameSite=Lax) that expires when idle and
// at an absolute age, a CSRF token on every form, and a role from a
// claim of the user's: viewer reads, operator requeues, skips, pauses
// and resumes, admin also discards and acts on more than BulkAdminAbove
// events at once. The sessions and the sign-ins under way live in this process.

// The roles, least first.
const (
	RoleViewer   = "viewer"
	RoleOperator = "operator"
	RoleAdmin    = "admin"
)

// roleRank orders the roles; 0 is none.
func roleRank(role string) int {
	switch role {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// Defaults of OIDCConfig.
const (
	SessionIdleDefault      = 30 * time.Minute
	SessionMaxAgeDefault    = 8 * time.Hour
	RolesClaimDefault       = "roles"
	UserClaimDefault        = "email"
	BulkAdminAboveDefault   = 100
	sessionCookie           = "outbox_console_session"
	signInCookie            = "outbox_console_signin"
	signInTTL               = 10 * time.Minute
	sessionsMax             = 10000
	signInsMax              = 10000
	oidcDiscoveryTimeout    = 15 * time.Second
	oidcCallbackTimeout     = 15 * time.Second
	csrfField               = "csrf"
	oidcCallbackPath        = "/auth/callback"
	oidcSignInPath          = "/auth/signin"
	oidcSignOutPath         = "/auth/signout"
	oidcSignedOutPath       = "/auth/signed-out"
	oidcRoleMissingAnswer   = "your account has no role in this console (viewer, operator or admin): ask for one"
	oidcSignInFailedAnswer  = "sign-in failed: start again"
	oidcSignInExpiredAnswer = "this sign-in expired or was started in another browser: start again"
)

// OIDCConfig configures sign-in through an OpenID provider.
type OIDCConfig struct {
	// IssuerURL is the provider's issuer, whose discovery document
	// (/.well-known/openid-configuration) NewOIDC reads. Required.
	IssuerURL string
	// ClientID and ClientSecret are the console's client at the
	// provider. ClientID is required; ClientSecret is "" for a public
	// client (PKCE alone).
	ClientID, ClientSecret string
	// RedirectURL is the console's callback as the browser reaches it:
	// https://<host><BasePath>/auth/callback. Required.
	RedirectURL string
	// Scopes are asked besides openid. Defaults to profile and email.
	Scopes []string
	// RolesClaim names the claim (a string or a list of strings, in the
	// ID token or the userinfo) that holds the user's console roles:
	// viewer, operator, admin; the highest counts. Defaults to
	// RolesClaimDefault.
	RolesClaim string
	// UserClaim names the claim the audit records as who; the subject
	// when it is missing. Defaults to UserClaimDefault.
	UserClaim string
	// SessionIdle ends a session not used for so long; SessionMaxAge
	// ends any session so long after its sign-in. Default to
	// SessionIdleDefault and SessionMaxAgeDefault.
	SessionIdle, SessionMaxAge time.Duration
	// HTTPClient reaches the provider. Defaults to a client with a
	// timeout.
	HTTPClient *http.Client
}

// OIDC is a provider discovered, ready to sign operators in (NewOIDC).
type OIDC struct {
	cfg      OIDCConfig
	provider *oidc.Provider
	verifier *oidc.IDTokenVerifier
	oauth    oauth2.Config
}

// NewOIDC checks cfg and reads the provider's discovery document.
func NewOIDC(ctx context.Context, cfg OIDCConfig) (*OIDC, error) {
	cfg.RolesClaim = cmp.Or(cfg.RolesClaim, RolesClaimDefault)
	cfg.UserClaim = cmp.Or(cfg.UserClaim, UserClaimDefault)
	cfg.SessionIdle = cmp.Or(cfg.SessionIdle, SessionIdleDefault)
	cfg.SessionMaxAge = cmp.Or(cfg.SessionMaxAge, SessionMaxAgeDefault)
	if cfg.Scopes == nil {
		cfg.Scopes = []string{"profile", "email"}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: oidcCallbackTimeout}
	}
	redirect, rerr := url.Parse(cfg.RedirectURL)
	if err := rule.First("console OIDC",
		rule.Required("IssuerURL", cfg.IssuerURL != ""),
		rule.Required("ClientID", cfg.ClientID != ""),
		rule.Check("RedirectURL", rerr == nil && redirect.IsAbs() && strings.HasSuffix(redirect.Path, oidcCallbackPath), cfg.RedirectURL,
			"the absolute URL of the console's "+oidcCallbackPath),
		rule.Check("SessionIdle", cfg.SessionIdle >= time.Minute, cfg.SessionIdle, "at least 1m"),
		rule.Check("SessionMaxAge", cfg.SessionMaxAge >= cfg.SessionIdle, cfg.SessionMaxAge, "at least SessionIdle"),
	); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, cfg.HTTPClient), oidcDiscoveryTimeout)
	defer cancel()
	provider, err := oidc.NewProvider(ctx, cfg.IssuerURL)
	if err != nil {
		return nil, fmt.Errorf("console OIDC: discover %s: %w", cfg.IssuerURL, err)
	}
	return &OIDC{
		cfg: cfg, provider: provider,
		verifier: provider.Verifier(&oidc.Config{ClientID: cfg.ClientID}),
		oauth: oauth2.Config{
			ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, RedirectURL: cfg.RedirectURL,
			Endpoint: provider.Endpoint(), Scopes: append([]string{oidc.ScopeOpenID}, cfg.Scopes...),
		},
	}, nil
}

// session is one signed-in browser.
type session struct {
	user, role, csrf string
	started, seen    time.Time
}

// signIn is a sign-in under way: what its callback checks.
type signIn struct {
	verifier, nonce, next string
	expires               time.Time
}

// sessionBook holds the sessions and the sign-ins under way.
type sessionBook struct {
	idle, maxAge time.Duration
	now          func() time.Time

	mu       sync.Mutex
	sessions map[string]*session
	signIns  map[string]signIn
}

func newSessionBook(idle, maxAge time.Duration, now func() time.Time) *sessionBook {
	return &sessionBook{idle: idle, maxAge: maxAge, now: now, sessions: map[string]*session{}, signIns: map[string]signIn{}}
}

// randomID is 24 random bytes, URL-safe.
func randomID() string {
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// sessionKey is how a session id is kept: its digest, so that the map
// holds nothing a cookie could be made from.
func sessionKey(id string) string {
	d := sha256.Sum256([]byte(id))
	return string(d[:])
}

// start opens a session and returns its cookie's value.
func (b *sessionBook) start(user, role string) (string, *session) {
	id := randomID()
	now := b.now()
	s := &session{user: user, role: role, csrf: randomID(), started: now, seen: now}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	if len(b.sessions) >= sessionsMax {
		b.dropOldest()
	}
	b.sessions[sessionKey(id)] = s
	return id, s
}

// get returns the live session of id, and marks it used.
func (b *sessionBook) get(id string) (session, bool) {
	if id == "" {
		return session{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	s, ok := b.sessions[sessionKey(id)]
	if !ok {
		return session{}, false
	}
	if now.Sub(s.seen) >= b.idle || now.Sub(s.started) >= b.maxAge {
		delete(b.sessions, sessionKey(id))
		return session{}, false
	}
	s.seen = now
	return *s, true
}

// end closes the session of id.
func (b *sessionBook) end(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sessions, sessionKey(id))
}

// expire drops the sessions and sign-ins past their time. b.mu is held.
func (b *sessionBook) expire(now time.Time) {
	for k, s := range b.sessions {
		if now.Sub(s.seen) >= b.idle || now.Sub(s.started) >= b.maxAge {
			delete(b.sessions, k)
		}
	}
	for k, si := range b.signIns {
		if !now.Before(si.expires) {
			delete(b.signIns, k)
		}
	}
}

// dropOldest forgets the session used least recently. b.mu is held.
func (b *sessionBook) dropOldest() {
	var oldest string
	var at time.Time
	for k, s := range b.sessions {
		if oldest == "" || s.seen.Before(at) {
			oldest, at = k, s.seen
		}
	}
	delete(b.sessions, oldest)
}

// begin keeps a sign-in under state.
func (b *sessionBook) begin(state string, si signIn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.expire(now)
	if len(b.signIns) >= signInsMax {
		for k := range b.signIns {
			delete(b.signIns, k)
			break
		}
	}
	si.expires = now.Add(signInTTL)
	b.signIns[state] = si
}

// finish returns the sign-in of state and forgets it.
func (b *sessionBook) finish(state string) (signIn, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	si, ok := b.signIns[state]
	delete(b.signIns, state)
	return si, ok && b.now().Before(si.expires)
}

// cookie is one of the console's cookies: Secure, HttpOnly,
// SameSite=Lax, for the console's path; maxAge < 0 deletes it.
func (c *Console) cookie(name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: name, Value: value, Path: cmp.Or(c.cfg.BasePath, "/"), MaxAge: maxAge,
		Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode,
	}
}

// serveAuth serves the sign-in routes, which need no session; false
// when r is for another route.
func (c *Console) serveAuth(w http.ResponseWriter, r *http.Request) bool {
	switch r.URL.Path {
	case oidcSignInPath:
		c.beginSignIn(w, r, r.URL.Query().Get("next"))
	case oidcCallbackPath:
		c.finishSignIn(w, r)
	case oidcSignedOutPath:
		writeText(w, http.StatusOK, "You are signed out of the outbox console. Sign in again: "+c.cfg.BasePath+"/")
	default:
		return false
	}
	return true
}

// beginSignIn sends the browser to the provider, with a state bound to
// this browser by a cookie, a nonce and a PKCE challenge.
func (c *Console) beginSignIn(w http.ResponseWriter, r *http.Request, next string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeText(w, http.StatusMethodNotAllowed, "GET only")
		return
	}
	state, nonce, verifier := randomID(), randomID(), oauth2.GenerateVerifier()
	c.sessions.begin(state, signIn{verifier: verifier, nonce: nonce, next: localPath(next)})
	http.SetCookie(w, c.cookie(signInCookie, state, int(signInTTL/time.Second)))
	http.Redirect(w, r, c.cfg.OIDC.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)), http.StatusFound)
}

// localPath is next when it is a path of this site, else "/": a
// sign-in never sends the browser elsewhere.
func localPath(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.ContainsAny(next, "\r\n") {
		return "/"
	}
	return next
}

// finishSignIn checks the provider's answer (the state this browser was
// given, the code exchanged with its PKCE verifier, the ID token's
// signature, audience, expiry and nonce), reads the user and the role,
// and opens a session.
func (c *Console) finishSignIn(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state := q.Get("state")
	bound, err := r.Cookie(signInCookie)
	http.SetCookie(w, c.cookie(signInCookie, "", -1))
	if err != nil || state == "" || subtle.ConstantTimeCompare([]byte(bound.Value), []byte(state)) != 1 {
		writeText(w, http.StatusBadRequest, oidcSignInExpiredAnswer)
		return
	}
	si, ok := c.sessions.finish(state)
	if !ok {
		writeText(w, http.StatusBadRequest, oidcSignInExpiredAnswer)
		return
	}
	if e := q.Get("error"); e != "" {
		c.cfg.Logger.Warn("console sign-in refused by the provider", "error", cut(e, 100))
		writeText(w, http.StatusUnauthorized, oidcSignInFailedAnswer)
		return
	}
	o := c.cfg.OIDC
	ctx, cancel := context.WithTimeout(oidc.ClientContext(r.Context(), o.cfg.HTTPClient), oidcCallbackTimeout)
	defer cancel()
	user, role, err := o.signedIn(ctx, q.Get("code"), si)
	if err != nil {
		c.cfg.Logger.Warn("console sign-in failed", "error", err)
		c.signIns.allow(clientKey(requesterOf(r).from))
		writeText(w, http.StatusUnauthorized, oidcSignInFailedAnswer)
		return
	}
	if role == "" {
		c.cfg.Logger.Warn("console sign-in without a role", "user", user)
		writeText(w, http.StatusForbidden, oidcRoleMissingAnswer)
		return
	}
	id, _ := c.sessions.start(user, role)
	http.SetCookie(w, c.cookie(sessionCookie, id, int(o.cfg.SessionMaxAge/time.Second)))
	c.cfg.Logger.Info("console sign-in", "user", user, "role", role)
	http.Redirect(w, r, c.cfg.BasePath+si.next, http.StatusSeeOther)
}

// signedIn exchanges code and reads who signed in and their role.
func (o *OIDC) signedIn(ctx context.Context, code string, si signIn) (user, role string, err error) {
	if code == "" {
		return "", "", errors.New("no code in the callback")
	}
	token, err := o.oauth.Exchange(ctx, code, oauth2.VerifierOption(si.verifier))
	if err != nil {
		return "", "", fmt.Errorf("exchange the code: %w", err)
	}
	raw, ok := token.Extra("id_token").(string)
	if !ok {
		return "", "", errors.New("no id_token in the token response")
	}
	idToken, err := o.verifier.Verify(ctx, raw)
	if err != nil {
		return "", "", fmt.Errorf("verify the ID token: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(idToken.Nonce), []byte(si.nonce)) != 1 {
		return "", "", errors.New("the ID token's nonce is not this sign-in's")
	}
	claims := map[string]any{}
	if err := idToken.Claims(&claims); err != nil {
		return "", "", fmt.Errorf("read the ID token's claims: %w", err)
	}
	if _, ok := claims[o.cfg.RolesClaim]; !ok || claims[o.cfg.UserClaim] == nil {
		// Many providers put roles and e-mail in the userinfo only.
		info, err := o.provider.UserInfo(ctx, oauth2.StaticTokenSource(token))
		if err != nil {
			return "", "", fmt.Errorf("read the userinfo: %w", err)
		}
		more := map[string]any{}
		if err := info.Claims(&more); err != nil {
			return "", "", fmt.Errorf("read the userinfo's claims: %w", err)
		}
		if sub, _ := more["sub"].(string); sub != idToken.Subject {
			return "", "", errors.New("the userinfo's subject is not the ID token's")
		}
		for k, v := range more {
			if _, ok := claims[k]; !ok {
				claims[k] = v
			}
		}
	}
	user, _ = claims[o.cfg.UserClaim].(string)
	return cmp.Or(strings.TrimSpace(user), idToken.Subject), highestRole(claims[o.cfg.RolesClaim]), nil
}

// highestRole is the highest console role a claim names: a string, or
// a list of strings.
func highestRole(claim any) string {
	var names []string
	switch v := claim.(type) {
	case string:
		names = strings.Fields(strings.ReplaceAll(v, ",", " "))
	case []any:
		for _, e := range v {
			if s, ok := e.(string); ok {
				names = append(names, s)
			}
		}
	}
	best := ""
	for _, n := range names {
		if roleRank(n) > roleRank(best) {
			best = n
		}
	}
	return best
}

// signOut ends the session of a POST that carries its CSRF token.
func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.sessions.end(ck.Value)
	}
	http.SetCookie(w, c.cookie(sessionCookie, "", -1))
	c.cfg.Logger.Info("console sign-out", "user", actor(r))
	http.Redirect(w, r, c.cfg.BasePath+oidcSignedOutPath, http.StatusSeeOther)
}

// sessionOf is the live session r's cookie names.
func (c *Console) sessionOf(r *http.Request) (session, bool) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	return c.sessions.get(ck.Value)
}

// csrfOK reports whether a POST of a session carries its CSRF token.
func csrfOK(r *http.Request, want string) bool {
	got := r.PostFormValue(csrfField)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// mayAct reports why r's role may not do a of planned events, or "".
// Without OIDC there are no roles: every authenticated user may act.
func (c *Console) mayAct(r *http.Request, name string, planned int) string {
	role := requesterOf(r).role
	if c.cfg.OIDC == nil || role == "" && requesterOf(r).credential == "" {
		return ""
	}
	if name == "discard" && roleRank(role) < roleRank(RoleAdmin) {
		// A discard cannot be undone: whatever the number of events, it
		// is an admin's.
		return fmt.Sprintf("%s may not discard events: that needs the role %s", cmp.Or(role, "no role"), RoleAdmin)
	}
	need := RoleOperator
	if planned > c.cfg.BulkAdminAbove {
		need = RoleAdmin
	}
	if roleRank(role) < roleRank(need) {
		return fmt.Sprintf("%s may not %s %d events: that needs the role %s (BulkAdminAbove %d)", cmp.Or(role, "no role"), name, planned, need, c.cfg.BulkAdminAbove)
	}
	return ""
}

// writeText answers with a short plain text.
func writeText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(text + "\n"))
}

// wantsPage reports whether a request is a browser's for a page, which
// is sent to sign in rather than answered 401.
func wantsPage(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && !strings.HasPrefix(r.URL.Path, "/api/") &&
		slices.ContainsFunc(strings.Split(r.Header.Get("Accept"), ","), func(s string) bool { return strings.HasPrefix(strings.TrimSpace(s), "text/html") })
}
