package main

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/outboxrelay/outbox/console"
)

// ConsoleConfig is what `worker console` reads besides the operator
// commands' settings.
type ConsoleConfig struct {
	// ConsoleAddr is where it listens; ConsoleWrites turns its actions
	// on, behind ConsoleToken; ConsoleRequeueRate spreads a group's
	// requeue; ConsoleActionMax bounds the events of one action.
	ConsoleAddr        string
	ConsoleWrites      bool
	ConsoleToken       string
	ConsoleRequeueRate int
	ConsoleActionMax   int
	// ConsoleActionsPerMinute and ConsoleSignInFailures are the rate
	// limits of each operator's actions and each address's failed
	// sign-ins.
	ConsoleActionsPerMinute int
	ConsoleSignInFailures   int
	// ConsoleUsers are per-user credentials, read from
	// OUTBOX_CONSOLE_USERS_FILE: each name and its token's SHA-256 in hex.
	ConsoleUsers map[string]string
	// ConsoleAllowedHosts are the Host names it answers to; none: its
	// address and localhost (consoleHosts).
	ConsoleAllowedHosts []string
	// ConsoleTrustedProxies are the reverse proxies whose X-Forwarded-*
	// and ConsoleIdentityHeader it believes.
	ConsoleTrustedProxies []netip.Prefix
	ConsoleIdentityHeader string
	// ConsoleProxySecret is what the trusted proxies send in
	// console.ProxySecretHeaderDefault: without it their requests are
	// believed no more than any other's. Required with
	// ConsoleIdentityHeader.
	ConsoleProxySecret string
	// ConsoleOIDC* sign operators in through an OpenID provider: its
	// issuer, the console's client there, the console's callback URL
	// and the claim that holds the users' console roles.
	ConsoleOIDCIssuer, ConsoleOIDCClientID, ConsoleOIDCClientSecret string
	ConsoleOIDCRedirectURL, ConsoleOIDCRolesClaim                   string
	// ConsoleOIDCScopes are asked besides openid: many providers put a
	// user's groups in the tokens only when a scope asks for them.
	ConsoleOIDCScopes []string
	// ConsoleTLSCert and ConsoleTLSKey are the files of the console's
	// TLS certificate and key: set, it serves HTTPS, and reads them again
	// when they change.
	ConsoleTLSCert, ConsoleTLSKey string
	// ConsoleInsecureOpen lets it serve without authentication on an
	// address other hosts reach.
	ConsoleInsecureOpen bool
}

