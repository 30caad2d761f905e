// Package tcpproxy is an in-process TCP proxy for fault injection: put it
// between the code under test and a server, then cut the link, stall it, or
// slow every round trip on it. The tests use it through internal/testenv,
// which closes it in t.Cleanup; the benchmark harness (cmd/bench) uses it
// directly to put a slow database in front of worker processes.
package tcpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/internal/redact"
)

const dialTimeout = 5 * time.Second

// Proxy forwards every connection it accepts on 127.0.0.1 to one target.
type Proxy struct {
	ctx    context.Context // canceled by Close; bounds dials to the target
	cancel context.CancelFunc
	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every copying goroutine

	mu      sync.Mutex
	cut     bool
	closed  bool
	stalled chan struct{} // non-nil while stalled; closed by Restore
	latency time.Duration // see SetLatency
	conns   map[*conn]struct{}
}

// conn is one proxied connection: the accepted client side and the dialed
// server side.
type conn struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

func (c *conn) close() {
	c.once.Do(func() { close(c.done) })
	_ = c.client.Close()
	_ = c.server.Close()
}

// New starts a proxy listening on 127.0.0.1 (a free port) that forwards
// every connection to target (host:port). Close stops it.
func New(target string) (*Proxy, error) {
	ctx, cancel := context.WithCancel(context.Background())
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	p := &Proxy{
		ctx:    ctx,
		cancel: cancel,
		target: target,
		ln:     ln,
		conns:  make(map[*conn]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
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
// the clients' bytes held by Stall. It leaves the latency as it is.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// SetLatency adds d to every round trip through the proxy, on open
// connections and new ones alike; 0 (the start) adds none.
//
// The whole delay is on the way in: each chunk of bytes read from a client
// is written to the server d after the proxy read it, while the server's
// replies pass at once. In a request-reply protocol such as MongoDB's wire
// protocol, a round trip is one request and its reply, so each takes d
// longer, the one-way delay counted once. The chunks queue in a delay line
// rather than the reader sleeping on each, so a request that arrives in
// several reads (a large insert) is delayed d in all, not d per read, and
// back-to-back requests are not serialized behind each other's delays.
// A chunk keeps the latency in force when it was read.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = max(d, 0)
}

// Latency returns what SetLatency set.
func (p *Proxy) Latency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// Conns returns the number of connections currently proxied.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close closes the listener and every connection and waits for the
// proxy's goroutines. It is safe to call more than once.
func (p *Proxy) Close() {
	p.cancel()
	p.mu.Lock()
	p.closed = true
	p.closeConnsLocked()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// waitUnstalled returns true once the proxy is not stalled, or false if c
// is closed or the proxy stops first.
func (p *Proxy) waitUnstalled(c *conn) bool {
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
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &conn{client: client, server: server, done: make(chan struct{})}

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

// chunk is bytes read from a client, due at the server at due.
type chunk struct {
	data []byte
	due  time.Time
}

// delayLineLen bounds the chunks read from one client but not yet written
// to the server (at most 32 KiB each). Past it the client's writes block,
// as they would on a slow link.
const delayLineLen = 1024

// pipeFromClient copies the client's bytes to the server through a delay
// line (see SetLatency); neither reads nor writes while the proxy is
// stalled.
func (p *Proxy) pipeFromClient(c *conn) {
	line := make(chan chunk, delayLineLen)
	go func() {
		defer close(line)
		buf := make([]byte, 32<<10)
		for p.waitUnstalled(c) {
			n, err := c.client.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.Latency())
				select {
				case line <- chunk{data: append([]byte(nil), buf[:n]...), due: due}:
				case <-c.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		for range line { // let the reader end once the writer has
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ch := range line {
		if wait := time.Until(ch.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-c.done:
				c.close()
				return
			}
		}
		if !p.waitUnstalled(c) {
			break
		}
		if _, err := c.server.Write(ch.data); err != nil {
			c.close()
			return
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

// URI returns uri (mongodb:// or amqp[s]://) with its host:port replaced
// by addr, keeping credentials, path and query. For mongodb:// it adds
// directConnection=true when the URI does not set it, so that the driver keeps
// talking to the proxy instead of the hosts the server advertises.
func URI(uri, addr string) (string, error) {
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

// Target returns the host:port of uri's one server (mongodb:// with one
// host, or amqp[s]://), for New.
func Target(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Host == "" || strings.Contains(u.Host, ",") {
		return "", fmt.Errorf("proxy to %s: want a URL with one host", redact.URL(uri))
	}
	return u.Host, nil
}
