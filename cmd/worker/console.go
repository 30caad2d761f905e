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

// consoleCommand is `worker console`: the read-only operator console on
// OUTBOX_CONSOLE_ADDR until SIGINT or SIGTERM. It needs MongoDB only.
func consoleCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, _, err := loadConfig("console", args, getenv, consoleKind, nil)
	if err != nil {
		return err
	}
	if err := cfg.checkConsole(); err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	client, err := driver.Connect(mongoClientOptions(cfg, "outbox-console"))
	if err != nil {
		return fmt.Errorf("%w: invalid OUTBOX_MONGO_URI %q: %v", ErrUsage, redact.URL(cfg.MongoURI), err)
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	store := mongo.New(client, mongoStoreConfig(cfg, logger))
	if err := waitForDatabase(ctx, logger, store); err != nil {
		return err
	}
	if err := store.EnsureBrowseIndex(ctx); err != nil {
		logger.Warn("could not create the console's index; event lists read more of the outbox without it", "error", err)
	}
	clock := mongo.NewClock(client, logger)
	if err := clock.Sync(ctx); err != nil {
		logger.Warn("database clock not measured; ages use this machine's clock until it is", "error", err)
	}
	arch := service.Archetype{Logger: logger, Now: clock.Now}
	sampler, err := ops.NewSampler(ops.SamplerConfig{
		Archetype: arch, Store: store, StaleAfter: cfg.StaleAfter,
		Held: heldSource(cfg, store), FailedHolds: cfg.OrderingAfterFailed == claim.AfterFailedWait, Paused: store,
		Failures: store, Holders: store,
	})
	if err != nil {
		return err
	}
	ccfg := console.Config{
		Archetype: arch, Store: store, Samples: sampler, Lists: sampler, Owners: store.Owners(),
		TermLength: cfg.StaleAfter / 2, FailedHolds: cfg.Ordering == claim.OrderingAggregate && cfg.OrderingAfterFailed == claim.AfterFailedWait,
		RequeuePerSecond: cfg.ConsoleRequeueRate, ActionMax: cfg.ConsoleActionMax,
		ActionsPerMinute: cfg.ConsoleActionsPerMinute, SignInFailuresPerMinute: cfg.ConsoleSignInFailures,
		Token: cfg.ConsoleToken, Users: cfg.ConsoleUsers, AllowedHosts: cfg.consoleHosts(),
		TrustedProxies: cfg.ConsoleTrustedProxies, IdentityHeader: cfg.ConsoleIdentityHeader, ProxySecret: cfg.ConsoleProxySecret,
	}
	if cfg.ConsoleWrites {
		ccfg.Writer = store
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
	for _, s := range []interface{ Start(context.Context) error }{clock, sampler} {
		if err := s.Start(ctx); err != nil {
			return err
		}
	}
	defer stopQuietly(clock, sampler)
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