// consoleSettings are the settings of ConsoleConfig.
func consoleSettings() []setting {
	return []setting{
		{env: "OUTBOX_CONSOLE_ADDR", flag: "console-addr", def: "127.0.0.1:8090", forConsole: true,
			usage: "address the console command serves the operator console on; off loopback it needs authentication (a token, users, or a trusted proxy's identity header) or OUTBOX_CONSOLE_INSECURE_OPEN=true",
			parse: func(c *Config, v string) error { return parseAddr(&c.ConsoleAddr, v) }},
		{env: "OUTBOX_CONSOLE_WRITES", flag: "console-writes", def: "false", forConsole: true,
			usage: "true turns the console's actions on (requeue, skip, requeue of a failure group, pause and resume of an event type, each with a reason and audited); it then needs OUTBOX_CONSOLE_TOKEN, OUTBOX_CONSOLE_USERS_FILE or OUTBOX_CONSOLE_IDENTITY_HEADER",
			parse: func(c *Config, v string) error { return parseBool(&c.ConsoleWrites, v) }},
		{env: "OUTBOX_CONSOLE_TOKEN", flag: "console-token", def: "", forConsole: true, secret: true,
			usage: "password shared by every operator, given by HTTP Basic authentication on every console request, reads included (the user name is recorded as who acted, marked shared token). Prefer the variable: a flag shows in ps",
			parse: parseConsoleToken},
		{env: "OUTBOX_CONSOLE_REQUEUE_RATE", flag: "console-requeue-rate", def: strconv.Itoa(console.RequeuePerSecondDefault), forConsole: true,
			usage: "events a second a failure group's requeue from the console makes due, oldest first, so that the relay and its consumers are not flooded",
			parse: func(c *Config, v string) error { return parseIntBetween(&c.ConsoleRequeueRate, v, 1, 100000) }},
		{env: "OUTBOX_CONSOLE_ACTION_MAX", flag: "console-action-max", def: strconv.Itoa(console.ActionMaxDefault), forConsole: true,
			usage: "most events one console action touches: a preview selects the oldest so many, and the rest wait for another action",
			parse: func(c *Config, v string) error {
				return parseIntBetween(&c.ConsoleActionMax, v, 1, console.ActionMaxLimit)
			}},
		{env: "OUTBOX_CONSOLE_ACTIONS_PER_MINUTE", flag: "console-actions-per-minute", def: strconv.Itoa(console.ActionsPerMinuteDefault), forConsole: true,
			usage: "most console actions one operator may start in a minute; more get 429",
			parse: func(c *Config, v string) error { return parseIntBetween(&c.ConsoleActionsPerMinute, v, 1, 10000) }},
		{env: "OUTBOX_CONSOLE_SIGNIN_FAILURES_PER_MINUTE", flag: "console-signin-failures-per-minute", def: strconv.Itoa(console.SignInFailuresPerMinuteDefault), forConsole: true,
			usage: "most failed console sign-ins from one address in a minute; past it every request from there gets 429 until the minute ends",
			parse: func(c *Config, v string) error { return parseIntBetween(&c.ConsoleSignInFailures, v, 1, 10000) }},
		{env: "OUTBOX_CONSOLE_USERS_FILE", flag: "console-users-file", def: "", forConsole: true,
			usage: "file of per-user console credentials, one name:bcrypt-hash a line as htpasswd -nbBC 12 NAME TOKEN writes it (or, unsalted, name:sha256-hex-of-the-token), # starts a comment; every request then signs in as one of them",
			parse: parseUsersFile},
		{env: "OUTBOX_CONSOLE_ALLOWED_HOSTS", flag: "console-allowed-hosts", def: "", forConsole: true,
			usage: "comma-separated Host names the console answers to (name, name:port, or * for any); unset: its own address and localhost. Any other gets 421, which stops DNS rebinding",
			parse: func(c *Config, v string) error { return parseHosts(&c.ConsoleAllowedHosts, v) }},
		{env: "OUTBOX_CONSOLE_TRUSTED_PROXIES", flag: "console-trusted-proxies", def: "", forConsole: true,
			usage: "comma-separated addresses or CIDR prefixes of the reverse proxies in front of the console: only from them are X-Forwarded-For, -Host, -Proto and OUTBOX_CONSOLE_IDENTITY_HEADER believed",
			parse: func(c *Config, v string) error { return parsePrefixes(&c.ConsoleTrustedProxies, v) }},
		{env: "OUTBOX_CONSOLE_IDENTITY_HEADER", flag: "console-identity-header", def: "", forConsole: true,
			usage: "header in which a trusted proxy passes the user it authenticated (oauth2-proxy: X-Forwarded-User); needs OUTBOX_CONSOLE_TRUSTED_PROXIES",
			parse: func(c *Config, v string) error {
				c.ConsoleIdentityHeader = http.CanonicalHeaderKey(strings.TrimSpace(v))
				return nil
			}},
		{env: "OUTBOX_CONSOLE_PROXY_SECRET", flag: "console-proxy-secret", def: "", forConsole: true, secret: true,
			usage: "secret, at least 16 characters, the trusted proxies send in the X-Outbox-Proxy-Secret header of every request; required with OUTBOX_CONSOLE_IDENTITY_HEADER, for an address alone lets any process on the proxy's host act as anyone. Prefer the variable: a flag shows in ps",
			parse: func(c *Config, v string) error {
				if v != "" && len(v) < console.TokenMinLength {
					return fmt.Errorf("want at least %d characters (got %d)", console.TokenMinLength, len(v))
				}
				c.ConsoleProxySecret = v
				return nil
			}},
		{env: "OUTBOX_CONSOLE_OIDC_ISSUER", flag: "console-oidc-issuer", def: "", forConsole: true,
			usage: "issuer URL of the OpenID provider operators sign in through (authorization code with PKCE, then a session); needs OUTBOX_CONSOLE_OIDC_CLIENT_ID and OUTBOX_CONSOLE_OIDC_REDIRECT_URL",
			parse: func(c *Config, v string) error { c.ConsoleOIDCIssuer = strings.TrimSpace(v); return nil }},
		{env: "OUTBOX_CONSOLE_OIDC_CLIENT_ID", flag: "console-oidc-client-id", def: "", forConsole: true,
			usage: "the console's client id at the OpenID provider",
			parse: func(c *Config, v string) error { c.ConsoleOIDCClientID = strings.TrimSpace(v); return nil }},
		{env: "OUTBOX_CONSOLE_OIDC_CLIENT_SECRET", flag: "console-oidc-client-secret", def: "", forConsole: true, secret: true,
			usage: "the console's client secret at the OpenID provider; unset for a public client. Prefer the variable: a flag shows in ps",
			parse: func(c *Config, v string) error { c.ConsoleOIDCClientSecret = v; return nil }},
		{env: "OUTBOX_CONSOLE_OIDC_REDIRECT_URL", flag: "console-oidc-redirect-url", def: "", forConsole: true,
			usage: "the console's callback as browsers reach it, registered at the provider: https://HOST/auth/callback",
			parse: func(c *Config, v string) error { c.ConsoleOIDCRedirectURL = strings.TrimSpace(v); return nil }},
		{env: "OUTBOX_CONSOLE_OIDC_ROLES_CLAIM", flag: "console-oidc-roles-claim", def: console.RolesClaimDefault, forConsole: true,
			usage: "claim (ID token or userinfo) that lists a user's console roles: viewer, operator, admin",
			parse: func(c *Config, v string) error { c.ConsoleOIDCRolesClaim = strings.TrimSpace(v); return nil }},
		{env: "OUTBOX_CONSOLE_OIDC_SCOPES", flag: "console-oidc-scopes", def: "profile,email", forConsole: true,
			usage: "comma-separated scopes asked besides openid; add the one that puts the roles claim in the tokens (Dex: groups)",
			parse: func(c *Config, v string) error {
				return parseScopes(&c.ConsoleOIDCScopes, cmp.Or(strings.TrimSpace(v), "profile,email"))
			}},
		{env: "OUTBOX_CONSOLE_TLS_CERT", flag: "console-tls-cert", def: "", forConsole: true,
			usage: "file of the console's TLS certificate (PEM, the chain after it): set with OUTBOX_CONSOLE_TLS_KEY, the console serves HTTPS, sends HSTS, and reads the pair again when the files change",
			parse: func(c *Config, v string) error { c.ConsoleTLSCert = strings.TrimSpace(v); return nil }},
		{env: "OUTBOX_CONSOLE_TLS_KEY", flag: "console-tls-key", def: "", forConsole: true,
			usage: "file of the console's TLS private key (PEM); with OUTBOX_CONSOLE_TLS_CERT",
			parse: func(c *Config, v string) error { c.ConsoleTLSKey = strings.TrimSpace(v); return nil }},
		{env: "OUTBOX_CONSOLE_INSECURE_OPEN", flag: "console-insecure-open", def: "false", forConsole: true,
			usage: "true lets the console serve without authentication on an address other hosts reach; without it such a console refuses to start",
			parse: func(c *Config, v string) error { return parseBool(&c.ConsoleInsecureOpen, v) }},
	}
}

