package ops

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/buildinfo"
	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/service"
)

// Pinger checks that the database answers.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Readier says whether the broker can take a publish.
type Readier interface {
	Ready() error
}

// Owner is the partition ownership as /readyz and /status see it
// (ownership.Manager).
type Owner interface {
	// Owned returns the partitions this replica holds.
	Owned() []int
	// Unowned returns how long this replica has owned no partition it may
	// claim in (0 while it owns one), and the last round's error if it
	// failed.
	Unowned() (time.Duration, error)
	// TermLength is how long a replica may own nothing before it is not
	// ready.
	TermLength() time.Duration
}

// Job is a background job the status page reports on.
type Job interface {
	LastRun() time.Time
}

const (
	// AddrDefault is the listen address of the endpoints.
	AddrDefault = ":8080"
	// readyTimeout bounds /readyz's ping, under a probe's usual timeout.
	readyTimeout = 2 * time.Second
)

// The server's timeouts. Its clients are probes, scrapers and triggers,
// whose requests have no body and whose answers are small and made in
// memory (/readyz waits readyTimeout at most); a client that sends or
// reads slower than these is stuck or hostile, and without them each one
// holds a connection and a goroutine for as long as it likes.
const (
	// readHeaderTimeout: a request line and headers arrive in one packet.
	readHeaderTimeout = 5 * time.Second
	// readTimeout: no endpoint reads a body, so the whole request is the
	// headers and whatever a client sends after them.
	readTimeout = 10 * time.Second
	// writeTimeout: above a Prometheus scrape's default timeout (10s), so
	// that /metrics still gets through on a loaded machine.
	writeTimeout = 15 * time.Second
	// idleTimeout: above the scrape interval (15s) and the probes' period
	// (10s), so that their kept-alive connections are reused, and short
	// enough that idle connections from anyone else are closed.
	idleTimeout = 60 * time.Second
)

// SampleSource gives /status the last sample of the outbox (Sampler).
type SampleSource interface {
	Latest() (Sample, bool)
}

// Outbox is one outbox the endpoints report on: the parts of the worker
// that relay it.
type Outbox struct {
	// Name names the outbox in /readyz, /status and their ?outbox=
	// parameter. Required, unique among the server's outboxes.
	Name string
	// Store answers /readyz's ping. Required.
	Store Pinger
	// Broker answers /readyz's broker check. Required.
	Broker Readier
	// Samples gives /status the sampler's last sample: /status sends no
	// query of its own. Required.
	Samples SampleSource
	// Claimer runs a claim at once on POST /trigger, unless claims are
	// backing off after failed runs (claim.Claimer.Wake). Required.
	Claimer interface {
		Job
		Wake() (backoffLeft time.Duration)
		// BatchLimit is how many events the next claim may take: less
		// than the batch size while the database times out.
		BatchLimit() int
	}
	// Recovery's last run is /status's lastRecoveryAt. Required.
	Recovery Job
	// Owner, when set, makes an outbox that this replica has owned no
	// partition of for longer than a term not ready, although its
	// database and broker answer: it relays nothing of it (its rounds
	// cannot write the owners collection, or it is one replica too
	// many). /status says why. Defaults to nil: ownership is not checked.
	Owner Owner
	// BrokerNode, if set, names the broker node in use, its password
	// redacted (broker.Publisher.Node), for /status.
	BrokerNode func() string
	// WakeUp, if set, says how claims are woken between ticks, for
	// /status: "change stream", "polling" or "starting".
	WakeUp func() string
	// Now, if set, is the clock the outbox's sample age is measured with:
	// its database server's, which its sampler stamped the sample with.
	// Defaults to the server's Archetype.Now.
	Now func() time.Time
}

