package testenv

import (
	"net"
	"testing"

	"github.com/outboxrelay/outbox/internal/tcpproxy"
)

// Proxy is an in-process TCP proxy for fault injection: put it between the
// code under test and a server, then Cut, Stall or slow (SetLatency) the
// link, and Restore it. See internal/tcpproxy.
type Proxy = tcpproxy.Proxy

// NewProxy starts a proxy listening on 127.0.0.1 (a free port) that forwards
// every connection to target (host:port). It is closed in t.Cleanup, not
// when t.Context is canceled: code under test may still reconnect through
// the proxy while it stops in an earlier cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// ProxyURI returns uri (mongodb:// or amqp[s]://) with its host:port replaced
// by addr; see tcpproxy.URI.
func ProxyURI(uri, addr string) (string, error) {
	return tcpproxy.URI(uri, addr)
}

// ClosedPortURL is uri pointed at a local port nothing listens on: a
// server that refuses connections, for tests of failover and start-up
// without a server.
func ClosedPortURL(t testing.TB, uri string) string {
	t.Helper()
	ln, err := new(net.ListenConfig).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	out, err := ProxyURI(uri, addr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Proxied starts a Proxy to the server of uri (mongodb:// with one host, or
// amqp[s]://) and returns uri pointed at the proxy, for code under test
// whose link the test will cut.
func Proxied(t testing.TB, uri string) (string, *Proxy) {
	t.Helper()
	target, err := tcpproxy.Target(uri)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, target)
	proxied, err := ProxyURI(uri, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return proxied, p
}
