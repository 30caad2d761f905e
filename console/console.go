// Package console serves the operator console of an outbox: HTML pages,
// and the JSON API they are built from, of the events by status, one
// event with the history of its attempts, the failures grouped by cause,
// the held aggregates, the paused event types and the replicas that own
// the partitions. It serves one outbox, or every outbox of a fleet
// (Config.Outboxes), each page and action of the outbox its path names
// (outbox.go).
//
// A Console is an http.Handler. `worker console` serves it on its own
// address; an application mounts it under a path prefix of its own admin
// server, behind its own authentication:
//
//	c, err := console.New(console.Config{BasePath: "/outbox", ...})
//	mux.Handle("/outbox/", http.StripPrefix("/outbox", c))
//
// Everything it serves is in the binary. It is read-only unless
// Config.Writer is set, and then every request must give Config.Token;
// read-only, any request other than GET or HEAD is refused with 403
// whatever a page shows. A request that changes something must come from
// the console's own pages. Every value of an event (payload, headers,
// errors) is untrusted input and is escaped; pages allow no script, style
// or image from elsewhere.
package console

import (
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

// Store is the outbox as the console reads it (mongo.Store).
type Store interface {
	ListEvents(ctx context.Context, q mongo.EventQuery) ([]bson.Raw, *mongo.PageMark, error)
	Find(ctx context.Context, id string) (bson.Raw, error)
	LaterPublished(ctx context.Context, aggregateType, aggregateID string, at time.Time, limit int) (int, error)
	FailureGroups(ctx context.Context, now time.Time, limit int) (events.FailureGroups, error)
	Holders(ctx context.Context, now time.Time, failedHolds bool, limit int) ([]events.Holder, bool, error)
	PublishedPerMinute(ctx context.Context, since, now time.Time) ([]int64, error)
	Actions(ctx context.Context, limit int) ([]mongo.Action, error)
	ActionByID(ctx context.Context, id bson.ObjectID) (mongo.Action, error)
	Touched(ctx context.Context, action bson.ObjectID, ids []any) ([]any, error)
	PausedTypes(ctx context.Context) ([]events.Pause, error)
}

// ListSource gives the lists of the incident pages it keeps current on
// a schedule (ops.Sampler with ops.SamplerConfig.Failures and Holders):
// the failure groups and the held aggregates' holders it last read,
// each false before its first read. Trigger asks it to read them again
// soon, after an action changed them.
type ListSource interface {
	LatestGroups() (events.FailureGroups, bool)
	LatestHolders() (events.Holders, bool)
	Trigger()
}

// OwnersReader reads the partition terms and the replicas' heartbeats
// (mongo.Owners).
type OwnersReader interface {
	Read(ctx context.Context) ([]ownership.Term, []ownership.Member, error)
}

// Defaults of Config.
const (
	PageSizeDefault = 50
	RefreshDefault  = 5 * time.Second
	// ActionMaxDefault is the most events one action touches.
	ActionMaxDefault = 1000
	// ActionMaxLimit bounds Config.ActionMax: a preview's ids are held
	// in memory and recorded whole in the audit.
	ActionMaxLimit = 10000
	// ActionsPerMinuteDefault and SignInFailuresPerMinuteDefault are
	// the rate limits of Config.
	ActionsPerMinuteDefault        = 30
	SignInFailuresPerMinuteDefault = 10
	// LoopbackHosts are the names a console without authentication
	// answers to by default.
	LoopbackHosts = "localhost,127.0.0.1,::1"
	// ReadsPerUserDefault bounds the requests one user has read at once.
	ReadsPerUserDefault = 4
	// ProxySecretHeaderDefault carries Config.ProxySecret.
	ProxySecretHeaderDefault = "X-Outbox-Proxy-Secret"
	// ActionTimeoutDefault bounds an action's request.
	ActionTimeoutDefault = 20 * time.Second
	// requestTimeout bounds the queries of one request: a page that
	// cannot be read in it says so rather than hold the connection.
	requestTimeout = 15 * time.Second
)

// Config configures a Console.
type Config struct {
	// Outboxes are the outboxes the console serves, each with its own
	// store, samples and writer: a fleet's. With several, a selector
	// in every page's header chooses one, and every page and action is
	// of the outbox it chose alone (see Outbox). Unset, the console
	// serves the one outbox Store and the fields beside it describe.
	Outboxes []Outbox
	// Store is read by every page of a console of one outbox. Required
	// without Outboxes; unset with them.
	Store Store
	// Samples gives the counts, ages and held totals: the console sends
	// no count query of its own (ops.Sampler). Required without
	// Outboxes.
	Samples ops.SampleSource
	// Lists, when set, gives the failures page the failure groups, the
	// FAILED list its first page and the held page the held aggregates'
	// holders, which it keeps current on a schedule (the console's
	// ops.Sampler with SamplerConfig.Failures and Holders): a view reads
	// none of the events they come from. Unset, before its first read of
	// a list, or when this console acted since that read, each view reads
	// it.
	Lists ListSource
	// Owners, when set, gives the overview the replicas and the
	// partitions each owns. Samples, Lists, Owners, TermLength,
	// FailedHolds and Writer are of the one outbox Store is: with
	// Outboxes, each outbox sets its own.
	Owners OwnersReader
	// TermLength is the replicas' ownership term (OUTBOX_STALE_AFTER / 2):
	// a replica not heard from within a term is shown as gone. Required
	// with Owners.
	TermLength time.Duration
	// FailedHolds is OUTBOX_ORDERING_AFTER_FAILED=wait: FAILED events
	// hold their aggregates.
	FailedHolds bool
	// BasePath is the path the console is mounted under, e.g. "/outbox",
	// with http.StripPrefix; its links start with it. Defaults to "".
	BasePath string
	// PageSize is the events of one page. Defaults to PageSizeDefault.
	PageSize int
	// Refresh is the live refresh period of the pages. Defaults to
	// RefreshDefault.
	Refresh time.Duration
	// Writer, when set, enables the actions: requeue and skip of an
	// event, requeue of a failure group, pause and resume of an event
	// type. Every action takes a reason and
	// is recorded in the audit collection. Defaults to nil: read-only.
	Writer Writer
	// Token is a password shared by every operator, given by HTTP Basic
	// authentication, at least TokenMinLength characters: when set,
	// every request must give it (or be authenticated otherwise, below),
	// page views included. The user name given is recorded as who acted,
	// marked "(shared token)": it is whatever was typed. Defaults to "".
	Token string
	// Users are per-user credentials, by HTTP Basic authentication: each
	// user name and the bcrypt hash of that user's own token (salted
	// and slow: htpasswd -nbBC 12 NAME TOKEN), or, as before, its
	// SHA-256 digest in hex, which New warns of.
	// When set, every request must give one (or the shared Token).
	Users map[string]string
	// OIDC, when set (NewOIDC), signs operators in through an OpenID
	// provider: a session cookie, a CSRF token on every form, and a role
	// from a claim (viewer, operator, admin). It replaces Identity,
	// IdentityHeader, Users and Token.
	OIDC *OIDC
	// BulkAdminAbove is, with OIDC, the most events an operator may act
	// on at once; more need an admin. Defaults to BulkAdminAboveDefault.
	BulkAdminAbove int
	// Identity, when set, tells who a request comes from as the
	// application that mounts the console authenticated it; ok false
	// refuses the request (401). It replaces Users and Token.
	Identity func(r *http.Request) (user string, ok bool)
	// IdentityHeader, when set, names the header in which a trusted
	// proxy (TrustedProxies) passes the user it authenticated, such as
	// oauth2-proxy's X-Forwarded-User. From any other address, or
	// without ProxySecret, the header is ignored. Requires
	// TrustedProxies and ProxySecret.
	IdentityHeader string
	// TrustedProxies are the addresses of the reverse proxies in front
	// of the console: only from them are X-Forwarded-For (the client's
	// address, for the audit), X-Forwarded-Host and X-Forwarded-Proto
	// (the host and scheme a POST's Origin is compared with, and the
	// host AllowedHosts checks) and IdentityHeader believed. New warns
	// when they include loopback or every address.
	TrustedProxies []netip.Prefix
	// ProxySecret is a secret, at least TokenMinLength characters, that
	// the proxy sends in ProxySecretHeader on every request it forwards.
	// When set, a request from TrustedProxies is believed only with it:
	// another process on the proxy's host, or anything else that can
	// reach the console from a trusted address, cannot pass a user or
	// forwarded addresses. Required with IdentityHeader. Defaults to "".
	ProxySecret string
	// ProxySecretHeader is the header that carries ProxySecret. Defaults
	// to ProxySecretHeaderDefault.
	ProxySecretHeader string
	// AllowedHosts are the Host names the console answers to: "name"
	// on any port, "name:port", or "*" for any. A request for another
	// is refused with 421, so that a page of another site whose name
	// was rebound to the console's address (DNS rebinding) reads
	// nothing. Defaults to any host when the console authenticates
	// (an application that mounts it checks its own), and to the
	// loopback names (LoopbackHosts) when it does not: set it, or "*",
	// to serve an unauthenticated console under another name. `worker
	// console` sets its address and localhost.
	AllowedHosts []string
	// RequeuePerSecond spreads a group's requeue over time, so many
	// events a second (mongo.RequeueFilter.PerSecond). Defaults to
	// RequeuePerSecondDefault.
	RequeuePerSecond int
	// ActionsPerMinute is the most actions one credential may start in
	// a minute (a user, or the shared Token whatever name is typed);
	// more are refused with 429. Defaults to
	// ActionsPerMinuteDefault.
	ActionsPerMinute int
	// SignInFailuresPerMinute is the most failed sign-ins one client
	// network (an IPv4 address, an IPv6 /64) or one user name may make in
	// a minute; past it every request from there, or as that user, is
	// refused with 429 for a minute, then for twice as long at each
	// new strike (at most an hour). Defaults to
	// SignInFailuresPerMinuteDefault.
	SignInFailuresPerMinute int
	// ActionTimeout bounds an action's request: a requeue still running
	// then stops, and its audit record says how far it got. Defaults to
	// ActionTimeoutDefault; keep it below the server's write timeout.
	ActionTimeout time.Duration
	// ActionMax is the most events one action touches: a preview
	// selects the oldest ActionMax of its events, and the rest wait for
	// another action. Defaults to ActionMaxDefault.
	ActionMax int
	// ReadsPerUser is how many requests one credential (or, without
	// authentication, one client network) may have read at once; more
	// are refused with 429, so that one operator's tabs cannot hold
	// every database connection. Defaults to ReadsPerUserDefault.
	ReadsPerUser int
	// PreviewTTL is how long a preview may be confirmed: the console
	// holds its ids for the user who asked until then, or until it is
	// used. Defaults to PreviewTTLDefault.
	PreviewTTL time.Duration
	// Archetype is the logger and the clock: the database server's time,
	// which ages and the held test compare with.
	service.Archetype
}

func (c *Config) setDefaults() {
	c.Archetype = c.Archetype.WithDefaults()
	c.PageSize = cmp.Or(c.PageSize, PageSizeDefault)
	c.Refresh = cmp.Or(c.Refresh, RefreshDefault)
	c.RequeuePerSecond = cmp.Or(c.RequeuePerSecond, RequeuePerSecondDefault)
	c.ActionMax = cmp.Or(c.ActionMax, ActionMaxDefault)
	c.ActionsPerMinute = cmp.Or(c.ActionsPerMinute, ActionsPerMinuteDefault)
	c.SignInFailuresPerMinute = cmp.Or(c.SignInFailuresPerMinute, SignInFailuresPerMinuteDefault)
	c.ActionTimeout = cmp.Or(c.ActionTimeout, ActionTimeoutDefault)
	c.PreviewTTL = cmp.Or(c.PreviewTTL, PreviewTTLDefault)
	c.ReadsPerUser = cmp.Or(c.ReadsPerUser, ReadsPerUserDefault)
	c.BulkAdminAbove = cmp.Or(c.BulkAdminAbove, BulkAdminAboveDefault)
	if len(c.AllowedHosts) == 0 && c.OIDC == nil && c.Identity == nil && c.IdentityHeader == "" && len(c.Users) == 0 && c.Token == "" {
		c.AllowedHosts = strings.Split(LoopbackHosts, ",")
	}
	c.ProxySecretHeader = http.CanonicalHeaderKey(cmp.Or(c.ProxySecretHeader, ProxySecretHeaderDefault))
	c.BasePath = strings.TrimRight(c.BasePath, "/")
}

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	if err := rule.First("console", outboxRules(c)...); err != nil {
		return err
	}
	return rule.First("console",
		rule.Check("PageSize", c.PageSize >= 1 && c.PageSize <= 500, c.PageSize, "1 to 500"),
		rule.Check("Refresh", c.Refresh >= time.Second, c.Refresh, "at least 1s"),
		rule.Check("BasePath", c.BasePath == "" || strings.HasPrefix(c.BasePath, "/"), c.BasePath, `"" or a path starting with "/"`),
		rule.Check("Token", c.Token == "" || len(c.Token) >= TokenMinLength, "<redacted>", fmt.Sprintf("at least %d characters", TokenMinLength)),
		rule.Check("Writer", !c.writes() || c.OIDC != nil || c.Token != "" || len(c.Users) > 0 || c.Identity != nil || c.IdentityHeader != "", "set",
			"with OIDC, Token, Users, Identity or IdentityHeader: the actions need authentication"),
		rule.Check("BulkAdminAbove", c.BulkAdminAbove >= 1, c.BulkAdminAbove, "at least 1"),
		rule.Check("IdentityHeader", c.IdentityHeader == "" || len(c.TrustedProxies) > 0, c.IdentityHeader, "set only with TrustedProxies: the header is believed from them alone"),
		rule.Check("ProxySecret", c.IdentityHeader == "" || c.ProxySecret != "", "unset",
			"set with IdentityHeader: the proxy proves itself with it, for an address alone lets any process on its host act as anyone"),
		rule.Check("ProxySecret", c.ProxySecret == "" || len(c.ProxySecret) >= TokenMinLength, "<redacted>", fmt.Sprintf("at least %d characters", TokenMinLength)),
		rule.Check("ProxySecret", c.ProxySecret == "" || len(c.TrustedProxies) > 0, "<redacted>", "set only with TrustedProxies"),
		rule.Check("RequeuePerSecond", c.RequeuePerSecond >= 1, c.RequeuePerSecond, "at least 1"),
		rule.Check("ActionMax", c.ActionMax >= 1 && c.ActionMax <= ActionMaxLimit, c.ActionMax, fmt.Sprintf("1 to %d", ActionMaxLimit)),
		rule.Check("ActionsPerMinute", c.ActionsPerMinute >= 1, c.ActionsPerMinute, "at least 1"),
		rule.Check("SignInFailuresPerMinute", c.SignInFailuresPerMinute >= 1, c.SignInFailuresPerMinute, "at least 1"),
		rule.Check("ActionTimeout", c.ActionTimeout >= time.Second, c.ActionTimeout, "at least 1s"),
		rule.Check("ReadsPerUser", c.ReadsPerUser >= 1, c.ReadsPerUser, "at least 1"),
		rule.Check("PreviewTTL", c.PreviewTTL >= time.Minute, c.PreviewTTL, "at least 1m"),
	)
}

