package ops

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"
)

// Who may do what on the worker's port: /healthz, /readyz, /metrics and
// /status only read, and answer anyone who reaches the port, the probes
// and the scrapers first. POST /trigger acts, so it answers only a client
// that shows the token, or, while no token is set, a client on this host.
// The profiler shows the process's memory and costs CPU while it runs, so
// it listens on a loopback address of its own.

// TokenMinLength is the least length of ServerConfig.Token: a token an
// operator made up is short; one from `openssl rand -hex 16` is 32.
const TokenMinLength = 16

var tokenWant = fmt.Sprintf("at least %d visible ASCII characters, no spaces", TokenMinLength)

const loopbackWant = "a loopback address such as 127.0.0.1:6060, [::1]:6060 or localhost:6060"

// CheckToken returns why token cannot be the bearer token of POST
// /trigger, or nil. The error does not show the token.
func CheckToken(token string) error {
	if len(token) < TokenMinLength {
		return fmt.Errorf("want %s (got %d characters)", tokenWant, len(token))
	}
	for _, c := range []byte(token) {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("want %s", tokenWant)
		}
	}
	return nil
}

// CheckLoopbackAddr returns why addr is no loopback host:port, or nil. An
// empty host (":6060") listens on every interface and is refused.
func CheckLoopbackAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port")
	}
	if host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap().IsLoopback() {
		return nil
	}
	return errors.New("want " + loopbackWant + ": the profiler must not be reachable from other hosts")
}

// checkLoopbackListener makes sure that what ln listens on is loopback,
// whatever "localhost" resolved to.
func checkLoopbackListener(ln net.Listener) error {
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return fmt.Errorf("listens on %s, want a loopback address", ln.Addr())
	}
	return nil
}

// tokenDigest is the SHA-256 of a token: tokens are compared by their
// digests, of one length, so that the comparison's time tells nothing of
// the token, not even its length.
type tokenDigest [sha256.Size]byte

func digest(token string) tokenDigest { return sha256.Sum256([]byte(token)) }

// authorizeTrigger reports whether r may trigger a claim, and answers it
// when not: with a token set, every client must send it, on this host
// too (a proxy or a sidecar on the same host makes any client look
// local); without one, only loopback clients may.
func (s *Server) authorizeTrigger(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.Token != "" {
		if s.tokenSent(r) {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="outbox worker"`)
		writeJSON(w, http.StatusUnauthorized, map[string]any{
			"error": "POST /trigger needs the worker's token: Authorization: Bearer <OUTBOX_HTTP_TOKEN>",
		})
		return false
	}
	if isLoopback(r.RemoteAddr) {
		return true
	}
	writeJSON(w, http.StatusForbidden, map[string]any{
		"error": "POST /trigger answers only clients on the worker's host while OUTBOX_HTTP_TOKEN is unset; set it and send Authorization: Bearer <token>",
	})
	return false
}

// tokenSent reports whether r carries the token as a bearer token.
func (s *Server) tokenSent(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sent := digest(strings.TrimSpace(token))
	return subtle.ConstantTimeCompare(sent[:], s.token[:]) == 1
}

// isLoopback reports whether remoteAddr, a request's RemoteAddr, is on
// this host. Headers such as X-Forwarded-For are not read: any client can
// write them.
func isLoopback(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// newPprofServer serves net/http/pprof. It has no write timeout: a CPU
// profile or a trace streams for as long as it was asked to (pprof refuses
// a duration beyond the write timeout), and only this host reaches it.
// pprof's /cmdline is left out: the command line may hold a URI with its
// password.
func newPprofServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout}
}
