package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const ioTimeout = 5 * time.Second

// startEcho starts a TCP server that writes back every line it reads.
func startEcho(t *testing.T) string {
	t.Helper()
	return Serve(t, func(c net.Conn) {
		_, _ = io.Copy(c, c)
		_ = c.Close()
	})
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: ioTimeout}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends one line and returns the line read back.
func roundTrip(c net.Conn, line string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(ioTimeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

// requireClosed fails unless the peer has closed c: a read ends with EOF or
// a reset, well before the deadline.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(ioTimeout)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(make([]byte, 1))
	if err == nil {
		t.Fatalf("read %d bytes from a connection that should be closed", n)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("connection still open: read timed out instead of seeing EOF")
	}
}

func TestProxyForwards(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr())

	for _, line := range []string{"hello", strings.Repeat("x", 100_000)} {
		got, err := roundTrip(c, line)
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if got != line {
			t.Fatalf("echo through proxy: got %d bytes, want %d", len(got), len(line))
		}
	}
	wantConns(t, p, 1, "after the round trips")
}

// wantConns checks how many connections p holds, when says at what
// point of the test.
func wantConns(t *testing.T, p *Proxy, want int, when string) {
	t.Helper()
	if got := p.Conns(); got != want {
		t.Errorf("Conns() %s = %d, want %d", when, got, want)
	}
}

func TestProxyCutAndRestore(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	before := dial(t, p.Addr())
	if _, err := roundTrip(before, "ping"); err != nil {
		t.Fatalf("round trip before Cut: %v", err)
	}

	p.Cut()
	wantConns(t, p, 0, "after Cut")
	requireClosed(t, before)

	// While cut, connections are accepted and closed at once.
	during := dial(t, p.Addr())
	requireClosed(t, during)
	wantConns(t, p, 0, "while cut")

	p.Restore()
	after := dial(t, p.Addr())
	got, err := roundTrip(after, "again")
	if err != nil {
		t.Fatalf("round trip after Restore: %v", err)
	}
	if got != "again" {
		t.Errorf("echo after Restore = %q, want %q", got, "again")
	}
	wantConns(t, p, 1, "after Restore")
}

func TestProxyClientCloseReleasesConn(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "ping"); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()

	Eventually(t, ioTimeout, func() (bool, string) {
		n := p.Conns()
		return n == 0, fmt.Sprintf("Conns() = %d after the client closed, want 0", n)
	})
}

func TestProxyURI(t *testing.T) {
	t.Parallel()
	const addr = "127.0.0.1:40000"
	tests := []struct {
		name, uri, want string
	}{
		{
			name: "mongodb with credentials, path and query",
			uri:  "mongodb://user:p%40ss@db.example:27017/outbox?authSource=admin&w=majority",
			want: "mongodb://user:p%40ss@127.0.0.1:40000/outbox?authSource=admin&w=majority&directConnection=true",
		},
		{
			name: "mongodb host list",
			uri:  "mongodb://a:27017,b:27018/?replicaSet=rs0",
			want: "mongodb://127.0.0.1:40000/?replicaSet=rs0&directConnection=true",
		},
		{
			name: "mongodb without path",
			uri:  "mongodb://127.0.0.1:27017",
			want: "mongodb://127.0.0.1:40000/?directConnection=true",
		},
		{
			name: "mongodb with trailing slash",
			uri:  "mongodb://127.0.0.1:27017/",
			want: "mongodb://127.0.0.1:40000/?directConnection=true",
		},
		{
			name: "mongodb keeps its directConnection",
			uri:  "mongodb://h:1/?directConnection=false",
			want: "mongodb://127.0.0.1:40000/?directConnection=false",
		},
		{
			name: "amqp with vhost",
			uri:  "amqp://guest:guest@rabbit:5672/outbox?heartbeat=5",
			want: "amqp://guest:guest@127.0.0.1:40000/outbox?heartbeat=5",
		},
		{
			name: "amqps",
			uri:  "amqps://u:p@rabbit",
			want: "amqps://u:p@127.0.0.1:40000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ProxyURI(tt.uri, addr)
			if err != nil {
				t.Fatalf("ProxyURI(%q): %v", tt.uri, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ProxyURI(%q) (-want +got):\n%s", tt.uri, diff)
			}
		})
	}
}