// writes reports whether the actions are on: whether the outboxes have
// a Writer (all of them or none, as Validate checks).
func (c Config) writes() bool {
	list := c.outboxes()
	return len(list) > 0 && list[0].Writer != nil
}

//go:embed templates/*.html static/*
var assets embed.FS

// Console serves the console's pages and API.
type Console struct {
	cfg   Config
	mux   *http.ServeMux
	pages map[string]*template.Template
	token [sha256.Size]byte            // the digest of Config.Token
	proxy [sha256.Size]byte            // the digest of Config.ProxySecret
	users map[string][sha256.Size]byte // Config.Users given as SHA-256 digests
	// hashed are Config.Users given as bcrypt hashes; verified
	// remembers the tokens they accepted lately.
	hashed   map[string][]byte
	verified *verifiedTokens
	// actions limits the actions of each operator, signIns the failed
	// sign-ins of each client address.
	actions, signIns *limiter
	// previews holds what each preview showed until it is confirmed.
	previews *previewBook
	// reading counts each credential's requests being read.
	reading inFlight
	// sessions are the signed-in browsers, with OIDC.
	sessions *sessionBook
	// outboxes are the outboxes served, each with when this console
	// last acted on it: a list its source read before that is not shown
	// (kept).
	outboxes []*served
}

