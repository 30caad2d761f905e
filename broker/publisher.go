package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/rule"
	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// ExchangeDefault is the exchange events are published to by default.
	ExchangeDefault = "events"
	// WindowDefault is how many confirms may be outstanding at once.
	WindowDefault = 1000
	// ReconnectMinDefault is the first wait before reconnecting.
	ReconnectMinDefault = 500 * time.Millisecond
	// ReconnectMaxDefault caps the wait between reconnects.
	ReconnectMaxDefault = 30 * time.Second
	// WriteTimeoutDefault bounds one socket write to the broker.
	WriteTimeoutDefault = 30 * time.Second
)

const (
	// dialTimeout bounds the TCP connect and the AMQP handshake. Well
	// below the worker's shutdown timeout; a stop also ends a dial at once.
	dialTimeout = 5 * time.Second
	// closeTimeout bounds a graceful connection.close; after it the socket
	// is closed under the library, whatever it was waiting for.
	closeTimeout = time.Second
)

// Config configures a Publisher.
type Config struct {
	// URL is the AMQP URL, credentials included, or a comma-separated list
	// of them (the nodes of a cluster; see SplitURLs). The publisher
	// connects to the first node that answers; when a connection is lost
	// it tries the list again from the node after the one it lost. It is
	// never logged as is.
	URL string
	// Exchange is the topic exchange to publish to; the publisher declares
	// it (durable) on every connect. Defaults to ExchangeDefault.
	Exchange string
	// Window is how many confirms may be outstanding at once.
	// Defaults to WindowDefault.
	Window int
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// reconnects. Default to ReconnectMinDefault and ReconnectMaxDefault.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// WriteTimeout bounds every socket write to the broker. A broker that
	// stops reading (but keeps the connection open) makes the write fail
	// after it; the connection is then closed, the messages in flight get
	// events.ErrUnavailable, and the publisher reconnects. The worker passes
	// its publish timeout. Defaults to WriteTimeoutDefault.
	WriteTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnConnected, if set, is told every time the connection comes up (true)
	// or goes down (false). The worker feeds its metrics from it.
	OnConnected func(bool)
	// ConnectionName is the connection's name in the broker's management
	// UI and rabbitmqctl list_connections (the client property
	// connection_name): the worker's says which replica and version.
	// Defaults to ConnectionNameDefault.
	ConnectionName string
}

// ConnectionNameDefault is the connection name of a publisher whose
// Config names none.
const ConnectionNameDefault = "outbox-worker"

func (c *Config) setDefaults() {
	c.Exchange = cmp.Or(c.Exchange, ExchangeDefault)
	c.Window = cmp.Or(c.Window, WindowDefault)
	c.ReconnectMin = cmp.Or(c.ReconnectMin, ReconnectMinDefault)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, ReconnectMaxDefault)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, WriteTimeoutDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.ConnectionName = cmp.Or(c.ConnectionName, ConnectionNameDefault)
	if c.OnConnected == nil {
		c.OnConnected = func(bool) {}
	}
}

// Validate reports the first bad field, naming it and its value. New
// calls it after filling the defaults, so a zero value is never bad there.
func (c Config) Validate() error {
	return rule.First("broker",
		urlRule("URL", c.URL),
		rule.AtLeast("Window", c.Window, 1),
		rule.Above("ReconnectMin", c.ReconnectMin, 0),
		rule.AtLeastField("ReconnectMax", c.ReconnectMax, "ReconnectMin", c.ReconnectMin),
		rule.Above("WriteTimeout", c.WriteTimeout, 0),
	)
}

// session is one live connection and its confirming channel.
type session struct {
	conn     *amqp.Connection
	wire     *corkedConn // conn's socket
	ch       *amqp.Channel
	returns  chan amqp.Return
	frameMax int // negotiated frame_max; 0: unlimited

	// What the library tells of the connection and the channel, for
	// watch. Registered by open, before anything is published: the
	// library tells a listener that comes after a close only that it
	// happened, not why, and watch may run late on a busy host.
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
	blocked    chan amqp.Blocking

	closed  chan struct{} // closed by end
	endOnce sync.Once
	cause   error // why the session ended; read only after closed
}

// end marks the session over, for cause; the first cause wins. The run
// loop then closes the connection and reconnects.
func (s *session) end(cause error) {
	s.endOnce.Do(func() {
		s.cause = cause
		close(s.closed)
	})
}

// ended reports whether end was called. A session without a closed
// channel (a test's stand-in) never ends.
func (s *session) ended() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

var (
	errStopping = errors.New("publisher stopping")
	// errRetired ends a session after a window left confirms outstanding
	// at its deadline: their returns may still come, and on the same
	// channel they could be taken for a later publish of the same message.
	errRetired = errors.New("replaced: confirms were outstanding at the publish deadline")
)