func TestProxyURIRejects(t *testing.T) {
	t.Parallel()
	for _, uri := range []string{
		"mongodb+srv://user:secret@cluster.example/",
		"user:secret@host:27017",
		"http://user:secret@host/",
	} {
		_, err := ProxyURI(uri, "127.0.0.1:1")
		if err == nil {
			t.Errorf("ProxyURI(%q): no error, want one", uri)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("ProxyURI(%q) error leaks the password: %v", uri, err)
		}
	}
}

// Code under test often stops in t.Cleanup and may reconnect while it drains:
// the proxy must still forward then, after t.Context is canceled.
func TestProxyServesDuringCleanup(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	t.Cleanup(func() {
		c, err := net.DialTimeout("tcp", p.Addr(), ioTimeout) //nolint:noctx // t.Context is canceled here.
		if err != nil {
			t.Errorf("dial proxy during cleanup: %v", err)
			return
		}
		defer c.Close()
		if got, err := roundTrip(c, "bye"); err != nil || got != "bye" {
			t.Errorf("round trip during cleanup = %q, %v; want %q", got, err, "bye")
		}
	})
}

// startTarget starts a TCP server that hands each accepted connection to
// the test, which then reads and writes the server's side itself.
func startTarget(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String(), accepted
}

// proxiedConn waits for the connection the proxy makes to a target of
// startTarget and returns the target's side of it.
func proxiedConn(t *testing.T, accepted <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-accepted:
		return c
	case <-time.After(ioTimeout):
		t.Fatal("the proxy did not connect to the target")
		return nil
	}
}

// sink reads everything from c in the background, counting the bytes and
// keeping the last few.
type sink struct {
	mu    sync.Mutex
	total int
	tail  []byte
	err   error
}

func drain(t *testing.T, c net.Conn) *sink {
	t.Helper()
	s := &sink{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			s.mu.Lock()
			s.total += n
			s.tail = append(s.tail, buf[:n]...)
			if len(s.tail) > 16 {
				s.tail = s.tail[len(s.tail)-16:]
			}
			s.err = err
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.Close()
		<-done
	})
	return s
}

func (s *sink) get() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total, string(s.tail)
}