// New returns a console, or the first bad field of cfg.
func New(cfg Config) (*Console, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux(), token: sha256.Sum256([]byte(cfg.Token)), proxy: sha256.Sum256([]byte(cfg.ProxySecret))}
	warnBroadProxies(cfg)
	for _, o := range cfg.outboxes() {
		if o.Now == nil {
			o.Now = cfg.Now
		}
		c.outboxes = append(c.outboxes, &served{Outbox: o})
	}
	var err error
	if c.users, c.hashed, err = userDigests(cfg.Users); err != nil {
		return nil, err
	}
	c.verified = newVerifiedTokens()
	if len(c.users) > 0 {
		cfg.Logger.Warn("console: Users holds unsalted SHA-256 digests of tokens; store bcrypt hashes instead (htpasswd -nbBC 12 NAME TOKEN)", "users", len(c.users))
	}
	c.actions = newLimiter(cfg.ActionsPerMinute, time.Minute, time.Now)
	c.signIns = newLimiter(cfg.SignInFailuresPerMinute, time.Minute, time.Now).growing()
	c.previews = newPreviewBook(cfg.PreviewTTL, cfg.Local)
	if cfg.OIDC != nil {
		c.sessions = newSessionBook(cfg.OIDC.cfg.SessionIdle, cfg.OIDC.cfg.SessionMaxAge, cfg.Local)
		c.mux.HandleFunc("POST "+oidcSignOutPath, c.signOut)
	}
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	c.route("/{$}", "/api/overview", "overview", c.overview)
	c.route("/events", "/api/events", "events", c.events)
	c.route("/events/{id}", "/api/events/{id}", "event", c.event)
	c.route("/failures", "/api/failures", "failures", c.failures)
	c.route("/held", "/api/held", "held", c.held)
	c.route("/audit", "/api/audit", "audit", c.audit)
	c.route("/audit/{id}", "/api/audit/{id}", "action", c.auditRecord)
	c.mux.HandleFunc("GET /api/published", func(w http.ResponseWriter, r *http.Request) { c.serveJSON(w, r, c.published) })
	if c.writes() {
		c.route("/requeue", "/api/requeue", "confirm", c.confirmRequeue)
		c.mux.HandleFunc("POST /requeue", c.requeueSelection)
		c.route("/skip", "/api/skip", "confirm", c.confirmSkip)
		c.mux.HandleFunc("POST /skip", c.skipSelection)
		c.route("/discard", "/api/discard", "confirm", c.confirmDiscard)
		c.mux.HandleFunc("POST /discard", c.discardSelection)
		c.mux.HandleFunc("POST /events/{id}/requeue", c.requeueEvent)
		c.mux.HandleFunc("POST /events/{id}/skip", c.skipEvent)
		c.mux.HandleFunc("POST /events/{id}/discard", c.discardEvent)
		c.mux.HandleFunc("POST /pause", c.pauseType)
		c.mux.HandleFunc("POST /resume", c.resumeType)
	}
	c.mux.HandleFunc("GET /outbox", c.switchOutbox)
	return c, nil
}