// Publisher publishes messages with confirms over one connection that it
// keeps alive.
type Publisher struct {
	cfg    Config
	logger *slog.Logger
	urls   []string // the nodes of cfg.URL, in order

	mu      sync.Mutex // guards sess, node, blocked and changed
	sess    *session
	node    string // the redacted URL of sess's node
	blocked bool
	changed chan struct{} // closed and replaced whenever sess or blocked changes
	// publishing serializes Publish calls: one window in flight per channel
	// keeps confirms and returns easy to match to their messages.
	publishing sync.Mutex

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
	watchers sync.WaitGroup
}

// New returns a Publisher; Start connects it.
func New(cfg Config) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{
		cfg: cfg, logger: cfg.Logger, urls: SplitURLs(cfg.URL),
		done: make(chan struct{}), changed: make(chan struct{}),
	}, nil
}

// Exchange is the exchange the publisher publishes to: the destination
// of the relay's publish spans.
func (p *Publisher) Exchange() string { return p.cfg.Exchange }

// Node is the URL of the node the publisher is connected to, its password
// redacted, or "" while it is not connected.
func (p *Publisher) Node() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == nil || p.sess.ended() {
		return ""
	}
	return p.node
}

// Start connects once and returns, keeping the connection alive in the
// background until Stop. If the first connect fails it returns nil anyway
// and keeps trying: the worker runs, reports not-ready, and starts
// publishing when the broker comes.
func (p *Publisher) Start(ctx context.Context) error {
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	first := make(chan struct{})
	go p.run(ctx, first)
	select {
	case <-first:
	case <-ctx.Done():
	}
	return nil
}

// Stop closes the connection. It is idempotent and safe before Start. A
// connection that does not close gracefully within a second (a broker that
// stopped reading) has its socket closed under it.
func (p *Publisher) Stop(ctx context.Context) error {
	p.stopOnce.Do(func() {
		if p.cancel == nil {
			close(p.done)
			return
		}
		p.cancel()
	})
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready returns nil when messages can be published, or why not.
func (p *Publisher) Ready() error {
	_, err := p.readySession()
	return err
}

// readySession returns the live, unblocked session, or why there is none.
// The check and the read share one lock: the run loop may drop the session
// at any moment.
func (p *Publisher) readySession() (*session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.sess == nil || p.sess.ended():
		return nil, fmt.Errorf("%w: not connected", events.ErrUnavailable)
	case p.blocked:
		return nil, fmt.Errorf("%w: blocked by a broker alarm", events.ErrUnavailable)
	}
	return p.sess, nil
}

// run connects, waits for the connection to drop, and connects again with
// exponential backoff and jitter, until ctx ends. Each attempt is a round
// over the nodes: the first that answers is used. The first round starts
// at the first node; after a lost connection the next round starts at the
// node after the lost one, so that a node that dropped its clients is
// tried last.
func (p *Publisher) run(ctx context.Context, first chan struct{}) {
	defer close(p.done)
	defer p.watchers.Wait()
	wait := backoff.Backoff{Min: p.cfg.ReconnectMin, Max: p.cfg.ReconnectMax, Jitter: true}
	start := 0
	for attempt := 0; ; attempt++ {
		s, i, err := p.connectAny(ctx, start)
		if err != nil {
			if attempt == 0 {
				close(first)
			}
			if ctx.Err() != nil {
				return
			}
			d := wait.Next()
			p.logger.Warn("broker connect failed; retrying", "error", err, "retry_in", d.String(), "url", RedactList(p.cfg.URL))
			if !backoff.Sleep(ctx, d) {
				return
			}
			continue
		}
		wait.Reset()
		node := redact.URL(p.urls[i])
		p.setSession(s, node)
		if attempt == 0 {
			close(first) // after setSession: Ready is nil once Start returns
		}
		p.logger.Info("broker connected", "exchange", p.cfg.Exchange, "url", node)
		select {
		case <-ctx.Done():
			s.end(errStopping)
			p.setSession(nil, "")
			closeSession(s)
			return
		case <-s.closed:
			p.setSession(nil, "")
			closeSession(s)
			p.logger.Warn("broker connection lost; reconnecting", append(closeAttrs(s.cause), "url", node)...)
			start = (i + 1) % len(p.urls)
		}
	}
}

// connectAny tries every node once, from start on, and returns the first
// session and its node's index. A node that does not answer is logged and
// the next one tried at once; only a round in which none answers backs
// off.
func (p *Publisher) connectAny(ctx context.Context, start int) (*session, int, error) {
	var errs []error
	for k := range p.urls {
		i := (start + k) % len(p.urls)
		s, err := p.connect(ctx, p.urls[i])
		if err == nil {
			return s, i, nil
		}
		if ctx.Err() != nil {
			return nil, i, err
		}
		if len(p.urls) == 1 {
			return nil, i, err
		}
		node := redact.URL(p.urls[i])
		p.logger.Warn("broker node unreachable; trying the next", "error", err, "url", node)
		errs = append(errs, fmt.Errorf("%s: %w", node, err))
	}
	return nil, start, errors.Join(errs...)
}

