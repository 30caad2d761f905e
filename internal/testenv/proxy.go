package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/redact"
)

const proxyDialTimeout = 5 * time.Second

// Proxy is an in-process TCP proxy for fault injection: put it between the
// code under test and a server, then Cut or Stall the link, and Restore it.
type Proxy struct {
	ctx    context.Context // canceled by close; bounds dials to the target
	cancel context.CancelFunc
	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every copying goroutine

	mu      sync.Mutex
	cut     bool
	closed  bool
	stalled chan struct{} // non-nil while stalled; closed by Restore
	conns   map[*proxyConn]struct{}
}

// proxyConn is one proxied connection: the accepted client side and the
// dialed server side.
type proxyConn struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

func (c *proxyConn) close() {
	c.once.Do(func() { close(c.done) })
	_ = c.client.Close()
	_ = c.server.Close()
}

// NewProxy starts a proxy listening on 127.0.0.1 (a free port) that forwards
// every connection to target (host:port). It is closed in t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy listen: %v", err)
	}
	// Not t.Context() itself: that is canceled before cleanups run, and code
	// under test may still reconnect through the proxy while it stops.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	p := &Proxy{
		ctx:    ctx,
		cancel: cancel,
		target: target,
		ln:     ln,
		conns:  make(map[*proxyConn]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

// Addr returns the address clients dial, "127.0.0.1:port".
func (p *Proxy) Addr() string {
	return p.ln.Addr().String()
}

// Cut closes every open connection and, until Restore, accepts new ones only
// to close them at once. When Cut returns, Conns reports 0.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.closeConnsLocked()
}

// Stall keeps every connection open, and still accepts new ones, but stops
// reading from the clients until Restore: like a server that stopped
// reading, a client's writes fill the socket buffers and then block. What
// the server sends still reaches the clients. Bytes already read when Stall
// is called are held back too.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Restore forwards again after Cut or Stall: new connections after Cut, and
// the clients' bytes held by Stall.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// waitUnstalled returns true once the proxy is not stalled, or false if c
// is closed or the proxy stops first.
func (p *Proxy) waitUnstalled(c *proxyConn) bool {
	p.mu.Lock()
	stalled := p.stalled
	p.mu.Unlock()
	if stalled == nil {
		return true
	}
	select {
	case <-stalled:
		return true
	case <-c.done:
		return false
	case <-p.ctx.Done():
		return false
	}
}

// Conns returns the number of connections currently proxied.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) close() {
	p.cancel()
	p.mu.Lock()
	p.closed = true
	p.closeConnsLocked()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) closeConnsLocked() {
	for c := range p.conns {
		c.close()
		delete(p.conns, c)
	}
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a failed accept (e.g. too many open files) ends nothing.
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		if !refuse {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if refuse {
			_ = client.Close()
			continue
		}
		go p.serve(client)
	}
}

// serve dials the target for one accepted client and copies bytes both ways
// until both directions end or the connection is cut.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: proxyDialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &proxyConn{client: client, server: server, done: make(chan struct{})}

	p.mu.Lock()
	if p.cut || p.closed { // cut while dialing
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pipeFromClient(c)
	}()
	pipe(client, server)
	<-done

	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.close()
}

// pipeFromClient copies the client's bytes to the server like pipe, but
// neither reads nor writes while the proxy is stalled.
func (p *Proxy) pipeFromClient(c *proxyConn) {
	buf := make([]byte, 32<<10)
	for p.waitUnstalled(c) {
		n, err := c.client.Read(buf)
		if n > 0 {
			if !p.waitUnstalled(c) {
				break
			}
			if _, werr := c.server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	halfClose(c.server)
}

// pipe copies src to dst, then half-closes dst so that the peer sees EOF
// while the other direction may still carry a reply.
func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	halfClose(dst)
}

func halfClose(dst net.Conn) {
	if tcp, ok := dst.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
		return
	}
	_ = dst.Close()
}

// ProxyURI returns uri (mongodb:// or amqp[s]://) with its host:port replaced
// by addr, keeping credentials, path and query. For mongodb:// it adds
// directConnection=true when the URI does not set it, so that the driver keeps
// talking to the proxy instead of the hosts the server advertises.
func ProxyURI(uri, addr string) (string, error) {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return "", fmt.Errorf("proxy URI: %q has no scheme", redact.URL(uri))
	}
	switch scheme {
	case "mongodb", "amqp", "amqps":
	default:
		return "", fmt.Errorf("proxy URI: scheme %q: want mongodb, amqp or amqps", scheme)
	}

	// Split by hand: a mongodb:// host list ("a:1,b:2") is not a valid URL
	// host for net/url.
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo := ""
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo = authority[:i+1]
	}
	out := scheme + "://" + userinfo + addr + tail

	if scheme == "mongodb" {
		u, err := url.Parse(out)
		if err != nil {
			return "", fmt.Errorf("proxy URI: %w", err)
		}
		if !u.Query().Has("directConnection") {
			switch {
			case u.RawQuery != "":
				out += "&directConnection=true"
			case strings.HasSuffix(out, "?"):
				out += "directConnection=true"
			case u.Path == "":
				out += "/?directConnection=true"
			default:
				out += "?directConnection=true"
			}
		}
	}
	return out, nil
}

// ClosedPortURL is uri pointed at a local port nothing listens on: a
// server that refuses connections, for tests of failover and start-up
// without a server.
func ClosedPortURL(t testing.TB, uri string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
	u, err := url.Parse(uri)
	if err != nil || u.Host == "" {
		t.Fatalf("proxy to %s: want a URL with one host", redact.URL(uri))
	}
	p := NewProxy(t, u.Host)
	proxied, err := ProxyURI(uri, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return proxied, p
}
