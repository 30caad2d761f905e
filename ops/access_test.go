package ops_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/ops"
)

const token = "0123456789abcdef0123456789abcdef"

// TestTriggerAccess sends POST /trigger from loopback and other clients,
// with and without a token set on the server: without one only loopback
// clients may trigger; with one every client must send it, loopback
// clients too (a proxy on the same host makes any client look local).
func TestTriggerAccess(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		token         string // the server's
		remote, auth  string // the request's
		want          int
		wantTriggered bool
	}{
		{name: "loopback, no token set", remote: "127.0.0.1:50000", want: http.StatusAccepted, wantTriggered: true},
		{name: "IPv6 loopback, no token set", remote: "[::1]:50000", want: http.StatusAccepted, wantTriggered: true},
		{name: "other host, no token set", remote: "10.1.2.3:50000", want: http.StatusForbidden},
		{name: "other host claiming loopback in a header", remote: "10.1.2.3:50000", auth: "Bearer x", want: http.StatusForbidden},
		{name: "other host, right token", token: token, remote: "10.1.2.3:50000", auth: "Bearer " + token, want: http.StatusAccepted, wantTriggered: true},
		{name: "scheme in any case", token: token, remote: "10.1.2.3:50000", auth: "bearer " + token, want: http.StatusAccepted, wantTriggered: true},
		{name: "other host, wrong token", token: token, remote: "10.1.2.3:50000", auth: "Bearer " + strings.ToUpper(token), want: http.StatusUnauthorized},
		{name: "other host, token as a prefix", token: token, remote: "10.1.2.3:50000", auth: "Bearer " + token[:20], want: http.StatusUnauthorized},
		{name: "other host, no token sent", token: token, remote: "10.1.2.3:50000", want: http.StatusUnauthorized},
		{name: "other host, basic auth", token: token, remote: "10.1.2.3:50000", auth: "Basic " + token, want: http.StatusUnauthorized},
		{name: "loopback, token set but not sent", token: token, remote: "127.0.0.1:50000", want: http.StatusUnauthorized},
		{name: "loopback, right token", token: token, remote: "127.0.0.1:50000", auth: "Bearer " + token, want: http.StatusAccepted, wantTriggered: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, srv := newServer(t, func(c *ops.ServerConfig) { c.Token = tt.token })
			req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/trigger", nil)
			req.RemoteAddr = tt.remote
			req.Header.Set("X-Forwarded-For", "127.0.0.1")
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("POST /trigger = %d %s, want %d", rec.Code, rec.Body, tt.want)
			}
			if got := s.claimer.triggers.Load() == 1; got != tt.wantTriggered {
				t.Errorf("claim triggered: %t, want %t", got, tt.wantTriggered)
			}
			if tt.want == http.StatusUnauthorized && !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate: Bearer (got %q)", rec.Header().Get("WWW-Authenticate"))
			}
			if strings.Contains(rec.Body.String(), token) {
				t.Errorf("the answer shows the token: %s", rec.Body)
			}
		})
	}
}

// TestReadEndpointsAnswerAnyone: the probes and scrapers come from other
// hosts and send no token.
func TestReadEndpointsAnswerAnyone(t *testing.T) {
	t.Parallel()
	_, srv := newServer(t, func(c *ops.ServerConfig) { c.Token = token })
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil)
		req.RemoteAddr = "10.1.2.3:50000"
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("GET %s from another host = %d, want 200", path, rec.Code)
		}
	}
}

func TestServerTimeouts(t *testing.T) {
	t.Parallel()
	_, srv := newServer(t, nil)
	readHeader, read, write, idle := srv.Timeouts()
	for name, d := range map[string]struct{ got, least float64 }{
		// The least each may be: a probe, a scrape (10s timeout) and a
		// kept-alive connection between scrapes (15s) must get through.
		"read header": {readHeader.Seconds(), 1},
		"read":        {read.Seconds(), readHeader.Seconds()},
		"write":       {write.Seconds(), 10},
		"idle":        {idle.Seconds(), 15},
	} {
		if d.got < d.least || d.got > 120 {
			t.Errorf("%s timeout = %gs, want %gs to 120s", name, d.got, d.least)
		}
	}
}

func TestCheckToken(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		token string
		ok    bool
	}{
		{token, true},
		{"0123456789abcdef", true},
		{"0123456789abcde", false},
		{"0123456789 abcdef", false},
		{"0123456789abcdef\t", false},
		{"0123456789abcdéf", false},
	} {
		err := ops.CheckToken(tt.token)
		if (err == nil) != tt.ok {
			t.Errorf("CheckToken(%q) = %v, want ok %t", tt.token, err, tt.ok)
		}
		if err != nil && strings.Contains(err.Error(), tt.token) {
			t.Errorf("CheckToken(%q) = %v shows the token", tt.token, err)
		}
	}
}

// TestPprofAddrLoopbackOnly: the profiler is refused an address other
// hosts reach, by its name in the error.
func TestPprofAddrLoopbackOnly(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:6060", true},
		{"127.0.0.2:6060", true},
		{"[::1]:6060", true},
		{"localhost:6060", true},
		{":6060", false},
		{"0.0.0.0:6060", false},
		{"[::]:6060", false},
		{"10.1.2.3:6060", false},
		{"pprof.example.com:6060", false},
		{"127.0.0.1", false},
	} {
		err := ops.CheckLoopbackAddr(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("CheckLoopbackAddr(%q) = %v, want ok %t", tt.addr, err, tt.ok)
		}
		cfg := ops.ServerConfig{
			Outboxes: []ops.Outbox{{Name: "default", Store: &fakeStore{}, Broker: &switchBroker{}, Samples: &fakeSamples{}, Claimer: &fakeJob{}, Recovery: &fakeJob{}}},
			Gatherer: prometheus.NewRegistry(), PprofAddr: tt.addr,
		}
		err = cfg.Validate()
		if (err == nil) != tt.ok || (err != nil && !strings.Contains(err.Error(), "PprofAddr")) {
			t.Errorf("Validate with PprofAddr %q = %v, want ok %t or an error naming PprofAddr", tt.addr, err, tt.ok)
		}
	}
}

// TestPprofOnItsOwnAddress: the profiler answers on its own address only,
// never on the main one.
func TestPprofOnItsOwnAddress(t *testing.T) {
	t.Parallel()
	_, srv := newServer(t, func(c *ops.ServerConfig) { c.PprofAddr = "127.0.0.1:0" })
	testenv.Start(t, srv)
	if code, _ := do(t, http.MethodGet, "http://"+srv.PprofAddr()+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("GET /debug/pprof/ on the profiler's address = %d, want 200", code)
	}
	if code, _ := do(t, http.MethodGet, "http://"+srv.PprofAddr()+"/debug/pprof/cmdline"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/cmdline = %d, want 404: the command line may hold a password", code)
	}
	if code, _ := do(t, http.MethodGet, "http://"+srv.Addr()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ on the main address = %d, want 404", code)
	}

	_, off := newServer(t, nil)
	testenv.Start(t, off)
	if got := off.PprofAddr(); got != "" {
		t.Errorf("PprofAddr without a profiler = %q, want empty", got)
	}
}
