package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Who may read and act, and from where. A request passes three checks
// before any page sees it: its Host is one the console answers to
// (AllowedHosts: a page of another site whose name was rebound to the
// console's address carries its own name, and is refused), it is
// authenticated when any authentication is configured (Identity, a
// trusted proxy's IdentityHeader, Users or Token), and a request that
// changes something comes from the console's own pages. X-Forwarded-*
// headers are believed only from TrustedProxies.

// requester is who sent a request and from where, as ServeHTTP
// established it.
type requester struct {
	// who is the identity the audit records; "" on a console without
	// authentication.
	who string
	// credential is what authenticated the request, which limits count:
	// the user for a user's own token, the application's identity or a
	// proxy's, but the shared token itself (its user name is typed).
	credential string
	// role is the OIDC session's role; "" without OIDC. csrf is the
	// session's CSRF token, which its forms carry.
	role, csrf string
	// from is the client's address: the request's peer, or behind a
	// trusted proxy the address it forwarded for.
	from string
	// host is the Host the client asked for: the request's, or behind a
	// trusted proxy its X-Forwarded-Host.
	host string
	// proto is http or https as a trusted proxy says the client used
	// it; "" when none says.
	proto string
}

type requesterKey struct{}

// requesterOf is the requester ServeHTTP stored in r's context.
func requesterOf(r *http.Request) requester {
	if v, ok := r.Context().Value(requesterKey{}).(requester); ok {
		return v
	}
	return requester{who: "", from: r.RemoteAddr, host: r.Host}
}

// actor is who acts, for the audit: the authenticated identity, or
// "console" on a console without authentication.
func actor(r *http.Request) string {
	if who := requesterOf(r).who; who != "" {
		return who
	}
	return "console"
}

// authenticates reports whether the console asks who a request is from.
func (c *Console) authenticates() bool {
	return c.cfg.OIDC != nil || c.cfg.Identity != nil || c.cfg.IdentityHeader != "" || len(c.cfg.Users) > 0 || c.cfg.Token != ""
}

// peer is the address of the request's peer, without its port.
func peer(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		a, _ := netip.ParseAddr(r.RemoteAddr)
		return a.Unmap()
	}
	return ap.Addr().Unmap()
}

// trusted reports whether the request comes from a trusted proxy: its
// peer is one of TrustedProxies and, when ProxySecret is set, it sends
// the secret.
func (c *Console) trusted(r *http.Request) bool {
	if !c.trustedAddr(peer(r)) {
		return false
	}
	if c.cfg.ProxySecret == "" {
		return true
	}
	sent := sha256.Sum256([]byte(r.Header.Get(c.cfg.ProxySecretHeader)))
	return subtle.ConstantTimeCompare(sent[:], c.proxy[:]) == 1
}

// warnBroadProxies warns when TrustedProxies include loopback or every
// address: then any process on this host, or anyone, is a proxy, and
// only ProxySecret tells the real one.
func warnBroadProxies(cfg Config) {
	for _, p := range cfg.TrustedProxies {
		switch {
		case p.Bits() == 0:
			cfg.Logger.Warn("console: TrustedProxies include every address: anyone who reaches the console may pass forwarded headers; list the proxies' own addresses",
				"trusted_proxy", p.String(), "proxy_secret", cfg.ProxySecret != "")
		case p.Contains(netip.AddrFrom4([4]byte{127, 0, 0, 1})) || p.Contains(netip.IPv6Loopback()) || p.Masked().Addr().IsLoopback():
			cfg.Logger.Warn("console: TrustedProxies include loopback: any process on this host is believed as a proxy unless it must send ProxySecret",
				"trusted_proxy", p.String(), "proxy_secret", cfg.ProxySecret != "")
		}
	}
}

