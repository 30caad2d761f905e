package main

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheckConsole: actions need authentication, an identity header
// trusted proxies, and an address other hosts reach authentication or
// the explicit OUTBOX_CONSOLE_INSECURE_OPEN.
func TestCheckConsole(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for name, tt := range map[string]struct {
		cfg  ConsoleConfig
		want string // "" for valid
	}{
		"loopback, no auth":                  {ConsoleConfig{ConsoleAddr: "127.0.0.1:8090"}, ""},
		"localhost, no auth":                 {ConsoleConfig{ConsoleAddr: "localhost:8090"}, ""},
		"every address, no auth":             {ConsoleConfig{ConsoleAddr: ":8090"}, "OUTBOX_CONSOLE_INSECURE_OPEN"},
		"a LAN address, no auth":             {ConsoleConfig{ConsoleAddr: "10.1.2.3:8090"}, "OUTBOX_CONSOLE_INSECURE_OPEN"},
		"every address, said open":           {ConsoleConfig{ConsoleAddr: "0.0.0.0:8090", ConsoleInsecureOpen: true}, ""},
		"every address, a token":             {ConsoleConfig{ConsoleAddr: "0.0.0.0:8090", ConsoleToken: "0123456789abcdef"}, ""},
		"writes without auth":                {ConsoleConfig{ConsoleAddr: "127.0.0.1:8090", ConsoleWrites: true}, "OUTBOX_CONSOLE_TOKEN"},
		"writes with users":                  {ConsoleConfig{ConsoleAddr: "127.0.0.1:8090", ConsoleWrites: true, ConsoleUsers: map[string]string{"a": "x"}}, ""},
		"identity header without proxies":    {ConsoleConfig{ConsoleAddr: "127.0.0.1:8090", ConsoleIdentityHeader: "X-Forwarded-User"}, "OUTBOX_CONSOLE_TRUSTED_PROXIES"},
		"identity header behind proxies, 0s": {ConsoleConfig{ConsoleAddr: ":8090", ConsoleIdentityHeader: "X-Forwarded-User", ConsoleTrustedProxies: proxies, ConsoleProxySecret: "proxy-secret-0123456789", ConsoleWrites: true}, ""},
		"oidc":                               {ConsoleConfig{ConsoleAddr: ":8090", ConsoleOIDCIssuer: "https://login.example.com", ConsoleOIDCClientID: "c", ConsoleOIDCRedirectURL: "https://outbox.example.com/auth/callback", ConsoleWrites: true}, ""},
		"oidc without a client":              {ConsoleConfig{ConsoleAddr: ":8090", ConsoleOIDCIssuer: "https://login.example.com"}, "OUTBOX_CONSOLE_OIDC_CLIENT_ID"},
		"oidc beside a token":                {ConsoleConfig{ConsoleAddr: ":8090", ConsoleOIDCIssuer: "https://login.example.com", ConsoleOIDCClientID: "c", ConsoleOIDCRedirectURL: "https://outbox.example.com/auth/callback", ConsoleToken: "0123456789abcdef"}, "replaces"},
		"a certificate without its key":      {ConsoleConfig{ConsoleAddr: "127.0.0.1:8090", ConsoleTLSCert: "tls.crt"}, "OUTBOX_CONSOLE_TLS_KEY"},
		"identity header without a secret":   {ConsoleConfig{ConsoleAddr: ":8090", ConsoleIdentityHeader: "X-Forwarded-User", ConsoleTrustedProxies: proxies, ConsoleWrites: true}, "OUTBOX_CONSOLE_PROXY_SECRET"},
	} {
		err := tt.cfg.checkConsole()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want valid", name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrUsage)):
			t.Errorf("%s: %v, want a usage error naming %s", name, err, tt.want)
		}
	}
}