// parseConsoleToken accepts no token, or one long enough; the error
// never shows it.
func parseConsoleToken(c *Config, v string) error {
	if v != "" && len(v) < console.TokenMinLength {
		return fmt.Errorf("want at least %d characters (got %d)", console.TokenMinLength, len(v))
	}
	c.ConsoleToken = v
	return nil
}

// parseUsersFile reads the per-user credentials of a file: name:digest
// lines, the digest the SHA-256 of the user's token in hex.
func parseUsersFile(c *Config, path string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	users := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, digest, ok := strings.Cut(line, ":")
		name, digest = strings.TrimSpace(name), strings.TrimSpace(digest)
		if !strings.HasPrefix(digest, "$2") {
			digest = strings.ToLower(digest)
		}
		if !ok || name == "" || !validUserHash(digest) {
			return fmt.Errorf("%s line %d: want name:bcrypt-hash (htpasswd -nbBC 12 NAME TOKEN) or name:sha256-hex (64 hex digits of the SHA-256 of the user's token)", path, i+1)
		}
		if _, dup := users[name]; dup {
			return fmt.Errorf("%s line %d: user %q is listed twice", path, i+1, name)
		}
		users[name] = digest
	}
	if len(users) == 0 {
		return fmt.Errorf("%s lists no user", path)
	}
	c.ConsoleUsers = users
	return nil
}

// validUserHash reports whether a users file's value is a bcrypt hash or
// a SHA-256 digest in hex.
func validUserHash(v string) bool {
	if strings.HasPrefix(v, "$2") {
		_, err := bcrypt.Cost([]byte(v))
		return err == nil
	}
	d, err := hex.DecodeString(v)
	return err == nil && len(d) == sha256.Size
}

// parseHosts reads a comma-separated list of host names.
func parseHosts(dst *[]string, v string) error {
	*dst = nil
	for _, h := range strings.Split(v, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if strings.ContainsAny(h, "/ ") {
			return fmt.Errorf("%q is not a host name (name, name:port or *)", h)
		}
		*dst = append(*dst, h)
	}
	return nil
}

// parseScopes reads a comma-separated list of OAuth2 scopes, which
// cannot hold a space: the request sends them space-separated.
func parseScopes(dst *[]string, v string) error {
	*dst = nil
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if strings.ContainsAny(s, " \t\"") {
			return fmt.Errorf("%q is not a scope (comma-separate them)", s)
		}
		*dst = append(*dst, s)
	}
	return nil
}