func TestProxyStallAndRestore(t *testing.T) {
	t.Parallel()
	addr, accepted := startTarget(t)
	p := NewProxy(t, addr)
	client := dial(t, p.Addr())
	server := proxiedConn(t, accepted)
	if err := client.SetReadDeadline(time.Now().Add(ioTimeout)); err != nil {
		t.Fatal(err)
	}

	p.Stall()
	// What the server sends still reaches the client.
	if _, err := io.WriteString(server, "hello\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(client).ReadString('\n')
	if err != nil || line != "hello\n" {
		t.Fatalf("client read while stalled = %q, %v; want the server's hello", line, err)
	}
	// The server reads all it is sent, yet the client's writes block once
	// the socket buffers are full: far more than they hold cannot be
	// written before a deadline, and none of it reaches the server.
	received := drain(t, server)
	if err := client.SetWriteDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 64<<20)
	n, err := client.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("client write of %d bytes while stalled: wrote %d, err %v; want it to block until its deadline", len(big), n, err)
	}
	if got, _ := received.get(); got != 0 {
		t.Errorf("server received %d bytes while stalled, want 0", got)
	}
	if got := p.Conns(); got != 1 {
		t.Errorf("Conns() while stalled = %d, want 1: Stall keeps connections open", got)
	}

	// After Restore every byte the client wrote arrives, then what it
	// writes next.
	p.Restore()
	if err := client.SetWriteDeadline(time.Now().Add(ioTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(client, "after\n"); err != nil {
		t.Fatalf("client write after Restore: %v", err)
	}
	want := n + len("after\n")
	Eventually(t, ioTimeout, func() (bool, string) {
		got, tail := received.get()
		return got == want && strings.HasSuffix(tail, "after\n"),
			fmt.Sprintf("server received %d bytes ending %q after Restore, want %d ending \"after\\n\"", got, tail, want)
	})
}

// Cut ends the connections of a stalled proxy too, and Restore after it
// forwards new connections without a stall.
func TestProxyCutWhileStalled(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	p.Stall()
	p.Cut()
	requireClosed(t, c)
	p.Restore()
	got, err := roundTrip(dial(t, p.Addr()), "again")
	if err != nil || got != "again" {
		t.Fatalf("round trip after Cut and Restore of a stall = %q, %v", got, err)
	}
}

func TestClosedPortURLRefuses(t *testing.T) {
	t.Parallel()
	got := ClosedPortURL(t, "amqp://guest:guest@127.0.0.1:5672/vh")
	u, err := url.Parse(got)
	if err != nil || u.Path != "/vh" || u.User.Username() != "guest" || u.Port() == "5672" {
		t.Fatalf("ClosedPortURL = %q (%v): want the same URL on another port", got, err)
	}
	if c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(t.Context(), "tcp", u.Host); err == nil {
		_ = c.Close()
		t.Errorf("something listens on %s", u.Host)
	}
}

// SetLatency adds its delay to every round trip, and only delays: what
// arrives is what was sent, however many reads a message takes.
func TestProxyLatency(t *testing.T) {
	t.Parallel()
	const delay = 200 * time.Millisecond
	p := NewProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "warm"); err != nil {
		t.Fatalf("round trip before SetLatency: %v", err)
	}

	p.SetLatency(delay)
	if got := p.Latency(); got != delay {
		t.Fatalf("Latency() = %s, want %s", got, delay)
	}
	// A lower bound only: a busy host can make a round trip slower, never
	// faster than the delay.
	for _, line := range []string{"slow", strings.Repeat("y", 1<<20)} {
		start := time.Now()
		got, err := roundTrip(c, line)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("round trip of %d bytes with latency: %v", len(line), err)
		}
		if got != line {
			t.Fatalf("echo with latency: got %d bytes, want %d", len(got), len(line))
		}
		if took < delay {
			t.Errorf("round trip of %d bytes took %s with a latency of %s, want at least the latency", len(line), took, delay)
		}
	}

	// New connections get it too.
	start := time.Now()
	if _, err := roundTrip(dial(t, p.Addr()), "new"); err != nil {
		t.Fatalf("round trip on a new connection: %v", err)
	}
	if took := time.Since(start); took < delay {
		t.Errorf("round trip on a new connection took %s, want at least %s", took, delay)
	}

	p.SetLatency(0)
	if got, err := roundTrip(c, "fast"); err != nil || got != "fast" {
		t.Fatalf("round trip after SetLatency(0) = %q, %v", got, err)
	}
}

// The delay is on the way to the server: the server sees nothing of a
// request before the latency has passed.
func TestProxyLatencyHoldsRequests(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	addr, accepted := startTarget(t)
	p := NewProxy(t, addr)
	p.SetLatency(delay)
	client := dial(t, p.Addr())
	server := proxiedConn(t, accepted)
	sent := time.Now()
	if _, err := io.WriteString(client, "request\n"); err != nil {
		t.Fatal(err)
	}
	if err := server.SetReadDeadline(time.Now().Add(ioTimeout)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(server).ReadString('\n')
	if err != nil || line != "request\n" {
		t.Fatalf("server read = %q, %v; want the request", line, err)
	}
	if took := time.Since(sent); took < delay {
		t.Errorf("the server read the request %s after it was sent, want at least %s", took, delay)
	}
}

// Cut ends connections with requests still in the delay line.
func TestProxyCutWithLatency(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, startEcho(t))
	p.SetLatency(time.Hour)
	c := dial(t, p.Addr())
	if _, err := io.WriteString(c, "never\n"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, ioTimeout, func() (bool, string) {
		return p.Conns() == 1, fmt.Sprintf("Conns() = %d, want 1", p.Conns())
	})
	p.Cut()
	requireClosed(t, c)
}