// TestConsoleHosts: unset, the console answers to its own address and
// localhost; listening on every address adds no name of its own.
func TestConsoleHosts(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string][]string{
		"127.0.0.1:8090":  {"localhost", "127.0.0.1", "::1"},
		"10.1.2.3:8090":   {"localhost", "127.0.0.1", "::1", "10.1.2.3"},
		"0.0.0.0:8090":    {"localhost", "127.0.0.1", "::1"},
		":8090":           {"localhost", "127.0.0.1", "::1"},
		"relay.lan:8090":  {"localhost", "127.0.0.1", "::1", "relay.lan"},
		"[fd00::7]:8090":  {"localhost", "127.0.0.1", "::1", "fd00::7"},
		"localhost:18090": {"localhost", "127.0.0.1", "::1"},
	} {
		if got := (ConsoleConfig{ConsoleAddr: addr}).consoleHosts(); !slices.Equal(got, want) {
			t.Errorf("hosts of %s = %q, want %q", addr, got, want)
		}
	}
	listed := ConsoleConfig{ConsoleAddr: ":8090", ConsoleAllowedHosts: []string{"console.example.com"}}
	if got := listed.consoleHosts(); !slices.Equal(got, []string{"console.example.com"}) {
		t.Errorf("listed hosts = %q", got)
	}
}

// TestUsersFile: a users file gives each name its digest; a bad line is
// named by its number.
func TestUsersFile(t *testing.T) {
	t.Parallel()
	const digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	dir := t.TempDir()
	for name, tt := range map[string]struct {
		text, want string
	}{
		"valid":     {"# operators\nana:" + digest + "\n\nbo : " + strings.ToUpper(digest) + "\n", ""},
		"bcrypt":    {"ana:$2y$04$9eLDCVXqOz2tCbMRM3QBZOX0kDSEZ9bZTr8MUjO3djwU8lDsZcRYa\nbo:" + digest + "\n", ""},
		"bad hash":  {"ana:$2y$04$short\n", "line 1"},
		"no digest": {"ana:" + digest + "\nbo\n", "line 2"},
		"short":     {"ana:abcd\n", "line 1"},
		"twice":     {"ana:" + digest + "\nana:" + digest + "\n", "twice"},
		"empty":     {"# nobody\n", "no user"},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(tt.text), 0o600); err != nil {
			t.Fatal(err)
		}
		var c Config
		err := parseUsersFile(&c, path)
		switch {
		case tt.want == "" && (err != nil || len(c.ConsoleUsers) != 2 || c.ConsoleUsers["bo"] != digest):
			t.Errorf("%s: %v, users %v", name, err, c.ConsoleUsers)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want an error with %q", name, err, tt.want)
		}
	}
}

// TestConsoleOIDCScopes: the scopes asked besides openid default to
// profile and email, and a provider that puts groups in a token only
// when asked (Dex's groups, Keycloak's client scopes) gets them asked.
func TestConsoleOIDCScopes(t *testing.T) {
	t.Parallel()
	for v, want := range map[string][]string{
		"":                       {"profile", "email"},
		"profile, email, groups": {"profile", "email", "groups"},
		"groups,,":               {"groups"},
	} {
		cfg, _, err := loadConfig("console", nil, envOf(map[string]string{"OUTBOX_CONSOLE_OIDC_SCOPES": v}), consoleKind, nil)
		if err != nil || !slices.Equal(cfg.ConsoleOIDCScopes, want) {
			t.Errorf("OUTBOX_CONSOLE_OIDC_SCOPES=%q: scopes %q, %v; want %q", v, cfg.ConsoleOIDCScopes, err, want)
		}
	}
	if _, _, err := loadConfig("console", nil, envOf(map[string]string{"OUTBOX_CONSOLE_OIDC_SCOPES": "email groups"}), consoleKind, nil); err == nil ||
		!strings.Contains(err.Error(), "OUTBOX_CONSOLE_OIDC_SCOPES") {
		t.Errorf("a scope with a space: %v, want an error naming the setting", err)
	}
}