// ServerConfig wires the endpoints to the worker's parts.
type ServerConfig struct {
	// Addr is the listen address, e.g. ":8080". Defaults to AddrDefault.
	Addr string
	// WorkerID names the worker in /healthz and /status.
	WorkerID string
	// Outboxes are the outboxes the worker relays. None is allowed (a
	// fleet whose patterns match no database yet): /readyz then answers
	// 503 and /status lists none.
	Outboxes []Outbox
	// Gatherer is what /metrics serves. Required.
	Gatherer prometheus.Gatherer
	// Archetype is the logger and the clock /status measures the sample's
	// age with, the sampler's; the server updates no metric of its own
	// (Gatherer serves them).
	service.Archetype
	// Token, when set, is the bearer token POST /trigger requires of every
	// client (Authorization: Bearer <token>), at least TokenMinLength
	// visible ASCII characters. Defaults to "": only loopback clients may
	// trigger.
	Token string
	// PprofAddr, when set, is a loopback address (127.0.0.1:6060,
	// [::1]:6060, localhost:6060) on which a listener of its own serves
	// net/http/pprof under /debug/pprof/. Defaults to "": no profiler.
	PprofAddr string
	// Build is the build /status names, so that an operator can tell the
	// versions of a rolling upgrade apart. Defaults to this binary's
	// (buildinfo.Read).
	Build buildinfo.Info
}

func (c *ServerConfig) setDefaults() {
	c.Addr = cmp.Or(c.Addr, AddrDefault)
	c.Archetype = c.Archetype.WithDefaults()
	if c.Build == (buildinfo.Info{}) {
		c.Build = buildinfo.Read()
	}
}

// Validate reports the first bad field, naming it and its value (not a
// token's).
func (c ServerConfig) Validate() error {
	rules := []*rule.Error{
		rule.Required("Gatherer", c.Gatherer != nil),
		rule.Check("Token", c.Token == "" || CheckToken(c.Token) == nil, "<redacted>", tokenWant),
		rule.Check("PprofAddr", c.PprofAddr == "" || CheckLoopbackAddr(c.PprofAddr) == nil, c.PprofAddr, loopbackWant),
	}
	seen := map[string]bool{}
	for i, o := range c.Outboxes {
		field := fmt.Sprintf("Outboxes[%d].", i)
		rules = append(rules,
			rule.Check(field+"Name", o.Name != "" && !seen[o.Name], o.Name, "a name of its own"),
			rule.Required(field+"Store", o.Store != nil),
			rule.Required(field+"Broker", o.Broker != nil),
			rule.Required(field+"Samples", o.Samples != nil),
			rule.Required(field+"Claimer", o.Claimer != nil),
			rule.Required(field+"Recovery", o.Recovery != nil),
		)
		seen[o.Name] = true
	}
	return rule.First("ops server", rules...)
}

// Server serves the operations endpoints.
type Server struct {
	cfg ServerConfig
	// mu guards cfg.Outboxes, which SetOutboxes replaces while the
	// endpoints read it.
	mu    sync.RWMutex
	main  listener
	pprof listener // not started without ServerConfig.PprofAddr
	token tokenDigest
}

// NewServer returns a Server; Start serves it.
func NewServer(cfg ServerConfig) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg}
	if cfg.Token != "" {
		s.token = digest(cfg.Token)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /status", s.status)
	mux.HandleFunc("POST /trigger", s.trigger)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	s.main = listener{name: "OUTBOX_HTTP_ADDR", addr: cfg.Addr, done: make(chan struct{}), srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
	}}
	s.pprof = listener{name: "OUTBOX_PPROF_ADDR", addr: cfg.PprofAddr, done: make(chan struct{}), srv: newPprofServer()}
	return s, nil
}

// Start listens on the main address and on the profiler's, if any, so
// that a taken port fails the start, and serves in the background.
func (s *Server) Start(ctx context.Context) error {
	if err := s.main.start(ctx, s.cfg.Logger); err != nil {
		return err
	}
	if s.pprof.addr == "" {
		return nil
	}
	if err := s.pprof.start(ctx, s.cfg.Logger); err != nil {
		_ = s.main.stop(ctx)
		return err
	}
	if err := checkLoopbackListener(s.pprof.ln); err != nil {
		_ = s.main.stop(ctx)
		_ = s.pprof.stop(ctx)
		return fmt.Errorf("OUTBOX_PPROF_ADDR %s: %w", s.pprof.addr, err)
	}
	return nil
}