// route serves a page at path and the same data as JSON at api.
func (c *Console) route(path, api, page string, data func(r *http.Request) (any, error)) {
	c.mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { c.servePage(w, r, page, data) })
	c.mux.HandleFunc("GET "+api, func(w http.ResponseWriter, r *http.Request) { c.serveJSON(w, r, data) })
}

// ServeHTTP serves the console to a request for an allowed host, from
// someone it authenticated (when it authenticates). Read-only, anything
// but GET and HEAD is refused.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No script, style or image from elsewhere, no framing: an event's
	// data that slipped through escaping still could not run or load.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	rq := c.requesterFrom(r)
	if !c.hostAllowed(rq.host) {
		writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": "refused: this console does not answer to the host " + strconv.Quote(rq.host) + " (AllowedHosts)"})
		return
	}
	secure := r.TLS != nil || rq.proto == "https"
	if secure {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if _, _, basic := r.BasicAuth(); basic && !secure && !loopbackClient(rq.from) {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "refused: credentials sent over plain HTTP from another host; serve the console with TLS (OUTBOX_CONSOLE_TLS_CERT) or behind a proxy that terminates it, and change the token that travelled in clear"})
		return
	}
	if c.cfg.OIDC != nil {
		if c.serveAuth(w, r) {
			return
		}
		s, ok := c.sessionOf(r)
		if !ok {
			if wantsPage(r) {
				http.Redirect(w, r, c.cfg.BasePath+oidcSignInPath+"?"+url.Values{"next": {r.URL.RequestURI()}}.Encode(), http.StatusSeeOther)
				return
			}
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "sign in: open " + c.cfg.BasePath + "/ in a browser"})
			return
		}
		rq.who, rq.credential, rq.role, rq.csrf = s.user, "oidc:"+s.user, s.role, s.csrf
	} else if c.authenticates() {
		client := clientKey(rq.from)
		user, _, basic := r.BasicAuth()
		if c.signIns.blocked(client) || basic && c.signIns.blocked(userKey(user)) {
			writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "too many failed sign-ins from this network or as this user: wait and try again"})
			return
		}
		who, credential, ok := c.identify(r)
		if !ok {
			if r.Header.Get("Authorization") != "" || c.cfg.IdentityHeader != "" && r.Header.Get(c.cfg.IdentityHeader) != "" {
				// A sign-in that failed, not a first request without one.
				c.signIns.allow(client)
				if basic {
					c.signIns.allow(userKey(user))
				}
			}
			c.unauthorized(w, r)
			return
		}
		rq.who, rq.credential = who, credential
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		switch {
		case !c.writes() && (c.cfg.OIDC == nil || r.URL.Path != oidcSignOutPath):
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "the console is read-only: " + r.Method + " is refused"})
			return
		case !sameOrigin(r, rq):
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "refused: the request does not come from the console's own pages"})
			return
		case rq.csrf != "" && !csrfOK(r, rq.csrf):
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "refused: the form's CSRF token is not this session's: reload the page"})
			return
		}
	}
	r = withRequester(r, rq)
	// The static files and the sign-out are the console's, not an
	// outbox's: every other request is of the outbox its path names.
	if !strings.HasPrefix(r.URL.Path, "/static/") && r.URL.Path != oidcSignOutPath {
		routed, ok, err := c.routeOutbox(r)
		switch {
		case err != nil:
			c.answerRefused(w, r, err)
			return
		case !ok:
			c.serveUnrouted(w, r)
			return
		}
		if err := unavailable(outboxOf(routed)); err != nil {
			c.serveUnavailable(w, routed, err)
			return
		}
		r = routed
	}
	if !strings.HasPrefix(r.URL.Path, "/static/") {
		reader := cmp.Or(rq.credential, clientKey(rq.from))
		if !c.reading.enter(reader, c.cfg.ReadsPerUser) {
			writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": fmt.Sprintf("more than %d requests of yours are being read (ReadsPerUser): wait for them", c.cfg.ReadsPerUser)})
			return
		}
		defer c.reading.leave(reader)
	}
	c.mux.ServeHTTP(w, r)
}

