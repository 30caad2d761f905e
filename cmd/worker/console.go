package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/internal/backoff"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

// consoleCommand is `worker console`: the operator console on
// OUTBOX_CONSOLE_ADDR until SIGINT or SIGTERM, of every outbox of
// OUTBOX_FLEET_FILE (or of the one --outbox names, or of the one outbox
// the settings describe). It needs MongoDB only.
func consoleCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, _, err := loadConfig("console", args, getenv, consoleKind, nil)
	if err != nil {
		return err
	}
	if err := cfg.checkConsole(); err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	opened := &consoleOutboxes{clients: map[string]*driver.Client{}, clocks: map[*driver.Client]*mongo.Clock{}}
	defer opened.close(ctx)
	for _, oc := range cfg.Outboxes {
		if err := opened.open(ctx, oc, logger); err != nil {
			return err
		}
	}
	// Ages and the held test go by the first outbox's database clock;
	// each outbox's sampler by its own.
	arch := service.Archetype{Logger: logger, Now: opened.clocks[opened.first].Now}
	ccfg := console.Config{
		Archetype: arch, Outboxes: opened.list,
		RequeuePerSecond: cfg.ConsoleRequeueRate, ActionMax: cfg.ConsoleActionMax,
		ActionsPerMinute: cfg.ConsoleActionsPerMinute, SignInFailuresPerMinute: cfg.ConsoleSignInFailures,
		Token: cfg.ConsoleToken, Users: cfg.ConsoleUsers, AllowedHosts: cfg.consoleHosts(),
		TrustedProxies: cfg.ConsoleTrustedProxies, IdentityHeader: cfg.ConsoleIdentityHeader, ProxySecret: cfg.ConsoleProxySecret,
	}
	if !cfg.ConsoleWrites {
		for i := range ccfg.Outboxes {
			ccfg.Outboxes[i].Writer = nil
		}
	}
	if cfg.ConsoleOIDCIssuer != "" {
		if ccfg.OIDC, err = console.NewOIDC(ctx, console.OIDCConfig{
			IssuerURL: cfg.ConsoleOIDCIssuer, ClientID: cfg.ConsoleOIDCClientID, ClientSecret: cfg.ConsoleOIDCClientSecret,
			RedirectURL: cfg.ConsoleOIDCRedirectURL, RolesClaim: cfg.ConsoleOIDCRolesClaim, Scopes: cfg.ConsoleOIDCScopes,
		}); err != nil {
			return err
		}
	}
	con, err := console.New(ccfg)
	if err != nil {
		return err
	}
	if err := opened.start(ctx); err != nil {
		return err
	}
	var certs *certReloader
	if cfg.ConsoleTLSCert != "" {
		if certs, err = newCertReloader(cfg.ConsoleTLSCert, cfg.ConsoleTLSKey, func(err error) {
			logger.Warn("console TLS certificate not reloaded; serving the last one read", "error", err)
		}); err != nil {
			return fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	return serveConsole(ctx, logger, cfg.ConsoleAddr, con, cfg.ConsoleWrites, cfg.consoleAuthenticates(), certs)
}

// consoleOutboxes are the outboxes `worker console` serves, with the
// clients, clocks and samplers they read through: one client and one
// clock per MongoDB URI, shared by the outboxes on it.
type consoleOutboxes struct {
	list     []console.Outbox
	clients  map[string]*driver.Client
	clocks   map[*driver.Client]*mongo.Clock
	first    *driver.Client
	services []interface {
		Start(context.Context) error
		Stop(context.Context) error
	}
}

// open connects to oc's database, or reuses the client of its URI,
// waits until it answers, and adds oc with a sampler of its own.
func (s *consoleOutboxes) open(ctx context.Context, oc outboxConfig, logger *slog.Logger) error {
	client, err := s.client(ctx, oc.Config, logger)
	if err != nil {
		return err
	}
	olog := logger
	if oc.Name != "" {
		olog = logger.With("outbox", oc.Name)
	}
	cfg := oc.Config
	store := mongo.New(client, mongoStoreConfig(cfg, olog))
	if err := waitForDatabase(ctx, olog, store); err != nil {
		return err
	}
	if err := store.EnsureBrowseIndex(ctx); err != nil {
		olog.Warn("could not create the console's index; event lists read more of the outbox without it", "error", err)
	}
	sampler, err := ops.NewSampler(ops.SamplerConfig{
		Archetype: service.Archetype{Logger: olog, Now: s.clocks[client].Now}, Store: store, StaleAfter: cfg.StaleAfter,
		Held: heldSource(cfg, store), FailedHolds: cfg.OrderingAfterFailed == claim.AfterFailedWait, Paused: store,
		Failures: store, Holders: store,
	})
	if err != nil {
		return err
	}
	s.services = append(s.services, sampler)
	s.list = append(s.list, console.Outbox{
		Name: oc.Name, Store: store, Samples: sampler, Lists: sampler, Owners: store.Owners(), Writer: store,
		TermLength: cfg.StaleAfter / 2, FailedHolds: cfg.Ordering == claim.OrderingAggregate && cfg.OrderingAfterFailed == claim.AfterFailedWait,
	})
	return nil
}

// client is the client of cfg's MongoDB URI, connected, with its clock
// measured, on first use.
func (s *consoleOutboxes) client(ctx context.Context, cfg Config, logger *slog.Logger) (*driver.Client, error) {
	if c, ok := s.clients[cfg.MongoURI]; ok {
		return c, nil
	}
	client, err := driver.Connect(mongoClientOptions(cfg, "outbox-console"))
	if err != nil {
		return nil, fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, redact.URL(cfg.MongoURI), err)
	}
	clock := mongo.NewClock(client, logger)
	if err := clock.Sync(ctx); err != nil {
		logger.Warn("database clock not measured; ages use this machine's clock until it is", "error", err)
	}
	s.clients[cfg.MongoURI], s.clocks[client] = client, clock
	s.services = append(s.services, clock)
	if s.first == nil {
		s.first = client
	}
	return client, nil
}

