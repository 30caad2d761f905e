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

	"github.com/outboxrelay/outbox/console"
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
	opened := newConsoleOutboxes()
	defer opened.close()
	for _, oc := range cfg.Outboxes {
		if err := opened.add(oc, logger); err != nil {
			return err
		}
	}
	ccfg := console.Config{
		Archetype: service.Archetype{Logger: logger}, Outboxes: opened.list,
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
	// The console serves at once: each outbox becomes available when
	// its database answers, so that one database that is down leaves
	// the others served.
	opened.start(ctx)
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