// inFlight counts the requests each key has being served.
type inFlight struct {
	mu sync.Mutex
	n  map[string]int
}

// enter counts one more request of key, unless it has max already.
func (f *inFlight) enter(key string, maxInFlight int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	if f.n[key] >= maxInFlight {
		return false
	}
	f.n[key]++
	return true
}

// leave counts one request of key done.
func (f *inFlight) leave(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key]--; f.n[key] <= 0 {
		delete(f.n, key)
	}
}

// writes reports whether the console's actions are on.
func (c *Console) writes() bool { return c.cfg.writes() }

// errNotFound makes a page answer 404.
type errNotFound struct{ msg string }

func (e errNotFound) Error() string { return e.msg }

// errBadRequest makes a page answer 400.
type errBadRequest struct{ msg string }

func (e errBadRequest) Error() string { return e.msg }

// errForbidden makes an action answer 403.
type errForbidden struct{ msg string }

func (e errForbidden) Error() string { return e.msg }

// errTooMany makes an action answer 429.
type errTooMany struct{ msg string }

func (e errTooMany) Error() string { return e.msg }

// status is the HTTP status of a page's error: the database's errors
// are 503, for the page may work again in a moment.
func status(err error) int {
	var notFound errNotFound
	var bad errBadRequest
	var tooMany errTooMany
	var forbidden errForbidden
	var noOutbox errNoOutbox
	switch {
	case errors.As(err, &noOutbox):
		return http.StatusNotFound
	case errors.As(err, &forbidden):
		return http.StatusForbidden
	case errors.As(err, &tooMany):
		return http.StatusTooManyRequests
	case errors.As(err, &notFound):
		return http.StatusNotFound
	case errors.As(err, &bad):
		return http.StatusBadRequest
	default:
		return http.StatusServiceUnavailable
	}
}