// closeSession closes s's connection gracefully if it can within
// closeTimeout, and closes its socket otherwise: the library's close waits
// behind a write blocked on a broker that stopped reading.
func closeSession(s *session) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
	}()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.wire.abort()
		<-done
	}
}

// closeAttrs are the log attributes of why a session ended.
func closeAttrs(cause error) []any {
	attrs := []any{"error", fmt.Sprint(cause)}
	var ae *amqp.Error
	if errors.As(cause, &ae) {
		attrs = append(attrs, "code", ae.Code, "by_broker", ae.Server, "recoverable", ae.Recover)
	}
	return attrs
}

func (p *Publisher) setSession(s *session, node string) {
	p.mu.Lock()
	p.sess = s
	p.node = node
	p.blocked = false
	p.notifyLocked()
	p.mu.Unlock()
	p.cfg.OnConnected(s != nil)
}

// notifyLocked wakes every waitSession.
func (p *Publisher) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// setBlocked records an alarm that s's connection was told of. An alarm
// of a session that is no longer the live one is dropped: its watcher may
// run after the run loop has replaced it (a busy host), and the new
// connection is told of its own alarms and of their end, while the old
// one never will be of this one's end.
func (p *Publisher) setBlocked(s *session, b amqp.Blocking) {
	p.mu.Lock()
	if p.sess != s {
		p.mu.Unlock()
		return
	}
	p.blocked = b.Active
	p.notifyLocked()
	p.mu.Unlock()
	if b.Active {
		p.logger.Warn("broker blocked publishing (memory or disk alarm); claiming paused", "reason", b.Reason)
	} else {
		p.logger.Info("broker unblocked publishing; claiming resumes")
	}
}

// connect dials, opens a confirming channel and declares the exchange.
func (p *Publisher) connect(ctx context.Context, nodeURL string) (*session, error) {
	var wire *corkedConn
	stopDial := func() bool { return false }
	dialer := amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The handshake's deadline; the library clears it once open.
			if err := c.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
				_ = c.Close()
				return nil, err
			}
			wire = &corkedConn{Conn: c, timeout: p.cfg.WriteTimeout}
			// A stop ends a handshake with a broker that does not answer.
			stopDial = context.AfterFunc(ctx, wire.abort)
			return wire, nil
		},
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		Properties: amqp.Table{
			"connection_name": p.cfg.ConnectionName,
		},
	}
	conn, err := amqp.DialConfig(nodeURL, dialer)
	stopDial()
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	s, err := p.open(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	s.wire = wire
	s.frameMax = conn.Config.FrameSize
	p.watchers.Add(1)
	go p.watch(ctx, s)
	return s, nil
}

// open opens the confirming channel on conn and declares the exchange.
// It registers every listener the session needs before it returns, so
// that no close, return or alarm can come before someone listens: a
// channel the broker closes over the first message published on it (a
// poison) must end its session with the broker's code, which is what
// sends the window to isolation.
func (p *Publisher) open(conn *amqp.Connection) (*session, error) {
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.ExchangeDeclare(p.cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange %q: %w", p.cfg.Exchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	s := &session{
		conn: conn,
		ch:   ch,
		// Buffered for a whole window: the library hands a return over
		// before it resolves that message's confirm, so once a window's
		// confirms are in, its returns are already in this buffer. A
		// window takes them all, and a window that ends with confirms
		// outstanding retires the session, so the buffer never holds more
		// than one window's: the library, which waits 5 s on a full
		// listener and then drops the return, never has to.
		returns:    ch.NotifyReturn(make(chan amqp.Return, p.cfg.Window)),
		connClosed: connClosed,
		chClosed:   chClosed,
		blocked:    blocked,
		closed:     make(chan struct{}),
	}
	return s, nil
}

// watch ends s when the connection or the channel goes away, and tracks
// connection.blocked alarms meanwhile, from the listeners open
// registered: it may start after the close it reports.
func (p *Publisher) watch(ctx context.Context, s *session) {
	defer p.watchers.Done()
	blocked := s.blocked
	for {
		select {
		case <-ctx.Done():
			s.end(errStopping)
			return
		case <-s.closed:
			return
		case err := <-s.connClosed:
			s.end(closeCause("connection", err))
			return
		case err := <-s.chClosed:
			s.end(closeCause("channel", err))
			return
		case b, ok := <-blocked:
			if !ok {
				// The library closes this listener with the close
				// listeners, after it has told them why: the cause
				// comes from connClosed, which is ready now too.
				blocked = nil
				continue
			}
			p.setBlocked(s, b)
		}
	}
}