// requesterFrom reads where a request comes from: from a trusted proxy,
// the client it forwarded for (the last address of X-Forwarded-For that
// is not itself a trusted proxy), the Host and scheme it was asked for.
func (c *Console) requesterFrom(r *http.Request) requester {
	rq := requester{from: r.RemoteAddr, host: r.Host}
	if !c.trusted(r) {
		return rq
	}
	if h := lastValue(r.Header.Values("X-Forwarded-Host")); h != "" {
		rq.host = h
	}
	if p := strings.ToLower(lastValue(r.Header.Values("X-Forwarded-Proto"))); p == "http" || p == "https" {
		rq.proto = p
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		rq.from = a.String()
		if !c.trustedAddr(a) {
			break
		}
	}
	return rq
}

func (c *Console) trustedAddr(a netip.Addr) bool {
	for _, prefix := range c.cfg.TrustedProxies {
		if prefix.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// lastValue is the last comma-separated value of a header's lines: the
// one the nearest proxy added.
func lastValue(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	parts := strings.Split(lines[len(lines)-1], ",")
	return strings.TrimSpace(parts[len(parts)-1])
}

// hostAllowed reports whether host is one the console answers to: any
// when AllowedHosts is empty; otherwise an entry "name" allows the name
// on any port, "name:port" that port only, and "*" any host.
func (c *Console) hostAllowed(host string) bool {
	if len(c.cfg.AllowedHosts) == 0 {
		return true
	}
	name, port := splitHost(host)
	for _, allowed := range c.cfg.AllowedHosts {
		if allowed == "*" {
			return true
		}
		an, ap := splitHost(allowed)
		if strings.EqualFold(an, name) && (ap == "" || ap == port) {
			return true
		}
	}
	return false
}

// splitHost splits "name:port", "[v6]:port", "name" or "v6" into its
// name, without brackets, and port.
func splitHost(h string) (string, string) {
	if name, port, err := net.SplitHostPort(h); err == nil {
		return name, port
	}
	return strings.Trim(h, "[]"), ""
}

// identify tells who a request is from, and whether it may pass: the
// embedding application's Identity; a trusted proxy's IdentityHeader;
// HTTP Basic authentication as one of Users, by their own token; or as
// anyone who knows the shared Token, whose user name is recorded with
// "(shared token)", for it is whatever was typed.
// The credential, for the limits, is the identity but for the shared
// token, which is one credential whatever name is typed.
func (c *Console) identify(r *http.Request) (who, credential string, ok bool) {
	if c.cfg.Identity != nil {
		who, ok := c.cfg.Identity(r)
		who = strings.TrimSpace(who)
		return who, "app:" + who, ok && who != ""
	}
	if c.cfg.IdentityHeader != "" && c.trusted(r) {
		if who := strings.TrimSpace(r.Header.Get(c.cfg.IdentityHeader)); who != "" {
			return who, "proxy:" + who, true
		}
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return "", "", false
	}
	user = strings.TrimSpace(user)
	sent := sha256.Sum256([]byte(pass))
	if want, ok := c.users[user]; ok {
		return user, "user:" + user, subtle.ConstantTimeCompare(sent[:], want[:]) == 1
	}
	if hash, ok := c.hashed[user]; ok {
		return user, "user:" + user, c.verified.check(user, pass, hash)
	}
	if c.cfg.Token != "" && subtle.ConstantTimeCompare(sent[:], c.token[:]) == 1 {
		if user == "" {
			user = "anonymous"
		}
		return user + " (shared token)", "shared token", true
	}
	return "", "", false
}

// userDigests reads Config.Users: each user's token as a bcrypt hash
// (salted and slow: "$2a$", "$2b$" or "$2y$"), or, as before, its
// unsalted SHA-256 digest in hex.
func userDigests(users map[string]string) (map[string][sha256.Size]byte, map[string][]byte, error) {
	digests, hashed := map[string][sha256.Size]byte{}, map[string][]byte{}
	for name, digest := range users {
		if strings.TrimSpace(name) == "" || strings.Contains(name, ":") {
			return nil, nil, errBadUser(name)
		}
		if isBcrypt(digest) {
			if _, err := bcrypt.Cost([]byte(digest)); err != nil {
				return nil, nil, errBadUser(name)
			}
			hashed[name] = []byte(digest)
			continue
		}
		b, err := hex.DecodeString(digest)
		if err != nil || len(b) != sha256.Size {
			return nil, nil, errBadUser(name)
		}
		digests[name] = [sha256.Size]byte(b)
	}
	return digests, hashed, nil
}

// isBcrypt reports whether a user's stored token is a bcrypt hash.
func isBcrypt(s string) bool {
	return strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$")
}

type errBadUser string

func (e errBadUser) Error() string {
	return "console: Users: user " + `"` + string(e) + `"` + ": want a name without a colon and the bcrypt hash of the user's token (htpasswd -nbBC 12 NAME TOKEN), or its SHA-256 in hex (64 digits)"
}

// verifiedTokens remembers, for a few minutes, the users' tokens that a
// slow hash accepted, so that a page's refresh every few seconds does
// not cost a bcrypt comparison each: by an HMAC under a key of this
// process, never the token itself.
type verifiedTokens struct {
	key [32]byte
	mu  sync.Mutex
	ok  map[[sha256.Size]byte]time.Time
}

// verifiedTTL is how long an accepted token is remembered;
// verifiedMax bounds how many are.
const (
	verifiedTTL = 5 * time.Minute
	verifiedMax = 1000
)

func newVerifiedTokens() *verifiedTokens {
	v := &verifiedTokens{ok: map[[sha256.Size]byte]time.Time{}}
	_, _ = rand.Read(v.key[:]) // crypto/rand.Read does not fail
	return v
}

// check reports whether pass is user's token, by hash.
func (v *verifiedTokens) check(user, pass string, hash []byte) bool {
	m := hmac.New(sha256.New, v.key[:])
	m.Write(hash)
	m.Write([]byte{0})
	m.Write([]byte(user))
	m.Write([]byte{0})
	m.Write([]byte(pass))
	k := [sha256.Size]byte(m.Sum(nil))
	now := time.Now()
	v.mu.Lock()
	at, seen := v.ok[k]
	v.mu.Unlock()
	if seen && now.Sub(at) < verifiedTTL {
		return true
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(pass)) != nil {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.ok) >= verifiedMax {
		clear(v.ok)
	}
	v.ok[k] = now
	return true
}

// sameOrigin reports whether a request that changes something comes from
// the console's own pages: a browser says where a request comes from
// (Sec-Fetch-Site, Origin), and a page of another site that makes the
// operator's browser post here, credentials and all, is refused. A client
// that is no browser sends neither, and had to authenticate. The origin
// is compared with the host and scheme the client asked for, which
// behind a trusted proxy are its X-Forwarded-Host and -Proto.
func sameOrigin(r *http.Request, rq requester) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && strings.EqualFold(u.Host, rq.host) && (rq.proto == "" || u.Scheme == rq.proto)
}

// withRequester stores rq in r's context.
func withRequester(r *http.Request, rq requester) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), requesterKey{}, rq))
}

// clientKey is the network a client's address is in, which failed
// sign-ins count against: an IPv4 address, or the /64 of an IPv6
// address (one host or link commonly holds a whole /64, and may change
// address within it at will). The port, which changes with each
// connection, is dropped.
func clientKey(from string) string {
	host := from
	if h, _, err := net.SplitHostPort(from); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return "net:" + host
	}
	if a = a.Unmap(); a.Is6() {
		return "net:" + netip.PrefixFrom(a, 64).Masked().String()
	}
	return "net:" + a.String()
}

// userKey is the key failed sign-ins as a user name count against, so
// that many networks guessing one user's token are throttled too.
func userKey(user string) string { return "user:" + strings.TrimSpace(user) }

// loopbackClient reports whether the client's address (a request's
// peer, or the client a trusted proxy forwarded for) is a loopback one:
// credentials it sends in clear never left the host.
func loopbackClient(from string) bool {
	host := from
	if h, _, err := net.SplitHostPort(from); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