// Addr is the address the server listens on, once started.
func (s *Server) Addr() string { return s.main.boundAddr() }

// PprofAddr is the address the profiler listens on, once started; "" when
// it is off.
func (s *Server) PprofAddr() string { return s.pprof.boundAddr() }

// Stop shuts the server down gracefully. Idempotent; safe before Start.
func (s *Server) Stop(ctx context.Context) error {
	return errors.Join(s.pprof.stop(ctx), s.main.stop(ctx))
}

// listener is one address the server listens on and its http.Server.
type listener struct {
	name     string // the setting of the address, for errors
	addr     string
	srv      *http.Server
	ln       net.Listener
	stopOnce sync.Once
	done     chan struct{}
}

func (l *listener) start(ctx context.Context, logger *slog.Logger) error {
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", l.addr)
	if err != nil {
		return fmt.Errorf("listen on %s %s: %w", l.name, l.addr, err)
	}
	l.ln = ln
	go func() {
		defer close(l.done)
		if err := l.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server stopped", "error", err, "address", l.name)
		}
	}()
	return nil
}

func (l *listener) boundAddr() string {
	if l.ln == nil {
		return ""
	}
	return l.ln.Addr().String()
}

// stop shuts the listener's server down gracefully. Idempotent; safe
// before start.
func (l *listener) stop(ctx context.Context) error {
	if l.ln == nil {
		return nil
	}
	var err error
	l.stopOnce.Do(func() { err = l.srv.Shutdown(ctx) })
	return err
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "workerId": s.cfg.WorkerID})
}

// statusBody is the JSON of GET /status.
type statusBody struct {
	statusLocal
	Counts              map[string]int64 `json:"counts"`
	OldestNewAgeSeconds float64          `json:"oldestNewAgeSeconds"`
	StaleProcessing     int64            `json:"staleProcessing"`
	HeldAggregates      int64            `json:"heldAggregates"`
	HeldCapped          bool             `json:"heldCapped,omitempty"`
	// HeldSampledAt is when the held figures were read, when that was
	// before SampledAt (the sample's read of them failed).
	HeldSampledAt        *time.Time `json:"heldSampledAt,omitempty"`
	OldestHeldAgeSeconds float64    `json:"oldestHeldAgeSeconds"`
	// PausedTypes are the event types an operator paused, by type.
	PausedTypes      []events.Pause `json:"pausedTypes"`
	SampledAt        time.Time      `json:"sampledAt"`
	SampleAgeSeconds float64        `json:"sampleAgeSeconds"`
}

// statusLocal is what /status knows without a sample: this worker's own
// state.
type statusLocal struct {
	// Outbox names the outbox the body is about.
	Outbox         string         `json:"outbox"`
	WorkerID       string         `json:"workerId"`
	Build          buildinfo.Info `json:"build"`
	LastClaimAt    *time.Time     `json:"lastClaimAt"`
	BatchLimit     int            `json:"batchLimit"`
	LastRecoveryAt *time.Time     `json:"lastRecoveryAt"`
	BrokerNode     *string        `json:"brokerNode,omitempty"`
	WakeUp         string         `json:"wakeUp,omitempty"`
	// Ownership is this replica's share of the partitions, and why it is
	// not ready for want of one.
	Ownership *ownershipStatus `json:"ownership,omitempty"`
}

// ownershipStatus is /status's ownership: the partitions this replica
// owns, how long it has owned none, the last round's error, and, when it
// has owned none for longer than a term, why /readyz fails.
type ownershipStatus struct {
	Partitions     int     `json:"partitions"`
	UnownedSeconds float64 `json:"unownedSeconds"`
	LastError      string  `json:"lastError,omitempty"`
	NotReady       string  `json:"notReady,omitempty"`
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