// parsePrefixes reads comma-separated addresses and CIDR prefixes.
func parsePrefixes(dst *[]netip.Prefix, v string) error {
	*dst = nil
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return fmt.Errorf("%q is neither an address nor a CIDR prefix", p)
			}
			prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		*dst = append(*dst, prefix.Masked())
	}
	return nil
}

// consoleAuthenticates reports whether the console asks who each request
// is from.
func (c ConsoleConfig) consoleAuthenticates() bool {
	return c.ConsoleOIDCIssuer != "" || c.ConsoleToken != "" || len(c.ConsoleUsers) > 0 || c.ConsoleIdentityHeader != ""
}

// checkConsole checks the rules between the console's settings: actions
// need authentication, an identity header trusted proxies, and an address
// other hosts reach either authentication or OUTBOX_CONSOLE_INSECURE_OPEN.
func (c ConsoleConfig) checkConsole() error {
	switch {
	case c.ConsoleWrites && !c.consoleAuthenticates():
		return fmt.Errorf("%w: OUTBOX_CONSOLE_WRITES=true needs OUTBOX_CONSOLE_TOKEN, OUTBOX_CONSOLE_USERS_FILE or OUTBOX_CONSOLE_IDENTITY_HEADER: the console's actions are never open without authentication", ErrUsage)
	case c.ConsoleIdentityHeader != "" && len(c.ConsoleTrustedProxies) == 0:
		return fmt.Errorf("%w: OUTBOX_CONSOLE_IDENTITY_HEADER=%s needs OUTBOX_CONSOLE_TRUSTED_PROXIES: the header is believed only from the proxies that set it", ErrUsage, c.ConsoleIdentityHeader)
	case c.ConsoleOIDCIssuer != "" && (c.ConsoleOIDCClientID == "" || c.ConsoleOIDCRedirectURL == ""):
		return fmt.Errorf("%w: OUTBOX_CONSOLE_OIDC_ISSUER needs OUTBOX_CONSOLE_OIDC_CLIENT_ID and OUTBOX_CONSOLE_OIDC_REDIRECT_URL", ErrUsage)
	case c.ConsoleOIDCIssuer != "" && (c.ConsoleToken != "" || len(c.ConsoleUsers) > 0 || c.ConsoleIdentityHeader != ""):
		return fmt.Errorf("%w: OUTBOX_CONSOLE_OIDC_ISSUER replaces OUTBOX_CONSOLE_TOKEN, OUTBOX_CONSOLE_USERS_FILE and OUTBOX_CONSOLE_IDENTITY_HEADER: set one way of signing in", ErrUsage)
	case (c.ConsoleTLSCert == "") != (c.ConsoleTLSKey == ""):
		return fmt.Errorf("%w: OUTBOX_CONSOLE_TLS_CERT and OUTBOX_CONSOLE_TLS_KEY go together", ErrUsage)
	case c.ConsoleIdentityHeader != "" && c.ConsoleProxySecret == "":
		return fmt.Errorf("%w: OUTBOX_CONSOLE_IDENTITY_HEADER=%s needs OUTBOX_CONSOLE_PROXY_SECRET, which the proxy sends in %s: an address alone lets any process on the proxy's host act as anyone", ErrUsage, c.ConsoleIdentityHeader, console.ProxySecretHeaderDefault)
	case !c.consoleAuthenticates() && !c.ConsoleInsecureOpen && !loopbackAddr(c.ConsoleAddr):
		return fmt.Errorf("%w: OUTBOX_CONSOLE_ADDR=%s is reachable from other hosts and the console has no authentication, yet it shows every event's payload: set OUTBOX_CONSOLE_TOKEN or OUTBOX_CONSOLE_USERS_FILE, put it behind an authenticating proxy (OUTBOX_CONSOLE_IDENTITY_HEADER), or say OUTBOX_CONSOLE_INSECURE_OPEN=true", ErrUsage, c.ConsoleAddr)
	}
	return nil
}

// loopbackAddr reports whether a listen address is on loopback only.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// consoleHosts are the Host names the console answers to: those listed,
// or its own address (unless it listens on every address) and localhost.
func (c ConsoleConfig) consoleHosts() []string {
	if len(c.ConsoleAllowedHosts) > 0 {
		return c.ConsoleAllowedHosts
	}
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	host, _, err := net.SplitHostPort(c.ConsoleAddr)
	if a, aerr := netip.ParseAddr(host); err == nil && host != "" && (aerr != nil || !a.IsUnspecified()) && !slices.Contains(hosts, host) {
		hosts = append(hosts, host)
	}
	return hosts
}
