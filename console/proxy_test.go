package console_test

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/service"
)

// TestIdentityHeaderNeedsAProxySecret: a header that names the user is
// believed only with a secret the proxy sends: by address alone, any
// process on the proxy's host (loopback, in the documented setup) could
// act as anyone.
func TestIdentityHeaderNeedsAProxySecret(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	_, err := console.New(console.Config{
		Store: store, Samples: samples{}, Writer: store,
		IdentityHeader: "X-Forwarded-User", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	})
	if err == nil || !strings.Contains(err.Error(), "ProxySecret") {
		t.Errorf("New with an identity header and no proxy secret = %v, want an error naming ProxySecret", err)
	}
}

// syncBuffer is a log that tests read while a console writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBroadTrustedProxiesAreWarnedOf: a console that trusts loopback
// or every address says so at start, naming the setting.
func TestBroadTrustedProxiesAreWarnedOf(t *testing.T) {
	t.Parallel()
	for prefix, want := range map[string]bool{
		"127.0.0.1/32": true, "::1/128": true, "0.0.0.0/0": true, "::/0": true, "127.0.0.0/8": true,
		"10.1.2.3/32": false,
	} {
		var log syncBuffer
		_, err := console.New(console.Config{
			Store: newFakeStore(t), Samples: samples{}, Token: token,
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix(prefix)},
			Archetype:      service.Archetype{Logger: slog.New(slog.NewTextHandler(&log, nil))},
		})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Contains(log.String(), "level=WARN") && strings.Contains(log.String(), "TrustedProxies")
		if got != want {
			t.Errorf("TrustedProxies %s: warned %v, want %v; log:\n%s", prefix, got, want, log.String())
		}
	}
}