func (c *Console) serveJSON(w http.ResponseWriter, r *http.Request, data func(r *http.Request) (any, error)) {
	v, err := c.read(r, data)
	if err != nil {
		writeJSON(w, status(err), map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (c *Console) servePage(w http.ResponseWriter, r *http.Request, page string, data func(r *http.Request) (any, error)) {
	v, err := c.read(r, data)
	code := http.StatusOK
	if err != nil {
		code = status(err)
		c.cfg.Logger.Warn("console page failed", "path", r.URL.Path, "error", err)
	}
	refresh := int(c.cfg.Refresh / time.Second)
	if page == "confirm" || page == "action" || page == "events" && filtered(r.URL.Query()) {
		// A preview is what the operator confirms: it must not change,
		// nor lose the reason typed, under their hands. A filtered list
		// is a search the database runs at each read: shown once.
		refresh = 0
	}
	l := c.layoutOf(r)
	l.Title, l.Page, l.RefreshSeconds, l.Data, l.Error, l.Query = titles[page], page, refresh, v, errText(err), r.URL.Query()
	c.render(w, code, page, l)
}

// read runs a page's queries within requestTimeout.
func (c *Console) read(r *http.Request, data func(r *http.Request) (any, error)) (any, error) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	return data(r.WithContext(ctx))
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// unauthorized asks for credentials: HTTP Basic, unless the identity
// comes from the application or a proxy.
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request) {
	c.cfg.Logger.Warn("console request not authenticated", "path", r.URL.Path, "remote", r.RemoteAddr)
	if c.cfg.Identity == nil && c.cfg.IdentityHeader == "" || len(c.users) > 0 || c.cfg.Token != "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="outbox console", charset="UTF-8"`)
	}
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "sign in: this console needs to know who you are"})
}