// start starts the clocks and samplers.
func (s *consoleOutboxes) start(ctx context.Context) error {
	for _, svc := range s.services {
		if err := svc.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// close stops the clocks and samplers (Stop is safe before Start) and
// disconnects the clients.
func (s *consoleOutboxes) close(ctx context.Context) {
	for _, svc := range s.services {
		stopQuietly(svc)
	}
	for _, c := range s.clients {
		_ = c.Disconnect(context.WithoutCancel(ctx))
	}
}

// heldSource is the store where ordering holds aggregates, nil where it
// does not.
func heldSource(cfg Config, store *mongo.Store) ops.HeldSource {
	if cfg.Ordering != claim.OrderingAggregate {
		return nil
	}
	return store
}

// waitForDatabase learns what the deployment supports, retrying with
// backoff until it answers: a console started before its database waits
// for it, as the worker does.
func waitForDatabase(ctx context.Context, logger *slog.Logger, store *mongo.Store) error {
	retry := backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := store.Detect(attemptCtx)
		cancel()
		if err == nil {
			return nil
		}
		wait := retry.Next()
		logger.Warn("mongodb not ready; retrying", "error", err, "retry_in", wait.String())
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// stopQuietly stops services, each within a few seconds.
func stopQuietly(services ...interface{ Stop(context.Context) error }) {
	for _, s := range services {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Stop(ctx)
		cancel()
	}
}

// serveConsole serves h on addr until ctx ends. Without authentication
// on an address other hosts reach (OUTBOX_CONSOLE_INSECURE_OPEN), it
// says so. Credentials travel in clear over plain HTTP, which is why a
// non-loopback address wants a proxy that terminates TLS in front.
func serveConsole(ctx context.Context, logger *slog.Logger, addr string, h http.Handler, writes, authenticates bool, certs *certReloader) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("console: listen on OUTBOX_CONSOLE_ADDR %s: %w", addr, err)
	}
	scheme := "http"
	if certs != nil {
		ln, scheme = tls.NewListener(ln, certs.tlsConfig()), "https"
	}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); (err != nil || !ap.Addr().Unmap().IsLoopback()) && !authenticates {
		logger.Warn("the console listens on an address other hosts may reach without authentication, as OUTBOX_CONSOLE_INSECURE_OPEN=true allows; it shows every event's payload",
			"addr", ln.Addr().String())
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// A page's queries have 15 s (console.requestTimeout), an
		// action console.ActionTimeoutDefault.
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  60 * time.Second,
	}
	logger.Info("console serving", "url", scheme+"://"+ln.Addr().String()+"/", "actions", writes)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: stop: %w", err)
	}
	return nil
}
